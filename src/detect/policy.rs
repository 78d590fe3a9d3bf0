//! The verdict policy: which runs form a build's baseline, which runs are
//! the candidate, which reference a build is compared with, and when
//! flagged evaluations become a confirmed regression. The daemon's
//! verdicts and the upgrade report both go through here.

use std::time::Duration;

use super::DetectorSettings;

/// Baselines and the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictPolicy {
    pub detector: DetectorSettings,
    /// Completed runs per server version that form its baseline (K).
    pub baseline_runs: usize,
    /// Completed runs of a new version ignored before its baseline starts,
    /// so caches and compilation warm up first.
    pub warmup_runs: usize,
    /// The candidate is the newest this many completed runs.
    pub candidate_window: usize,
    /// After a version change, probe every scenario back to back until
    /// the new version has enough runs for a verdict.
    pub upgrade_rounds: bool,
    /// Pause between two runs of those rounds.
    pub upgrade_round_gap: Duration,
}

impl Default for VerdictPolicy {
    fn default() -> Self {
        VerdictPolicy {
            detector: DetectorSettings::default(),
            baseline_runs: 30,
            warmup_runs: 2,
            candidate_window: 12,
            upgrade_rounds: true,
            upgrade_round_gap: Duration::ZERO,
        }
    }
}

impl VerdictPolicy {
    /// Completed runs a new version needs before its verdict can be a
    /// confirmed regression: the candidate minimum plus the confirmations.
    pub fn runs_for_verdict(&self) -> usize {
        self.warmup_runs + self.detector.min_candidate_runs + self.detector.confirm_needed - 1
    }
}
