//! The series alert rules and regression dashboards read: verdicts and
//! their evidence, the baseline each comparison uses, version changes,
//! and the per-scenario schedule period and SLOs (exported so rules need
//! no hard-coded numbers), plus notification delivery counts.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{GaugeVec, IntCounterVec, Registry};

use super::{Metrics, MetricsError, PAIR, counter_vec, gauge_vec};
use crate::detect::verdict::PairVerdict;
use crate::store::baselines::PairKey;

pub struct AlertingMetrics {
    regression_state: GaugeVec,
    relative_change: GaugeVec,
    p_value: GaugeVec,
    baseline_info: GaugeVec,
    version_change_ts: GaugeVec,
    last_success_ts: GaugeVec,
    schedule_interval: GaugeVec,
    slo: GaugeVec,
    notifications_total: IntCounterVec,
    evaluations_total: IntCounterVec,
    upgrade_runs_total: IntCounterVec,
    /// The `baseline_info` labels set per pair, to replace them.
    baseline_labels: Mutex<HashMap<PairKey, [String; 2]>>,
}

pub const CHANNELS: [&str; 3] = ["email", "webhook", "alertmanager"];

impl AlertingMetrics {
    /// Removers for the families with a `model` label.
    pub(super) fn model_removers(&self) -> Vec<(String, super::stale::Remover)> {
        let gauges = [
            &self.regression_state,
            &self.relative_change,
            &self.p_value,
            &self.baseline_info,
            &self.version_change_ts,
            &self.last_success_ts,
            &self.schedule_interval,
            &self.slo,
        ];
        let mut all: Vec<_> = gauges
            .into_iter()
            .filter_map(super::stale::by_model)
            .collect();
        for counter in [&self.evaluations_total, &self.upgrade_runs_total] {
            all.extend(super::stale::by_model(counter));
        }
        all
    }

    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        let gauge =
            |name: &str, help: &str, labels: &[&str]| gauge_vec(registry, name, help, labels);
        let counter =
            |name: &str, help: &str, labels: &[&str]| counter_vec(registry, name, help, labels);
        let pair_and = |extra: &[&'static str]| -> Vec<&'static str> {
            PAIR.iter().chain(extra).copied().collect()
        };
        let notifications_total = counter(
            "sentinel_notifications_total",
            "Notification deliveries by channel and result (sent, failed, retried).",
            &["channel", "result"],
        )?;
        for channel in CHANNELS {
            for result in ["sent", "failed", "retried"] {
                notifications_total.with_label_values(&[channel, result]);
            }
        }
        Ok(AlertingMetrics {
            regression_state: gauge(
                "sentinel_regression_state",
                "Confirmed verdict: 0 ok, 1 inconclusive, 2 regression, 3 confirming (slower, not yet in enough evaluations).",
                PAIR,
            )?,
            relative_change: gauge(
                "sentinel_regression_relative_change",
                "Hodges-Lehmann shift of the candidate runs over the baseline, relative to the baseline median (0.2 = 20% slower).",
                &pair_and(&["metric"]),
            )?,
            p_value: gauge(
                "sentinel_regression_p_value",
                "One-sided Mann-Whitney p-value (candidate slower), Benjamini-Hochberg adjusted across the evaluation.",
                &pair_and(&["metric"]),
            )?,
            baseline_info: gauge(
                "sentinel_baseline_info",
                "The baseline the verdict compares with: its server version and when it was pinned (empty when chosen automatically); value 1.",
                &pair_and(&["version", "pinned_at"]),
            )?,
            version_change_ts: gauge(
                "sentinel_server_version_change_timestamp_seconds",
                "When the target's server build (version, model root or fingerprint) last changed.",
                &["target"],
            )?,
            last_success_ts: gauge(
                "sentinel_run_last_success_timestamp_seconds",
                "When the last run in which every request succeeded started.",
                PAIR,
            )?,
            schedule_interval: gauge(
                "sentinel_schedule_interval_seconds",
                "Time between two scheduled runs of the pair.",
                &["target", "scenario"],
            )?,
            slo: gauge(
                "sentinel_scenario_slo_seconds",
                "The scenario's configured SLO per metric.",
                &["target", "scenario", "metric"],
            )?,
            notifications_total,
            evaluations_total: counter(
                "sentinel_evaluations_total",
                "Detector evaluations by confirmed state.",
                &["target", "scenario", "state"],
            )?,
            upgrade_runs_total: counter(
                "sentinel_upgrade_runs_total",
                "Runs started at once after a version change (upgrade rounds), beyond the schedule.",
                &["target", "scenario"],
            )?,
            baseline_labels: Mutex::new(HashMap::new()),
        })
    }
}

impl Metrics {
    pub fn set_verdict(&self, v: &PairVerdict, fresh: bool) {
        let _changed = self.change();
        let a = &self.alerting;
        let pair = [v.target.as_str(), v.model.as_str(), v.scenario.as_str()];
        a.regression_state
            .with_label_values(&pair)
            .set(v.state as i32 as f64);
        if fresh {
            a.evaluations_total
                .with_label_values(&[&v.target, &v.scenario, v.state.as_str()])
                .inc();
        }
        for m in &v.evaluation.metrics {
            let labels = [pair[0], pair[1], pair[2], m.metric.as_str()];
            a.relative_change
                .with_label_values(&labels)
                .set(m.relative_change);
            a.p_value.with_label_values(&labels).set(m.p_adjusted);
        }
        let mut known = a.baseline_labels.lock().unwrap_or_else(|p| p.into_inner());
        let key = v.key();
        if let Some([version, pinned]) = known.remove(&key) {
            let _ = a
                .baseline_info
                .remove_label_values(&[pair[0], pair[1], pair[2], &version, &pinned]);
        }
        if let Some(reference) = &v.reference_build {
            let pinned = v
                .baseline_pinned_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default();
            a.baseline_info
                .with_label_values(&[pair[0], pair[1], pair[2], reference, &pinned])
                .set(1.0);
            known.insert(key, [reference.clone(), pinned]);
        }
    }

    pub fn set_version_change(&self, target: &str, at: chrono::DateTime<chrono::Utc>) {
        let _changed = self.change();
        self.alerting
            .version_change_ts
            .with_label_values(&[target])
            .set(at.timestamp_millis() as f64 / 1000.0);
    }

    pub fn set_last_success(&self, target: &str, model: &str, scenario: &str, at: f64) {
        let _changed = self.change();
        self.alerting
            .last_success_ts
            .with_label_values(&[target, model, scenario])
            .set(at);
    }

    /// The pair's schedule period and SLOs, declared with the pair.
    pub fn set_pair_policy(
        &self,
        target: &str,
        scenario: &str,
        interval_s: Option<f64>,
        slos: &crate::stats::bench::Slos,
    ) {
        let _changed = self.change();
        let a = &self.alerting;
        if let Some(i) = interval_s {
            a.schedule_interval
                .with_label_values(&[target, scenario])
                .set(i);
        }
        for (metric, value) in [
            ("ttft", slos.ttft_s),
            ("tpot", slos.tpot_s),
            ("e2el", slos.e2el_s),
        ] {
            if let Some(v) = value {
                a.slo.with_label_values(&[target, scenario, metric]).set(v);
            }
        }
    }

    /// Forgets the per-pair policy series before a reload declares them again.
    pub fn reset_policies(&self) {
        let _changed = self.change();
        self.alerting.schedule_interval.reset();
        self.alerting.slo.reset();
    }

    pub fn upgrade_run(&self, target: &str, scenario: &str) {
        let _changed = self.change();
        self.alerting
            .upgrade_runs_total
            .with_label_values(&[target, scenario])
            .inc();
    }

    pub fn notification(&self, channel: &'static str, result: &'static str) {
        let _changed = self.change();
        self.alerting
            .notifications_total
            .with_label_values(&[channel, result])
            .inc();
    }
}
