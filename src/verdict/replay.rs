//! Replay: runs as the daemon filed them, oldest first, passed through the
//! daemon's own filing and judging code (an in-memory store, the
//! [`super::filed`] rule) to give the verdicts the daemon gave, or would
//! give under another `[detector]` section.

use std::collections::{HashMap, HashSet};

use chrono::Duration as ChronoDuration;

use super::filed::{self, FiledRun};
use super::pair::PairVerdict;
use super::policy::VerdictPolicy;
use crate::store::baselines::PairKey;
use crate::store::fleet::{FleetBuild, FleetScope};
use crate::store::{Store, StoreError};
use crate::vocabulary::records::{RunOutcome, RunRecord};

/// One verdict replay gave, and the run it followed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Replayed {
    /// The id the run had where it came from (its store or its JSON).
    pub after_run: Option<i64>,
    pub replica: String,
    pub verdict: PairVerdict,
}

/// Where one target stands, as the daemon's target states keep it.
#[derive(Default)]
struct TargetView {
    rollout: Option<(String, String)>,
    fleet: Vec<FleetBuild>,
    /// Replicas by the index of the target's run that last probed them.
    replicas: HashMap<String, u64>,
    runs: u64,
}

/// Files runs one by one and judges them as the daemon does.
pub struct Replayer {
    store: Store,
    policy: VerdictPolicy,
    /// Scenarios judged by their answers, not their latency.
    drift_scenarios: HashSet<String>,
    targets: HashMap<String, TargetView>,
    /// The records of one run (one per build that served it) wait here
    /// until a record of another run arrives: they are filed together.
    pending: Vec<RunRecord>,
}

impl Replayer {
    /// A replayer filing into memory: for a few thousand runs at most
    /// (each keeps its requests there, about 10 KiB a run).
    pub fn new(
        policy: VerdictPolicy,
        drift_scenarios: HashSet<String>,
    ) -> Result<Self, StoreError> {
        Ok(Self::with_store(
            Store::in_memory()?,
            policy,
            drift_scenarios,
        ))
    }

    /// A replayer filing into `store`, which should be empty: a scratch
    /// file keeps memory bounded however many runs are replayed.
    pub fn with_store(
        store: Store,
        policy: VerdictPolicy,
        drift_scenarios: HashSet<String>,
    ) -> Self {
        Replayer {
            store,
            policy,
            drift_scenarios,
            targets: HashMap::new(),
            pending: Vec::new(),
        }
    }

    /// Takes the next run (oldest first); returns the verdicts of the run
    /// before it once it is complete.
    pub fn push(&mut self, run: RunRecord) -> Result<Vec<Replayed>, StoreError> {
        let same_run = self.pending.first().is_some_and(|first| {
            first.target == run.target
                && first.replica == run.replica
                && first.scenario == run.scenario
                && first.started_at == run.started_at
        });
        let done = if same_run { Vec::new() } else { self.flush()? };
        self.pending.push(run);
        Ok(done)
    }

    /// Files and judges the run still waiting, if any.
    pub fn flush(&mut self) -> Result<Vec<Replayed>, StoreError> {
        let records = std::mem::take(&mut self.pending);
        let Some(first) = records.first() else {
            return Ok(Vec::new());
        };
        let (target, replica) = (first.target.clone(), first.replica.clone());
        let after_run = records.iter().filter_map(|r| r.id).max();
        let ended = records
            .iter()
            .map(|r| {
                // A recorded length past what a time can hold is its start.
                ChronoDuration::try_milliseconds((r.duration_s * 1e3) as i64)
                    .and_then(|d| r.started_at.checked_add_signed(d))
                    .unwrap_or(r.started_at)
            })
            .max()
            .unwrap_or(first.started_at);
        let view = self.targets.entry(target.clone()).or_default();
        view.runs += 1;
        if !replica.is_empty() {
            view.replicas.insert(replica.clone(), view.runs);
        }
        // The replicas "discovered now": those probed within the last
        // rounds of every replica the window spans.
        let horizon = (self.policy.canary_window.max(1) * view.replicas.len().max(1)) as u64;
        let now_runs = view.runs;
        view.replicas
            .retain(|_, last| now_runs.saturating_sub(*last) <= horizon);
        let scope = FleetScope {
            window: self.policy.canary_window,
            replicas: view.replicas.keys().cloned().collect(),
            ..FleetScope::default()
        }
        .under(&self.policy);
        let mut to_judge = Vec::new();
        for record in &records {
            let (_, observed) = self.store.insert_run_filed(record, &scope)?;
            if let Some(change) = &observed.change
                && let Some(from) = &change.from_build
            {
                view.rollout = Some((from.clone(), change.to_build.clone()));
            }
            if record.summary.completed > 0 {
                view.fleet = observed.fleet.clone();
                if observed.rollout_ended.is_some() {
                    view.rollout = None;
                }
            }
            if record.outcome == RunOutcome::Ok && !self.drift_scenarios.contains(&record.scenario)
            {
                to_judge.push((
                    PairKey {
                        target: record.target.clone(),
                        model: record.model.clone(),
                        scenario: record.scenario.clone(),
                    },
                    observed.build.clone(),
                ));
            }
        }
        let run = FiledRun {
            to_judge,
            replica_run: !replica.is_empty(),
            by_replica: !scope.replicas.is_empty(),
            rollout: view.rollout.clone(),
            fleet: view.fleet.clone(),
        };
        let verdicts = filed::judge(&self.store, &self.policy, run, ended)?;
        Ok(verdicts
            .into_iter()
            .map(|verdict| Replayed {
                after_run,
                replica: replica.clone(),
                verdict,
            })
            .collect())
    }
}

/// One line of a runs file: a run object as `/api/v1/runs` gives it, with
/// its requests when the file was written by `export` (a rollout's canary
/// compares requests; without them it has none to compare).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunLine {
    #[serde(flatten)]
    pub run: RunRecord,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<crate::vocabulary::records::SampleRow>,
}

impl RunLine {
    pub fn into_record(self) -> RunRecord {
        RunRecord {
            samples: self.samples,
            ..self.run
        }
    }
}

/// What replay prints for one evaluation: the verdict in a flat form.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayLine {
    pub after_run: Option<i64>,
    pub at: chrono::DateTime<chrono::Utc>,
    pub target: String,
    pub model: String,
    pub scenario: String,
    pub replica: String,
    pub build: String,
    pub reference_build: Option<String>,
    pub state: super::State,
    pub reason: String,
    pub changes: Vec<MetricChange>,
}

/// One metric's change with its interval, relative to the reference.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MetricChange {
    pub metric: String,
    pub change: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_adjusted: f64,
    pub flagged: bool,
}

impl From<&Replayed> for ReplayLine {
    fn from(r: &Replayed) -> Self {
        let v = &r.verdict;
        ReplayLine {
            after_run: r.after_run,
            at: v.at,
            target: v.target.clone(),
            model: v.model.clone(),
            scenario: v.scenario.clone(),
            replica: r.replica.clone(),
            build: v.build.clone(),
            reference_build: v.reference_build.clone(),
            state: v.state,
            reason: v.reason.clone(),
            changes: v
                .evaluation
                .metrics
                .iter()
                .map(|m| MetricChange {
                    metric: m.metric.clone(),
                    change: m.relative_change,
                    ci_low: m.ci_low,
                    ci_high: m.ci_high,
                    p_adjusted: m.p_adjusted,
                    flagged: m.flagged && m.alerting,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod redeploy_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod rollout_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upgrade_tests;
