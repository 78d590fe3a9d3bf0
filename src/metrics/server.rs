//! What the watcher reads from each target's server: health, build, kind
//! and model, load from the server's `/metrics`, version changes, and
//! whether each telemetry source reads.
//! Writes that change nothing leave the encoded page alone.

use std::sync::Arc;

use super::MetricsError;
use super::page::{Counters, Gauges, Page};
use super::stale::ModelSeries;
use crate::telemetry::Identified;
use crate::vocabulary::records::ServerLoad;

pub struct ServerMetrics {
    up: Gauges,
    info: Gauges,
    running: Gauges,
    waiting: Gauges,
    kv_cache: Gauges,
    prefix_hit: Gauges,
    preemptions: Gauges,
    version_change_ts: Gauges,
    telemetry_errors_total: Counters,
    telemetry_up: Gauges,
    identity_unstable: Gauges,
    models: Arc<ModelSeries>,
}

/// Why a target's builds are named by a stable identity instead of what
/// its server says (the `reason` label of `sentinel_build_identity_unstable`).
pub const IDENTITY_REASONS: [&str; 2] = ["fingerprint_churn", "version_disagrees"];

impl ServerMetrics {
    pub fn new(page: &Page, models: Arc<ModelSeries>) -> Result<Self, MetricsError> {
        let per_target = |name: &str, help: &str| page.gauges(name, help, &["target"]);
        let m = ServerMetrics {
            up: per_target(
                "sentinel_target_up",
                "1 if the target answered its last health check.",
            )?,
            info: page.gauges(
                "sentinel_server_info",
                "The server's kind (vllm, sglang, openai), version and model; value 1.",
                &["target", "kind", "version", "model", "max_model_len"],
            )?,
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
            version_change_ts: per_target(
                "sentinel_server_version_change_timestamp_seconds",
                "When the target's server build (version, model root or fingerprint) last changed.",
            )?,
            telemetry_errors_total: page.counters(
                "sentinel_telemetry_errors_total",
                "Failed reads of server or GPU telemetry.",
                &["target", "source"],
            )?,
            telemetry_up: page.gauges(
                "sentinel_telemetry_up",
                "1 if the last read of the source (server: its /metrics; dcgm: the DCGM exporter) gave the families read.",
                &["target", "source"],
            )?,
            identity_unstable: page.gauges(
                "sentinel_build_identity_unstable",
                "1 while the target's server identity is not stable enough to name builds by: fingerprint_churn (system_fingerprint new on nearly every request, or more new builds in an hour than detector.max_new_builds_per_hour), version_disagrees (/version names another version than the stream's fingerprints). Builds are then named by the stable part.",
                &["target", "reason"],
            )?,
            models,
        };
        m.models.add(&m.info);
        Ok(m)
    }

    pub fn set_target_up(&self, target: &str, up: bool) {
        self.up.set(&[target], if up { 1.0 } else { 0.0 });
    }

    /// Replaces the target's info series (one per target).
    pub fn set_server_info(&self, target: &str, server: &Identified) {
        let (model, kind, id) = (server.model.as_str(), server.kind, &server.identity);
        self.models.note(target, model);
        let max_len = id.max_model_len.map(|v| v.to_string()).unwrap_or_default();
        let version = id.version.as_deref().unwrap_or("unknown");
        let labels = [target, kind.as_str(), version, model, &max_len];
        self.info.replace_target(target, &[(&labels, 1.0)]);
    }

    /// The server's load as last read; `None` (unreadable) removes the
    /// series rather than leave old values standing.
    pub fn set_server_load(&self, target: &str, load: Option<&ServerLoad>) {
        let load = load.copied().unwrap_or_default();
        for (gauges, value) in [
            (&self.running, load.running),
            (&self.waiting, load.waiting),
            (&self.kv_cache, load.kv_cache_usage),
            (&self.prefix_hit, load.prefix_cache_hit_ratio),
            (&self.preemptions, load.preemptions_total),
        ] {
            match value {
                Some(v) => gauges.set(&[target], v),
                None => gauges.remove(&[target]),
            }
        }
    }

    /// Which of [`IDENTITY_REASONS`] holds for the target now, if any.
    pub fn set_identity_unstable(&self, target: &str, reason: Option<&str>) {
        let rows: Vec<([&str; 2], f64)> = IDENTITY_REASONS
            .iter()
            .map(|r| ([target, *r], if Some(*r) == reason { 1.0 } else { 0.0 }))
            .collect();
        let rows: Vec<(&[&str], f64)> = rows.iter().map(|(l, v)| (&l[..], *v)).collect();
        self.identity_unstable.replace_target(target, &rows);
    }

    pub fn set_version_change(&self, target: &str, at: chrono::DateTime<chrono::Utc>) {
        self.version_change_ts
            .set(&[target], at.timestamp_millis() as f64 / 1000.0);
    }

    /// How a telemetry read went: the source's up gauge, and failures
    /// counted.
    pub fn telemetry_read(&self, target: &str, source: &str, worked: bool) {
        self.telemetry_up
            .set(&[target, source], if worked { 1.0 } else { 0.0 });
        if !worked {
            self.telemetry_errors_total.inc(&[target, source]);
        }
    }

    /// Forgets health and build series before a reload declares targets
    /// again; the next reading sets them again.
    pub fn reset(&self) {
        self.up.reset();
        self.info.reset();
        self.telemetry_up.reset();
    }
}
