//! A target's workers: the service's (when probed) and one per replica
//! found by its `[targets.replicas]` source, read again every `refresh`.
//! Replicas that appear get a worker; those that vanish finish their run,
//! then lose their series. A new worker starts only once the worker
//! retired before it for the same replica (or the service) has stopped:
//! one replica never sees two probes at once, and a replica that hangs
//! after leaving the list delays nobody else (the run of a replica gone
//! gives its permit back at once; `max_parallel` bounds the replicas
//! listed). A failed read keeps the last list and is counted.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::worker::{Clock, Runs, Worker};
use crate::config::ReplicasConfig;
use crate::config::live::LiveConfig;
use crate::discovery::{Discovery, Replica};
use crate::metrics::Metrics;
use crate::status::StatusBoard;

/// What each of a target's workers is built from.
#[derive(Clone)]
pub struct WorkerParts<R> {
    pub live: Arc<LiveConfig>,
    pub runs: R,
    pub metrics: Arc<Metrics>,
    pub board: Arc<StatusBoard>,
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
        released: CancellationToken,
    ) -> Worker<R> {
        let label = replica.as_ref().map_or("", |r| r.label.as_str());
        let liveness = Arc::new(super::liveness::Liveness::new(
            target,
            label,
            self.metrics.clone(),
            self.board.clone(),
        ));
        Worker {
            name: target.to_owned(),
            liveness,
            released,
            replica,
            parallel,
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

/// A worker running, and how to stop it.
struct Running {
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
    /// are gone); a new worker for the same replica waits for it.
    retired: HashMap<Option<String>, Retired>,
    /// Done once the workers of the replica settings before the current
    /// ones have all stopped; every replica worker waits for it.
    old_permits: Option<Retired>,
    source: Option<Source>,
    found: Vec<Replica>,
}

impl<R: Runs + Clone> Fleet<R> {
    pub fn new(parts: WorkerParts<R>, target: &str) -> Self {
        Fleet {
            parts,
            target: target.to_owned(),
            service: None,
            replicas: HashMap::new(),
            retired: HashMap::new(),
            old_permits: None,
            source: None,
            found: Vec::new(),
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
            let wanted = target.replicas.filter(|r| r.probe.replicas());
            let refresh = wanted.as_ref().map(|r| r.refresh);
            self.follow_source(wanted).await;
            self.reconcile(&stop);
            tokio::select! {
                _ = stop.cancelled() => break,
                changed = generation.changed() => if changed.is_err() { break },
                _ = sleep_or_forever(refresh) => {}
            }
        }
        self.shut(stop).await;
    }

    /// Takes new replica settings (a new reader and permits) and reads the
    /// list; a failed read keeps the last one.
    async fn follow_source(&mut self, wanted: Option<ReplicasConfig>) {
        let Some(config) = wanted else {
            self.source = None;
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
            let all: Vec<Retired> = self.retired.values().cloned().collect();
            self.old_permits = Some(
                async move {
                    for r in all {
                        r.await;
                    }
                }
                .boxed()
                .shared(),
            );
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
        match source.discovery.read().await {
            Ok(found) => {
                if found != self.found {
                    let labels: Vec<&str> = found.iter().map(|r| r.label.as_str()).collect();
                    tracing::info!(target = %self.target, replicas = ?labels, "replicas found");
                }
                self.parts
                    .metrics
                    .fleet
                    .set_replicas(&self.target, found.len());
                self.found = found;
            }
            Err(e) => self.read_failed(&e),
        }
    }

    fn read_failed(&self, e: &crate::discovery::DiscoveryError) {
        tracing::warn!(target = %self.target, error = %e, "reading the replica list failed; keeping the last one");
        self.parts.metrics.fleet.discovery_failed(&self.target);
    }

    /// One worker per replica found: new ones started, vanished ones
    /// stopped (their series removed once their run is over).
    fn reconcile(&mut self, stop: &CancellationToken) {
        let labels: Vec<String> = self.found.iter().map(|r| r.label.clone()).collect();
        self.parts.board.set_replicas(&self.target, &labels);
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
        for replica in self.found.clone() {
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
        self.retired.retain(|_, r| r.peek().is_none());
        let key = replica.as_ref().map(|r| r.label.clone());
        let retired = self.retired.get(&key).cloned();
        let old_permits = self.old_permits.clone().filter(|_| key.is_some());
        let released = CancellationToken::new();
        let worker = self
            .parts
            .worker(&self.target, replica, parallel, released.clone());
        let token = stop.child_token();
        let worker_stop = token.clone();
        let handle = tokio::spawn(async move {
            for earlier in [retired, old_permits].into_iter().flatten() {
                earlier.await;
            }
            worker.run(worker_stop).await;
        });
        Running {
            stop: token,
            released,
            handle,
        }
    }

    /// Stops the worker of `replica` (`None`: the service) after its run;
    /// when the replica `vanished`, its series go then.
    fn retire(&mut self, replica: Option<String>, vanished: bool, running: Running) {
        running.stop.cancel();
        if vanished {
            running.released.cancel();
        }
        let metrics = self.parts.metrics.clone();
        let target = self.target.clone();
        let label = replica.clone();
        let drained = tokio::spawn(async move {
            let _ = running.handle.await;
            if let (true, Some(label)) = (vanished, label) {
                metrics.runs.remove_replica(&target, &label);
                metrics.liveness.remove_replica(&target, &label);
            }
        });
        let earlier = self.retired.remove(&replica);
        let retired = async move {
            if let Some(earlier) = earlier {
                earlier.await;
            }
            let _ = drained.await;
        }
        .boxed()
        .shared();
        self.retired.insert(replica, retired);
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
            retired.await;
        }
    }
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;

async fn sleep_or_forever(wait: Option<std::time::Duration>) {
    match wait {
        Some(w) => tokio::time::sleep(w).await,
        None => std::future::pending().await,
    }
}
