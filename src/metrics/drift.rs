//! The drift canary's series: per pair, how the latest answers compare
//! with the build served before (the verdict, prompts parted early, the
//! log-probability shift) and with the build's own earlier answers.

use std::sync::Arc;

use super::page::{Gauges, Page};
use super::stale::ModelSeries;
use super::{MetricsError, PAIR};
use crate::verdict::drift::DriftReport;

pub struct DriftMetrics {
    verdict: Gauges,
    prompts: Gauges,
    diverged_early: Gauges,
    logprob_shift: Gauges,
    self_diverged: Gauges,
    self_logprob_shift: Gauges,
}

impl DriftMetrics {
    pub fn new(page: &Page, models: &Arc<ModelSeries>) -> Result<Self, MetricsError> {
        let m = DriftMetrics {
            verdict: page.gauges(
                "sentinel_drift",
                "1 when the build answers the drift canary's prompts differently from the build served before it, 0 when not.",
                PAIR,
            )?,
            prompts: page.gauges(
                "sentinel_drift_prompts",
                "Drift canary prompts compared with the build served before.",
                PAIR,
            )?,
            diverged_early: page.gauges(
                "sentinel_drift_diverged_early_prompts",
                "Drift canary prompts whose greedy answer parts from the previous build's before the detector's drift_position.",
                PAIR,
            )?,
            logprob_shift: page.gauges(
                "sentinel_drift_logprob_shift",
                "Mean absolute log-probability difference from the previous build over the tokens the answers share.",
                PAIR,
            )?,
            self_diverged: page.gauges(
                "sentinel_drift_self_diverged_prompts",
                "Drift canary prompts answered differently from the same build's previous run (a server that is not deterministic).",
                PAIR,
            )?,
            self_logprob_shift: page.gauges(
                "sentinel_drift_self_logprob_shift",
                "Mean absolute log-probability difference from the same build's previous run: the noise floor for drift_logprob_shift.",
                PAIR,
            )?,
        };
        for g in [
            &m.verdict,
            &m.prompts,
            &m.diverged_early,
            &m.logprob_shift,
            &m.self_diverged,
            &m.self_logprob_shift,
        ] {
            models.add(g);
        }
        Ok(m)
    }

    /// The comparison with the build served before.
    pub fn set_against_previous(&self, pair: &[&str; 3], report: &DriftReport) {
        self.verdict.set(pair, if report.drift { 1.0 } else { 0.0 });
        self.prompts.set(pair, report.prompts.len() as f64);
        self.diverged_early.set(pair, report.diverged_early as f64);
        self.logprob_shift.set(pair, report.logprob_shift);
    }

    /// The comparison with the same build's previous answers.
    pub fn set_against_itself(&self, pair: &[&str; 3], report: &DriftReport) {
        self.self_diverged.set(pair, report.diverged as f64);
        self.self_logprob_shift.set(pair, report.logprob_shift);
    }
}
