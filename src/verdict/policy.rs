//! The verdict policy: which runs form a build's baseline, which runs are
//! the candidate, which reference a build is compared with, and when
//! flagged evaluations become a confirmed regression. The daemon's
//! verdicts and the upgrade report both go through here.

pub use crate::config::verdict_policy::VerdictPolicy;

use super::{Evaluation, RunPoint, State, evaluate_with_noise};
use crate::store::baselines::{Baseline, PairKey};
use crate::store::{Store, StoreError};
use crate::vocabulary::records::RunRecord;

/// The runs one judgement compares.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// The stored baseline used as the reference, when one is.
    pub reference: Option<Baseline>,
    /// The reference side's runs.
    pub baseline: Vec<RunRecord>,
    /// The candidate side's runs, oldest first.
    pub candidate: Vec<RunRecord>,
    /// The reference build's newest runs outside the candidate, oldest
    /// first, whose spread the test is told (`noise_runs`).
    pub history: Vec<RunRecord>,
}

impl Comparison {
    pub fn baseline_points(&self) -> Vec<RunPoint> {
        self.baseline.iter().map(run_point).collect()
    }

    pub fn candidate_points(&self) -> Vec<RunPoint> {
        self.candidate.iter().map(run_point).collect()
    }

    pub fn history_points(&self) -> Vec<RunPoint> {
        self.history.iter().map(run_point).collect()
    }
}

/// A confirmed state and the words that explain it.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirmed {
    pub state: State,
    pub reason: String,
}

impl VerdictPolicy {
    /// What the daemon judges for `build` as runs arrive: the reference
    /// (see [`reference`]) against the build's newest completed runs after
    /// its warm-up and outside the reference, at most a candidate window.
    pub fn latest(
        &self,
        store: &Store,
        key: &PairKey,
        build: &str,
    ) -> Result<Comparison, StoreError> {
        let reference = reference(store, key, build)?;
        let (baseline, exclude) = match &reference {
            Some(b) => (store.runs_by_id(&b.run_ids)?, b.run_ids.clone()),
            None => (Vec::new(), Vec::new()),
        };
        let candidate = store.newest_ok_runs(
            key,
            build,
            self.warmup_runs,
            &exclude,
            self.candidate_window,
        )?;
        let history = match &reference {
            // Within one build the history would hold the very slowdown
            // being judged: one not caught before its runs age out of the
            // candidate would pass for noise from then on.
            Some(b) if b.build != build => self.history(store, key, &b.build, &candidate)?,
            _ => Vec::new(),
        };
        Ok(Comparison {
            reference,
            baseline,
            candidate,
            history,
        })
    }

    /// What a report of `to` against `from` judges: `from`'s baseline (its
    /// newest completed runs after warm-up, up to a baseline's worth, while
    /// none has formed yet) against every completed run of `to` after its
    /// warm-up.
    pub fn across(
        &self,
        store: &Store,
        key: &PairKey,
        from: &str,
        to: &str,
    ) -> Result<Comparison, StoreError> {
        let reference = store.baseline(key, from)?;
        let baseline = match &reference {
            Some(b) => store.runs_by_id(&b.run_ids)?,
            None => store.newest_ok_runs(key, from, self.warmup_runs, &[], self.baseline_runs)?,
        };
        let candidate = store.newest_ok_runs(key, to, self.warmup_runs, &[], usize::MAX)?;
        let history = self.history(store, key, from, &candidate)?;
        Ok(Comparison {
            reference,
            baseline,
            candidate,
            history,
        })
    }

    /// `build`'s newest completed runs after its warm-up, up to
    /// `noise_runs`, leaving out the candidate's: how the reference build
    /// strays on its own, told to a test of another build against it.
    fn history(
        &self,
        store: &Store,
        key: &PairKey,
        build: &str,
        candidate: &[RunRecord],
    ) -> Result<Vec<RunRecord>, StoreError> {
        // Only the logarithmic test reads it; the rank test would load
        // 300 runs for nothing on every evaluation.
        if self.noise_runs == 0 || !self.detector.log_test {
            return Ok(Vec::new());
        }
        let exclude: Vec<i64> = candidate.iter().filter_map(|r| r.id).collect();
        store.newest_ok_runs(key, build, self.warmup_runs, &exclude, self.noise_runs)
    }

    /// The confirmation rule: given this evaluation and the flags of the
    /// earlier ones (oldest first), a regression only when
    /// `confirm_needed` of the last `confirm_window` evaluations, this one
    /// included, flagged; flagged with fewer is a regression being
    /// confirmed, which alerts do not follow yet.
    pub fn confirm(&self, current: &Evaluation, earlier_flags: &[bool]) -> Confirmed {
        let cfg = &self.detector;
        if current.state == State::Inconclusive || !current.flagged() {
            return Confirmed {
                state: current.state,
                reason: current.reason.clone(),
            };
        }
        let window = cfg.confirm_window.max(1);
        let flags = earlier_flags
            .iter()
            .rev()
            .take(window - 1)
            .filter(|f| **f)
            .count()
            + 1;
        let slower = slower_list(current);
        if flags >= cfg.confirm_needed {
            Confirmed {
                state: State::Regression,
                reason: format!("slower in {flags} of the last {window} evaluations: {slower}"),
            }
        } else {
            Confirmed {
                state: State::Confirming,
                reason: format!(
                    "slower, confirming: {flags} of {}: {slower}",
                    cfg.confirm_needed
                ),
            }
        }
    }

    /// The daemon's rule over runs already stored: the evaluations it made
    /// as each of the last `confirm_window` candidate runs arrived (each on
    /// the candidate window ending there), then the confirmation.
    pub fn replay(
        &self,
        baseline: &[RunPoint],
        candidate: &[RunPoint],
        history: &[RunPoint],
    ) -> Confirmed {
        let window = self.detector.confirm_window.max(1);
        let ends = candidate.len().saturating_sub(window - 1).max(1)..=candidate.len();
        let mut flags = Vec::new();
        let mut last = None;
        for end in ends {
            let start = end.saturating_sub(self.candidate_window);
            let evaluation =
                evaluate_with_noise(baseline, &candidate[start..end], history, &self.detector);
            if let Some(previous) = last.replace(evaluation) {
                flags.push(previous.flagged() && previous.state != State::Inconclusive);
            }
        }
        match last {
            Some(evaluation) => self.confirm(&evaluation, &flags),
            None => Confirmed {
                state: State::Inconclusive,
                reason: "no candidate runs".into(),
            },
        }
    }
}

/// `ttft_p50 +12.3%, ...`: the alerting metrics found slower.
fn slower_list(evaluation: &Evaluation) -> String {
    let slower: Vec<String> = evaluation
        .metrics
        .iter()
        .filter(|m| m.flagged && m.alerting)
        .map(|m| format!("{} {:+.1}%", m.metric, m.relative_change * 100.0))
        .collect();
    slower.join(", ")
}

/// The baseline a candidate build is compared with, in order: the pinned
/// baseline; else the baseline of the newest build the target ran before
/// `build` (an upgrade verdict); else `build`'s own baseline (drift within
/// one version).
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
