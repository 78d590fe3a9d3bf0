//! The always-on daemon, wired from its parts: opens the store, restores
//! the last runs onto `/metrics`, starts one worker and one telemetry loop
//! per target and the HTTP server, follows reloads, and shuts down by
//! draining probes in flight within a grace period.
//!
//! Each part gets only what it uses (the live configuration, the status
//! board, the store, the metrics, an HTTP client, the shutdown token);
//! nothing outside `daemon` and `cli` knows the daemon exists. The
//! listener and the shutdown token are arguments, so tests run the whole
//! daemon in-process on port 0 and stop it at will.

pub mod background;
mod drift;
pub mod execute;
pub mod filing;
pub mod fleet;
mod heap;
pub mod heartbeat;
mod identity;
pub mod liveness;
mod schedule;
mod slo_counts;
pub mod verdicts;
pub mod worker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::config::live::{LiveConfig, ReloadError, Reloaded};
use crate::metrics::{Metrics, MetricsError};
use crate::notify::Notifier;
use crate::state::TargetStates;
use crate::store::writer_lock::WriterLock;
use crate::store::{AsyncStore, Store, StoreError};
use background::TelemetryLoop;
use execute::RunContext;
use fleet::{Fleet, WorkerParts};
use verdicts::Verdicts;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot serve HTTP: {0}")]
    Http(std::io::Error),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("a daemon task failed: {0}")]
    Task(String),
}

/// A running daemon.
pub struct DaemonHandle {
    pub addr: SocketAddr,
    live: Arc<LiveConfig>,
    metrics: Arc<Metrics>,
    store: AsyncStore,
    notifier: Notifier,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), DaemonError>>,
}

impl DaemonHandle {
    pub fn config(&self) -> Arc<Config> {
        self.live.current()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn store(&self) -> &Store {
        self.store.blocking()
    }

    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// Reads the configuration file again (the path SIGHUP takes).
    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        let live = self.live.clone();
        tokio::task::spawn_blocking(move || live.reload())
            .await
            .unwrap_or(Ok(Reloaded::NoFile))
    }

    /// Starts the graceful shutdown; `wait` returns when it is done.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    pub async fn wait(self) -> Result<(), DaemonError> {
        self.task
            .await
            .map_err(|e| DaemonError::Task(e.to_string()))?
    }
}

/// The parts every worker and loop is built from.
#[derive(Clone)]
struct Parts {
    live: Arc<LiveConfig>,
    metrics: Arc<Metrics>,
    board: Arc<TargetStates>,
    store: AsyncStore,
    verdicts: Verdicts,
    /// One HTTP client (one connection pool) for telemetry, load reads and
    /// notifications; each request carries its own timeout.
    http: reqwest::Client,
    shutdown: CancellationToken,
    ready: Arc<AtomicBool>,
    clock: Clock,
}

/// Opens the store and starts everything; `shutdown` (or the handle's
/// `shutdown`) stops it. Every part reads the time from `clock`.
pub async fn start(
    config: Config,
    config_path: Option<PathBuf>,
    listener: TcpListener,
    shutdown: CancellationToken,
    clock: Clock,
) -> Result<DaemonHandle, DaemonError> {
    let addr = listener.local_addr().map_err(DaemonError::Http)?;
    let store_path = config.store.path.clone();
    // Taken before the store is opened: a second daemon must not migrate
    // or prune it either.
    let claim = WriterLock::acquire(&store_path)?;
    let store = tokio::task::spawn_blocking(move || Store::open(&store_path))
        .await
        .map_err(|e| DaemonError::Task(e.to_string()))??;
    let pruned = store.prune(clock.now(), config.store.retention)?;
    if pruned > 0 {
        tracing::info!(
            runs = pruned,
            "deleted runs older than the retention period"
        );
    }
    let metrics = Arc::new(Metrics::with_histograms(config.exporter.histograms)?);
    metrics.health.config_loaded(Ok(()), clock.now());
    metrics.set_stale_series_grace(config.exporter.stale_series_after);
    let store = AsyncStore::new(
        store,
        store_error_handler(metrics.health.clone(), config.store.path.clone()),
    );
    let board = Arc::new(TargetStates::default());
    let (notifier, inbox) = crate::notify::channel();
    let http = crate::client::http::client_builder()
        .build()
        .map_err(|e| DaemonError::Client(crate::client::http::error_chain(&e)))?;
    if let Some(shard) = config.cluster.shard {
        tracing::info!(
            %shard, targets = config.targets.len(), others = config.cluster.others,
            "probing this instance's share of the targets"
        );
    }
    let live = Arc::new(LiveConfig::new(config, config_path));
    let parts = Parts {
        verdicts: Verdicts {
            store: store.clone(),
            metrics: metrics.clone(),
            board: board.clone(),
            notifier: notifier.clone(),
            upgrades: watch::channel(0).0,
            nondeterministic: Arc::default(),
            clock,
        },
        live: live.clone(),
        metrics: metrics.clone(),
        board,
        store: store.clone(),
        http: http.clone(),
        shutdown: shutdown.clone(),
        ready: Arc::new(AtomicBool::new(false)),
        clock,
    };
    declare_and_restore(&parts, &live.current());
    parts.verdicts.restore(&live.current())?;
    let follower = parts.clone();
    live.on_reload(Box::new(move |result| follower.follow_reload(result)));
    let notifications = crate::notify::spawn(
        crate::notify::Delivery {
            live: live.clone(),
            http,
            metrics: metrics.notifications.clone(),
            shutdown: shutdown.clone(),
            clock,
        },
        inbox,
    );
    let http = spawn_http(&parts, listener);
    let task = tokio::spawn(supervise(parts, http, notifications, claim));
    tracing::info!(%addr, "exporter listening");
    Ok(DaemonHandle {
        addr,
        live,
        metrics,
        store,
        notifier,
        shutdown,
        task,
    })
}

/// Store failures are counted and logged here, once each; a missing
/// baseline or run is the caller's answer, not a failure.
fn store_error_handler(
    health: Arc<crate::metrics::health::HealthMetrics>,
    file: std::path::PathBuf,
) -> crate::store::async_store::ErrorHandler {
    Arc::new(move |e: &StoreError| {
        if e.is_failure() {
            health.store_error(&file, e);
        }
    })
}

fn spawn_http(parts: &Parts, listener: TcpListener) -> JoinHandle<()> {
    let exporter = &parts.live.current().exporter;
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
    let requests = crate::http::RequestLimits {
        max_requests: exporter.max_requests,
        timeout: exporter.request_timeout,
    };
    let app = crate::http::router(
        crate::http::AppState {
            live: parts.live.clone(),
            metrics: parts.metrics.clone(),
            store: parts.store.clone(),
            board: parts.board.clone(),
            ready: parts.ready.clone(),
            password_checks: {
                let health = parts.metrics.health.clone();
                Arc::new(crate::http::password_checks::PasswordChecks::new(
                    parts.shutdown.clone(),
                    move || health.password_checked(),
                ))
            },
            clock: parts.clock,
        },
        requests,
    );
    let (shutdown, health) = (parts.shutdown.clone(), parts.metrics.health.clone());
    let live = parts.live.clone();
    tokio::spawn(async move {
        crate::http::serve::serve(
            listener,
            app,
            limits,
            shutdown,
            move |e| health.accept_error(e),
            // Read per connection, so a reload that changes the web
            // configuration (a renewed certificate) applies to the next one.
            move || live.current().exporter.web.as_ref()?.get().tls().cloned(),
        )
        .await;
    })
}

impl Parts {
    /// What a reload changes beyond the configuration itself: the series
    /// and policies declared from it. Workers re-plan on the generation.
    fn follow_reload(&self, result: Result<&Config, &ReloadError>) {
        match result {
            Ok(fresh) => {
                self.metrics
                    .set_stale_series_grace(fresh.exporter.stale_series_after);
                self.metrics.reset_pairs();
                declare_and_restore(self, fresh);
                if let Err(e) = self.verdicts.redeclare(fresh) {
                    self.store.report(&e);
                }
                self.metrics.health.config_loaded(Ok(()), self.clock.now());
                tracing::info!("configuration reloaded");
            }
            Err(e) => self.metrics.health.config_loaded(Err(e), self.clock.now()),
        }
    }
}

/// Declares every configured series and puts the last stored run of each
/// configured pair back on `/metrics`. Blocking (reads the store).
fn declare_and_restore(parts: &Parts, config: &Config) {
    let latest = parts.store.blocking().latest_runs().unwrap_or_else(|e| {
        parts.store.report(&e);
        Vec::new()
    });
    for t in &config.targets {
        parts.metrics.schedule.declare_target(&t.name);
        let condition = parts.board.identity_condition(&t.name);
        parts.metrics.server.set_identity_unstable(
            &t.name,
            condition
                .as_ref()
                .map(crate::state::IdentityCondition::reason),
        );
        let in_rollout = parts.board.rollout(&t.name).is_some();
        parts.metrics.fleet.declare(&t.name, in_rollout);
        let seen = latest
            .iter()
            .find(|r| r.target == t.name && r.summary.completed > 0);
        if let Some(run) = seen {
            parts.board.remember_model(&t.name, &run.model);
        }
        let model = parts.board.known_model(&t.name, t.model.as_deref());
        for s in &t.scenarios {
            // Outcome counters wait for the model: declared under
            // "unknown" they would stay beside the real model's for the
            // stale-series grace, a dozen series per pair for nothing.
            parts
                .metrics
                .runs
                .declare_pair(&t.name, model.as_deref(), s);
            if let Some(scenario) = config.scenario(s) {
                let interval = config.schedule_for(t, scenario).interval_seconds();
                parts
                    .metrics
                    .schedule
                    .declare_pair(&t.name, s, interval, &scenario.slos);
            }
            if let Some(run) = latest
                .iter()
                .find(|r| r.target == t.name && &r.scenario == s)
            {
                parts.metrics.runs.record_run(run, false);
            }
        }
    }
    let names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
    parts.board.keep_targets(&names);
    let objectives: Vec<&str> = config.slos.iter().map(|o| o.name.as_str()).collect();
    parts.metrics.slos.declare(&objectives);
}

/// A target's workers, telemetry loop and filing task, and the token that
/// stops them.
struct TargetTasks {
    stop: CancellationToken,
    handles: Vec<JoinHandle<()>>,
}

/// Ends once a removed target's tasks have all ended (its runs in flight
/// finished and filed).
type Drained = JoinHandle<()>;

impl TargetTasks {
    /// Stops the tasks, after `earlier` (the same target's tasks retired
    /// before); the handle ends once they have all ended.
    fn retire(self, earlier: Option<Drained>) -> Drained {
        self.stop.cancel();
        let handles = self.handles;
        tokio::spawn(async move {
            if let Some(e) = earlier {
                let _ = e.await;
            }
            for h in handles {
                let _ = h.await;
            }
        })
    }
}

impl Parts {
    /// Stops a removed target's tasks. Once they have ended (its run in
    /// flight filed), every series labelled with the target and its row on
    /// the status page are removed, unless a reload has configured the
    /// target again: nothing writes them any more.
    fn retire_target(&self, name: &str, tasks: TargetTasks, earlier: Option<Drained>) -> Drained {
        let drained = tasks.retire(earlier);
        let (live, metrics, board) = (self.live.clone(), self.metrics.clone(), self.board.clone());
        let name = name.to_owned();
        tokio::spawn(async move {
            let _ = drained.await;
            let forget = move || {
                live.between_reloads(|config| {
                    if config.targets.iter().any(|t| t.name == name) {
                        return;
                    }
                    let removed = metrics.forget_target(&name);
                    board.forget_target(&name);
                    tracing::info!(target = %name, series = removed, "removed target: its tasks ended and its series are gone");
                })
            };
            let _ = tokio::task::spawn_blocking(forget).await;
        })
    }

    /// Starts a target's tasks once `after` (the same target's previous
    /// tasks, when a reload removed and re-added it) is done: one worker
    /// per (target, replica) ever, so the old run in flight and the new
    /// schedule never probe the server at once.
    fn start_target(&self, name: &str, after: Option<Drained>) -> TargetTasks {
        let stop = self.shutdown.child_token();
        let (filer, filing) = filing::spawn(filing::Filing {
            live: self.live.clone(),
            metrics: self.metrics.clone(),
            board: self.board.clone(),
            store: self.store.clone(),
            verdicts: self.verdicts.clone(),
        });
        let fleet = Fleet::new(
            WorkerParts {
                live: self.live.clone(),
                runs: RunContext {
                    http: self.http.clone(),
                    metrics: self.metrics.clone(),
                    board: self.board.clone(),
                    filer,
                    verdicts: self.verdicts.clone(),
                    shutdown: self.shutdown.clone(),
                },
                metrics: self.metrics.clone(),
                board: self.board.clone(),
                upgrades: self.verdicts.upgrades.clone(),
                clock: self.clock,
            },
            name,
        );
        let telemetry = TelemetryLoop {
            live: self.live.clone(),
            http: self.http.clone(),
            metrics: self.metrics.clone(),
            board: self.board.clone(),
            verdicts: self.verdicts.clone(),
        };
        let fleet_stop = stop.clone();
        let fleet = async move {
            if let Some(previous) = after {
                let _ = previous.await;
            }
            fleet.run(fleet_stop).await;
        };
        TargetTasks {
            handles: vec![
                tokio::spawn(fleet),
                tokio::spawn(telemetry.run(name.to_owned(), stop.clone())),
                // Last: it ends once the workers have handed over their
                // last runs.
                filing,
            ],
            stop,
        }
    }
}

/// Keeps one worker and one telemetry loop per configured target,
/// following reloads, until shutdown; then drains them and flushes the
/// store.
async fn supervise(
    parts: Parts,
    http: JoinHandle<()>,
    notifications: JoinHandle<()>,
    claim: WriterLock,
) -> Result<(), DaemonError> {
    let mut tasks: HashMap<String, TargetTasks> = HashMap::new();
    // Removed targets whose runs in flight are still finishing.
    let mut draining: HashMap<String, Drained> = HashMap::new();
    let mut generation = parts.live.subscribe();
    let shutdown = parts.shutdown.clone();
    let host_gpus =
        background::spawn_host_gpus(parts.live.clone(), parts.metrics.clone(), shutdown.clone());
    let retention = background::spawn_retention(
        parts.live.clone(),
        parts.store.clone(),
        shutdown.clone(),
        parts.clock,
    );
    let store_check =
        background::spawn_store_check(parts.store.clone(), parts.metrics.clone(), shutdown.clone());
    let heap_trim = heap::spawn_trim(shutdown.clone());
    loop {
        let config = parts.live.current();
        let names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
        // A removed target's probe in flight finishes; then it stops.
        for name in tasks.keys().cloned().collect::<Vec<_>>() {
            if !names.contains(&name)
                && let Some(t) = tasks.remove(&name)
            {
                let drained = parts.retire_target(&name, t, draining.remove(&name));
                draining.insert(name, drained);
            }
        }
        draining.retain(|_, d| !d.is_finished());
        for name in names {
            if !tasks.contains_key(&name) {
                let after = draining.remove(&name);
                tasks.insert(name.clone(), parts.start_target(&name, after));
            }
        }
        parts.ready.store(true, Ordering::Release);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = generation.changed() => if changed.is_err() { break },
        }
    }
    tracing::info!("shutting down: no new runs; probes in flight may finish");
    parts.ready.store(false, Ordering::Release);
    // Probes in flight have the grace, and so has a write another process
    // holds the store against; waiting after it would keep the daemon past
    // its supervisor's grace.
    let grace = parts.live.current().scheduler.shutdown_grace;
    let store = parts.store.clone();
    let waits_end = tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        store.stop_waiting();
    });
    for (_, t) in tasks {
        for h in t.handles {
            let _ = h.await;
        }
    }
    for (_, d) in draining {
        let _ = d.await;
    }
    waits_end.abort();
    host_gpus.abort();
    retention.abort();
    store_check.abort();
    heap_trim.abort();
    // Every run has been judged: what waits to be said goes out now.
    parts.verdicts.notifier.finish();
    let _ = notifications.await;
    let _ = http.await;
    // A request that outlived the HTTP drain (a pin) is waited for; any
    // later call is refused.
    let flushed = parts.store.close(|s| s.checkpoint()).await;
    // Released only now: every writer has ended, so the next daemon on
    // this store starts on everything this one filed.
    drop(claim);
    flushed?;
    tracing::info!("stopped");
    Ok(())
}
