//! The drift canary's side of filing: a run's greedy answers against the
//! build served before (the verdict, exported and notified like a
//! regression) and against the build's own earlier answers (a server that
//! is not deterministic).

use chrono::{DateTime, Utc};

use super::verdicts::Verdicts;
use crate::config::Config;
use crate::store::answers::AnswersOf;
use crate::store::baselines::PairKey;
use crate::verdict::drift::{self, DriftReport};
use crate::verdict::pair::PairVerdict;
use crate::verdict::{Evaluation, State};
use crate::vocabulary::records::RunRecord;

/// Compares the answers of the run filed as `run_id` under `build`.
pub async fn judge(
    verdicts: &Verdicts,
    config: &Config,
    record: &RunRecord,
    run_id: i64,
    build: &str,
) {
    let key = PairKey {
        target: record.target.clone(),
        model: record.model.clone(),
        scenario: record.scenario.clone(),
    };
    let pair = [
        key.target.as_str(),
        key.model.as_str(),
        key.scenario.as_str(),
    ];
    let thresholds = config.verdict_policy.drift;
    let (k, b) = (key.clone(), build.to_owned());
    let references = verdicts
        .store
        .call_or_none(move |s| {
            Ok((
                s.answers(&k, AnswersOf::Build(&b), run_id)?,
                s.answers(&k, AnswersOf::OtherThan(&b), run_id)?,
            ))
        })
        .await;
    let Some((own, previous)) = references else {
        return;
    };
    if let Some((_, own)) = own {
        let report = drift::compare(&own, &record.answers, &thresholds);
        verdicts.metrics.drift.set_against_itself(&pair, &report);
        let mut said = verdicts
            .nondeterministic
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = (key.clone(), build.to_owned());
        let change = self_divergence_change(&mut said, entry, &report);
        if change == Some(true) {
            tracing::warn!(
                target = %key.target, scenario = %key.scenario, build,
                diverged = report.diverged, prompts = report.prompts.len(),
                "the same build answered the drift canary differently: the server is not deterministic (said once; sentinel_drift_self_diverged_prompts follows it)"
            );
        } else if change == Some(false) {
            tracing::info!(
                target = %key.target, scenario = %key.scenario, build,
                "the build answers the drift canary as it did before again"
            );
        }
    }
    let Some((reference_build, previous)) = previous else {
        return;
    };
    let report = drift::compare(&previous, &record.answers, &thresholds);
    verdicts.metrics.drift.set_against_previous(&pair, &report);
    let now = verdicts.clock.now();
    verdicts.tell(verdict_of(key, build, reference_build, &report, now));
}

/// Whether a run's answers against its own build's earlier ones change
/// what is known of `entry`: `Some(true)` when it starts answering
/// differently (said once, however many runs follow), `Some(false)` when
/// it answers as before again, `None` otherwise.
fn self_divergence_change(
    said: &mut std::collections::HashSet<(PairKey, String)>,
    entry: (PairKey, String),
    report: &DriftReport,
) -> Option<bool> {
    if report.diverged > 0 {
        said.insert(entry).then_some(true)
    } else if report.judged() && said.remove(&entry) {
        Some(false)
    } else {
        None
    }
}

/// The comparison with the previous build as a verdict, notified like a
/// regression's.
fn verdict_of(
    key: PairKey,
    build: &str,
    reference_build: String,
    report: &DriftReport,
    at: DateTime<Utc>,
) -> PairVerdict {
    let state = if !report.judged() {
        State::Inconclusive
    } else if report.drift {
        State::Regression
    } else {
        State::Ok
    };
    let reason = report.sentence(build);
    PairVerdict {
        drift: true,
        target: key.target,
        model: key.model,
        scenario: key.scenario,
        build: build.to_owned(),
        reference_build: Some(reference_build),
        baseline_id: None,
        baseline_pinned_at: None,
        candidate_runs: 1,
        baseline_runs: 1,
        state,
        reason: reason.clone(),
        evaluation: Evaluation {
            state,
            reason,
            metrics: Vec::new(),
            decisive: None,
        },
        at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::drift::{Answer, DriftThresholds};

    #[test]
    fn a_canary_that_compared_nothing_is_inconclusive() {
        let answer = |prompt| Answer {
            prompt,
            tokens: vec!["a".into()],
            logprobs: vec![-0.5],
        };
        let report = drift::compare(
            &[answer(0), answer(2)],
            &[answer(1), answer(3)],
            &DriftThresholds::default(),
        );
        let key = PairKey {
            target: "t".into(),
            model: "m".into(),
            scenario: "drift".into(),
        };
        let v = verdict_of(key, "0.33.0", "0.32.0".into(), &report, Utc::now());
        assert_eq!(v.state, State::Inconclusive);
        assert!(v.reason.contains("cannot be judged"), "{}", v.reason);
    }

    #[test]
    fn a_server_that_is_not_deterministic_is_said_once_not_per_run() {
        let answer = |prompt, token: &str| Answer {
            prompt,
            tokens: vec![token.into(), "b".into()],
            logprobs: vec![-0.5, -0.5],
        };
        let own = [answer(0, "a"), answer(1, "a")];
        let thresholds = DriftThresholds::default();
        let differs = drift::compare(&own, &[answer(0, "x"), answer(1, "a")], &thresholds);
        let same = drift::compare(&own, &own, &thresholds);
        assert!(differs.diverged > 0 && same.diverged == 0);
        let entry = || {
            (
                PairKey {
                    target: "t".into(),
                    model: "m".into(),
                    scenario: "drift".into(),
                },
                "0.32.0".to_owned(),
            )
        };
        let mut said = std::collections::HashSet::new();
        // Ten runs that answer differently: one line, at the first.
        let told: Vec<_> = (0..10)
            .map(|_| self_divergence_change(&mut said, entry(), &differs))
            .collect();
        assert_eq!(told[0], Some(true));
        assert!(told[1..].iter().all(Option::is_none), "{told:?}");
        // Answering as before again is said once too.
        assert_eq!(
            self_divergence_change(&mut said, entry(), &same),
            Some(false)
        );
        assert_eq!(self_divergence_change(&mut said, entry(), &same), None);
    }
}
