//! What a comparison judges (within one build, or an upgrade told which
//! history), which decides its candidate, its spans and its confirmation.

/// What a comparison judges, by its reference and the history it is
/// told, which decides its candidate, its spans and its confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// A build against its own baseline (or nothing to judge yet).
    WithinBuild,
    /// An upgrade told the old build's settled history (at least half of
    /// `noise_runs` runs), which has shown the machine's spells: the new
    /// build's runs since warm-up up to `upgrade_candidate_window`, every
    /// span, `upgrade_confirm_needed` evaluations from its 3rd run to its
    /// `candidate_window`-th (`VerdictPolicy::confirm_needed`).
    UpgradeSettled,
    /// An upgrade told the old build's young history (or none, as the
    /// rank test, `log_test = false`, reads none): the same candidate,
    /// judged on the whole of it (its change began at the upgrade, while
    /// a short span's median can be a spell such a history has not
    /// shown), `confirm_needed` evaluations.
    UpgradeYoung,
    /// An upgrade told the new build's own settled runs: by then the
    /// upgrade is long past and what is left to judge is the new build
    /// drifting, so its newest `candidate_window` runs, judged whole and
    /// confirmed by `confirm_needed` evaluations, as told a young history.
    UpgradeOwn,
    /// An upgrade told no history (`noise_runs = 0`): the newest
    /// `candidate_window` runs, every span, `confirm_needed` evaluations.
    UpgradeUntold,
}

impl Judged {
    /// The candidate is another build than the reference.
    pub fn upgrade(self) -> bool {
        self != Judged::WithinBuild
    }

    /// The candidate is every run of the new build since its warm-up, up
    /// to `upgrade_candidate_window`: the change began at the upgrade, so
    /// a lasting one keeps adding evidence after `candidate_window` runs.
    pub(super) fn grows(self) -> bool {
        matches!(self, Judged::UpgradeSettled | Judged::UpgradeYoung)
    }

    /// Judged on the whole candidate only, no shorter span.
    pub(super) fn whole_window(self) -> bool {
        matches!(self, Judged::UpgradeYoung | Judged::UpgradeOwn)
    }
}
