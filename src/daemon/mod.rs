//! The always-on daemon: opens the store, restores the last runs onto
//! `/metrics`, starts one scheduler worker and one telemetry watcher per
//! target and the HTTP server, reloads the configuration on request, and
//! shuts down by draining probes in flight within a grace period.
//!
//! The listener and the shutdown token are arguments, so tests run the
//! whole daemon in-process on port 0 and stop it at will.

pub mod execute;
pub mod verdicts;
pub mod watch;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use chrono::{DateTime, Utc};
use tokio::net::TcpListener;
use tokio::sync::watch as tokio_watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError, TargetConfig};
use crate::detect::State;
use crate::detect::verdict::PairVerdict;
use crate::metrics::{Metrics, MetricsError};
use crate::run::ServerIdentity;
use crate::store::baselines::PairKey;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot serve HTTP: {0}")]
    Http(std::io::Error),
    #[error("a daemon task failed: {0}")]
    Task(String),
}

/// What the status page shows about one target.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TargetStatus {
    pub up: Option<bool>,
    pub model: Option<String>,
    pub identity: Option<ServerIdentity>,
    pub running: Option<String>,
    pub backoff_until: Option<DateTime<Utc>>,
    pub next_due: BTreeMap<String, DateTime<Utc>>,
}

/// State shared by the workers, watchers and HTTP handlers.
pub struct Shared {
    config: RwLock<Arc<Config>>,
    pub config_path: Option<PathBuf>,
    pub metrics: Arc<Metrics>,
    pub store: Store,
    /// One HTTP client (one connection pool) for every watcher and
    /// load read; each request carries its own timeout.
    pub http: reqwest::Client,
    status: Mutex<BTreeMap<String, TargetStatus>>,
    /// Bumped on every successful reload; workers re-plan on change.
    pub generation: tokio_watch::Sender<u64>,
    pub shutdown: CancellationToken,
    pub ready: AtomicBool,
    pub notifier: crate::notify::Notifier,
    /// Bumped when a target's server build changes; workers check whether
    /// an upgrade needs probe rounds.
    pub upgrades: tokio_watch::Sender<u64>,
    /// The last verdict per pair, to log changes and show on the status page.
    verdicts: Mutex<HashMap<PairKey, PairVerdict>>,
}

impl Shared {
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn with_status(&self, target: &str, f: impl FnOnce(&mut TargetStatus)) {
        let mut map = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(target.to_owned()).or_default());
    }

    pub fn status(&self) -> BTreeMap<String, TargetStatus> {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_next_due(&self, target: &str, due: Vec<(String, DateTime<Utc>)>) {
        self.with_status(target, |s| s.next_due = due.into_iter().collect());
    }

    pub fn set_running(&self, target: &str, scenario: Option<&str>) {
        self.with_status(target, |s| s.running = scenario.map(str::to_owned));
    }

    pub fn set_backoff(&self, target: &str, until: Option<DateTime<Utc>>) {
        self.with_status(target, |s| s.backoff_until = until);
    }

    pub fn set_up(&self, target: &str, up: bool) {
        self.metrics.set_target_up(target, up);
        self.with_status(target, |s| s.up = Some(up));
    }

    pub fn set_identity(&self, target: &str, model: &str, identity: ServerIdentity) {
        self.metrics.set_server_info(target, model, &identity);
        self.with_status(target, |s| {
            s.model = Some(model.to_owned());
            s.identity = Some(identity);
        });
    }

    pub fn remember_model(&self, target: &str, model: &str) {
        self.with_status(target, |s| {
            if s.model.is_none() {
                s.model = Some(model.to_owned());
            }
        });
    }

    /// Records a pair's confirmed state; returns the one before.
    pub fn remember_verdict(&self, v: &PairVerdict) -> Option<State> {
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(v.key(), v.clone())
            .map(|old| old.state)
    }

    /// The last verdict of every pair, sorted by target and scenario.
    pub fn verdicts(&self) -> Vec<PairVerdict> {
        let mut all: Vec<PairVerdict> = self
            .verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.target, &a.scenario).cmp(&(&b.target, &b.scenario)));
        all
    }

    /// The model label for runs that never learnt the model: the last one
    /// seen, else the configured one, else "unknown".
    pub fn model_label(&self, target: &TargetConfig) -> String {
        let map = self.status.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&target.name)
            .and_then(|s| s.model.clone())
            .or_else(|| target.model.clone())
            .unwrap_or_else(|| "unknown".to_owned())
    }

    /// Parses the configuration file again and swaps it in only if valid.
    /// The listen address and store path need a restart to change.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let Some(path) = &self.config_path else {
            return Ok(());
        };
        let fresh = match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.reload_result(false);
                tracing::error!("configuration reload failed, keeping the running one: {e}");
                return Err(e);
            }
        };
        let old = self.config();
        if fresh.exporter.listen != old.exporter.listen || fresh.store.path != old.store.path {
            tracing::warn!("exporter.listen and store.path take effect at the next restart");
        }
        self.metrics
            .set_stale_series_grace(fresh.exporter.stale_series_after);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
        self.metrics.reset_pairs();
        self.metrics.reset_policies();
        self.declare_and_restore();
        self.metrics.reload_result(true);
        self.generation.send_modify(|g| *g += 1);
        tracing::info!("configuration reloaded");
        Ok(())
    }

    /// Declares every configured series and puts the last stored run of
    /// each configured pair back on `/metrics`.
    fn declare_and_restore(&self) {
        let config = self.config();
        let latest = self.store.latest_runs().unwrap_or_else(|e| {
            tracing::error!("cannot read the last runs from the store: {e}");
            Vec::new()
        });
        for t in &config.targets {
            self.metrics.declare_target(&t.name);
            let model = latest
                .iter()
                .find(|r| r.target == t.name && r.summary.completed > 0)
                .map(|r| r.model.clone());
            if let Some(m) = &model {
                self.remember_model(&t.name, m);
            }
            let model = self.model_label(t);
            for s in &t.scenarios {
                self.metrics.declare_pair(&t.name, &model, s);
                if let Some(scenario) = config.scenario(s) {
                    let interval = config.schedule_for(t, scenario).interval_seconds();
                    self.metrics
                        .set_pair_policy(&t.name, s, interval, &scenario.slos);
                }
                if let Some(run) = latest
                    .iter()
                    .find(|r| r.target == t.name && &r.scenario == s)
                {
                    self.metrics.record_run(run, false);
                }
            }
        }
        let names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| names.contains(k));
    }
}

/// A running daemon.
pub struct DaemonHandle {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
    task: JoinHandle<Result<(), DaemonError>>,
}

impl DaemonHandle {
    /// Starts the graceful shutdown; `wait` returns when it is done.
    pub fn shutdown(&self) {
        self.shared.shutdown.cancel();
    }

    pub async fn wait(self) -> Result<(), DaemonError> {
        self.task
            .await
            .map_err(|e| DaemonError::Task(e.to_string()))?
    }
}

/// Opens the store and starts everything; the returned handle stops it.
pub async fn start(
    config: Config,
    config_path: Option<PathBuf>,
    listener: TcpListener,
) -> Result<DaemonHandle, DaemonError> {
    let addr = listener.local_addr().map_err(DaemonError::Http)?;
    let store_path = config.store.path.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&store_path))
        .await
        .map_err(|e| DaemonError::Task(e.to_string()))??;
    let pruned = store.prune(Utc::now(), config.store.retention)?;
    if pruned > 0 {
        tracing::info!(
            runs = pruned,
            "deleted runs older than the retention period"
        );
    }
    let metrics = Arc::new(Metrics::new()?);
    metrics.reload_result(true);
    let (notifier, inbox) = crate::notify::channel();
    let shared = Arc::new(Shared {
        config: RwLock::new(Arc::new(config)),
        config_path,
        metrics,
        store,
        http: reqwest::Client::new(),
        status: Mutex::new(BTreeMap::new()),
        generation: tokio_watch::channel(0).0,
        shutdown: CancellationToken::new(),
        ready: AtomicBool::new(false),
        notifier,
        upgrades: tokio_watch::channel(0).0,
        verdicts: Mutex::new(HashMap::new()),
    });
    shared.declare_and_restore();
    verdicts::restore(&shared)?;
    let notifications = crate::notify::spawn(shared.clone(), inbox);
    let http = {
        let exporter = &shared.config().exporter;
        let descriptors = crate::http::serve::descriptor_limit();
        let limits = crate::http::serve::ConnectionLimits {
            max_connections: crate::http::serve::connection_limit(
                descriptors,
                exporter.max_connections,
            ),
            header_timeout: exporter.header_timeout,
        };
        tracing::info!(
            descriptor_limit = ?descriptors, max_connections = limits.max_connections,
            header_timeout = ?limits.header_timeout,
            "exporter connections bounded below the file-descriptor limit"
        );
        shared
            .metrics
            .set_stale_series_grace(exporter.stale_series_after);
        let shutdown = shared.shutdown.clone();
        let app = crate::http::router(shared.clone());
        let metrics = shared.metrics.clone();
        tokio::spawn(async move {
            crate::http::serve::serve(listener, app, limits, shutdown, move |e| {
                metrics.accept_error();
                tracing::warn!("exporter cannot accept a connection: {e}");
            })
            .await;
            Ok::<(), std::io::Error>(())
        })
    };
    let task = tokio::spawn(supervise(shared.clone(), http, notifications));
    tracing::info!(%addr, "exporter listening");
    Ok(DaemonHandle { addr, shared, task })
}

/// Keeps one worker and one watcher per configured target, following
/// reloads, until shutdown; then drains them and flushes the store.
async fn supervise(
    shared: Arc<Shared>,
    http: JoinHandle<std::io::Result<()>>,
    notifications: JoinHandle<()>,
) -> Result<(), DaemonError> {
    let mut tasks: HashMap<String, (CancellationToken, Vec<JoinHandle<()>>)> = HashMap::new();
    let mut generation = shared.generation.subscribe();
    let host_gpus = watch::spawn_host_gpus(shared.clone());
    let retention = watch::spawn_retention(shared.clone());
    let store_check = watch::spawn_store_check(shared.clone());
    loop {
        let config = shared.config();
        let names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
        for gone in tasks
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect::<Vec<_>>()
        {
            // A removed target's probe in flight finishes; then it stops.
            if let Some((stop, _)) = tasks.remove(&gone) {
                stop.cancel();
            }
        }
        for name in names {
            tasks.entry(name.clone()).or_insert_with(|| {
                let stop = shared.shutdown.child_token();
                let worker = tokio::spawn(crate::scheduler::run_target(
                    shared.clone(),
                    name.clone(),
                    stop.clone(),
                ));
                let watcher = tokio::spawn(watch::watch_target(
                    shared.clone(),
                    name.clone(),
                    stop.clone(),
                ));
                (stop, vec![worker, watcher])
            });
        }
        shared.ready.store(true, Ordering::Release);
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            changed = generation.changed() => if changed.is_err() { break },
        }
    }
    tracing::info!("shutting down: no new runs; probes in flight may finish");
    shared.ready.store(false, Ordering::Release);
    for (_, (_, handles)) in tasks {
        for h in handles {
            let _ = h.await;
        }
    }
    host_gpus.abort();
    retention.abort();
    store_check.abort();
    let _ = notifications.await;
    let _ = http.await;
    let store = shared.store.clone();
    tokio::task::spawn_blocking(move || store.checkpoint())
        .await
        .map_err(|e| DaemonError::Task(e.to_string()))??;
    tracing::info!("stopped");
    Ok(())
}
