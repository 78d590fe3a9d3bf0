//! `[targets.replicas]`: where a target's replicas are found (the
//! Kubernetes API, a static list, DNS A/AAAA records, or a Prometheus
//! file_sd file), how often a list that is not watched is read again, and
//! what is probed: the service, each replica, or both.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::check_url;
use super::kubernetes::{KubernetesSource, kubernetes};
use super::reader::{Errors, Fields};

/// What a target's workers probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMode {
    /// Only `base_url` (the load balancer): what users see.
    Service,
    /// Only each replica, directly.
    Replicas,
    /// Both; the service probe counts as one more replica.
    Both,
}

impl ProbeMode {
    pub fn service(self) -> bool {
        matches!(self, ProbeMode::Service | ProbeMode::Both)
    }

    pub fn replicas(self) -> bool {
        matches!(self, ProbeMode::Replicas | ProbeMode::Both)
    }
}

/// Where the replica list comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicaSource {
    /// Base URLs, as written.
    Static(Vec<String>),
    /// A name whose A/AAAA records are the replicas, all on `port`.
    Dns {
        name: String,
        port: u16,
        /// The name server asked; `None`: the system's (`/etc/resolv.conf`).
        name_server: Option<SocketAddr>,
    },
    /// A Prometheus file_sd file (JSON or YAML): `[{"targets": ["host:port"]}]`.
    FileSd(PathBuf),
    /// The ready endpoints of a Service, watched through the Kubernetes API.
    Kubernetes(KubernetesSource),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplicasConfig {
    pub source: ReplicaSource,
    /// How often DNS and file_sd are read again (the Kubernetes API is
    /// watched instead).
    pub refresh: Duration,
    pub probe: ProbeMode,
    /// Replicas of this target probed at once (the service is one more).
    pub max_parallel: usize,
    /// `http` or `https`, for addresses found by DNS or file_sd.
    pub scheme: String,
    /// The most replicas probed; those a source lists beyond it (in
    /// address order) are dropped and counted.
    pub max_replicas: usize,
}

/// The most replicas probed at once per target: each is a full probe
/// against production.
const MAX_PARALLEL: u64 = 64;
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// Replicas probed per target unless `max_replicas` says otherwise, and
/// the most it may say: each replica is a worker, a line on the status
/// page and about five series.
pub const DEFAULT_MAX_REPLICAS: usize = 256;
const MAX_REPLICAS: u64 = 4096;

pub fn replicas(f: &mut Fields, errors: &mut Errors) -> Option<ReplicasConfig> {
    let mut r = f.table("replicas", errors)?;
    let source = source(&mut r, errors);
    let refresh = r
        .positive_duration("refresh", errors)
        .unwrap_or(Duration::from_secs(30));
    if refresh < MIN_REFRESH {
        errors.push(r.path_of("refresh"), "must be at least 1s");
    }
    let probe = match r.string("probe", errors).as_deref() {
        None | Some("both") => ProbeMode::Both,
        Some("service") => ProbeMode::Service,
        Some("replicas") => ProbeMode::Replicas,
        Some(other) => {
            errors.push(
                r.path_of("probe"),
                format!("{other:?} is not one of \"service\", \"replicas\", \"both\""),
            );
            ProbeMode::Both
        }
    };
    let max_parallel = r
        .integer("max_parallel", 1, MAX_PARALLEL, errors)
        .unwrap_or(1) as usize;
    let scheme = match r.string("scheme", errors).as_deref() {
        None | Some("http") => "http".to_owned(),
        Some("https") => "https".to_owned(),
        Some(other) => {
            errors.push(
                r.path_of("scheme"),
                format!("{other:?} is not \"http\" or \"https\""),
            );
            "http".to_owned()
        }
    };
    let max_replicas = r
        .integer("max_replicas", 1, MAX_REPLICAS, errors)
        .map_or(DEFAULT_MAX_REPLICAS, |n| n as usize);
    if let Some(ReplicaSource::Static(urls)) = &source
        && urls.len() > max_replicas
    {
        errors.push(
            r.path_of("static"),
            format!(
                "lists {} replicas, more than max_replicas ({max_replicas})",
                urls.len()
            ),
        );
    }
    r.finish(errors);
    Some(ReplicasConfig {
        source: source?,
        refresh: refresh.max(MIN_REFRESH),
        probe,
        max_parallel,
        scheme,
        max_replicas,
    })
}

/// Exactly one of `kubernetes`, `static`, `dns`, `file_sd`.
fn source(r: &mut Fields, errors: &mut Errors) -> Option<ReplicaSource> {
    let given: Vec<&str> = ["kubernetes", "static", "dns", "file_sd"]
        .into_iter()
        .filter(|k| r.has(k))
        .collect();
    if given.len() != 1 {
        let found = if given.is_empty() {
            "none is set".to_owned()
        } else {
            format!("{} are set", given.join(" and "))
        };
        errors.push(
            r.path(),
            format!("set exactly one of kubernetes, static, dns, file_sd; {found}"),
        );
    }
    let name_server = r.string("name_server", errors).and_then(|s| {
        let parsed = s.parse::<SocketAddr>().ok();
        if parsed.is_none() {
            errors.push(
                r.path_of("name_server"),
                format!("{s:?} is not an ip:port address"),
            );
        }
        parsed
    });
    if name_server.is_some() && !r.has("dns") {
        errors.push(r.path_of("name_server"), "applies only with dns");
    }
    if r.has("kubernetes") {
        return kubernetes(r, errors).map(ReplicaSource::Kubernetes);
    }
    if let Some(urls) = r.strings("static", errors) {
        if urls.is_empty() {
            errors.push(r.path_of("static"), "lists no replica");
        }
        let hint = "use the target's api_key_env or api_key_file";
        let checked: Vec<Option<String>> = urls
            .iter()
            .enumerate()
            .map(|(i, u)| check_url(r, &format!("static[{i}]"), u, hint, errors))
            .collect();
        return checked
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .map(ReplicaSource::Static);
    }
    if let Some(dns) = r.string("dns", errors) {
        let parsed = dns
            .rsplit_once(':')
            .and_then(|(name, port)| Some((name, port.parse::<u16>().ok()?)))
            .filter(|(name, port)| !name.is_empty() && *port > 0);
        let Some((name, port)) = parsed else {
            errors.push(
                r.path_of("dns"),
                format!(
                    "{dns:?} must be name:port, e.g. \"vllm-headless.llm.svc.cluster.local:8000\""
                ),
            );
            return None;
        };
        return Some(ReplicaSource::Dns {
            name: name.to_owned(),
            port,
            name_server,
        });
    }
    let path = r.string("file_sd", errors)?;
    if path.is_empty() {
        errors.push(r.path_of("file_sd"), "is empty");
        return None;
    }
    Some(ReplicaSource::FileSd(PathBuf::from(path)))
}
