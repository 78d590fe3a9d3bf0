//! From stored runs to a verdict: forms baselines as runs arrive, picks
//! the reference a candidate is compared with, runs the detector on the
//! candidate window and confirms it against the stored earlier
//! evaluations, which are kept so a restart loses nothing.
//!
//! The reference of a (target, model, scenario) running build B is, in
//! order: the pinned baseline; else the baseline of the newest build the
//! target ran before B (an upgrade verdict); else B's own baseline (drift
//! within one version). The candidate is B's newest completed runs after
//! its warm-up and outside the reference.

use chrono::{DateTime, Utc};

use super::{Evaluation, RunPoint, State, confirm, evaluate};
use crate::detect::policy::VerdictPolicy;
use crate::run::RunRecord;
use crate::store::baselines::{Baseline, PairKey, StoredEvaluation};
use crate::store::{Store, StoreError};

/// One (target, model, scenario)'s verdict after an evaluation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PairVerdict {
    pub target: String,
    pub model: String,
    pub scenario: String,
    /// The build judged.
    pub build: String,
    /// The build of the reference baseline, when there is one.
    pub reference_build: Option<String>,
    pub baseline_id: Option<i64>,
    pub baseline_pinned_at: Option<DateTime<Utc>>,
    pub candidate_runs: usize,
    pub baseline_runs: usize,
    /// Confirmed state (what alerts follow).
    pub state: State,
    pub evaluation: Evaluation,
    pub at: DateTime<Utc>,
}

impl PairVerdict {
    pub fn key(&self) -> PairKey {
        PairKey {
            target: self.target.clone(),
            model: self.model.clone(),
            scenario: self.scenario.clone(),
        }
    }

    /// A comparison across versions rather than drift within one.
    pub fn is_upgrade(&self) -> bool {
        self.reference_build
            .as_deref()
            .is_some_and(|r| r != self.build)
    }

    /// The alerting metrics this evaluation found slower.
    pub fn slower(&self) -> Vec<&super::MetricResult> {
        self.evaluation
            .metrics
            .iter()
            .filter(|m| m.flagged && m.alerting)
            .collect()
    }

    pub fn faster(&self) -> Vec<&super::MetricResult> {
        self.evaluation
            .metrics
            .iter()
            .filter(|m| m.improvement)
            .collect()
    }
}

/// The detector's view of a run: per-run p50/p90/p99 of each latency and
/// the background load (running + waiting, before and after, averaged).
pub fn run_point(run: &RunRecord) -> RunPoint {
    let s = &run.summary;
    let mut values = Vec::with_capacity(12);
    for (name, l) in [
        ("ttft", &s.ttft),
        ("tpot", &s.tpot),
        ("itl", &s.itl),
        ("e2el", &s.e2el),
    ] {
        if l.count > 0 {
            values.push((format!("{name}_p50"), l.p50));
            values.push((format!("{name}_p90"), l.p90));
            values.push((format!("{name}_p99"), l.p99));
        }
    }
    let loads: Vec<f64> = [run.load_before, run.load_after]
        .iter()
        .flatten()
        .filter_map(|l| l.busy())
        .collect();
    RunPoint {
        values,
        load: (!loads.is_empty()).then(|| crate::stats::mean(&loads)),
    }
}

/// The baseline a candidate build is compared with; see the module docs.
pub fn reference(
    store: &Store,
    key: &PairKey,
    build: &str,
) -> Result<Option<Baseline>, StoreError> {
    if let Some(pinned) = store.pinned_baseline(key)? {
        return Ok(Some(pinned));
    }
    let mut seen = vec![build.to_owned()];
    for change in store.version_changes(&key.target, &key.model)? {
        for b in [Some(change.to_build), change.from_build]
            .into_iter()
            .flatten()
        {
            if seen.contains(&b) {
                continue;
            }
            if let Some(baseline) = store.baseline(key, &b)? {
                return Ok(Some(baseline));
            }
            seen.push(b);
        }
    }
    store.baseline(key, build)
}

/// Forms `build`'s baseline when it can, evaluates the pair and stores the
/// evaluation; without a reference yet the verdict is inconclusive.
pub fn evaluate_pair(
    store: &Store,
    cfg: &VerdictPolicy,
    key: &PairKey,
    build: &str,
    now: DateTime<Utc>,
) -> Result<PairVerdict, StoreError> {
    store.form_baseline(key, build, cfg.warmup_runs, cfg.baseline_runs, now)?;
    let reference = reference(store, key, build)?;
    let (baseline_runs, exclude) = match &reference {
        Some(b) => (store.runs_by_id(&b.run_ids)?, b.run_ids.clone()),
        None => (Vec::new(), Vec::new()),
    };
    // The newest completed runs after the build's warm-up, outside the reference.
    let candidate =
        store.newest_ok_runs(key, build, cfg.warmup_runs, &exclude, cfg.candidate_window)?;
    let base_points: Vec<RunPoint> = baseline_runs.iter().map(run_point).collect();
    let cand_points: Vec<RunPoint> = candidate.iter().map(run_point).collect();
    let evaluation = evaluate(&base_points, &cand_points, &cfg.detector);
    let state = match &reference {
        Some(b) => {
            let window = cfg.detector.confirm_window.saturating_sub(1);
            let earlier = store.recent_flags(key, build, b.id, window)?;
            confirm(&evaluation, &earlier, &cfg.detector)
        }
        None => State::Inconclusive,
    };
    let verdict = PairVerdict {
        target: key.target.clone(),
        model: key.model.clone(),
        scenario: key.scenario.clone(),
        build: build.to_owned(),
        reference_build: reference.as_ref().map(|b| b.build.clone()),
        baseline_id: reference.as_ref().map(|b| b.id),
        baseline_pinned_at: reference.as_ref().and_then(|b| b.pinned_at),
        candidate_runs: candidate.len(),
        baseline_runs: baseline_runs.len(),
        state,
        evaluation,
        at: now,
    };
    if let Some(b) = &reference {
        store.insert_evaluation(&StoredEvaluation {
            key: key.clone(),
            build: build.to_owned(),
            baseline_id: b.id,
            at: now,
            flagged: verdict.evaluation.flagged(),
            state: state.as_str().to_owned(),
            detail: serde_json::to_string(&verdict)?,
        })?;
    }
    Ok(verdict)
}

/// Scenarios of a target still short of runs for the verdict on its
/// current build after a version change, fewest runs first. Rounds stop
/// for a scenario once it has enough completed runs, or after twice that
/// many attempts (a server that keeps failing is not hammered).
pub fn pending_upgrade_runs(
    store: &Store,
    cfg: &VerdictPolicy,
    target: &str,
    model: &str,
    scenarios: &[String],
) -> Result<Vec<String>, StoreError> {
    let Some(latest) = store.latest_version_change(target, model)? else {
        return Ok(Vec::new());
    };
    if latest.from_build.is_none() {
        return Ok(Vec::new());
    }
    let need = cfg.runs_for_verdict();
    let mut short = Vec::new();
    for scenario in scenarios {
        let key = PairKey {
            target: target.to_owned(),
            model: model.to_owned(),
            scenario: scenario.clone(),
        };
        let has_reference = reference(store, &key, &latest.to_build)?
            .is_some_and(|b| b.build != latest.to_build || b.pinned_at.is_some());
        if !has_reference {
            continue;
        }
        let ok = store.count_ok_runs(&key, &latest.to_build)?;
        let attempts = store.count_build_runs(&key, &latest.to_build)?;
        if ok < need && attempts < 2 * need {
            short.push((ok, scenario.clone()));
        }
    }
    short.sort();
    Ok(short.into_iter().map(|(_, s)| s).collect())
}
