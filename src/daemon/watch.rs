//! Background loops beside the probes: per-target health, identity, load
//! and DCGM GPU counters on the scrape interval; this host's GPUs through
//! NVML; and the store's retention.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::run::ServerLoad;
use crate::telemetry::TargetWatch;
use crate::telemetry::nvml::LocalGpus;

/// Reads one target's telemetry every scrape interval until `stop`.
pub async fn watch_target(shared: Arc<Shared>, name: String, stop: CancellationToken) {
    loop {
        let config = shared.config();
        let Some(target) = config.target(&name).cloned() else {
            return;
        };
        // A key that cannot be read now is read again next interval.
        let key = target
            .api_key
            .as_ref()
            .and_then(|s| s.load(false).ok())
            .flatten();
        match TargetWatch::new(
            shared.http.clone(),
            target,
            key,
            config.telemetry.scrape_timeout,
        ) {
            Ok(watch) => read_all(&shared, &name, &watch).await,
            Err(e) => tracing::warn!(target = %name, "telemetry: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(config.telemetry.scrape_interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

async fn read_all(shared: &Arc<Shared>, name: &str, watch: &TargetWatch) {
    let health = watch.health().await;
    let identity = match health {
        Some(false) => None,
        _ => Some(watch.identity().await),
    };
    let up = health.unwrap_or_else(|| identity.as_ref().is_some_and(Result::is_ok));
    shared.set_up(name, up);
    match identity {
        Some(Ok((model, identity))) => {
            super::verdicts::observe_identity(shared, name, &model, &identity).await;
            shared.set_identity(name, &model, identity);
        }
        Some(Err(e)) => tracing::debug!(target = %name, "identity: {e}"),
        None => {}
    }
    read_load(shared, name, watch).await;
    if let Some(result) = watch.gpus().await {
        match result {
            Ok(gpus) => shared.metrics.set_gpus(name, &gpus),
            Err(e) => {
                tracing::debug!(target = %name, "DCGM: {e}");
                shared.metrics.telemetry_error(name, "dcgm");
                shared.metrics.set_gpus(name, &[]);
            }
        }
    }
}

/// The server's load from its `/metrics`, exported as read; `None` when not
/// configured or unreadable (counted).
pub async fn read_load(shared: &Shared, target: &str, watch: &TargetWatch) -> Option<ServerLoad> {
    match watch.load().await? {
        Ok(load) => {
            shared.metrics.set_server_load(target, Some(&load));
            Some(load)
        }
        Err(e) => {
            tracing::debug!(target, "server metrics: {e}");
            shared.metrics.telemetry_error(target, "vllm");
            shared.metrics.set_server_load(target, None);
            None
        }
    }
}

/// This host's GPUs through NVML, under `target="local"`, when enabled and
/// a driver is present.
pub fn spawn_host_gpus(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !shared.config().telemetry.nvml {
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
                shared.metrics.set_gpus("local", &readings);
            }
            tokio::select! {
                _ = tokio::time::sleep(shared.config().telemetry.scrape_interval) => {}
                _ = shared.shutdown.cancelled() => return,
            }
        }
    })
}

/// How often the store's file is checked for being deleted or replaced.
const STORE_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Checks that the store's file is still the one opened; when it is not,
/// says so loudly (every minute, an error in the log and on `/metrics`),
/// since every run stored from then on is lost at the next restart.
pub fn spawn_store_check(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_said: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(STORE_CHECK_INTERVAL) => {}
                _ = shared.shutdown.cancelled() => return,
            }
            match shared.store.check_file() {
                Ok(()) => {
                    if last_said.take().is_some() {
                        shared.metrics.set_store_file_missing(false);
                    }
                }
                Err(reason) => {
                    if last_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        shared.metrics.store_error();
                        shared.metrics.set_store_file_missing(true);
                        tracing::error!(
                            "the store's file is gone: {reason}; runs stored from now on are lost \
at the next restart; restart the daemon to open a new store (or restore the file)"
                        );
                        last_said = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    })
}

/// Deletes runs past the retention period every hour.
pub fn spawn_retention(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
                _ = shared.shutdown.cancelled() => return,
            }
            let store = shared.store.clone();
            let retention = shared.config().store.retention;
            match tokio::task::spawn_blocking(move || store.prune(chrono::Utc::now(), retention))
                .await
            {
                Ok(Ok(n)) if n > 0 => tracing::info!(runs = n, "deleted runs past retention"),
                Ok(Err(e)) => tracing::error!("retention: {e}"),
                _ => {}
            }
        }
    })
}
