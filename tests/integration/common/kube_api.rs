//! A stand-in Kubernetes API server on 127.0.0.1 port 0, serving list and
//! watch of EndpointSlices and Pods as the real one does: JSON objects as
//! the API returns them, resource versions, label and field selectors
//! applied on the server, chunked watch streams with bookmarks, 410 Gone
//! (as a watch event) for a version older than it keeps, and 403 Status
//! answers for a verb and resource the test forbids. The test edits pods;
//! the Service's EndpointSlice follows them as the EndpointSlice
//! controller would. It counts requests and bytes sent, and writes a
//! kubeconfig pointing at itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// The bearer token the kubeconfig carries: it must never show in a log,
/// a metric or a page.
pub const TOKEN: &str = "stand-in-token-4f1c2b9e7d";
pub const NAMESPACE: &str = "llm";
pub const SERVICE: &str = "vllm";

/// One pod as the test describes it.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub ip: String,
    pub port: u16,
    pub image: String,
    /// `None`: the container has not started (no image ID yet).
    pub digest: Option<String>,
    pub ready: bool,
    /// Being deleted: its endpoint is terminating.
    pub terminating: bool,
    /// Behind the Service (else another workload of the namespace).
    pub in_service: bool,
    pub node: String,
}

impl PodSpec {
    pub fn ready(name: &str, ip: &str, port: u16, digest: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            ip: ip.into(),
            port,
            image: "vllm/vllm-openai:v0.32.0".into(),
            digest: Some(digest.into()),
            ready: true,
            terminating: false,
            in_service: true,
            node: format!("node-{name}"),
        }
    }
}

/// Which resource an event or request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Slices,
    Pods,
}

#[derive(Default)]
struct World {
    version: u64,
    /// Watches from a version below this get 410 Gone.
    kept_from: u64,
    pods: BTreeMap<String, PodSpec>,
    slice: Option<Value>,
    pod_objects: BTreeMap<String, Value>,
    /// Every change, for watches that resume from a version.
    log: Vec<(u64, Kind, &'static str, Value)>,
    /// `(verb, resource)` answered 403.
    forbidden: HashSet<(&'static str, &'static str)>,
    /// Every request refused with 503 while set (the API server away).
    down: bool,
}

/// What the stand-in served, for the test to check.
#[derive(Debug, Default, Clone)]
pub struct Served {
    /// Requests by `(verb, resource)`.
    pub requests: HashMap<(String, String), u64>,
    pub bytes: u64,
    pub bookmarks: u64,
    pub gone: u64,
    /// Whether every request carried the kubeconfig's bearer token.
    pub tokens_ok: bool,
    /// Selectors seen on watches and lists.
    pub selectors: HashSet<String>,
}

pub struct KubeApi {
    pub addr: SocketAddr,
    world: Arc<Mutex<World>>,
    served: Arc<Mutex<Served>>,
    events: broadcast::Sender<(u64, Kind, &'static str, Value)>,
    /// Bumped to end every open watch stream (a dropped connection).
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Shared {
    world: Arc<Mutex<World>>,
    served: Arc<Mutex<Served>>,
    events: broadcast::Sender<(u64, Kind, &'static str, Value)>,
    cut: tokio::sync::watch::Receiver<u64>,
}

impl KubeApi {
    pub async fn start() -> KubeApi {
        let world = Arc::new(Mutex::new(World {
            version: 100,
            ..World::default()
        }));
        let served = Arc::new(Mutex::new(Served {
            tokens_ok: true,
            ..Served::default()
        }));
        let (events, _) = broadcast::channel(4096);
        let (cut, cut_rx) = tokio::sync::watch::channel(0);
        let shared = Shared {
            world: world.clone(),
            served: served.clone(),
            events: events.clone(),
            cut: cut_rx,
        };
        let app = axum::Router::new()
            .route(
                "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                axum::routing::get(
                    |s: State<Shared>,
                     ns: UrlPath<String>,
                     q: Query<HashMap<String, String>>,
                     h: HeaderMap| async move {
                        serve(s.0, Kind::Slices, ns.0, q.0, h)
                    },
                ),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods",
                axum::routing::get(
                    |s: State<Shared>,
                     ns: UrlPath<String>,
                     q: Query<HashMap<String, String>>,
                     h: HeaderMap| async move {
                        serve(s.0, Kind::Pods, ns.0, q.0, h)
                    },
                ),
            )
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KubeApi {
            addr,
            world,
            served,
            events,
            cut,
            task,
        }
    }

    /// A kubeconfig in `dir` whose current context is this server, the
    /// namespace `llm`, with a bearer token.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: http://{}\n\
contexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: sentinel\n    namespace: {NAMESPACE}\n\
current-context: stand-in\nusers:\n- name: sentinel\n  user:\n    token: {TOKEN}\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Adds or replaces a pod; the Service's slice follows.
    pub fn put_pod(&self, pod: PodSpec) {
        let mut world = self.world.lock().unwrap();
        let existed = world.pods.insert(pod.name.clone(), pod.clone()).is_some();
        world.version += 1;
        let object = pod_object(&pod, world.version);
        world.pod_objects.insert(pod.name.clone(), object.clone());
        let kind = if existed { "MODIFIED" } else { "ADDED" };
        self.record(&mut world, Kind::Pods, kind, object);
        if pod.in_service || existed {
            self.refresh_slice(&mut world);
        }
    }

    /// Many pods of other workloads at once, none behind the Service
    /// (one version, no events: they exist before anyone watches).
    pub fn put_other_pods(&self, count: usize) {
        let mut world = self.world.lock().unwrap();
        world.version += 1;
        let version = world.version;
        for i in 0..count {
            let mut pod = PodSpec::ready(&format!("batch-{i:05}"), "10.9.0.1", 8080, &digest(0xee));
            pod.in_service = false;
            let object = pod_object(&pod, version);
            world.pods.insert(pod.name.clone(), pod);
            world.pod_objects.insert(format!("batch-{i:05}"), object);
        }
    }

    pub fn delete_pod(&self, name: &str) {
        let mut world = self.world.lock().unwrap();
        let Some(object) = world.pod_objects.remove(name) else {
            return;
        };
        world.pods.remove(name);
        world.version += 1;
        let mut object = object;
        object["metadata"]["resourceVersion"] = world.version.to_string().into();
        self.record(&mut world, Kind::Pods, "DELETED", object);
        self.refresh_slice(&mut world);
    }

    /// Answers `verb` (`list` or `watch`) on `resource` with 403, or
    /// stops doing so.
    pub fn forbid(&self, verb: &'static str, resource: &'static str, forbidden: bool) {
        let mut world = self.world.lock().unwrap();
        if forbidden {
            world.forbidden.insert((verb, resource));
        } else {
            world.forbidden.remove(&(verb, resource));
        }
    }

    /// The API server goes away (every request a 503, every watch cut)
    /// or comes back.
    pub fn set_down(&self, down: bool) {
        self.world.lock().unwrap().down = down;
        if down {
            self.cut.send_modify(|n| *n += 1);
        }
    }

    /// Ends every open watch stream, as a dropped connection does.
    pub fn cut_watches(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Forgets every version before now: a watch resuming from an older
    /// one gets 410 Gone and must list again.
    pub fn compact(&self) {
        let mut world = self.world.lock().unwrap();
        world.version += 1;
        world.kept_from = world.version;
        world.log.clear();
    }

    pub fn served(&self) -> Served {
        self.served.lock().unwrap().clone()
    }

    fn record(&self, world: &mut World, kind: Kind, type_: &'static str, object: Value) {
        let version = world.version;
        world.log.push((version, kind, type_, object.clone()));
        let _ = self.events.send((version, kind, type_, object));
    }

    /// The Service's one EndpointSlice, as the controller writes it.
    fn refresh_slice(&self, world: &mut World) {
        world.version += 1;
        let endpoints: Vec<Value> = world
            .pods
            .values()
            .filter(|p| p.in_service)
            .map(|p| {
                json!({
                    "addresses": [p.ip],
                    "conditions": {
                        "ready": p.ready && !p.terminating,
                        "serving": p.ready,
                        "terminating": p.terminating
                    },
                    "targetRef": {"kind": "Pod", "name": p.name, "namespace": NAMESPACE},
                    "nodeName": p.node,
                    "zone": "zone-a"
                })
            })
            .collect();
        let port = world
            .pods
            .values()
            .find(|p| p.in_service)
            .map_or(8000, |p| p.port);
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{SERVICE}-x7k2p"),
                "namespace": NAMESPACE,
                "resourceVersion": world.version.to_string(),
                "labels": {"kubernetes.io/service-name": SERVICE}
            },
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9090, "protocol": "TCP"}, {"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": endpoints
        });
        let type_ = if world.slice.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        world.slice = Some(slice.clone());
        self.record(world, Kind::Slices, type_, slice);
    }
}

/// A digest made of one repeated byte.
pub fn digest(byte: u8) -> String {
    format!("sha256:{}", format!("{byte:02x}").repeat(32))
}

fn pod_object(pod: &PodSpec, version: u64) -> Value {
    let labels = if pod.in_service {
        json!({"app": "vllm"})
    } else {
        json!({"app": "batch"})
    };
    let mut metadata = json!({
        "name": pod.name,
        "namespace": NAMESPACE,
        "resourceVersion": version.to_string(),
        "labels": labels
    });
    if pod.terminating {
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    }
    // The server's container port is unnamed, as in vLLM's own
    // Kubernetes example, and the Service names it `http`: with the
    // sidecar, the container is told by the number the endpoint serves.
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": pod.node,
            "containers": [
                {"name": "proxy", "image": "envoyproxy/envoy:v1.31", "ports": [{"name": "admin", "containerPort": 9901}]},
                {"name": "vllm", "image": pod.image, "ports": [{"containerPort": pod.port}]}
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": pod.ip,
            "containerStatuses": [
                {"name": "proxy", "ready": true, "restartCount": 0, "image": "docker.io/envoyproxy/envoy:v1.31",
                 "imageID": format!("docker.io/envoyproxy/envoy@{}", digest(0x11))},
                {"name": "vllm", "ready": pod.ready, "restartCount": 0, "image": format!("docker.io/{}", pod.image),
                 "imageID": pod.digest.as_ref().map(|d| format!("docker.io/vllm/vllm-openai@{d}")).unwrap_or_default()}
            ]
        }
    })
}

/// Whether `object` passes the request's selectors (the server applies
/// them: a client never sees what it did not select).
fn selected(object: &Value, query: &HashMap<String, String>) -> bool {
    let labels = |k: &str, v: &str| object["metadata"]["labels"][k].as_str() == Some(v);
    let fields = |k: &str, v: &str| match k {
        "metadata.name" => object["metadata"]["name"].as_str() == Some(v),
        _ => false,
    };
    let all = |selector: Option<&String>, test: &dyn Fn(&str, &str) -> bool| {
        selector.is_none_or(|s| {
            s.split(',')
                .filter(|t| !t.is_empty())
                .all(|term| match term.split_once('=') {
                    Some((k, v)) => test(k, v.trim_start_matches('=')),
                    None => false,
                })
        })
    };
    all(query.get("labelSelector"), &labels) && all(query.get("fieldSelector"), &fields)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn serve(
    shared: Shared,
    kind: Kind,
    namespace: String,
    query: HashMap<String, String>,
    headers: HeaderMap,
) -> Response {
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = if watch { "watch" } else { "list" };
    let resource = match kind {
        Kind::Slices => "endpointslices",
        Kind::Pods => "pods",
    };
    {
        let mut served = shared.served.lock().unwrap();
        *served
            .requests
            .entry((verb.to_owned(), resource.to_owned()))
            .or_default() += 1;
        let bearer = format!("Bearer {TOKEN}");
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(bearer.as_str()) {
            served.tokens_ok = false;
        }
        for key in ["labelSelector", "fieldSelector"] {
            if let Some(s) = query.get(key) {
                served.selectors.insert(format!("{resource}?{key}={s}"));
            }
        }
    }
    let world = shared.world.lock().unwrap();
    if world.down {
        let body = status(503, "ServiceUnavailable", "the API server is restarting");
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    if world.forbidden.contains(&(verb, resource)) {
        let group = if kind == Kind::Slices {
            " in API group \"discovery.k8s.io\""
        } else {
            " in API group \"\""
        };
        let message = format!(
            "{resource} is forbidden: User \"system:serviceaccount:{NAMESPACE}:vllm-sentinel\" cannot {verb} resource \"{resource}\"{group} in the namespace \"{namespace}\""
        );
        let body = status(403, "Forbidden", &message);
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    let in_namespace =
        move |o: &Value| o["metadata"]["namespace"].as_str() == Some(namespace.as_str());
    if !watch {
        let items: Vec<Value> = match kind {
            Kind::Slices => world.slice.iter().cloned().collect::<Vec<_>>(),
            Kind::Pods => world.pod_objects.values().cloned().collect(),
        }
        .into_iter()
        .filter(|o| in_namespace(o) && selected(o, &query))
        .collect();
        let (api_version, list_kind) = match kind {
            Kind::Slices => ("discovery.k8s.io/v1", "EndpointSliceList"),
            Kind::Pods => ("v1", "PodList"),
        };
        let body = json!({"apiVersion": api_version, "kind": list_kind,
            "metadata": {"resourceVersion": world.version.to_string()}, "items": items})
        .to_string();
        shared.served.lock().unwrap().bytes += body.len() as u64;
        return ([("content-type", "application/json")], body).into_response();
    }
    // A watch: 410 for a version no longer kept, else the changes since
    // it, then live ones, with bookmarks while idle.
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(256);
    let served = shared.served.clone();
    let line = move |v: Value| {
        let text = format!("{v}\n");
        served.lock().unwrap().bytes += text.len() as u64;
        text
    };
    if from < world.kept_from {
        shared.served.lock().unwrap().gone += 1;
        let gone = status(
            410,
            "Expired",
            &format!("too old resource version: {from} ({})", world.kept_from),
        );
        let _ = sender.try_send(Ok(line(json!({"type": "ERROR", "object": gone}))));
        drop(sender);
        return (
            [("content-type", "application/json")],
            Body::from_stream(tokio_stream(receiver)),
        )
            .into_response();
    }
    let backlog: Vec<(u64, &'static str, Value)> = world
        .log
        .iter()
        .filter(|(v, k, _, o)| *v > from && *k == kind && in_namespace(o) && selected(o, &query))
        .map(|(v, _, t, o)| (*v, *t, o.clone()))
        .collect();
    let mut live = shared.events.subscribe();
    let mut cut = shared.cut.clone();
    cut.mark_unchanged();
    let served_ref = shared.served.clone();
    drop(world);
    let bookmark_kind = match kind {
        Kind::Slices => ("discovery.k8s.io/v1", "EndpointSlice"),
        Kind::Pods => ("v1", "Pod"),
    };
    tokio::spawn(async move {
        // Every change up to this version was sent if selected: what a
        // bookmark may say.
        let mut sent_to = from;
        for (v, type_, object) in backlog {
            sent_to = v;
            if sender
                .send(Ok(line(json!({"type": type_, "object": object}))))
                .await
                .is_err()
            {
                return;
            }
        }
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = cut.changed() => return,
                event = live.recv() => match event {
                    Ok((v, k, type_, object)) if v > sent_to => {
                        sent_to = v;
                        if k == kind && in_namespace(&object) && selected(&object, &query)
                            && sender.send(Ok(line(json!({"type": type_, "object": object})))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let version = sent_to;
                    let mark = json!({"type": "BOOKMARK", "object": {"apiVersion": bookmark_kind.0,
                        "kind": bookmark_kind.1, "metadata": {"resourceVersion": version.to_string()}}});
                    served_ref.lock().unwrap().bookmarks += 1;
                    if sender.send(Ok(line(mark))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    (
        [("content-type", "application/json")],
        Body::from_stream(tokio_stream(receiver)),
    )
        .into_response()
}

/// A channel as a body stream.
fn tokio_stream(
    mut receiver: tokio::sync::mpsc::Receiver<Result<String, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}
