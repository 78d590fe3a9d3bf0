//! One watch per pod behind a ready endpoint, selected on the server by
//! `metadata.name`: the namespace's other pods cost nothing, and a pod
//! whose container becomes ready, gets its image digest, or is replaced
//! under the same name (a StatefulSet's) is seen when it happens. A pod
//! that leaves the endpoints has its watch stopped.

use std::collections::HashMap;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::failure::Failure;
use super::objects::{PodImage, image_of};
use crate::config::kubernetes::KubernetesSource;

/// What a pod's watch tells the Service's.
pub enum PodUpdate {
    /// The pod as now listed by watch number `u64`; `None`: there is no
    /// such pod (any more).
    Seen(String, u64, Option<PodImage>),
    Failed(Failure),
}

/// The pods watched, and what each watch last said.
pub struct PodWatches {
    api: Api<Pod>,
    source: KubernetesSource,
    updates: mpsc::Sender<PodUpdate>,
    watched: HashMap<String, Watched>,
    /// Numbers the watches started, so that what a stopped one had on its
    /// way is not taken for its successor's (a pod followed again).
    started: u64,
}

struct Watched {
    task: AbortHandle,
    number: u64,
    /// The port its endpoint serves, which tells the server's container.
    port: u16,
    /// `None` until the pod is first listed, or when it is gone.
    image: Option<PodImage>,
}

impl Drop for PodWatches {
    fn drop(&mut self) {
        for w in self.watched.values() {
            w.task.abort();
        }
    }
}

impl PodWatches {
    pub fn new(api: Api<Pod>, source: KubernetesSource, updates: mpsc::Sender<PodUpdate>) -> Self {
        PodWatches {
            api,
            source,
            updates,
            watched: HashMap::new(),
            started: 0,
        }
    }

    /// Watches exactly these pods, each with the port its endpoint
    /// serves: new ones start, others stop (and one whose port changed
    /// starts again).
    pub fn follow<'a>(&mut self, pods: impl Iterator<Item = (&'a str, u16)>) {
        let wanted: HashMap<&str, u16> = pods.collect();
        self.watched.retain(|name, w| {
            let keep = wanted.get(name.as_str()) == Some(&w.port);
            if !keep {
                w.task.abort();
            }
            keep
        });
        for (name, port) in wanted {
            if !self.watched.contains_key(name) {
                self.started += 1;
                let task = tokio::spawn(watch_pod(
                    self.api.clone(),
                    (name.to_owned(), port, self.started),
                    self.source.clone(),
                    self.updates.clone(),
                ));
                self.watched.insert(
                    name.to_owned(),
                    Watched {
                        task: task.abort_handle(),
                        number: self.started,
                        port,
                        image: None,
                    },
                );
            }
        }
    }

    /// What watch `number` of a pod said (ignored from a watch since
    /// stopped: its update was on its way when it stopped, and the pod may
    /// be followed again, by another watch, with another image).
    pub fn seen(&mut self, name: &str, number: u64, image: Option<PodImage>) {
        if let Some(w) = self.watched.get_mut(name).filter(|w| w.number == number) {
            w.image = image;
        }
    }

    pub fn image(&self, name: &str) -> Option<&PodImage> {
        self.watched.get(name)?.image.as_ref()
    }
}

/// Follows one pod, serving `port`, as watch `number`, until aborted.
async fn watch_pod(
    api: Api<Pod>,
    (name, port, number): (String, u16, u64),
    source: KubernetesSource,
    updates: mpsc::Sender<PodUpdate>,
) {
    let namespace = api.namespace().unwrap_or_default().to_owned();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // Whether the list in progress found the pod.
    let mut listed = false;
    // Said once while it lasts: no container could be told apart.
    let mut said_no_container = false;
    while let Some(event) = events.next().await {
        let update = match event {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitApply(pod)) | Ok(Event::Apply(pod)) => {
                listed = true;
                let image = image_of(&pod, source.container.as_deref(), &source.port, port);
                if image.no_container && !said_no_container {
                    tracing::warn!(
                        pod = %name, port, container = ?source.container,
                        "pod not probed: none of its containers is named in the configuration's `container` or declares the port its endpoint serves, and it has several; set `container` in [targets.replicas] kubernetes"
                    );
                }
                said_no_container = image.no_container;
                PodUpdate::Seen(name.clone(), number, Some(image))
            }
            Ok(Event::InitDone) if listed => continue,
            Ok(Event::InitDone) | Ok(Event::Delete(_)) => {
                PodUpdate::Seen(name.clone(), number, None)
            }
            Err(e) => match Failure::of_watch(&e, "list", "pods", &namespace) {
                Some(failure) => PodUpdate::Failed(failure),
                None => continue,
            },
        };
        if updates.send(update).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::kubernetes::PortRef;

    /// A pod dropped and followed again has a new watch: what the old one
    /// had on its way (its image) is not taken for the new one's.
    #[tokio::test]
    async fn an_update_from_a_stopped_watch_is_not_taken_for_its_successors() {
        // As the daemon does before building a client.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let source = KubernetesSource {
            namespace: Some("llm".into()),
            service: "vllm".into(),
            port: PortRef::Number(8000),
            container: None,
            context: None,
            kubeconfig: None,
        };
        let (updates, _seen) = mpsc::channel(8);
        let mut pods = PodWatches::new(Api::namespaced(client, "llm"), source, updates);
        let image = |digest: &str| PodImage {
            digest: Some(digest.into()),
            ready: true,
            ..PodImage::default()
        };
        pods.follow([("vllm-0", 8000)].into_iter());
        let first = pods.watched["vllm-0"].number;
        pods.follow(std::iter::empty());
        pods.follow([("vllm-0", 8000)].into_iter());
        pods.seen("vllm-0", first, Some(image("sha256:old")));
        assert_eq!(pods.image("vllm-0"), None);
        let second = pods.watched["vllm-0"].number;
        pods.seen("vllm-0", second, Some(image("sha256:new")));
        assert_eq!(pods.image("vllm-0"), Some(&image("sha256:new")));
    }
}
