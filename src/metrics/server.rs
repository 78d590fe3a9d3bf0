//! What the watcher reads from each target's server: health, build and
//! model, load from vLLM's `/metrics`, version changes, and failed reads.
//! Writes that change nothing leave the encoded page alone.

use std::sync::Arc;

use super::MetricsError;
use super::page::{Counters, Gauges, LastWritten, Page, TargetSeries};
use super::stale::ModelSeries;
use crate::records::{ServerIdentity, ServerLoad};

pub struct ServerMetrics {
    up: Gauges,
    info: TargetSeries,
    running: Gauges,
    waiting: Gauges,
    kv_cache: Gauges,
    prefix_hit: Gauges,
    preemptions: Gauges,
    scrape_ok: Gauges,
    version_change_ts: Gauges,
    telemetry_errors_total: Counters,
    last_up: LastWritten<bool>,
    last_info: LastWritten<(String, ServerIdentity)>,
    last_load: LastWritten<Option<ServerLoad>>,
    models: Arc<ModelSeries>,
}

impl ServerMetrics {
    pub fn new(page: &Page, models: Arc<ModelSeries>) -> Result<Self, MetricsError> {
        let per_target = |name: &str, help: &str| page.gauges(name, help, &["target"]);
        let m = ServerMetrics {
            up: per_target(
                "sentinel_target_up",
                "1 if the target answered its last health check.",
            )?,
            info: TargetSeries::new(page.gauges(
                "sentinel_server_info",
                "The server's version and model; value 1.",
                &["target", "version", "model", "max_model_len"],
            )?),
            running: per_target(
                "sentinel_server_requests_running",
                "Requests the server is running (vLLM num_requests_running).",
            )?,
            waiting: per_target(
                "sentinel_server_requests_waiting",
                "Requests waiting on the server (vLLM num_requests_waiting).",
            )?,
            kv_cache: per_target(
                "sentinel_server_kv_cache_usage_ratio",
                "KV cache usage of the server, 0-1.",
            )?,
            prefix_hit: per_target(
                "sentinel_server_prefix_cache_hit_ratio",
                "Prefix cache hits / queries on the server since it started.",
            )?,
            preemptions: per_target(
                "sentinel_server_preemptions",
                "The server's cumulative preemption count (vLLM num_preemptions_total).",
            )?,
            scrape_ok: per_target(
                "sentinel_server_scrape_success",
                "1 if the last read of the server's /metrics worked.",
            )?,
            version_change_ts: per_target(
                "sentinel_server_version_change_timestamp_seconds",
                "When the target's server build (version, model root or fingerprint) last changed.",
            )?,
            telemetry_errors_total: page.counters(
                "sentinel_telemetry_errors_total",
                "Failed reads of server or GPU telemetry.",
                &["target", "source"],
            )?,
            last_up: LastWritten::default(),
            last_info: LastWritten::default(),
            last_load: LastWritten::default(),
            models,
        };
        m.models.add(m.info.gauges().family());
        Ok(m)
    }

    pub fn set_target_up(&self, target: &str, up: bool) {
        if self.last_up.differs(target, up) {
            self.up.set(&[target], if up { 1.0 } else { 0.0 });
        }
    }

    /// Replaces the target's info series (one per target).
    pub fn set_server_info(&self, target: &str, model: &str, id: &ServerIdentity) {
        self.models.note(target, model);
        if !self
            .last_info
            .differs(target, (model.to_owned(), id.clone()))
        {
            return;
        }
        self.info.clear(target);
        let max_len = id.max_model_len.map(|v| v.to_string()).unwrap_or_default();
        let version = id.version.as_deref().unwrap_or("unknown");
        self.info.add(&[target, version, model, &max_len], 1.0);
    }

    pub fn set_server_load(&self, target: &str, load: Option<&ServerLoad>) {
        if !self.last_load.differs(target, load.copied()) {
            return;
        }
        let Some(load) = load else {
            self.scrape_ok.set(&[target], 0.0);
            return;
        };
        self.scrape_ok.set(&[target], 1.0);
        for (gauges, value) in [
            (&self.running, load.running),
            (&self.waiting, load.waiting),
            (&self.kv_cache, load.kv_cache_usage),
            (&self.prefix_hit, load.prefix_cache_hit_ratio),
            (&self.preemptions, load.preemptions_total),
        ] {
            if let Some(v) = value {
                gauges.set(&[target], v);
            }
        }
    }

    pub fn set_version_change(&self, target: &str, at: chrono::DateTime<chrono::Utc>) {
        self.version_change_ts
            .set(&[target], at.timestamp_millis() as f64 / 1000.0);
    }

    /// A failed telemetry read, counted and logged (at debug: the counter
    /// is what alerts read, and a down server fails every interval).
    pub fn telemetry_error(
        &self,
        target: &str,
        source: &'static str,
        error: &dyn std::fmt::Display,
    ) {
        tracing::debug!(target, source, error = %error, "telemetry read failed");
        self.telemetry_errors_total.inc(&[target, source]);
    }

    /// Forgets health and build series before a reload declares targets
    /// again; the next reading sets them again.
    pub fn reset(&self) {
        self.up.reset();
        self.info.reset();
        self.last_up.clear();
        self.last_info.clear();
    }
}
