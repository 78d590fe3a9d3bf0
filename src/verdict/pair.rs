//! From stored runs to a stored verdict: forms baselines as runs arrive,
//! judges the comparison the verdict policy picks, and confirms it against
//! the stored earlier evaluations, which are kept so a restart loses
//! nothing.

use chrono::{DateTime, Utc};

use super::policy::{VerdictPolicy, reference};
use super::{Evaluation, State};
use crate::store::baselines::{Comparison, PairKey, StoredEvaluation};
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
    /// Why: the metrics found slower and how far confirmed, or why the
    /// verdict could not be reached.
    #[serde(default)]
    pub reason: String,
    pub evaluation: Evaluation,
    pub at: DateTime<Utc>,
    /// A drift canary's verdict: the build answers differently (the reason
    /// says how), not a latency regression.
    #[serde(default)]
    pub drift: bool,
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
        self.evaluation.slower().collect()
    }

    pub fn faster(&self) -> Vec<&super::MetricResult> {
        self.evaluation
            .metrics
            .iter()
            .filter(|m| m.improvement)
            .collect()
    }
}

#[cfg(test)]
impl PairVerdict {
    /// A verdict of build 0.33.0 against 0.32.0's baseline, for tests.
    pub(crate) fn example(
        target: &str,
        scenario: &str,
        state: State,
        metrics: Vec<super::MetricResult>,
    ) -> Self {
        PairVerdict {
            drift: false,
            target: target.into(),
            model: "m".into(),
            scenario: scenario.into(),
            build: "0.33.0".into(),
            reference_build: Some("0.32.0".into()),
            baseline_id: Some(1),
            baseline_pinned_at: None,
            candidate_runs: 12,
            baseline_runs: 30,
            state,
            reason: String::new(),
            evaluation: Evaluation {
                state,
                reason: String::new(),
                metrics,
                decisive: None,
            },
            at: DateTime::UNIX_EPOCH,
        }
    }
}

#[cfg(test)]
impl super::MetricResult {
    /// `metric` `change` slower than a 100 ms baseline (its interval 3
    /// points either side, adjusted p 1e-5), flagged or not, for tests.
    pub(crate) fn example(metric: &str, change: f64, flagged: bool) -> Self {
        super::MetricResult {
            metric: metric.into(),
            baseline_median: 0.1,
            candidate_median: 0.1 * (1.0 + change),
            relative_change: change,
            ci_low: change - 0.03,
            ci_high: change + 0.03,
            p_value: 1e-6,
            p_adjusted: 1e-5,
            flagged,
            improvement: false,
            alerting: true,
            runs: 12,
            at_load: None,
        }
    }
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
    store.form_baseline(key, build, &cfg.warmup(), cfg.baseline_runs, now)?;
    let comparison = cfg.latest(store, key, build)?;
    let evaluation =
        comparison.evaluate(&cfg.detector_for(comparison.judged, comparison.runs_since_warmup));
    let reference = comparison.reference;
    let confirmed = match &reference {
        Some(b) => {
            // An upgrade's confirmation counts its rollout's canary
            // evaluations against the same old build: at the rollout's
            // end this comparison takes over from the canary.
            let of = Comparison {
                build,
                baseline_id: b.id,
                canary_against: (b.build != build).then_some(b.build.as_str()),
            };
            let needed = cfg.confirm_needed(comparison.judged, comparison.runs_since_warmup);
            cfg.confirm_stored(store, key, &of, &evaluation, needed)?
        }
        // The evaluation's own "too few runs" would count a candidate
        // window against an empty baseline; the reader wants to know how
        // far the baseline is from forming.
        None => {
            let collected = store
                .count_ok_runs_after_warmup(key, build, &cfg.warmup(), None)?
                .min(cfg.baseline_runs);
            super::confirmation::Confirmed {
                state: State::Inconclusive,
                reason: format!(
                    "no baseline yet: {collected} of the {} completed runs past warm-up (the first {} of the build, of each deployment and of each server start) that {build}'s baseline forms from",
                    cfg.baseline_runs, cfg.warmup_runs
                ),
            }
        }
    };
    let state = confirmed.state;
    let mut reason = confirmed.reason;
    // A change within one build says so, and since when: the reader must
    // not look for an upgrade that did not happen.
    if reference.as_ref().is_some_and(|b| b.build == build)
        && matches!(state, State::Confirming | State::Regression)
        && let Some(since) = change_start(&evaluation, &comparison.candidate)
    {
        reason = format!(
            "{reason}; since {} UTC, same build {build} (not an upgrade)",
            since.format("%H:%M")
        );
    }
    let verdict = PairVerdict {
        drift: false,
        target: key.target.clone(),
        model: key.model.clone(),
        scenario: key.scenario.clone(),
        build: build.to_owned(),
        reference_build: reference.as_ref().map(|b| b.build.clone()),
        baseline_id: reference.as_ref().map(|b| b.id),
        baseline_pinned_at: reference.as_ref().and_then(|b| b.pinned_at),
        candidate_runs: comparison.candidate.len(),
        baseline_runs: comparison.baseline.len(),
        state,
        reason,
        evaluation,
        at: now,
    };
    // The last step that can fail: a try the store refused stored nothing,
    // and `filed::judge_from` judges the pair again whole.
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

/// When the change within a build began: for the metric found most
/// slower, the candidate run after which the runs' excess over halfway
/// to the slower level accumulates (the CUSUM estimate of an upward step).
/// Runs compared at the baseline's load are put there first, as the test
/// put them, so that a stretch under more load is not taken for the step.
fn change_start(
    evaluation: &super::Evaluation,
    candidate: &[crate::vocabulary::records::RunRecord],
) -> Option<DateTime<Utc>> {
    let worst = evaluation
        .slower()
        .max_by(|a, b| a.relative_change.total_cmp(&b.relative_change))?;
    let values: Vec<(DateTime<Utc>, f64)> = candidate
        .iter()
        .filter_map(|r| {
            let point = super::policy::run_point(r);
            let value = point.get(&worst.metric)?;
            let value = match worst.at_load {
                Some(at_load) => at_load.value_at_reference(value, point.load?),
                None => value,
            };
            Some((r.started_at, value))
        })
        .collect();
    // Runs above halfway between the baseline and the slower level push
    // the sum up, runs below it down: it is lowest where the step began.
    let split = worst.baseline_median * (1.0 + worst.relative_change / 2.0);
    let mut sum = 0.0;
    let mut lowest = (0.0, values.first()?.0);
    for (at, v) in &values {
        if sum < lowest.0 {
            lowest = (sum, *at);
        }
        sum += v - split;
    }
    Some(lowest.1)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::MetricResult;
    use crate::verdict::load_covariate::AtLoad;
    use crate::vocabulary::records::{RunOutcome, RunRecord, ServerLoad};
    use chrono::TimeZone;

    /// A run at minute `i` with TTFT p50 `ttft` seconds under `load`
    /// running requests.
    fn run(i: i64, ttft: f64, load: f64) -> RunRecord {
        let at =
            Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, 0).unwrap() + chrono::Duration::minutes(i);
        let mut r = RunRecord::failed("t", "s", "m", at, 1.0, RunOutcome::Ok, String::new());
        r.summary.ttft.count = 8;
        r.summary.ttft.p50 = ttft;
        r.load_before = Some(ServerLoad {
            running: Some(load),
            ..ServerLoad::default()
        });
        r
    }

    fn slower_ttft(at_load: Option<AtLoad>) -> Evaluation {
        Evaluation {
            state: State::Ok,
            reason: "slower: ttft_p50".into(),
            metrics: vec![MetricResult {
                metric: "ttft_p50".into(),
                baseline_median: 0.1,
                candidate_median: 0.13,
                relative_change: 0.3,
                ci_low: 0.2,
                ci_high: 0.4,
                p_value: 1e-6,
                p_adjusted: 1e-5,
                flagged: true,
                improvement: false,
                alerting: true,
                runs: 8,
                at_load,
            }],
            decisive: None,
        }
    }

    /// Four runs under load 6 that the load explains (TTFT x1.1 per
    /// request), then a real +30% at the baseline's load 1: the step
    /// starts at the fifth run once runs are put at the baseline's load,
    /// at the first when they are read as measured.
    #[test]
    fn a_stretch_under_more_load_is_not_taken_for_the_start_of_the_step() {
        let per_request = 1.1f64.ln();
        let loaded = 0.1 * (per_request * 5.0).exp();
        let candidate: Vec<RunRecord> = (0..12)
            .map(|i| match i {
                0..4 => run(i, loaded, 6.0),
                _ => run(i, 0.13, 1.0),
            })
            .collect();
        let at_load = AtLoad {
            reference: 1.0,
            per_request,
        };
        let since = change_start(&slower_ttft(Some(at_load)), &candidate).unwrap();
        assert_eq!(since, candidate[4].started_at);
        let as_measured = change_start(&slower_ttft(None), &candidate).unwrap();
        assert_eq!(as_measured, candidate[0].started_at);
    }
}
