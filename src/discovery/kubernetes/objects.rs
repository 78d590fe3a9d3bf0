//! What the daemon keeps of the Kubernetes objects it watches: of an
//! EndpointSlice, each endpoint's pod, address, port, readiness, node and
//! zone; of a Pod, the image its probed container runs and whether that
//! container is ready. Pure functions over the API's objects, so the rules
//! (which endpoint is probed, which container names the build) are tested
//! without a server.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::config::kubernetes::PortRef;

/// One endpoint of the Service, as its slice lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// The pod behind it: the replica's name.
    pub pod: String,
    /// `ip:port`, IPv6 bracketed.
    pub address: String,
    /// The port's number, as the slice resolves the Service's port (a
    /// name the pod's containers need not share).
    pub port: u16,
    /// Ready for traffic and not terminating: probed. A terminating
    /// endpoint is drained (no new probes, a run in flight finishes).
    pub ready: bool,
    pub node: Option<String>,
    pub zone: Option<String>,
}

/// Longest text kept from an object (names, images, digests): the API
/// bounds them itself, this bounds what a stand-in or a proxy could send.
const MAX_TEXT: usize = 512;

fn kept(text: &str) -> Option<String> {
    let text = crate::text::clean(text, MAX_TEXT);
    (!text.is_empty()).then_some(text)
}

/// The endpoints of one slice that are pods serving `port`; the second
/// value counts the endpoints skipped because they are not pods.
pub fn endpoints_of(slice: &EndpointSlice, port: &PortRef) -> (Vec<SliceEndpoint>, usize) {
    let ports = slice.ports.as_deref().unwrap_or_default();
    let number = match port {
        PortRef::Number(n) => Some(i32::from(*n)),
        PortRef::Name(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| p.port),
    };
    let Some(number) = number
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| *n > 0)
    else {
        return (Vec::new(), 0);
    };
    let ipv6 = slice.address_type == "IPv6";
    let mut not_pods = 0;
    let mut found = Vec::new();
    for endpoint in &slice.endpoints {
        let pod = endpoint
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| r.name.as_deref())
            .and_then(kept);
        let (Some(pod), Some(ip)) = (pod, endpoint.addresses.first()) else {
            not_pods += 1;
            continue;
        };
        let Some(address) = address_of(ip, ipv6, number) else {
            not_pods += 1;
            continue;
        };
        let conditions = endpoint.conditions.as_ref();
        // The API says a missing `ready` is to be read as true; a
        // terminating endpoint is drained whatever it says.
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true)
            && !conditions.and_then(|c| c.terminating).unwrap_or(false);
        found.push(SliceEndpoint {
            pod,
            address,
            port: number,
            ready,
            node: endpoint.node_name.as_deref().and_then(kept),
            zone: endpoint.zone.as_deref().and_then(kept),
        });
    }
    (found, not_pods)
}

/// `ip:port` from an address the slice lists, only when it is an IP
/// address of the slice's family (an FQDN slice names no pod address).
fn address_of(ip: &str, ipv6: bool, port: u16) -> Option<String> {
    let parsed: std::net::IpAddr = ip.parse().ok()?;
    match (parsed, ipv6) {
        (std::net::IpAddr::V4(v4), false) => Some(format!("{v4}:{port}")),
        (std::net::IpAddr::V6(v6), true) => Some(format!("[{v6}]:{port}")),
        _ => None,
    }
}

/// What a pod says of the container probed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodImage {
    /// The image as the pod spec names it (`vllm/vllm-openai:v0.32.0`).
    pub image: Option<String>,
    /// The content digest the container runs (`sha256:...`), once the
    /// kubelet has pulled and started it.
    pub digest: Option<String>,
    /// The container is ready and the pod is not being deleted.
    pub ready: bool,
    pub node: Option<String>,
    /// No container could be told to be the server's (see [`image_of`]).
    pub no_container: bool,
}

impl PodImage {
    /// A pod is probed only with a ready container of a known digest.
    pub fn probed(&self) -> bool {
        self.ready && self.digest.is_some()
    }
}

/// The container named in the configuration, else the one exposing the
/// port (by the configured name, or by `number`, the port the endpoint
/// serves: a Service's port name need not be its container's), else the
/// pod's only container.
pub fn image_of(pod: &Pod, container: Option<&str>, port: &PortRef, number: u16) -> PodImage {
    let Some(spec) = &pod.spec else {
        return PodImage::default();
    };
    let exposes_by = |by_name: bool| {
        move |c: &&k8s_openapi::api::core::v1::Container| {
            c.ports.iter().flatten().any(|p| match port {
                PortRef::Name(name) if by_name => p.name.as_deref() == Some(name.as_str()),
                _ => !by_name && p.container_port == i32::from(number),
            })
        }
    };
    let chosen = match container {
        Some(name) => spec.containers.iter().find(|c| c.name == name),
        None => spec
            .containers
            .iter()
            .find(exposes_by(true))
            .or_else(|| spec.containers.iter().find(exposes_by(false)))
            .or_else(|| (spec.containers.len() == 1).then(|| &spec.containers[0])),
    };
    let Some(chosen) = chosen else {
        return PodImage {
            no_container: true,
            ..PodImage::default()
        };
    };
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| all.iter().find(|s| s.name == chosen.name));
    let deleting = pod.metadata.deletion_timestamp.is_some();
    PodImage {
        image: chosen.image.as_deref().and_then(kept),
        digest: status.and_then(|s| digest_of(&s.image_id)),
        ready: status.is_some_and(|s| s.ready) && !deleting,
        node: spec.node_name.as_deref().and_then(kept),
        no_container: false,
    }
}

/// The digest in a container's `imageID`: after the `@` of
/// `docker.io/vllm/vllm-openai@sha256:...`, or the whole ID when it is a
/// digest itself (some runtimes report `sha256:...`, Docker through
/// cri-dockerd `docker://sha256:...` for an image with no registry
/// digest).
pub fn digest_of(image_id: &str) -> Option<String> {
    let image_id = image_id.strip_prefix("docker://").unwrap_or(image_id);
    let digest = image_id.rsplit_once('@').map_or(image_id, |(_, d)| d);
    let (algorithm, hex) = digest.split_once(':')?;
    let valid = !algorithm.is_empty()
        && algorithm
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b))
        && hex.len() >= 32
        && hex.len() <= 128
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| digest.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(json: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn endpoints_are_pods_on_the_named_port_and_terminating_ones_are_drained() {
        let s = slice(serde_json::json!({
            "metadata": {"name": "vllm-abc"},
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.0.0.5"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "vllm-0"}, "nodeName": "gpu-1", "zone": "eu-1a"},
                {"addresses": ["10.0.0.6"], "conditions": {"ready": false, "serving": true, "terminating": true},
                 "targetRef": {"kind": "Pod", "name": "vllm-1"}},
                {"addresses": ["10.0.0.7"], "targetRef": {"kind": "Pod", "name": "vllm-2"}},
                {"addresses": ["10.0.0.8"]}
            ]
        }));
        let (found, not_pods) = endpoints_of(&s, &PortRef::Name("http".into()));
        assert_eq!(not_pods, 1);
        let seen: Vec<(&str, &str, bool)> = found
            .iter()
            .map(|e| (e.pod.as_str(), e.address.as_str(), e.ready))
            .collect();
        assert_eq!(
            seen,
            [
                ("vllm-0", "10.0.0.5:8000", true),
                ("vllm-1", "10.0.0.6:8000", false),
                ("vllm-2", "10.0.0.7:8000", true),
            ]
        );
        assert_eq!(found[0].node.as_deref(), Some("gpu-1"));
        assert_eq!(found[0].zone.as_deref(), Some("eu-1a"));
        // A port the slice does not name: nothing to probe.
        assert!(endpoints_of(&s, &PortRef::Name("grpc".into())).0.is_empty());
        assert_eq!(
            endpoints_of(&s, &PortRef::Number(8001)).0[0].address,
            "10.0.0.5:8001"
        );
    }

    #[test]
    fn ipv6_addresses_are_bracketed_and_other_families_refused() {
        let s = slice(serde_json::json!({
            "metadata": {"name": "v6"}, "addressType": "IPv6",
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["fd00::5"], "targetRef": {"kind": "Pod", "name": "a"}},
                {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": "b"}}
            ]
        }));
        let (found, skipped) = endpoints_of(&s, &PortRef::Name("http".into()));
        assert_eq!(found[0].address, "[fd00::5]:8000");
        assert_eq!((found.len(), skipped), (1, 1));
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_image_is_the_ready_container_exposing_the_port() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let p = pod(serde_json::json!({
            "metadata": {"name": "vllm-0"},
            "spec": {"nodeName": "gpu-1", "containers": [
                {"name": "proxy", "image": "envoy:1", "ports": [{"name": "admin", "containerPort": 9901}]},
                {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "ports": [{"name": "http", "containerPort": 8000}]}
            ]},
            "status": {"containerStatuses": [
                {"name": "proxy", "ready": true, "image": "envoy:1", "imageID": "", "restartCount": 0},
                {"name": "vllm", "ready": true, "image": "docker.io/vllm/vllm-openai:v0.32.0",
                 "imageID": format!("docker.io/vllm/vllm-openai@{digest}"), "restartCount": 0}
            ]}
        }));
        let image = image_of(&p, None, &PortRef::Name("http".into()), 8000);
        assert_eq!(image.image.as_deref(), Some("vllm/vllm-openai:v0.32.0"));
        assert_eq!(image.digest.as_deref(), Some(digest.as_str()));
        assert!(image.probed());
        assert_eq!(image.node.as_deref(), Some("gpu-1"));
        // Named in the configuration: that container, here without a
        // digest yet, so the pod is not probed.
        let proxy = image_of(&p, Some("proxy"), &PortRef::Name("http".into()), 8000);
        assert_eq!((proxy.probed(), proxy.digest), (false, None));
    }

    /// vLLM's own example names the Service's port `http-mistral-7b` and
    /// leaves its container's port unnamed; with a sidecar injected the
    /// server's container is the one serving the endpoint's port number.
    #[test]
    fn a_container_is_found_by_the_endpoints_port_when_its_port_has_another_name() {
        let digest = format!("sha256:{}", "ef".repeat(32));
        let p = pod(serde_json::json!({
            "metadata": {"name": "vllm-0"},
            "spec": {"containers": [
                {"name": "istio-proxy", "image": "istio/proxyv2:1.22",
                 "ports": [{"name": "http-envoy-prom", "containerPort": 15090}]},
                {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "ports": [{"containerPort": 8000}]}
            ]},
            "status": {"containerStatuses": [
                {"name": "istio-proxy", "ready": true, "image": "istio/proxyv2:1.22",
                 "imageID": format!("docker.io/istio/proxyv2@sha256:{}", "01".repeat(32)), "restartCount": 0},
                {"name": "vllm", "ready": true, "image": "vllm/vllm-openai:v0.32.0",
                 "imageID": format!("docker.io/vllm/vllm-openai@{digest}"), "restartCount": 0}
            ]}
        }));
        let named = PortRef::Name("http-mistral-7b".into());
        let image = image_of(&p, None, &named, 8000);
        assert_eq!(image.digest.as_deref(), Some(digest.as_str()));
        assert!(image.probed() && !image.no_container);
        // Served on a port no container declares: none is taken for the
        // server's, and that is said.
        let unknown = image_of(&p, None, &named, 9000);
        assert!(unknown.no_container && !unknown.probed());
    }

    #[test]
    fn a_pod_not_ready_or_being_deleted_is_not_probed() {
        let digest = format!("sha256:{}", "cd".repeat(32));
        let mut json = serde_json::json!({
            "metadata": {"name": "vllm-0"},
            "spec": {"containers": [{"name": "vllm", "image": "vllm:1"}]},
            "status": {"containerStatuses": [
                {"name": "vllm", "ready": false, "image": "vllm:1", "imageID": digest, "restartCount": 0}
            ]}
        });
        assert!(!image_of(&pod(json.clone()), None, &PortRef::Number(8000), 8000).probed());
        json["status"]["containerStatuses"][0]["ready"] = true.into();
        assert!(image_of(&pod(json.clone()), None, &PortRef::Number(8000), 8000).probed());
        json["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        assert!(!image_of(&pod(json), None, &PortRef::Number(8000), 8000).probed());
    }

    #[test]
    fn digests_are_read_from_image_ids_and_nothing_else_is_one() {
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(
            digest_of(&format!("registry.local:5000/team/vllm@sha256:{hex}")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(
            digest_of(&format!("sha256:{hex}")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(
            digest_of(&format!("docker://sha256:{hex}")),
            Some(format!("sha256:{hex}"))
        );
        for not_one in [
            "",
            "vllm:0.32.0",
            "sha256:xyz",
            "docker://abc",
            "@sha256:12",
        ] {
            assert_eq!(digest_of(not_one), None, "{not_one:?}");
        }
    }
}
