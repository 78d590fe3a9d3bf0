//! Every metric the daemon exports, as one struct on an explicit registry.
//! Probes and watchers write through the methods here; `/metrics` encodes
//! the registry. Labels stay bounded: target, model, scenario and fixed
//! value sets (outcome, metric, stat, gpu).

pub mod alerting;
pub mod exporter;
pub mod stale;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::client::Outcome;
use crate::run::{RunRecord, ServerIdentity, ServerLoad};

/// Bucket bounds from 0.5 ms to 700 s: 1-2-3-5-7 per decade, fine enough
/// for millisecond ITL and minutes-long TTFT in one family.
pub fn latency_buckets() -> Vec<f64> {
    let mut b = vec![0.0005];
    for exp in -3..=2 {
        for m in [1.0, 2.0, 3.0, 5.0, 7.0] {
            b.push(m * 10f64.powi(exp));
        }
    }
    b
}

/// GPU counters from NVML or a DCGM exporter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuReading {
    pub gpu: String,
    pub uuid: String,
    pub name: String,
    pub utilization_ratio: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub power_watts: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
}

struct ChangeGuard<'a>(&'a AtomicU64);

impl Drop for ChangeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Label sets set per (family name, target).
type TrackedSeries = std::collections::HashMap<(String, String), Vec<Vec<String>>>;

pub struct Metrics {
    pub registry: Registry,
    ttft: HistogramVec,
    tpot: HistogramVec,
    itl: HistogramVec,
    e2el: HistogramVec,
    run_latency: GaugeVec,
    run_output_tps: GaugeVec,
    run_rps: GaugeVec,
    run_goodput: GaugeVec,
    run_success: GaugeVec,
    run_last_ts: GaugeVec,
    run_duration: GaugeVec,
    run_input_tokens: GaugeVec,
    runs_total: IntCounterVec,
    requests_total: IntCounterVec,
    skipped_total: IntCounterVec,
    delayed_total: IntCounterVec,
    aborted_total: IntCounterVec,
    target_up: GaugeVec,
    target_backoff: GaugeVec,
    server_info: GaugeVec,
    server_running: GaugeVec,
    server_waiting: GaugeVec,
    server_kv: GaugeVec,
    server_prefix_hit: GaugeVec,
    server_preemptions: GaugeVec,
    server_scrape_ok: GaugeVec,
    gpu_util: GaugeVec,
    gpu_mem_used: GaugeVec,
    gpu_mem_total: GaugeVec,
    gpu_power: GaugeVec,
    gpu_temp: GaugeVec,
    gpu_sm_clock: GaugeVec,
    config_reload_ok: IntGauge,
    config_reload_ts: prometheus::Gauge,
    scrape_errors_total: IntCounterVec,
    store_errors_total: prometheus::IntCounter,
    alerting: alerting::AlertingMetrics,
    exporter: exporter::ExporterMetrics,
    /// Bumped by every change; the encoded page is reused until it moves.
    changes: AtomicU64,
    /// Last telemetry written per target, to skip writes that change nothing.
    last_up: Mutex<HashMap<String, bool>>,
    last_info: Mutex<HashMap<String, (String, ServerIdentity)>>,
    last_load: Mutex<HashMap<String, Option<ServerLoad>>>,
    last_gpus: Mutex<HashMap<String, Vec<GpuReading>>>,
    encoded: std::sync::Mutex<(u64, String)>,
    /// Label sets set per (family, target), for replacement.
    tracked: std::sync::Mutex<TrackedSeries>,
    model_series: stale::ModelSeries,
}

/// A family that could not be registered. The cause is in the message,
/// not chained, so it is printed once.
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct MetricsError(prometheus::Error);

impl From<prometheus::Error> for MetricsError {
    fn from(e: prometheus::Error) -> Self {
        MetricsError(e)
    }
}

const PAIR: &[&str] = &["target", "model", "scenario"];

/// A gauge family registered on `registry`.
fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<GaugeVec, MetricsError> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

/// A counter family registered on `registry`.
fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}
const GPU: &[&str] = &["target", "gpu", "uuid", "name"];

impl Metrics {
    pub fn new() -> Result<Metrics, MetricsError> {
        let registry = Registry::new();
        let histogram = |name: &str, help: &str| -> Result<HistogramVec, MetricsError> {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(latency_buckets()),
                PAIR,
            )?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let gauge =
            |name: &str, help: &str, labels: &[&str]| gauge_vec(&registry, name, help, labels);
        let counter =
            |name: &str, help: &str, labels: &[&str]| counter_vec(&registry, name, help, labels);
        let with = |l: &[&'static str], extra: &[&'static str]| -> Vec<&'static str> {
            l.iter().chain(extra).copied().collect()
        };
        let build_info = GaugeVec::new(
            Opts::new(
                "sentinel_build_info",
                "Build of this vllm-sentinel; value 1.",
            ),
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1.0);
        registry.register(Box::new(build_info))?;
        let config_reload_ok = IntGauge::new(
            "sentinel_config_last_reload_successful",
            "1 if the last configuration load or reload succeeded.",
        )?;
        config_reload_ok.set(1);
        registry.register(Box::new(config_reload_ok.clone()))?;
        let config_reload_ts = prometheus::Gauge::new(
            "sentinel_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully.",
        )?;
        registry.register(Box::new(config_reload_ts.clone()))?;
        let store_errors_total = prometheus::IntCounter::new(
            "sentinel_store_errors_total",
            "Store operations that failed (the run stays on /metrics).",
        )?;
        registry.register(Box::new(store_errors_total.clone()))?;
        let alerting = alerting::AlertingMetrics::new(&registry)?;
        let exporter = exporter::ExporterMetrics::new(&registry)?;
        let mut metrics = Metrics {
            alerting,
            exporter,
            ttft: histogram(
                "sentinel_ttft_seconds",
                "Time to first token per probe request (vLLM's definition).",
            )?,
            tpot: histogram(
                "sentinel_tpot_seconds",
                "Time per output token after the first, per probe request.",
            )?,
            itl: histogram(
                "sentinel_itl_seconds",
                "Gaps between successive streamed chunks of probe requests.",
            )?,
            e2el: histogram(
                "sentinel_e2e_latency_seconds",
                "Probe request start to its last streamed chunk.",
            )?,
            run_latency: gauge(
                "sentinel_run_latency_seconds",
                "Exact statistics of the last run, from its raw samples.",
                &with(PAIR, &["metric", "stat"]),
            )?,
            run_output_tps: gauge(
                "sentinel_run_output_tokens_per_second",
                "Output token throughput of the last run.",
                PAIR,
            )?,
            run_rps: gauge(
                "sentinel_run_requests_per_second",
                "Completed requests per second in the last run.",
                PAIR,
            )?,
            run_goodput: gauge(
                "sentinel_run_goodput_ratio",
                "Share of the last run's requests meeting every SLO of the scenario.",
                PAIR,
            )?,
            run_success: gauge(
                "sentinel_run_success",
                "1 if every request of the last run succeeded.",
                PAIR,
            )?,
            run_last_ts: gauge(
                "sentinel_run_last_timestamp_seconds",
                "When the last run started.",
                PAIR,
            )?,
            run_duration: gauge(
                "sentinel_run_duration_seconds",
                "How long the last run took.",
                PAIR,
            )?,
            run_input_tokens: gauge(
                "sentinel_run_input_tokens_mean",
                "Mean prompt tokens per request in the last run, as the server counted them.",
                PAIR,
            )?,
            runs_total: counter(
                "sentinel_runs_total",
                "Runs by how they ended.",
                &["target", "scenario", "outcome"],
            )?,
            requests_total: counter(
                "sentinel_requests_total",
                "Probe requests by outcome.",
                &with(PAIR, &["outcome"]),
            )?,
            skipped_total: counter(
                "sentinel_scheduler_skipped_runs_total",
                "Scheduled runs not started: the target was busy with another probe, or backed off.",
                &["target", "scenario", "reason"],
            )?,
            delayed_total: counter(
                "sentinel_scheduler_delayed_runs_total",
                "Runs started more than a second late because another probe held the target.",
                &["target", "scenario"],
            )?,
            aborted_total: counter(
                "sentinel_probes_aborted_total",
                "Runs aborted at shutdown after the grace period, or at their deadline.",
                &["target", "reason"],
            )?,
            target_up: gauge(
                "sentinel_target_up",
                "1 if the target answered its last health check.",
                &["target"],
            )?,
            target_backoff: gauge(
                "sentinel_target_backoff_seconds",
                "Current back-off of a target found down; 0 when healthy.",
                &["target"],
            )?,
            server_info: gauge(
                "sentinel_server_info",
                "The server's version and model; value 1.",
                &["target", "version", "model", "max_model_len"],
            )?,
            server_running: gauge(
                "sentinel_server_requests_running",
                "Requests the server is running (vLLM num_requests_running).",
                &["target"],
            )?,
            server_waiting: gauge(
                "sentinel_server_requests_waiting",
                "Requests waiting on the server (vLLM num_requests_waiting).",
                &["target"],
            )?,
            server_kv: gauge(
                "sentinel_server_kv_cache_usage_ratio",
                "KV cache usage of the server, 0-1.",
                &["target"],
            )?,
            server_prefix_hit: gauge(
                "sentinel_server_prefix_cache_hit_ratio",
                "Prefix cache hits / queries on the server since it started.",
                &["target"],
            )?,
            server_preemptions: gauge(
                "sentinel_server_preemptions",
                "The server's cumulative preemption count (vLLM num_preemptions_total).",
                &["target"],
            )?,
            server_scrape_ok: gauge(
                "sentinel_server_scrape_success",
                "1 if the last read of the server's /metrics worked.",
                &["target"],
            )?,
            gpu_util: gauge(
                "sentinel_gpu_utilization_ratio",
                "GPU utilization, 0-1.",
                GPU,
            )?,
            gpu_mem_used: gauge("sentinel_gpu_memory_used_bytes", "GPU memory in use.", GPU)?,
            gpu_mem_total: gauge(
                "sentinel_gpu_memory_total_bytes",
                "GPU memory in total.",
                GPU,
            )?,
            gpu_power: gauge("sentinel_gpu_power_watts", "GPU power draw.", GPU)?,
            gpu_temp: gauge("sentinel_gpu_temperature_celsius", "GPU temperature.", GPU)?,
            gpu_sm_clock: gauge("sentinel_gpu_sm_clock_hertz", "GPU SM clock.", GPU)?,
            scrape_errors_total: counter(
                "sentinel_telemetry_errors_total",
                "Failed reads of server or GPU telemetry.",
                &["target", "source"],
            )?,
            config_reload_ok,
            config_reload_ts,
            store_errors_total,
            tracked: Default::default(),
            changes: AtomicU64::new(1),
            last_up: Default::default(),
            last_info: Default::default(),
            last_load: Default::default(),
            last_gpus: Default::default(),
            encoded: std::sync::Mutex::new((0, String::new())),
            model_series: stale::ModelSeries::new([]),
            registry,
        };
        metrics.model_series = stale::ModelSeries::new(metrics.model_removers());
        Ok(metrics)
    }

    /// Creates every label combination a configured pair will use, at 0,
    /// so rates and dashboards have series before the first failure.
    pub fn declare_pair(&self, target: &str, model: &str, scenario: &str) {
        self.note_model(target, model);
        let _changed = self.change();
        for o in Outcome::ALL {
            self.requests_total
                .with_label_values(&[target, model, scenario, o.as_str()]);
        }
        for o in ["ok", "partial", "connect", "timeout", "http_5xx"] {
            self.runs_total.with_label_values(&[target, scenario, o]);
        }
        for reason in ["busy", "backoff"] {
            self.skipped_total
                .with_label_values(&[target, scenario, reason]);
        }
        self.delayed_total.with_label_values(&[target, scenario]);
    }

    pub fn declare_target(&self, target: &str) {
        let _changed = self.change();
        for reason in ["shutdown", "deadline"] {
            self.aborted_total.with_label_values(&[target, reason]);
        }
        self.target_backoff.with_label_values(&[target]).set(0.0);
    }

    /// Records a run: histograms and counters only for live runs
    /// (`fresh`), last-run gauges always (also when restoring from the store).
    pub fn record_run(&self, run: &RunRecord, fresh: bool) {
        if run.summary.completed > 0 {
            self.note_model(&run.target, &run.model);
        }
        let _changed = self.change();
        let pair = [
            run.target.as_str(),
            run.model.as_str(),
            run.scenario.as_str(),
        ];
        if fresh {
            for s in &run.samples {
                self.requests_total
                    .with_label_values(&[pair[0], pair[1], pair[2], s.outcome.as_str()])
                    .inc();
                if !s.outcome.is_ok() {
                    continue;
                }
                if let Some(v) = s.ttft_s {
                    self.ttft.with_label_values(&pair).observe(v);
                }
                if let Some(v) = s.tpot_s {
                    self.tpot.with_label_values(&pair).observe(v);
                }
                if let Some(v) = s.e2el_s {
                    self.e2el.with_label_values(&pair).observe(v);
                }
                let itl = self.itl.with_label_values(&pair);
                for v in &s.itls_s {
                    itl.observe(*v);
                }
            }
            self.runs_total
                .with_label_values(&[&run.target, &run.scenario, run.outcome.as_str()])
                .inc();
        }
        self.run_success
            .with_label_values(&pair)
            .set(if run.success() { 1.0 } else { 0.0 });
        if run.success() {
            self.set_last_success(
                pair[0],
                pair[1],
                pair[2],
                run.started_at.timestamp_millis() as f64 / 1000.0,
            );
        }
        self.run_last_ts
            .with_label_values(&pair)
            .set(run.started_at.timestamp_millis() as f64 / 1000.0);
        self.run_duration
            .with_label_values(&pair)
            .set(run.duration_s);
        let sum = &run.summary;
        if sum.completed > 0 {
            for (metric, summary) in sum.latencies() {
                if summary.count == 0 {
                    continue;
                }
                for (stat, value) in summary.stats() {
                    self.run_latency
                        .with_label_values(&[pair[0], pair[1], pair[2], metric, stat])
                        .set(value);
                }
            }
            self.run_input_tokens
                .with_label_values(&pair)
                .set(sum.total_input_tokens as f64 / sum.completed as f64);
        }
        self.run_output_tps
            .with_label_values(&pair)
            .set(sum.output_throughput);
        self.run_rps
            .with_label_values(&pair)
            .set(sum.request_throughput);
        if let Some(g) = sum.goodput_ratio {
            self.run_goodput.with_label_values(&pair).set(g);
        }
    }

    pub fn run_skipped(&self, target: &str, scenario: &str, reason: &'static str) {
        let _changed = self.change();
        self.skipped_total
            .with_label_values(&[target, scenario, reason])
            .inc();
    }

    pub fn run_delayed(&self, target: &str, scenario: &str) {
        let _changed = self.change();
        self.delayed_total
            .with_label_values(&[target, scenario])
            .inc();
    }

    pub fn run_aborted(&self, target: &str, reason: &'static str) {
        let _changed = self.change();
        self.aborted_total
            .with_label_values(&[target, reason])
            .inc();
    }

    pub fn set_target_up(&self, target: &str, up: bool) {
        if !Self::differs(&self.last_up, target, up) {
            return;
        }
        let _changed = self.change();
        self.target_up
            .with_label_values(&[target])
            .set(if up { 1.0 } else { 0.0 });
    }

    pub fn set_backoff(&self, target: &str, seconds: f64) {
        let _changed = self.change();
        self.target_backoff
            .with_label_values(&[target])
            .set(seconds);
    }

    /// Replaces the target's info series (one per target).
    pub fn set_server_info(&self, target: &str, model: &str, id: &ServerIdentity) {
        self.note_model(target, model);
        if !Self::differs(&self.last_info, target, (model.to_owned(), id.clone())) {
            return;
        }
        let _changed = self.change();
        self.remove_target_series(&self.server_info, target);
        let max_len = id.max_model_len.map(|v| v.to_string()).unwrap_or_default();
        self.track(
            &self.server_info,
            &[
                target,
                id.version.as_deref().unwrap_or("unknown"),
                model,
                &max_len,
            ],
            1.0,
        );
    }

    pub fn set_server_load(&self, target: &str, load: Option<&ServerLoad>) {
        if !Self::differs(&self.last_load, target, load.copied()) {
            return;
        }
        let _changed = self.change();
        let Some(load) = load else {
            self.server_scrape_ok.with_label_values(&[target]).set(0.0);
            return;
        };
        self.server_scrape_ok.with_label_values(&[target]).set(1.0);
        let set = |g: &GaugeVec, v: Option<f64>| {
            if let Some(v) = v {
                g.with_label_values(&[target]).set(v);
            }
        };
        set(&self.server_running, load.running);
        set(&self.server_waiting, load.waiting);
        set(&self.server_kv, load.kv_cache_usage);
        set(&self.server_prefix_hit, load.prefix_cache_hit_ratio);
        set(&self.server_preemptions, load.preemptions_total);
    }

    /// Replaces the target's GPU series with these readings.
    pub fn set_gpus(&self, target: &str, gpus: &[GpuReading]) {
        if !Self::differs(&self.last_gpus, target, gpus.to_vec()) {
            return;
        }
        let _changed = self.change();
        let families = [
            &self.gpu_util,
            &self.gpu_mem_used,
            &self.gpu_mem_total,
            &self.gpu_power,
            &self.gpu_temp,
            &self.gpu_sm_clock,
        ];
        for f in families {
            self.remove_target_series(f, target);
        }
        for g in gpus {
            let labels = [target, g.gpu.as_str(), g.uuid.as_str(), g.name.as_str()];
            let values = [
                g.utilization_ratio,
                g.memory_used_bytes,
                g.memory_total_bytes,
                g.power_watts,
                g.temperature_celsius,
                g.sm_clock_hertz,
            ];
            for (family, value) in families.iter().zip(values) {
                if let Some(v) = value {
                    self.track(family, &labels, v);
                }
            }
        }
    }

    /// Removes every series of `target` from `family` that this process set
    /// through [`Metrics::track`].
    fn remove_target_series(&self, family: &GaugeVec, target: &str) {
        let key = (family.desc()[0].fq_name.clone(), target.to_owned());
        let old = self
            .tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
            .unwrap_or_default();
        for labels in old {
            family
                .remove_label_values(&labels.iter().map(String::as_str).collect::<Vec<_>>())
                .ok();
        }
    }

    /// Sets a series and remembers its labels so it can be replaced later.
    fn track(&self, family: &GaugeVec, labels: &[&str], value: f64) {
        family.with_label_values(labels).set(value);
        let key = (family.desc()[0].fq_name.clone(), labels[0].to_owned());
        self.tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default()
            .push(labels.iter().map(|s| s.to_string()).collect());
    }

    /// Drops every last-run and per-target gauge (before a reload re-declares
    /// them); histograms and counters keep counting.
    pub fn reset_pairs(&self) {
        let _changed = self.change();
        for g in [
            &self.run_latency,
            &self.run_output_tps,
            &self.run_rps,
            &self.run_goodput,
            &self.run_success,
            &self.run_last_ts,
            &self.run_duration,
            &self.run_input_tokens,
            &self.target_up,
            &self.target_backoff,
            &self.server_info,
        ] {
            g.reset();
        }
        // The series are gone: the next telemetry write must set them again.
        self.last_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.last_info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(family, _), _| family != "sentinel_server_info");
    }

    /// Marks the registry changed when the returned guard drops, i.e.
    /// after the caller's writes: a page encoded in between is then
    /// replaced at the next scrape instead of being served as current.
    fn change(&self) -> ChangeGuard<'_> {
        ChangeGuard(&self.changes)
    }

    /// Whether `value` differs from what was last recorded for `target` in
    /// `seen` (recording it): telemetry that did not move must not throw
    /// the encoded page away every scrape interval.
    fn differs<T: PartialEq>(seen: &Mutex<HashMap<String, T>>, target: &str, value: T) -> bool {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.get(target) == Some(&value) {
            return false;
        }
        seen.insert(target.to_owned(), value);
        true
    }

    pub fn reload_result(&self, ok: bool) {
        let _changed = self.change();
        self.config_reload_ok.set(i64::from(ok));
        if ok {
            self.config_reload_ts
                .set(chrono::Utc::now().timestamp() as f64);
        }
    }

    pub fn telemetry_error(&self, target: &str, source: &'static str) {
        let _changed = self.change();
        self.scrape_errors_total
            .with_label_values(&[target, source])
            .inc();
    }

    pub fn store_error(&self) {
        let _changed = self.change();
        self.store_errors_total.inc();
    }

    /// The text exposition of everything. Encoding ten thousand series
    /// takes milliseconds, and between runs nothing changes: the page is
    /// encoded again only after a change.
    pub fn encode(&self) -> String {
        let now = self.changes.load(Ordering::Acquire);
        let mut cached = self.encoded.lock().unwrap_or_else(|p| p.into_inner());
        if cached.0 == now {
            return cached.1.clone();
        }
        let page = self.encode_fresh();
        *cached = (now, page.clone());
        page
    }

    fn encode_fresh(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail on I/O; a failure would be a
        // metric family the encoder rejects, which registration prevents.
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .ok();
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(m: &Metrics) -> u64 {
        m.changes.load(Ordering::Acquire)
    }

    #[test]
    fn repeated_telemetry_keeps_the_encoded_page_and_a_reset_forgets_it() {
        let m = Metrics::new().unwrap();
        let load = ServerLoad {
            running: Some(2.0),
            ..Default::default()
        };
        m.set_target_up("a", true);
        m.set_server_load("a", Some(&load));
        let before = generation(&m);
        let page = m.encode();
        m.set_target_up("a", true);
        m.set_server_load("a", Some(&load));
        assert_eq!(generation(&m), before, "nothing moved");
        assert_eq!(m.encode(), page);

        m.set_target_up("a", false);
        assert!(generation(&m) > before);
        assert!(m.encode().contains("sentinel_target_up{target=\"a\"} 0"));

        m.reset_pairs();
        assert!(!m.encode().contains("sentinel_target_up{"));
        m.set_target_up("a", false);
        assert!(
            m.encode().contains("sentinel_target_up{target=\"a\"} 0"),
            "after a reset the same value is written again"
        );
    }
}
