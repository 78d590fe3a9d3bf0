//! Service-level objectives measured by the probes: which requests and
//! heartbeats an objective counts and which of them are good (exact
//! thresholds, never histogram buckets), and what the counts say: the SLI
//! over a window, the error budget left and the burn rate, computed the
//! way the generated Prometheus rules compute them. Pure: the daemon
//! counts, the store keeps the counts, the pages and the rules read them.

pub mod rule_tests;
pub mod rules;

use crate::config::SloConfig;
use crate::config::slos::{LatencyMetric, Sli};
use crate::vocabulary::Outcome;
use crate::vocabulary::records::{RunOutcome, RunRecord, SampleRow};

/// Good and total events of one objective over some span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Tally {
    pub good: u64,
    pub total: u64,
}

impl Tally {
    pub fn add(&mut self, other: Tally) {
        self.good += other.good;
        self.total += other.total;
    }

    pub fn bad(&self) -> u64 {
        self.total.saturating_sub(self.good)
    }

    /// The good share; `None` without events.
    pub fn sli(&self) -> Option<f64> {
        (self.total > 0).then(|| self.good as f64 / self.total as f64)
    }

    /// The bad share; `None` without events.
    pub fn error_ratio(&self) -> Option<f64> {
        (self.total > 0).then(|| self.bad() as f64 / self.total as f64)
    }

    /// How many times faster than sustainable the budget burns: the bad
    /// share over the budget (1: the whole budget exactly over the window).
    pub fn burn_rate(&self, budget: f64) -> Option<f64> {
        Some(self.error_ratio()? / budget)
    }

    /// The share of the window's budget not yet spent (below 0: overspent).
    pub fn budget_remaining(&self, budget: f64) -> Option<f64> {
        Some(1.0 - self.error_ratio()? / budget)
    }
}

/// Whether one request met the SLI: `None` when it does not count (our
/// own resources failed it, not the target).
pub fn judge(sli: &Sli, sample: &SampleRow) -> Option<bool> {
    if sample.outcome == Outcome::Local {
        return None;
    }
    if !sample.outcome.is_ok() {
        return Some(false);
    }
    Some(match sli {
        Sli::Success | Sli::Liveness => true,
        Sli::Latency { metric, threshold } => {
            let limit = threshold.as_secs_f64();
            // A latency the request has none of (TPOT or ITL of a
            // one-token answer) cannot miss its threshold.
            let value = match metric {
                LatencyMetric::Ttft => sample.ttft_s,
                LatencyMetric::Tpot => sample.tpot_s,
                LatencyMetric::E2el => sample.e2el_s,
                LatencyMetric::ItlP99 => (!sample.itls_s.is_empty()).then(|| {
                    crate::stats::percentile_sorted(&crate::stats::sorted(&sample.itls_s), 99.0)
                }),
            };
            value.is_none_or(|v| v <= limit)
        }
    })
}

/// What one filed run counts toward `slo`: its requests that it covers
/// (by scenario and by the replica each reached). A run that sent no
/// request because the target failed it (unreachable, the model missing)
/// is one bad request: an outage must burn the budget. A run cut at
/// shutdown or refused by our own configuration counts nothing.
/// `replica_address` is the probed replica's `host:port` when its label is
/// a pod's name.
pub fn tally_run(slo: &SloConfig, run: &RunRecord, replica_address: Option<&str>) -> Tally {
    let mut tally = Tally::default();
    if slo.sli.counts_heartbeats()
        || !slo.covers_target(&run.target)
        || !slo.covers_scenario(&run.scenario)
        || matches!(run.outcome, RunOutcome::Aborted | RunOutcome::Config)
    {
        return tally;
    }
    if run.samples.is_empty() {
        if run.outcome != RunOutcome::Ok
            && run.outcome != RunOutcome::Failed(Outcome::Local)
            && slo.covers_replica(&run.replica, replica_address, None)
        {
            tally.total = 1;
        }
        return tally;
    }
    for sample in &run.samples {
        if !slo.covers_replica(&run.replica, replica_address, sample.served_by.as_deref()) {
            continue;
        }
        if let Some(good) = judge(&slo.sli, sample) {
            tally.total += 1;
            tally.good += u64::from(good);
        }
    }
    tally
}

/// What one heartbeat counts toward `slo`: one event, good when the
/// target (or replica, at `replica_address` when named otherwise)
/// generates after it.
pub fn tally_heartbeat(
    slo: &SloConfig,
    target: &str,
    (replica, replica_address): (&str, Option<&str>),
    generating: bool,
) -> Tally {
    if !slo.sli.counts_heartbeats()
        || !slo.covers_target(target)
        || !slo.covers_replica(replica, replica_address, None)
    {
        return Tally::default();
    }
    Tally {
        good: u64::from(generating),
        total: 1,
    }
}

pub use crate::config::slos::prometheus_duration;

#[cfg(test)]
mod tests;
