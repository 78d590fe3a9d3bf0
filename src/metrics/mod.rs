//! Every metric the daemon exports, registered per component on one
//! registry: probe runs, the schedule, server and GPU telemetry, verdicts,
//! notifications and the daemon's own health. Each component registers its
//! families on the page it is handed and writes through handles that mark
//! the page changed. Labels stay bounded: target, model, scenario and fixed
//! value sets (outcome, metric, stat, gpu).

pub mod drift;
pub mod family;
pub mod fleet;
pub mod gateway;
pub mod gpu;
pub mod health;
pub mod liveness;
pub mod page;
pub mod runs;
pub mod schedule;
pub mod server;
pub mod slo;
pub mod stale;
pub mod verdicts;

use std::sync::Arc;
use std::time::Duration;

pub use gpu::GpuReading;

/// A family that could not be registered: a mistake in the daemon's own
/// metric definitions, caught at start-up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics: {0:?} is not a valid metric name")]
    Name(String),
    #[error("metrics: {0}: {1:?} is not a valid label name here")]
    Label(String, String),
    #[error("metrics: {0} is registered twice")]
    Duplicate(String),
    #[error("metrics: {0}: bucket bounds must be finite and increasing")]
    Buckets(String),
}

const PAIR: &[&str] = &["target", "model", "scenario"];
/// A run's series: its pair, the replica probed (empty through the
/// service) and the build that served it.
const RUN: &[&str] = &["target", "model", "scenario", "replica", "build"];

/// `labels` followed by `extra`.
fn with(labels: &[&'static str], extra: &[&'static str]) -> Vec<&'static str> {
    labels.iter().chain(extra).copied().collect()
}

pub use crate::vocabulary::histograms::HistogramResolution;

impl HistogramResolution {
    pub fn as_str(self) -> &'static str {
        match self {
            HistogramResolution::Off => "off",
            HistogramResolution::Coarse => "coarse",
            HistogramResolution::Fine => "fine",
        }
    }
}

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

/// Nine bounds from 5 ms to 5 minutes (ten buckets with `+Inf`), for the
/// coarse TTFT histogram: the usual TTFT SLOs (100 ms to 2.5 s) are bounds.
pub fn coarse_buckets() -> Vec<f64> {
    vec![0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 300.0]
}

/// The components, each shareable on its own.
pub struct Metrics {
    page: page::Page,
    pub runs: Arc<runs::RunMetrics>,
    pub schedule: Arc<schedule::ScheduleMetrics>,
    pub server: Arc<server::ServerMetrics>,
    pub gpus: Arc<gpu::GpuMetrics>,
    pub verdicts: Arc<verdicts::VerdictMetrics>,
    pub notifications: Arc<verdicts::NotificationMetrics>,
    pub health: Arc<health::HealthMetrics>,
    pub fleet: Arc<fleet::FleetMetrics>,
    pub drift: Arc<drift::DriftMetrics>,
    pub liveness: Arc<liveness::LivenessMetrics>,
    pub slos: Arc<slo::SloMetrics>,
    pub gateway: Arc<gateway::GatewayMetrics>,
    models: Arc<stale::ModelSeries>,
}

impl Metrics {
    /// Every family, with histograms at the default resolution.
    pub fn new() -> Result<Metrics, MetricsError> {
        Metrics::with_histograms(HistogramResolution::default())
    }

    pub fn with_histograms(resolution: HistogramResolution) -> Result<Metrics, MetricsError> {
        let page = page::Page::default();
        let models = Arc::new(stale::ModelSeries::new());
        Ok(Metrics {
            runs: Arc::new(runs::RunMetrics::new(&page, models.clone(), resolution)?),
            schedule: Arc::new(schedule::ScheduleMetrics::new(&page)?),
            server: Arc::new(server::ServerMetrics::new(&page, models.clone())?),
            gpus: Arc::new(gpu::GpuMetrics::new(&page)?),
            verdicts: Arc::new(verdicts::VerdictMetrics::new(&page, &models)?),
            notifications: Arc::new(verdicts::NotificationMetrics::new(&page)?),
            health: Arc::new(health::HealthMetrics::new(&page)?),
            fleet: Arc::new(fleet::FleetMetrics::new(&page)?),
            drift: Arc::new(drift::DriftMetrics::new(&page, &models)?),
            liveness: Arc::new(liveness::LivenessMetrics::new(&page)?),
            slos: Arc::new(slo::SloMetrics::new(&page)?),
            gateway: Arc::new(gateway::GatewayMetrics::new(&page)?),
            models,
            page,
        })
    }

    /// How long a replaced model's series stay (`exporter.stale_series_after`).
    pub fn set_stale_series_grace(&self, grace: Duration) {
        self.models.set_grace(grace);
    }

    /// Drops every per-pair and per-target gauge before a reload declares
    /// them again; histograms and counters keep counting.
    pub fn reset_pairs(&self) {
        self.runs.reset();
        self.schedule.reset();
        self.server.reset();
    }

    /// Removes every series of a target no longer configured, once
    /// nothing of it runs any more (its tasks write them as they end);
    /// returns how many.
    pub fn forget_target(&self, target: &str) -> usize {
        self.models.forget_target(target);
        self.page.remove_target(target)
    }

    /// The text exposition of everything, encoded again only after a change.
    pub fn encode(&self) -> String {
        self.page.encode()
    }

    /// The same text as its families' parts, to be served in turn.
    pub fn encode_parts(&self) -> Vec<bytes::Bytes> {
        self.page.encode_parts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::records::ServerLoad;

    #[test]
    fn repeated_telemetry_keeps_the_encoded_page_and_a_reset_forgets_it() {
        let m = Metrics::new().unwrap();
        let load = ServerLoad {
            running: Some(2.0),
            ..Default::default()
        };
        m.server.set_target_up("a", true);
        m.server.set_server_load("a", Some(&load));
        let before = m.page.generation();
        let page = m.encode();
        m.server.set_target_up("a", true);
        m.server.set_server_load("a", Some(&load));
        assert_eq!(m.page.generation(), before, "nothing moved");
        assert_eq!(m.encode(), page);

        m.server.set_target_up("a", false);
        assert!(m.page.generation() > before);
        assert!(m.encode().contains("sentinel_target_up{target=\"a\"} 0"));

        m.reset_pairs();
        assert!(!m.encode().contains("sentinel_target_up{"));
        m.server.set_target_up("a", false);
        assert!(
            m.encode().contains("sentinel_target_up{target=\"a\"} 0"),
            "after a reset the same value is written again"
        );
    }

    #[test]
    fn forgetting_a_target_removes_its_series_in_every_family_and_no_others() {
        let m = Metrics::new().unwrap();
        for target in ["a", "ab"] {
            m.server.set_target_up(target, true);
            m.schedule.declare_target(target);
        }
        let before = m.encode();
        assert!(before.contains("target=\"a\"") && before.contains("target=\"ab\""));
        assert!(m.forget_target("a") >= 2);
        let after = m.encode();
        assert!(!after.contains("target=\"a\""), "{after}");
        assert_eq!(
            before.matches("target=\"ab\"").count(),
            after.matches("target=\"ab\"").count()
        );
        assert_eq!(m.forget_target("a"), 0);
    }

    /// A verdict with `slower` flagged and `ttft_p90` compared unflagged.
    fn verdict_finding(slower: &[&str]) -> crate::verdict::pair::PairVerdict {
        use crate::verdict::{MetricResult, State};
        let mut metrics: Vec<_> = slower
            .iter()
            .map(|m| MetricResult::example(m, 0.25, true))
            .collect();
        metrics.push(MetricResult::example("ttft_p90", 0.01, false));
        let state = if slower.is_empty() {
            State::Ok
        } else {
            State::Confirming
        };
        crate::verdict::pair::PairVerdict::example("prod", "chat", state, metrics)
    }

    #[test]
    fn a_verdicts_evidence_is_shown_for_the_metrics_it_finds_slower_only() {
        let m = Metrics::new().unwrap();
        let evidence = |page: &str| -> Vec<String> {
            let mut found: Vec<String> = page
                .lines()
                .filter(|l| l.starts_with("sentinel_regression_relative_change{"))
                .map(|l| {
                    l.split("metric=\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            found.sort();
            found
        };
        let p_values = |page: &str| {
            page.lines()
                .filter(|l| l.starts_with("sentinel_regression_p_value{"))
                .count()
        };
        m.verdicts.set_verdict(&verdict_finding(&[]), true);
        let page = m.encode();
        assert!(page.contains("sentinel_regression_state{"), "{page}");
        assert_eq!(evidence(&page), Vec::<String>::new(), "nothing slower");
        assert_eq!(p_values(&page), 0);

        m.verdicts
            .set_verdict(&verdict_finding(&["ttft_p50", "tpot_p50"]), true);
        let page = m.encode();
        assert_eq!(evidence(&page), ["tpot_p50", "ttft_p50"]);
        assert_eq!(p_values(&page), 2);
        assert!(page.contains(
            "sentinel_regression_relative_change{metric=\"ttft_p50\",model=\"m\",scenario=\"chat\",target=\"prod\"} 0.25"
        ));

        m.verdicts
            .set_verdict(&verdict_finding(&["tpot_p50"]), true);
        assert_eq!(evidence(&m.encode()), ["tpot_p50"], "ttft_p50's removed");

        m.verdicts.set_verdict(&verdict_finding(&[]), true);
        let page = m.encode();
        assert_eq!(evidence(&page), Vec::<String>::new(), "every one removed");
        assert_eq!(p_values(&page), 0);

        // Inconclusive (a load it refuses to judge across): flagged
        // metrics it does not act on are no evidence.
        let mut refused = verdict_finding(&["ttft_p50"]);
        refused.state = crate::verdict::State::Inconclusive;
        m.verdicts.set_verdict(&refused, true);
        assert_eq!(evidence(&m.encode()), Vec::<String>::new());
        // ...nor when that evaluation holds a regression confirmed before.
        let mut held = verdict_finding(&["ttft_p50"]);
        held.state = crate::verdict::State::Regression;
        held.evaluation.state = crate::verdict::State::Inconclusive;
        m.verdicts.set_verdict(&held, true);
        assert_eq!(evidence(&m.encode()), Vec::<String>::new());

        // The baseline's series follows the reference, one per pair.
        let baselines = |page: &str| -> Vec<String> {
            page.lines()
                .filter(|l| l.starts_with("sentinel_baseline_info{"))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(baselines(&m.encode()).len(), 1);
        let mut rebased = verdict_finding(&[]);
        rebased.reference_build = Some("0.31.0".into());
        m.verdicts.set_verdict(&rebased, true);
        let page = m.encode();
        assert_eq!(baselines(&page).len(), 1, "{page}");
        assert!(baselines(&page)[0].contains("version=\"0.31.0\""), "{page}");
        rebased.reference_build = None;
        m.verdicts.set_verdict(&rebased, true);
        assert_eq!(baselines(&m.encode()), Vec::<String>::new());
    }
}
