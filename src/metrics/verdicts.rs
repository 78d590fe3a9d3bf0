//! The series alert rules and regression dashboards read: each pair's
//! confirmed verdict and its evidence, the baseline it compares with, and
//! evaluations counted by state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::page::{Counters, Gauges, Page};
use super::stale::ModelSeries;
use super::{MetricsError, PAIR, with};
use crate::store::baselines::PairKey;
use crate::verdict::State;
use crate::verdict::pair::PairVerdict;

pub struct VerdictMetrics {
    state: Gauges,
    relative_change: Gauges,
    p_value: Gauges,
    baseline_info: Gauges,
    evaluations_total: Counters,
    /// The `baseline_info` labels set per pair, to replace them.
    baseline_labels: Mutex<HashMap<PairKey, [String; 2]>>,
    /// The metrics whose evidence each pair shows, to remove it once the
    /// verdict no longer finds them slower.
    evidence_metrics: Mutex<HashMap<PairKey, Vec<String>>>,
}

impl VerdictMetrics {
    pub fn new(page: &Page, models: &Arc<ModelSeries>) -> Result<Self, MetricsError> {
        let m = VerdictMetrics {
            state: page.gauges(
                "sentinel_regression_state",
                "Confirmed verdict: 0 ok, 1 inconclusive, 2 regression, 3 confirming (slower, not yet in enough evaluations).",
                PAIR,
            )?,
            relative_change: page.gauges(
                "sentinel_regression_relative_change",
                "For each metric the verdict finds slower (none while it finds none), the change of the candidate runs over the baseline, relative to the baseline median: the logarithmic test's ratio, or the Hodges-Lehmann shift with log_test = false (0.2 = 20% slower; for a phase over the other, its ratio 20% higher).",
                &with(PAIR, &["metric"]),
            )?,
            p_value: page.gauges(
                "sentinel_regression_p_value",
                "For each metric the verdict finds slower (none while it finds none), the one-sided p-value that the candidate is slower (the logarithmic test's, or Mann-Whitney's with log_test = false), Benjamini-Hochberg adjusted across the evaluation.",
                &with(PAIR, &["metric"]),
            )?,
            baseline_info: page.gauges(
                "sentinel_baseline_info",
                "The baseline the verdict compares with: its server version and when it was pinned (empty when chosen automatically); value 1.",
                &with(PAIR, &["version", "pinned_at"]),
            )?,
            evaluations_total: page.counters(
                "sentinel_evaluations_total",
                "Detector evaluations by confirmed state.",
                &["target", "scenario", "state"],
            )?,
            baseline_labels: Mutex::new(HashMap::new()),
            evidence_metrics: Mutex::new(HashMap::new()),
        };
        for g in [&m.state, &m.relative_change, &m.p_value, &m.baseline_info] {
            models.add(g);
        }
        Ok(m)
    }

    /// Forgets every pair's verdict series (evaluations keep counting).
    pub fn reset(&self) {
        for g in [
            &self.state,
            &self.relative_change,
            &self.p_value,
            &self.baseline_info,
        ] {
            g.reset();
        }
        self.evidence_metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.baseline_labels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The pair's verdict; counted as an evaluation when `fresh` (not
    /// restored from the store at start).
    pub fn set_verdict(&self, v: &PairVerdict, fresh: bool) {
        let pair = [v.target.as_str(), v.model.as_str(), v.scenario.as_str()];
        self.state.set(&pair, v.state as i32 as f64);
        if fresh {
            self.evaluations_total
                .inc(&[&v.target, &v.scenario, v.state.as_str()]);
        }
        self.set_evidence(v, pair);
        let mut known = self
            .baseline_labels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = v.key();
        if let Some([version, pinned]) = known.remove(&key) {
            self.baseline_info
                .remove(&[pair[0], pair[1], pair[2], &version, &pinned]);
        }
        if let Some(reference) = &v.reference_build {
            let pinned = v
                .baseline_pinned_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default();
            self.baseline_info
                .set(&[pair[0], pair[1], pair[2], reference, &pinned], 1.0);
            known.insert(key, [reference.clone(), pinned]);
        }
    }

    /// The evidence of the metrics the verdict finds slower, and only
    /// theirs: every compared metric would cost each pair two series per
    /// metric (28 with the phases against each other), about half the
    /// pair's budget, to show what the verdict does not act on; the whole
    /// evaluation stays on `/api/v1/verdicts`.
    fn set_evidence(&self, v: &PairVerdict, pair: [&str; 3]) {
        // An inconclusive verdict (a load it refuses to judge across) may
        // keep flagged metrics it does not act on.
        let slower = match v.state {
            State::Confirming | State::Regression => v.slower(),
            State::Ok | State::Inconclusive => Vec::new(),
        };
        let mut shown = self
            .evidence_metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let before = shown.remove(&v.key()).unwrap_or_default();
        for gone in before
            .iter()
            .filter(|name| !slower.iter().any(|m| &m.metric == *name))
        {
            let labels = [pair[0], pair[1], pair[2], gone.as_str()];
            self.relative_change.remove(&labels);
            self.p_value.remove(&labels);
        }
        for m in &slower {
            let labels = [pair[0], pair[1], pair[2], m.metric.as_str()];
            self.relative_change.set(&labels, m.relative_change);
            self.p_value.set(&labels, m.p_adjusted);
        }
        if !slower.is_empty() {
            shown.insert(v.key(), slower.iter().map(|m| m.metric.clone()).collect());
        }
    }
}

/// Notification deliveries per channel and result; each counted event is
/// also logged, in one call.
pub struct NotificationMetrics {
    total: Counters,
}

pub const CHANNELS: [&str; 3] = ["email", "webhook", "alertmanager"];

impl NotificationMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        let total = page.counters(
            "sentinel_notifications_total",
            "Notification deliveries by channel and result (sent, failed, retried).",
            &["channel", "result"],
        )?;
        for channel in CHANNELS {
            for result in ["sent", "failed", "retried"] {
                total.declare(&[channel, result]);
            }
        }
        Ok(NotificationMetrics { total })
    }

    pub fn sent(&self, channel: &'static str, name: &str) {
        self.total.inc(&[channel, "sent"]);
        tracing::info!(channel, name = %name, "notification delivered");
    }

    pub fn retried(
        &self,
        channel: &'static str,
        name: &str,
        attempt: u32,
        delay: std::time::Duration,
        error: &dyn std::fmt::Display,
    ) {
        self.total.inc(&[channel, "retried"]);
        tracing::warn!(channel, name = %name, attempt, "notification failed, retrying in {delay:?}: {error}");
    }

    pub fn failed(
        &self,
        channel: &'static str,
        name: &str,
        attempts: u32,
        error: &dyn std::fmt::Display,
    ) {
        self.total.inc(&[channel, "failed"]);
        tracing::error!(channel, name = %name, attempts, "notification not delivered: {error}");
    }
}
