//! A target's replicas from the Kubernetes API: the ready endpoints of one
//! Service's EndpointSlices (selected on the server by the
//! `kubernetes.io/service-name` label), each named by its pod, with the
//! image its container runs (each pod watched alone, selected on the
//! server by `metadata.name`). Both are watched, not polled: listed, then
//! watched from the list's resource version with bookmarks, listed again
//! when the server says the version is gone (410). A watch that fails
//! keeps the last list, counts the failure, names it, and retries with
//! back-off. Memory and requests go only to the matched Service's slices
//! and pods, however many other pods the namespace holds.

mod failure;
pub mod objects;
mod pods;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use self::failure::Failure;
use self::objects::{PodImage, SliceEndpoint, endpoints_of};
use super::{Placement, Rejected, Replica};
use crate::config::kubernetes::KubernetesSource;

/// What the watches know now, shared with the reader.
#[derive(Debug, Default)]
struct Known {
    /// Set once the slices were first listed: before that there is no
    /// list to give (nor to keep).
    replicas: Option<Vec<Replica>>,
    over_limit: usize,
    not_pods: usize,
    /// Failures since the last read, and the latest one's description
    /// while the watches fail (`None` once they work).
    failed: u64,
    failing: Option<String>,
    /// The ready pods per image, as the API lists them.
    images: Vec<ImagePods>,
}

/// The ready pods of one image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ImagePods {
    pub image: String,
    pub digest: String,
    pub pods: usize,
}

/// One read of the watched list.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// `None` before the first list.
    pub replicas: Option<Vec<Replica>>,
    pub over_limit: usize,
    pub rejected: Rejected,
    pub failed: u64,
    pub failing: Option<String>,
    pub images: Vec<ImagePods>,
}

/// The watches of one target's Service, running until dropped.
pub struct KubernetesWatch {
    known: Arc<Mutex<Known>>,
    changed: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Drop for KubernetesWatch {
    fn drop(&mut self) {
        // The pod watches end with the task that owns them.
        self.task.abort();
    }
}

impl KubernetesWatch {
    /// Starts watching; the credentials are found (and the kubeconfig
    /// read) in the background, a failure to find them being the first
    /// failure counted.
    pub fn start(source: KubernetesSource, scheme: String, max_replicas: usize) -> Self {
        let known = Arc::new(Mutex::new(Known::default()));
        let changed = Arc::new(Notify::new());
        let watching = Watching {
            source,
            scheme,
            max_replicas,
            known: known.clone(),
            changed: changed.clone(),
            told: None,
        };
        let task = tokio::spawn(watching.run());
        KubernetesWatch {
            known,
            changed,
            task,
        }
    }

    /// Notified whenever the list, or how the watches go, changes.
    pub fn changes(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// The list now, and the failures since the last read.
    pub fn read(&self) -> Listing {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if self.task.is_finished() && known.failing.is_none() {
            // Nothing is watched any more: said, and the last list kept.
            known.failing = Some("the Kubernetes watch stopped unexpectedly".into());
            known.failed += 1;
        }
        let failed = std::mem::take(&mut known.failed);
        Listing {
            replicas: known.replicas.clone(),
            over_limit: known.over_limit,
            rejected: Rejected {
                count: known.not_pods,
                examples: if known.not_pods > 0 {
                    vec!["endpoints that are not pods (no targetRef of kind Pod)".into()]
                } else {
                    Vec::new()
                },
            },
            failed,
            failing: known.failing.clone(),
            images: known.images.clone(),
        }
    }
}

/// The background side: the slices' watch, the pods' watches, and what
/// they make of the replica list.
struct Watching {
    source: KubernetesSource,
    scheme: String,
    max_replicas: usize,
    known: Arc<Mutex<Known>>,
    changed: Arc<Notify>,
    /// What failed last, while it fails: only news of that resource
    /// (a watch event of it) says it works again.
    told: Option<&'static str>,
}

impl Watching {
    async fn run(mut self) {
        let (client, namespace) = loop {
            match self.connect().await {
                Ok(found) => break found,
                Err(failure) => {
                    self.failed(failure);
                    // Credentials appear when a secret is mounted or a
                    // file written: tried again, not often.
                    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                }
            }
        };
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
        let selector = format!("kubernetes.io/service-name={}", self.source.service);
        let mut slice_events =
            watcher::watcher(slices, watcher::Config::default().labels(&selector))
                .default_backoff()
                .boxed();
        let (pod_sender, mut pod_updates) = mpsc::channel(64);
        let mut pods = pods::PodWatches::new(
            Api::namespaced(client, &namespace),
            self.source.clone(),
            pod_sender,
        );
        let mut listed: Option<BTreeMap<String, EndpointSlice>> = None;
        // Slices of a list in progress (after a 410, say): the last list
        // is kept until the new one is whole.
        let mut relisting: Option<BTreeMap<String, EndpointSlice>> = None;
        loop {
            tokio::select! {
                event = slice_events.next() => match event {
                    Some(Ok(Event::Init)) => relisting = Some(BTreeMap::new()),
                    Some(Ok(Event::InitApply(slice))) => {
                        if let Some(r) = &mut relisting {
                            r.insert(name_of(&slice), slice);
                        }
                    }
                    Some(Ok(Event::InitDone)) => {
                        listed = relisting.take().or(listed);
                        self.worked("endpointslices");
                    }
                    Some(Ok(Event::Apply(slice))) => {
                        listed.get_or_insert_default().insert(name_of(&slice), slice);
                        self.worked("endpointslices");
                    }
                    Some(Ok(Event::Delete(slice))) => {
                        if let Some(l) = &mut listed {
                            l.remove(&name_of(&slice));
                        }
                    }
                    Some(Err(e)) => {
                        if let Some(failure) = Failure::of_watch(&e, "list", "endpointslices", &namespace) {
                            self.failed(failure);
                        }
                        continue;
                    }
                    None => return,
                },
                update = pod_updates.recv() => match update {
                    Some(pods::PodUpdate::Seen(name, number, image)) => {
                        pods.seen(&name, number, image);
                        self.worked("pods");
                    }
                    Some(pods::PodUpdate::Failed(failure)) => {
                        self.failed(failure);
                        continue;
                    }
                    None => return,
                },
            }
            let Some(slices) = &listed else {
                continue;
            };
            let (endpoints, not_pods) = ready_endpoints(slices, &self.source);
            let total = endpoints.len();
            // The cap applies before any pod is watched: a Service of
            // thousands of endpoints costs `max_replicas` pod watches.
            let kept: Vec<SliceEndpoint> =
                endpoints.into_values().take(self.max_replicas).collect();
            pods.follow(kept.iter().map(|e| (e.pod.as_str(), e.port)));
            let replicas: Vec<Replica> = kept
                .iter()
                .filter_map(|e| self.replica_of(e, pods.image(&e.pod)?))
                .collect();
            self.publish(replicas, total.saturating_sub(self.max_replicas), not_pods);
        }
    }

    /// The client and the namespace, from the configured kubeconfig or
    /// found as Kubernetes clients find them.
    async fn connect(&self) -> Result<(Client, String), Failure> {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let options = KubeConfigOptions {
            context: self.source.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.source.kubeconfig, &self.source.context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path).map_err(|e| {
                    Failure::credentials(&format!("kubeconfig {}: {e}", path.display()))
                })?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| {
                        Failure::credentials(&format!("kubeconfig {}: {e}", path.display()))
                    })?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| Failure::credentials(&format!("kubeconfig: {e}")))?,
            (None, None) => kube::Config::infer()
                .await
                .map_err(|e| Failure::credentials(&e.to_string()))?,
        };
        // A 503 or 429 is retried by the watcher with its own back-off, each
        // failure counted and said: the client's own retries (15, up to
        // minutes apart) would hide an API server that is away.
        let mut config = config;
        config.default_retry = false;
        let namespace = self
            .source
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        // The Kubernetes client's TLS takes the process' provider: ring, as
        // everywhere else in the daemon (installed once; a later call is
        // refused, harmlessly).
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let client = Client::try_from(config).map_err(|e| Failure::credentials(&e.to_string()))?;
        Ok((client, namespace))
    }

    fn replica_of(&self, endpoint: &SliceEndpoint, image: &PodImage) -> Option<Replica> {
        if !image.probed() {
            return None;
        }
        Some(Replica {
            label: endpoint.pod.clone(),
            base_url: format!("{}://{}", self.scheme, endpoint.address),
            placement: Some(Placement {
                address: endpoint.address.clone(),
                node: endpoint.node.clone().or_else(|| image.node.clone()),
                zone: endpoint.zone.clone(),
                image: image.image.clone(),
                image_digest: image.digest.clone(),
            }),
        })
    }

    /// Publishes the list when it changed.
    fn publish(&mut self, replicas: Vec<Replica>, over_limit: usize, not_pods: usize) {
        let mut images: Vec<ImagePods> = Vec::new();
        for placement in replicas.iter().filter_map(|r| r.placement.as_ref()) {
            let (Some(digest), image) = (&placement.image_digest, &placement.image) else {
                continue;
            };
            let image = image.clone().unwrap_or_default();
            match images
                .iter_mut()
                .find(|i| &i.digest == digest && i.image == image)
            {
                Some(i) => i.pods += 1,
                None => images.push(ImagePods {
                    image,
                    digest: digest.clone(),
                    pods: 1,
                }),
            }
        }
        images.sort_by(|a, b| (&a.image, &a.digest).cmp(&(&b.image, &b.digest)));
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let unchanged = known.replicas.as_ref() == Some(&replicas)
            && known.over_limit == over_limit
            && known.not_pods == not_pods;
        if unchanged {
            return;
        }
        known.replicas = Some(replicas);
        known.over_limit = over_limit;
        known.not_pods = not_pods;
        known.images = images;
        drop(known);
        self.changed.notify_one();
    }

    /// A watch event of `resource` came: it works (again), and with it
    /// the credentials.
    fn worked(&mut self, resource: &str) {
        if self
            .told
            .is_some_and(|t| t == resource || t == "credentials")
        {
            self.told = None;
            let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            known.failing = None;
            drop(known);
            self.changed.notify_one();
        }
    }

    /// A failure: counted, and told when it is not the one told last.
    fn failed(&mut self, failure: Failure) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.failed += 1;
        known.failing = Some(failure.to_string());
        drop(known);
        self.told = Some(failure.resource);
        self.changed.notify_one();
    }
}

fn name_of(slice: &EndpointSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

/// The ready endpoints of every slice by pod name (sorted, one per pod:
/// a dual-stack Service lists a pod in two slices), and how many
/// endpoints are not pods.
fn ready_endpoints(
    slices: &BTreeMap<String, EndpointSlice>,
    source: &KubernetesSource,
) -> (BTreeMap<String, SliceEndpoint>, usize) {
    let mut ready: BTreeMap<String, SliceEndpoint> = BTreeMap::new();
    let mut not_pods = 0;
    for slice in slices.values() {
        let (endpoints, skipped) = endpoints_of(slice, &source.port);
        not_pods += skipped;
        for e in endpoints.into_iter().filter(|e| e.ready) {
            ready.entry(e.pod.clone()).or_insert(e);
        }
    }
    (ready, not_pods)
}
