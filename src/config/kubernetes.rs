//! `[targets.replicas] kubernetes = { ... }`: the Service whose ready
//! endpoints are a target's replicas, the port probed on each (by name or
//! number), the container whose image names the build, and where the
//! credentials come from. Checked without reading anything: the
//! kubeconfig is read when the replicas are first listed.

use std::path::PathBuf;

use super::reader::{Errors, Fields};

/// The port probed on each endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRef {
    /// An EndpointSlice port's name (the Service port's name).
    Name(String),
    Number(u16),
}

impl std::fmt::Display for PortRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortRef::Name(name) => write!(f, "{name:?}"),
            PortRef::Number(n) => write!(f, "{n}"),
        }
    }
}

/// A Service found through the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSource {
    /// `None`: the context's namespace, else the pod's own (in a cluster).
    pub namespace: Option<String>,
    pub service: String,
    pub port: PortRef,
    /// The container whose image is part of each replica's build; `None`:
    /// the one exposing the port.
    pub container: Option<String>,
    /// The kubeconfig context; `None`: its current context.
    pub context: Option<String>,
    /// A kubeconfig file; `None`: found as Kubernetes clients do (the
    /// pod's service account, else `KUBECONFIG`, else `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
}

/// Longest name Kubernetes gives a Service, a namespace or a container.
const MAX_NAME: usize = 63;
/// Longest port name (an IANA service name).
const MAX_PORT_NAME: usize = 15;

/// Reads the `kubernetes` table.
pub fn kubernetes(r: &mut Fields, errors: &mut Errors) -> Option<KubernetesSource> {
    let mut k = r.table("kubernetes", errors)?;
    let namespace = k.string("namespace", errors);
    if let Some(ns) = &namespace {
        check_label(&k, "namespace", ns, errors);
    }
    let service = k.string("service", errors);
    match &service {
        Some(s) => check_label(&k, "service", s, errors),
        None => errors.push(k.path_of("service"), "is required"),
    }
    let port = port(&mut k, errors);
    let container = k.string("container", errors);
    if let Some(c) = &container {
        check_label(&k, "container", c, errors);
    }
    let context = k.string("context", errors);
    if context.as_deref() == Some("") {
        errors.push(k.path_of("context"), "is empty");
    }
    let kubeconfig = k.string("kubeconfig", errors);
    if kubeconfig.as_deref() == Some("") {
        errors.push(k.path_of("kubeconfig"), "is empty");
    }
    k.finish(errors);
    Some(KubernetesSource {
        namespace,
        service: service?,
        port: port?,
        container,
        context,
        kubeconfig: kubeconfig.filter(|p| !p.is_empty()).map(PathBuf::from),
    })
}

/// `port`: a name (`"http"`) or a number (`8000`).
fn port(k: &mut Fields, errors: &mut Errors) -> Option<PortRef> {
    if !k.has("port") {
        errors.push(
            k.path_of("port"),
            "is required: a port name such as \"http\", or a number",
        );
        return None;
    }
    if let Some(n) = k.integer_or_string("port", 1, 65535, errors) {
        return match n {
            Ok(number) => Some(PortRef::Number(number as u16)),
            Err(name) => {
                let valid = !name.is_empty()
                    && name.len() <= MAX_PORT_NAME
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && name.bytes().any(|b| b.is_ascii_lowercase());
                if !valid {
                    errors.push(
                        k.path_of("port"),
                        format!(
                            "{name:?} is not a port name (at most {MAX_PORT_NAME} lowercase letters, digits and '-') or a number"
                        ),
                    );
                    return None;
                }
                Some(PortRef::Name(name))
            }
        };
    }
    None
}

/// A Kubernetes name: lowercase letters, digits and `-`, starting and
/// ending with a letter or digit, at most 63 characters.
fn check_label(k: &Fields, key: &str, value: &str, errors: &mut Errors) {
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_NAME
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if !valid {
        errors.push(
            k.path_of(key),
            format!(
                "{value:?} is not a Kubernetes name (at most {MAX_NAME} lowercase letters, digits and '-', starting and ending with a letter or digit)"
            ),
        );
    }
}
