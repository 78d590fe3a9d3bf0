//! A target's workers: the service's (when probed) and one per replica
//! found by its `[targets.replicas]` source, read again every `refresh`,
//! or whenever a watched source (Kubernetes) says it changed. A replica
//! whose address or image changed under the same name (a StatefulSet's
//! pod replaced) gets a new worker once the old one's run is over.
//! Replicas that appear get a worker; those that vanish finish their run,
//! then lose their series. A new worker starts only once the worker
//! retired before it for the same replica (or the service), or for
//! another replica at the same address, has stopped,
//! and, after new replica settings, once every worker of the old settings
//! has: one replica never sees two probes at once, permits given out under
//! new settings never add to old ones still held, and a replica that hangs
//! after leaving the list delays nobody else (the run of a replica gone
//! gives its permit back at once). A failed read keeps the last list and
//! is counted. What a read drops (replicas past `max_replicas`, entries
//! that are not addresses) is counted on every read and logged once, when
//! it starts; a failure is logged when its message changes, not on every
//! refresh.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::{RwLock, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::worker::{Clock, Runs, Worker};
use crate::config::ReplicasConfig;
use crate::config::live::LiveConfig;
use crate::discovery::{Discovery, DiscoveryError, Found, Replica};
use crate::metrics::Metrics;
use crate::state::TargetStates;

/// What each of a target's workers is built from.
#[derive(Clone)]
pub struct WorkerParts<R> {
    pub live: Arc<LiveConfig>,
    pub runs: R,
    pub metrics: Arc<Metrics>,
    pub board: Arc<TargetStates>,
    /// Bumped when a build changes (see `Verdicts::upgrades`).
    pub upgrades: tokio::sync::watch::Sender<u64>,
    pub clock: Clock,
}

impl<R: Runs + Clone> WorkerParts<R> {
    fn worker(
        &self,
        target: &str,
        replica: Option<Replica>,
        parallel: Option<Arc<Semaphore>>,
        turn: Arc<RwLock<()>>,
        released: CancellationToken,
    ) -> Worker<R> {
        let label = replica.as_ref().map_or("", |r| r.label.as_str());
        let liveness = Arc::new(super::liveness::Liveness::new(
            target,
            label,
            self.metrics.clone(),
            self.board.clone(),
            self.clock,
        ));
        Worker {
            name: target.to_owned(),
            liveness,
            released,
            replica,
            parallel,
            turn,
            live: self.live.clone(),
            runs: self.runs.clone(),
            metrics: self.metrics.clone(),
            board: self.board.clone(),
            upgrades: self.upgrades.subscribe(),
            clock: self.clock,
        }
    }
}

type Retired = Shared<BoxFuture<'static, ()>>;

/// The workers retired for one replica label, done once they have all
/// stopped, and the addresses they probed.
struct RetiredWorkers {
    done: Retired,
    base_urls: Vec<String>,
}

/// A worker running, and how to stop it.
struct Running {
    /// The replica as its worker was started with (`None`: the service).
    replica: Option<Replica>,
    stop: CancellationToken,
    /// Cancelled when its replica leaves the list (see `Worker::released`).
    released: CancellationToken,
    handle: JoinHandle<()>,
}

/// The replica source in use: its settings, its reader and its permits.
struct Source {
    config: ReplicasConfig,
    discovery: Discovery,
    permits: Arc<Semaphore>,
}

/// One target's workers, kept in step with its configuration and its
/// replica list.
pub struct Fleet<R> {
    parts: WorkerParts<R>,
    target: String,
    service: Option<Running>,
    replicas: HashMap<String, Running>,
    /// Per replica label (`None`: the service), done once the workers
    /// retired so far for it have stopped (and a vanished replica's series
    /// are gone); a new worker for the same replica, or for another name
    /// at the same address (a new pod given a gone one's address), waits
    /// for it. Left once done.
    retired: HashMap<Option<String>, RetiredWorkers>,
    /// Replicas whose last retired worker left with the replica: its run
    /// gave its permit back, so new settings' workers do not wait for it.
    released: std::collections::HashSet<Option<String>>,
    /// Done once the workers of the replica settings before the current
    /// ones have all stopped; every replica worker waits for it.
    old_permits: Option<Retired>,
    source: Option<Source>,
    found: Vec<Replica>,
    /// What the log has been told of the current source: whether replicas
    /// are dropped past the cap, whether bad entries are, and the last
    /// failure (cleared by a successful read).
    told_over_limit: bool,
    told_rejected: bool,
    told_failure: Option<String>,
    /// The target's probing turn: replica workers share it, the service
    /// worker holds it alone, so a probe through the balancer never meets
    /// a replica's own probe at that replica.
    turn: Arc<RwLock<()>>,
    /// Whether the replicas found are probed (else only their images are
    /// followed, for the service's runs).
    probe_replicas: bool,
}

/// Replicas named in the "replicas found" line; the rest are counted.
const LOGGED_LABELS: usize = 8;

impl<R: Runs + Clone> Fleet<R> {
    pub fn new(parts: WorkerParts<R>, target: &str) -> Self {
        Fleet {
            parts,
            target: target.to_owned(),
            service: None,
            replicas: HashMap::new(),
            retired: HashMap::new(),
            released: Default::default(),
            old_permits: None,
            source: None,
            found: Vec::new(),
            told_over_limit: false,
            told_rejected: false,
            told_failure: None,
            turn: Arc::default(),
            probe_replicas: false,
        }
    }

    /// Follows the configuration and the replica list until `stop`, then
    /// waits for every worker's run in flight.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut generation = self.parts.live.subscribe();
        while !stop.is_cancelled() {
            let config = self.parts.live.current();
            let Some(target) = config.target(&self.target).cloned() else {
                break;
            };
            let service_probed = target.probe_mode().service();
            match (service_probed, self.service.is_some()) {
                (true, false) => self.service = Some(self.start(None, None, &stop)),
                (false, true) => {
                    if let Some(r) = self.service.take() {
                        self.retire(None, false, r);
                    }
                }
                _ => {}
            }
            // A Service found through Kubernetes is watched even when only
            // the service is probed: its pods' images are the fleet's.
            let wanted = target.replicas.filter(|r| {
                r.probe.replicas()
                    || matches!(r.source, crate::config::ReplicaSource::Kubernetes(_))
            });
            self.probe_replicas = wanted.as_ref().is_some_and(|r| r.probe.replicas());
            self.follow_source(wanted).await;
            self.reconcile(&stop);
            let changes = self.source.as_ref().and_then(|s| s.discovery.changes());
            let refresh = match (&changes, &self.source) {
                (None, Some(s)) => Some(s.config.refresh),
                _ => None,
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                changed = generation.changed() => if changed.is_err() { break },
                _ = sleep_or_forever(refresh) => {}
                _ = until_changed(changes) => {}
            }
        }
        self.shut(stop).await;
    }

    /// Takes new replica settings (a new reader and permits) and reads the
    /// list; a failed read keeps the last one.
    async fn follow_source(&mut self, wanted: Option<ReplicasConfig>) {
        let Some(config) = wanted else {
            if self.source.take().is_some() {
                self.parts.board.set_images(&self.target, Vec::new());
                self.parts.metrics.fleet.set_image_pods(&self.target, &[]);
            }
            self.found.clear();
            return;
        };
        if self.source.as_ref().map(|s| &s.config) != Some(&config) {
            // Every replica worker restarts under the new permits, once
            // all the old ones have stopped.
            for (label, r) in std::mem::take(&mut self.replicas) {
                self.retire(Some(label), false, r);
            }
            // Permits given out under the new settings never add to the
            // old ones still held: every new worker waits for all of them.
            let all: Vec<Retired> = self
                .retired
                .iter()
                .filter(|(label, _)| !self.released.contains(*label))
                .map(|(_, r)| r.done.clone())
                .collect();
            self.old_permits = Some(
                async move {
                    for r in all {
                        r.await;
                    }
                }
                .boxed()
                .shared(),
            );
            (self.told_over_limit, self.told_rejected, self.told_failure) = (false, false, None);
            self.source = match Discovery::new(&config) {
                Ok(discovery) => Some(Source {
                    permits: Arc::new(Semaphore::new(config.max_parallel)),
                    config,
                    discovery,
                }),
                Err(e) => {
                    self.read_failed(&e);
                    None
                }
            };
        }
        let Some(source) = &self.source else {
            return;
        };
        let max_replicas = source.config.max_replicas;
        let watched = source.discovery.changes().is_some();
        match source.discovery.read().await {
            Ok(found) if watched => {
                self.watch_went(&found);
                if !found.unlisted {
                    self.listed(found, max_replicas);
                }
            }
            Ok(found) => {
                self.told_failure = None;
                self.listed(found, max_replicas);
            }
            Err(e) => self.read_failed(&e),
        }
    }

    /// A watched source's failures since the last read are counted; what
    /// fails is said once, and once more when its watches work again.
    fn watch_went(&mut self, found: &Found) {
        for _ in 0..found.failed {
            self.parts.metrics.fleet.discovery_failed(&self.target);
        }
        match (&found.failing, &self.told_failure) {
            (Some(now), told) if told.as_ref() != Some(now) => {
                tracing::warn!(target = %self.target, error = %now, "watching the replicas failed; keeping the last list and retrying with back-off (said again only if the error changes)");
                self.told_failure = Some(now.clone());
            }
            (None, Some(_)) => {
                tracing::info!(target = %self.target, "watching the replicas works again");
                self.told_failure = None;
            }
            _ => {}
        }
    }

    /// A successful read: the list, what it dropped, and the images the
    /// pods run.
    fn listed(&mut self, found: Found, max_replicas: usize) {
        if found.replicas != self.found {
            tracing::info!(target = %self.target, count = found.replicas.len(), replicas = %some_labels(&found.replicas), "replicas found");
        }
        self.tell_dropped(&found, max_replicas);
        self.parts.metrics.fleet.set_replicas(
            &self.target,
            found.replicas.len(),
            found.over_limit,
            found.rejected.count,
        );
        let images: Vec<(String, String, usize)> = found
            .images
            .iter()
            .map(|i| (i.image.clone(), i.digest.clone(), i.pods))
            .collect();
        self.parts
            .metrics
            .fleet
            .set_image_pods(&self.target, &images);
        self.parts.board.set_images(&self.target, found.images);
        self.found = found.replicas;
    }

    /// Logs what a read dropped once, when it starts (the gauge follows
    /// every read); and once more when it stops.
    fn tell_dropped(&mut self, found: &Found, max_replicas: usize) {
        let target = &self.target;
        match (found.over_limit > 0, self.told_over_limit) {
            (true, false) => tracing::warn!(
                target = %target, listed = found.replicas.len() + found.over_limit, max_replicas,
                dropped = found.over_limit,
                "more replicas listed than max_replicas: the first in sorted host:port order are probed, the rest dropped (sentinel_replicas_dropped)"
            ),
            (false, true) => {
                tracing::info!(target = %target, "no replica dropped past max_replicas any more")
            }
            _ => {}
        }
        self.told_over_limit = found.over_limit > 0;
        let rejected = &found.rejected;
        match (rejected.count > 0, self.told_rejected) {
            (true, false) => tracing::warn!(
                target = %target, skipped = rejected.count, first = %rejected.examples.join("; "),
                "replica entries that are not host:port addresses skipped (sentinel_replicas_dropped)"
            ),
            (false, true) => {
                tracing::info!(target = %target, "every replica entry is an address again")
            }
            _ => {}
        }
        self.told_rejected = rejected.count > 0;
    }

    /// Counts every failed read; logs one when its message is new.
    fn read_failed(&mut self, e: &DiscoveryError) {
        let message = e.to_string();
        if self.told_failure.as_ref() != Some(&message) {
            tracing::warn!(target = %self.target, error = %message, "reading the replica list failed; keeping the last one (said again only if the error changes)");
            self.told_failure = Some(message);
        }
        self.parts.metrics.fleet.discovery_failed(&self.target);
    }

    /// One worker per replica found: new ones started, vanished ones
    /// stopped (their series removed once their run is over), and one
    /// whose address or image changed under the same name restarted.
    fn reconcile(&mut self, stop: &CancellationToken) {
        // Only the images are followed when the replicas are not probed:
        // the fleet's shares stay the service's requests.
        let found = if self.probe_replicas {
            self.found.clone()
        } else {
            Vec::new()
        };
        self.parts.board.set_replicas(&self.target, &found);
        let labels: Vec<&String> = found.iter().map(|r| &r.label).collect();
        let vanished: Vec<String> = self
            .replicas
            .keys()
            .filter(|l| !labels.contains(l))
            .cloned()
            .collect();
        for label in vanished {
            if let Some(r) = self.replicas.remove(&label) {
                tracing::info!(target = %self.target, replica = %label, "replica gone; its worker stops after its run");
                self.retire(Some(label), true, r);
            }
        }
        let Some(permits) = self.source.as_ref().map(|s| s.permits.clone()) else {
            return;
        };
        // Every worker that goes is retired before any starts: a new
        // replica may have the address of one replaced later in the list.
        for replica in &found {
            let moved = self
                .replicas
                .get(&replica.label)
                .is_some_and(|r| r.replica.as_ref() != Some(replica));
            if moved && let Some(r) = self.replicas.remove(&replica.label) {
                tracing::info!(target = %self.target, replica = %replica.label, "replica replaced (new address or image); a new worker starts after the old one's run");
                self.retire(Some(replica.label.clone()), false, r);
            }
        }
        for replica in found {
            if !self.replicas.contains_key(&replica.label) {
                let label = replica.label.clone();
                let running = self.start(Some(replica), Some(permits.clone()), stop);
                self.replicas.insert(label, running);
            }
        }
    }

    /// Starts a worker once the worker retired before it for the same
    /// replica has stopped.
    fn start(
        &mut self,
        replica: Option<Replica>,
        parallel: Option<Arc<Semaphore>>,
        stop: &CancellationToken,
    ) -> Running {
        self.forget_stopped();
        let key = replica.as_ref().map(|r| r.label.clone());
        let key_replica = replica.clone();
        let url = replica.as_ref().map(|r| r.base_url.clone());
        let retired: Vec<Retired> = self
            .retired
            .iter()
            .filter(|(label, r)| {
                **label == key || url.as_ref().is_some_and(|u| r.base_urls.contains(u))
            })
            .map(|(_, r)| r.done.clone())
            .collect();
        let old_permits = self.old_permits.clone().filter(|_| key.is_some());
        let released = CancellationToken::new();
        let worker = self.parts.worker(
            &self.target,
            replica,
            parallel,
            self.turn.clone(),
            released.clone(),
        );
        let token = stop.child_token();
        let worker_stop = token.clone();
        let handle = tokio::spawn(async move {
            for earlier in retired.into_iter().chain(old_permits) {
                earlier.await;
            }
            worker.run(worker_stop).await;
        });
        Running {
            replica: key_replica,
            stop: token,
            released,
            handle,
        }
    }

    /// Stops the worker of `replica` (`None`: the service) after its run;
    /// when the replica `vanished`, its series go then.
    fn retire(&mut self, replica: Option<String>, vanished: bool, running: Running) {
        self.forget_stopped();
        running.stop.cancel();
        let mut base_urls: Vec<String> = running
            .replica
            .as_ref()
            .map(|r| r.base_url.clone())
            .into_iter()
            .collect();
        if vanished {
            running.released.cancel();
            self.released.insert(replica.clone());
        } else {
            self.released.remove(&replica);
        }
        let metrics = self.parts.metrics.clone();
        let runs = self.parts.runs.clone();
        let target = self.target.clone();
        let label = replica.clone();
        let drained = tokio::spawn(async move {
            let _ = running.handle.await;
            if let (true, Some(label)) = (vanished, label) {
                // Its last run is filed first: filed after, it would put
                // the series of a replica gone back on /metrics.
                runs.filed().await;
                metrics.runs.remove_replica(&target, &label);
                metrics.liveness.remove_replica(&target, &label);
            }
        });
        let earlier = self.retired.remove(&replica).map(|r| {
            base_urls.extend(r.base_urls);
            base_urls.sort();
            base_urls.dedup();
            r.done
        });
        let done = async move {
            if let Some(earlier) = earlier {
                earlier.await;
            }
            let _ = drained.await;
        }
        .boxed()
        .shared();
        // Driven to its end even if no worker ever waits for it, so that it
        // is seen done and forgotten: pods come and go by new names.
        tokio::spawn(done.clone());
        self.retired
            .insert(replica, RetiredWorkers { done, base_urls });
    }

    /// Forgets the retired workers that have stopped.
    fn forget_stopped(&mut self) {
        self.retired.retain(|_, r| r.done.peek().is_none());
        let retired = &self.retired;
        self.released.retain(|label| retired.contains_key(label));
    }

    /// Waits for every worker (they stop with `stop`).
    async fn shut(mut self, stop: CancellationToken) {
        stop.cancel();
        let running = self
            .service
            .take()
            .into_iter()
            .chain(self.replicas.into_values());
        for r in running {
            r.stop.cancel();
            let _ = r.handle.await;
        }
        for (_, retired) in self.retired {
            retired.done.await;
        }
    }
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;

/// The first replicas' labels, and how many more: one bounded log line.
fn some_labels(replicas: &[Replica]) -> String {
    let shown: Vec<&str> = replicas
        .iter()
        .take(LOGGED_LABELS)
        .map(|r| r.label.as_str())
        .collect();
    match replicas.len().saturating_sub(LOGGED_LABELS) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// Until a watched source says it changed (forever for others).
async fn until_changed(changes: Option<Arc<tokio::sync::Notify>>) {
    match changes {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

async fn sleep_or_forever(wait: Option<std::time::Duration>) {
    match wait {
        Some(w) => tokio::time::sleep(w).await,
        None => std::future::pending().await,
    }
}
