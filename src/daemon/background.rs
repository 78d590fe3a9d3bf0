//! Background loops beside the probes: per-target health, identity, load
//! and DCGM GPU counters on the scrape interval; this host's GPUs through
//! NVML; the store file's presence; and the store's retention.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::verdicts::Verdicts;
use crate::config::live::LiveConfig;
use crate::metrics::Metrics;
use crate::state::TargetStates;
use crate::store::AsyncStore;
use crate::telemetry::nvml::LocalGpus;
use crate::telemetry::{TargetWatch, TelemetryError};
use crate::vocabulary::records::ServerLoad;

/// What a target's telemetry loop reads with and writes to.
#[derive(Clone)]
pub struct TelemetryLoop {
    pub live: Arc<LiveConfig>,
    /// One HTTP client (one connection pool) for every watcher and load
    /// read; each request carries its own timeout.
    pub http: reqwest::Client,
    pub metrics: Arc<Metrics>,
    pub board: Arc<TargetStates>,
    pub verdicts: Verdicts,
}

impl TelemetryLoop {
    /// Reads one target's telemetry every scrape interval until `stop`.
    pub async fn run(self, name: String, stop: CancellationToken) {
        loop {
            let config = self.live.current();
            let Some(target) = config.target(&name).cloned() else {
                return;
            };
            // A key that cannot be read now is read again next interval.
            let key = target
                .api_key
                .as_ref()
                .and_then(|s| s.load(false).ok())
                .flatten();
            // With replicas probed, their runs say which builds serve; the
            // service's /version is one replica's, picked by the balancer.
            let files_builds = !target.probe_mode().replicas();
            match TargetWatch::new(
                self.http.clone(),
                target,
                key,
                config.telemetry.scrape_timeout,
            ) {
                Ok(watch) => {
                    let policy = files_builds.then_some(&config.verdict_policy);
                    self.read_all(&name, &watch, policy).await
                }
                Err(e) => tracing::warn!(target = %name, error = %e, "telemetry"),
            }
            tokio::select! {
                _ = tokio::time::sleep(config.telemetry.scrape_interval) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Health, identity, load and GPUs; the identity is filed as a build
    /// under `policy` when given.
    async fn read_all(
        &self,
        name: &str,
        watch: &TargetWatch,
        policy: Option<&crate::verdict::policy::VerdictPolicy>,
    ) {
        self.board.keep_telemetry(name, &watch.sources());
        let health = watch.health().await;
        let identity = match health {
            Some(false) => None,
            _ => Some(watch.identity().await),
        };
        let up = health.unwrap_or_else(|| identity.as_ref().is_some_and(Result::is_ok));
        self.metrics.server.set_target_up(name, up);
        self.board.set_up(name, up);
        let mut model = None;
        match identity {
            Some(Ok(server)) => {
                if let Some(policy) = policy {
                    self.verdicts
                        .observe_identity(name, &server.model, &server.identity, policy)
                        .await;
                }
                self.metrics.server.set_server_info(name, &server);
                self.board.set_identity(name, &server);
                model = Some(server.model);
            }
            Some(Err(e)) => tracing::debug!(target = %name, error = %e, "identity"),
            None => {}
        }
        read_load(&self.metrics, &self.board, name, watch, model.as_deref()).await;
        if let Some(result) = watch.gpus().await {
            let gpus = note_source(&self.metrics, &self.board, name, "dcgm", result);
            self.metrics.gpus.set_gpus(name, &gpus.unwrap_or_default());
        }
    }
}

/// The server's load from its `/metrics`, exported as read (counting
/// `model`'s series); `None` when not configured or unreadable.
pub async fn read_load(
    metrics: &Metrics,
    board: &TargetStates,
    target: &str,
    watch: &TargetWatch,
    model: Option<&str>,
) -> Option<ServerLoad> {
    let result = watch.load(model).await?;
    let load = note_source(metrics, board, target, "server", result);
    metrics.server.set_server_load(target, load.as_ref());
    load
}

/// Notes how a read of a telemetry source went, on `/metrics` and the
/// status page. A source that starts failing is said once, as a warning
/// with the reason; its recovery once, as news; failures in between only
/// at debug level (a down server fails every interval).
fn note_source<T>(
    metrics: &Metrics,
    board: &TargetStates,
    target: &str,
    source: &str,
    result: Result<T, TelemetryError>,
) -> Option<T> {
    metrics
        .server
        .telemetry_read(target, source, result.is_ok());
    let failure = result.as_ref().err().map(ToString::to_string);
    let before = board.set_telemetry(target, source, failure.clone());
    match (before, failure) {
        (Some(Some(_)), None) => {
            tracing::info!(target, source, "telemetry source reads again")
        }
        (Some(Some(_)), Some(reason)) => {
            tracing::debug!(target, source, reason, "telemetry source still failing")
        }
        (_, Some(reason)) => tracing::warn!(target, source, reason, "telemetry source failing"),
        (_, None) => {}
    }
    result.ok()
}

/// This host's GPUs through NVML, under `target="local"`, when enabled and
/// a driver is present.
pub fn spawn_host_gpus(
    live: Arc<LiveConfig>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !live.current().telemetry.nvml {
            return;
        }
        let Ok(gpus) = tokio::task::spawn_blocking(LocalGpus::open).await else {
            return;
        };
        if !gpus.available() {
            return;
        }
        let gpus = Arc::new(gpus);
        loop {
            let g = gpus.clone();
            if let Ok(readings) = tokio::task::spawn_blocking(move || g.read()).await {
                metrics
                    .gpus
                    .set_gpus(crate::config::targets::HOST_GPUS, &readings);
            }
            tokio::select! {
                _ = tokio::time::sleep(live.current().telemetry.scrape_interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    })
}

/// How often the store's file is checked for being deleted or replaced.
const STORE_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// How often a missing store file is said again.
const STORE_MISSING_REMINDER: Duration = Duration::from_secs(60);

/// Checks that the store's file is still the one opened; when it is not,
/// says so loudly (every minute, an error in the log and on `/metrics`),
/// since every run stored from then on is lost at the next restart.
pub fn spawn_store_check(
    store: AsyncStore,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_said: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(STORE_CHECK_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            match store.blocking().check_file() {
                Ok(()) => {
                    if last_said.take().is_some() {
                        metrics.health.store_file_back();
                    }
                }
                Err(reason) => {
                    if last_said.is_none_or(|t| t.elapsed() >= STORE_MISSING_REMINDER) {
                        metrics.health.store_file_missing(&reason);
                        last_said = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    })
}

/// How often runs past the retention period are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(3600);

/// Deletes runs past the retention period every hour.
pub fn spawn_retention(
    live: Arc<LiveConfig>,
    store: AsyncStore,
    shutdown: CancellationToken,
    clock: crate::clock::Clock,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RETENTION_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            let retention = live.current().store.retention;
            let now = clock.now();
            if let Some(n) = store.call_or_none(move |s| s.prune(now, retention)).await
                && n > 0
            {
                tracing::info!(runs = n, "deleted runs past retention");
            }
        }
    })
}
