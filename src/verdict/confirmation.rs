//! When flagged evaluations become a confirmed regression: how many of
//! the last `confirm_window` must flag, by what is judged and how far past
//! its warm-up the build is, and the daemon's rule replayed over stored runs.

use super::policy::{Judged, VerdictPolicy};
use super::{Evaluation, RunPoint, State, evaluate_with_noise};
use crate::store::baselines::{Comparison, PairKey};
use crate::store::{Store, StoreError};

/// A confirmed state and the words that explain it.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirmed {
    pub state: State,
    pub reason: String,
}

impl VerdictPolicy {
    /// How many of the last `confirm_window` evaluations must flag a
    /// slowdown for a regression: `upgrade_confirm_needed` for an upgrade
    /// told the old build's settled history, which has shown the
    /// machine's spells (a single evaluation beyond them is measured to be
    /// no false alarm), else `confirm_needed`. Not the new build's own
    /// settled history: on untouched series followed 200 evaluations, one
    /// evaluation on its spans of 3 and 6 alarmed on spells long after
    /// the upgrade (2 of 3 on the whole window removed that). Nor the
    /// first evaluation, on the fewest runs an upgrade is judged on
    /// (`runs_since_warmup` no more than `upgrade_min_candidate_runs`): a
    /// spike that long carries all of it (after 250 runs of `quiet`, its
    /// two-run spike paged at once, "tpot_p50 +59.3%", where the next
    /// evaluation, on 3 runs, passed it), so it waits for its confirmation
    /// unless beyond doubt (`upgrade_decisive_q`). Nor once the new build
    /// has run more than `candidate_window` runs since its warm-up
    /// (counted, however many the candidate holds): a slowdown
    /// first seen then is the new build's newest runs, not the upgrade,
    /// and a spell as likely as a change (after 250 runs of `quiet`, 27
    /// runs after an upgrade that changed nothing, 4 slow runs paged on
    /// one evaluation, "tpot_p50 +48.5%", adjusted p 8.8e-4).
    pub fn confirm_needed(&self, judged: Judged, runs_since_warmup: usize) -> usize {
        match judged {
            Judged::UpgradeSettled
                if runs_since_warmup > self.upgrade_min_candidate_runs
                    && self.upgrades_first_runs(judged, runs_since_warmup) =>
            {
                self.upgrade_confirm_needed
            }
            _ => self.detector.confirm_needed,
        }
    }

    /// The confirmation rule: given this evaluation and the flags of the
    /// earlier ones (oldest first), a regression only when `needed` (see
    /// [`VerdictPolicy::confirm_needed`]) of the last `confirm_window`
    /// evaluations, this one included, flagged; flagged with fewer is a
    /// regression being confirmed, which alerts do not follow yet.
    ///
    /// Once confirmed (`was_regression`: the last state of this comparison
    /// that was not inconclusive) a regression holds until
    /// `confirm_window` evaluations in a row flag nothing: one that finds
    /// the slowdown within the noise, or cannot judge (inconclusive),
    /// while one of those just before it flagged, does not end it.
    /// Without that a lasting slowdown whose evaluations pass the test one
    /// time in two flapped between regression and ok, announcing a
    /// resolution and a new regression each time (the demo's build 50%
    /// slower to first token did, on 12 baseline runs). An inconclusive
    /// evaluation flags nothing ([`Evaluation::flagged`]): it starts no
    /// regression and counts toward none.
    pub fn confirm(
        &self,
        current: &Evaluation,
        earlier_flags: &[bool],
        needed: usize,
        was_regression: bool,
    ) -> Confirmed {
        let window = self.detector.confirm_window.max(1);
        let earlier = earlier_flags
            .iter()
            .rev()
            .take(window - 1)
            .filter(|f| **f)
            .count();
        if !current.flagged() {
            // An inconclusive evaluation holds it as one finding nothing
            // slower does: the alert following the state must not resolve
            // for one evaluation under a load it refuses to judge across.
            let this_one = match current.state {
                State::Inconclusive => "this one could not judge",
                _ => "this one",
            };
            return match was_regression && earlier > 0 {
                true => Confirmed {
                    state: State::Regression,
                    reason: format!(
                        "a regression until {window} evaluations in a row find nothing slower ({earlier} of the {} before this one did); {this_one}: {}",
                        window - 1,
                        current.reason
                    ),
                },
                false => Confirmed {
                    state: current.state,
                    reason: current.reason.clone(),
                },
            };
        }
        let flags = earlier + 1;
        let slower = slower_list(current);
        if let Some(p) = current.decisive {
            return Confirmed {
                state: State::Regression,
                reason: format!(
                    "slower far beyond the runs' noise (p {}), a regression without waiting for a slow spell to pass: {slower}",
                    match p < 1e-16 {
                        true => "< 1e-16".to_owned(),
                        false => format!("{p:.1e}"),
                    }
                ),
            };
        }
        if flags >= needed {
            Confirmed {
                state: State::Regression,
                reason: format!("slower in {flags} of the last {window} evaluations: {slower}"),
            }
        } else {
            Confirmed {
                state: State::Confirming,
                reason: format!("slower, confirming: {flags} of {needed}: {slower}"),
            }
        }
    }

    /// [`VerdictPolicy::confirm`] against the stored evaluations `of`
    /// counts for this pair: the daemon's, the canary's and replay's one
    /// reading of them.
    pub fn confirm_stored(
        &self,
        store: &Store,
        key: &PairKey,
        of: &Comparison<'_>,
        current: &Evaluation,
        needed: usize,
    ) -> Result<Confirmed, StoreError> {
        let window = self.detector.confirm_window.saturating_sub(1);
        let earlier = store.recent_flags(key, of, window)?;
        // Asked only when it matters (`confirm` holds a regression only
        // while one of the earlier flagged): a flagged evaluation is the
        // newest judged one or after it, so the walk ends within them, not
        // after every evaluation of a build judged inconclusive for days.
        let was_regression = earlier.contains(&true) && store.was_regression(key, of)?;
        Ok(self.confirm(current, &earlier, needed, was_regression))
    }

    /// The daemon's rule over runs already stored: the evaluations it made
    /// as each of the last `confirm_window` candidate runs arrived (each on
    /// the candidate window ending there, as long as `judged` takes it),
    /// then the confirmation `judged` needs. `candidate` is the build's
    /// newest runs since its warm-up, as the report gives them, and
    /// `runs_since_warmup` how far past the warm-up the newest of them
    /// was: counted, since an upgrade's candidate holds at most
    /// `upgrade_candidate_window` runs.
    pub fn replay(
        &self,
        baseline: &[RunPoint],
        candidate: &[RunPoint],
        history: &[RunPoint],
        judged: Judged,
        runs_since_warmup: usize,
    ) -> Confirmed {
        // Every evaluation the candidate's runs gave, oldest first: a
        // regression held (`confirm`) depends on the states before the last
        // window's.
        let mut flags = Vec::new();
        let mut was_regression = false;
        let mut last = None;
        for end in 1..=candidate.len() {
            let start = end.saturating_sub(self.window_for(judged));
            // As the daemon did: its settings and confirmation so many
            // runs after the warm-up.
            let runs_then = runs_since_warmup.saturating_sub(candidate.len() - end);
            let detector = self.detector_for(judged, runs_then);
            let evaluation =
                evaluate_with_noise(baseline, &candidate[start..end], history, &detector);
            let needed = self.confirm_needed(judged, runs_then);
            let confirmed = self.confirm(&evaluation, &flags, needed, was_regression);
            if confirmed.state != State::Inconclusive {
                was_regression = confirmed.state == State::Regression;
            }
            flags.push(evaluation.flagged());
            last = Some(confirmed);
        }
        last.unwrap_or_else(|| Confirmed {
            state: State::Inconclusive,
            reason: "no candidate runs".into(),
        })
    }
}

/// `ttft_p50 +12.3%, ...`: the alerting metrics found slower.
fn slower_list(evaluation: &Evaluation) -> String {
    let slower: Vec<String> = evaluation
        .slower()
        .map(|m| format!("{} {:+.1}%", m.metric, m.relative_change * 100.0))
        .collect();
    slower.join(", ")
}
