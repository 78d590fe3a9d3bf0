//! The canary verdict during a rollout: while two builds serve in the same
//! runs, the new build's requests are compared with the old build's from
//! the same recent rounds (same time, same load), request by request, with
//! the detector's tests (one-sided Mann-Whitney, Hodges-Lehmann interval,
//! Benjamini-Hochberg), threshold and confirmation rule.

use chrono::{DateTime, Utc};

use super::pair::PairVerdict;
use super::policy::VerdictPolicy;
use super::{DetectorSettings, Evaluation, RunPoint, State, evaluate};
use crate::store::baselines::{Comparison, PairKey, StoredEvaluation};
use crate::store::{Store, StoreError};
use crate::vocabulary::records::SampleRow;

pub use crate::store::baselines::CANARY_BASELINE_ID;

/// What the message says about the rollout besides the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutProgress {
    pub from: String,
    pub to: String,
    /// e.g. "3 of 8 replicas" or "41% of requests".
    pub share: String,
    /// Compare replica runs (one build each) rather than the service's
    /// rounds (both builds in each).
    pub by_replica: bool,
    /// The images of the old and the new build, when they are known:
    /// what tells two builds of one version apart.
    pub from_image: Option<String>,
    pub to_image: Option<String>,
}

/// One request as the detector sees it: its latencies under the `_p50`
/// names, so the detector's median tests compare request distributions.
fn request_point(sample: &SampleRow) -> RunPoint {
    let mut values = Vec::new();
    let mut put = |name: &str, v: Option<f64>| {
        if let Some(v) = v {
            values.push((name.to_owned(), v));
        }
    };
    put("ttft_p50", sample.ttft_s);
    put("tpot_p50", sample.tpot_s);
    put("e2el_p50", sample.e2el_s);
    let itl = (!sample.itls_s.is_empty())
        .then(|| sample.itls_s.iter().sum::<f64>() / sample.itls_s.len() as f64);
    put("itl_p50", itl);
    RunPoint { values, load: None }
}

/// The detector settings for requests: each side needs
/// `min_canary_requests`, and there is no load check: both sides were
/// measured in the same rounds ([`super::load_check::SAME_ROUNDS`]).
fn settings(policy: &VerdictPolicy) -> DetectorSettings {
    DetectorSettings {
        min_candidate_runs: policy.min_canary_requests,
        min_baseline_runs: policy.min_canary_requests,
        load_min_difference: super::load_check::SAME_ROUNDS,
        ..policy.detector.clone()
    }
}

/// `TTFT p50 +38% [+31%, +45%], ...`: the metrics found slower.
fn slower_text(evaluation: &Evaluation) -> String {
    let slower: Vec<String> = evaluation
        .slower()
        .map(|m| {
            let name = m.metric.trim_end_matches("_p50").to_uppercase();
            format!(
                "{name} p50 {:+.0}% [{:+.0}%, {:+.0}%]",
                m.relative_change * 100.0,
                m.ci_low * 100.0,
                m.ci_high * 100.0
            )
        })
        .collect();
    slower.join(", ")
}

/// Judges the new build of a rollout against the old one in the same
/// recent rounds, confirms it against the earlier canary evaluations and
/// stores it. `None` when the two builds served in none of those rounds
/// (one server upgraded, or a fleet switched at once): there is nothing
/// to set side by side.
pub fn evaluate_canary(
    store: &Store,
    policy: &VerdictPolicy,
    key: &PairKey,
    rollout: &RolloutProgress,
    now: DateTime<Utc>,
) -> Result<Option<PairVerdict>, StoreError> {
    let (old, new) = store.canary_samples(
        key,
        &rollout.from,
        &rollout.to,
        policy.canary_window,
        rollout.by_replica,
        &policy.warmup(),
    )?;
    if old.is_empty() || new.is_empty() {
        return Ok(None);
    }
    let baseline: Vec<RunPoint> = old.iter().map(request_point).collect();
    let candidate: Vec<RunPoint> = new.iter().map(request_point).collect();
    let mut evaluation = evaluate(&baseline, &candidate, &settings(policy));
    // The canary counts requests, not runs, in every reason that quotes
    // this evaluation's (a held regression's too).
    evaluation.reason = evaluation
        .reason
        .replace("too few runs:", "too few requests:");
    let of = Comparison {
        build: &rollout.to,
        baseline_id: CANARY_BASELINE_ID,
        canary_against: None,
    };
    // Requests of a few rounds, not runs with a history of spells: the
    // canary keeps the plain confirmation.
    let confirmed =
        policy.confirm_stored(store, key, &of, &evaluation, policy.detector.confirm_needed)?;
    let image = |i: &Option<String>| {
        i.as_ref()
            .map(|i| format!(" (image {i})"))
            .unwrap_or_default()
    };
    let progress = format!(
        "rollout of {}{} in progress ({})",
        rollout.to,
        image(&rollout.to_image),
        rollout.share
    );
    let against = format!(
        "against {}{} measured at the same time",
        rollout.from,
        image(&rollout.from_image)
    );
    let reason = match confirmed.state {
        // Held by the evaluations before (`VerdictPolicy::confirm`): this one
        // flagged nothing, the confirmation says why it is still one.
        State::Regression if !evaluation.flagged() => {
            format!("{progress}: {} {against}", confirmed.reason)
        }
        State::Regression => format!("{progress}: {} {against}", slower_text(&evaluation)),
        State::Confirming => format!(
            "{progress}: {} {against} ({})",
            slower_text(&evaluation),
            confirmed.reason.split(':').next().unwrap_or_default()
        ),
        State::Inconclusive => format!("{progress}: {}", evaluation.reason),
        State::Ok => format!("{progress}: no metric slower beyond the threshold {against}"),
    };
    let verdict = PairVerdict {
        drift: false,
        target: key.target.clone(),
        model: key.model.clone(),
        scenario: key.scenario.clone(),
        build: rollout.to.clone(),
        reference_build: Some(rollout.from.clone()),
        baseline_id: None,
        baseline_pinned_at: None,
        candidate_runs: new.len(),
        baseline_runs: old.len(),
        state: confirmed.state,
        reason,
        evaluation,
        at: now,
    };
    // The last step that can fail: a try the store refused stored nothing,
    // and `filed::judge_from` judges it again whole.
    store.insert_evaluation(&StoredEvaluation {
        key: key.clone(),
        build: rollout.to.clone(),
        baseline_id: CANARY_BASELINE_ID,
        at: now,
        flagged: verdict.evaluation.flagged(),
        state: verdict.state.as_str().to_owned(),
        detail: serde_json::to_string(&verdict)?,
    })?;
    Ok(Some(verdict))
}
