//! The series alert rules and regression dashboards read: each pair's
//! confirmed verdict and its evidence, the baseline it compares with, and
//! evaluations counted by state.

use std::collections::HashMap;
use std::sync::Arc;

use super::page::{Counters, Gauges, Page};
use super::stale::ModelSeries;
use super::{MetricsError, PAIR, with};
use crate::verdict::State;
use crate::verdict::pair::PairVerdict;

pub struct VerdictMetrics {
    state: Gauges,
    relative_change: Gauges,
    p_value: Gauges,
    baseline_info: Gauges,
    evaluations_total: Counters,
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
        let pinned = v
            .baseline_pinned_at
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        let reference = v.reference_build.as_deref();
        remove_of_pair(&self.baseline_info, v, |labels| {
            reference.is_none_or(|r| {
                labels.get("version") != Some(&r)
                    || labels.get("pinned_at") != Some(&pinned.as_str())
            })
        });
        if let Some(reference) = reference {
            self.baseline_info
                .set(&[pair[0], pair[1], pair[2], reference, &pinned], 1.0);
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
        for gauges in [&self.relative_change, &self.p_value] {
            remove_of_pair(gauges, v, |labels| {
                !slower
                    .iter()
                    .any(|m| labels.get("metric") == Some(&m.metric.as_str()))
            });
        }
        for m in &slower {
            let labels = [pair[0], pair[1], pair[2], m.metric.as_str()];
            self.relative_change.set(&labels, m.relative_change);
            self.p_value.set(&labels, m.p_adjusted);
        }
    }
}

/// Removes the series of `v`'s pair that `gone` picks, found by their
/// labels: what a verdict no longer shows needs no list of its own.
fn remove_of_pair(gauges: &Gauges, v: &PairVerdict, gone: impl Fn(&HashMap<&str, &str>) -> bool) {
    gauges.family().remove_of_target(&v.target, &|labels| {
        labels.get("model") == Some(&v.model.as_str())
            && labels.get("scenario") == Some(&v.scenario.as_str())
            && gone(labels)
    });
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
