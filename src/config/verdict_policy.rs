//! The detector's and the verdicts' settings (`[detector]`), with their
//! documented defaults: plain data, read by the verdict layer's rules.

use std::time::Duration;

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
    /// An upgrade told the old build's history: the candidate is the new
    /// build's completed runs after warm-up, up to this many (below
    /// `candidate_window`, that); told a settled history (at least half of
    /// `noise_runs` runs) its spans double up to the whole, told a young
    /// one it is judged whole. Its change began at the upgrade, so a
    /// lasting slowdown's evidence keeps growing after `candidate_window`
    /// runs instead of being judged on the newest few forever. Told the
    /// new build's own runs, the newest `candidate_window`.
    pub upgrade_candidate_window: usize,
    /// When the reference is another build, its newest completed runs
    /// whose spread at each span tells the test how far a few runs stray
    /// on their own, slow spells included; 0 judges by the baseline alone.
    pub noise_runs: usize,
    /// Within one build, while its history holds fewer than half of
    /// `noise_runs` runs, only a slow stretch of at least this many runs
    /// is judged: a shorter one may be a slow spell of the machine, which
    /// so short a history cannot tell. 0 judges every stretch.
    pub spell_runs: usize,
    /// While the history a test is told holds fewer than half of
    /// `noise_runs` runs (a young build, or an upgrade from one), it
    /// cannot show how far long stretches of runs stray; the test then
    /// takes runs as long-memory with this Hurst exponent: the mean of k
    /// runs strays at least k^(H - 1/2) times as far as independent runs
    /// would (0.5 assumes no more than the measured lag-1 correlation).
    pub young_hurst: f64,
    /// While the history a test is told holds at least half of
    /// `noise_runs` runs (a settled build, or an upgrade from one), each
    /// span is judged by Student's t with at most this many degrees of
    /// freedom (tails at least that heavy), or the heavier tails the
    /// history shows; 0 (the default) assumes none. A few hundred runs
    /// need not have met the machine's rarest slow spells, and a normal
    /// tail calls a spell the history has not met one in thousands; but
    /// assumed tails cost a settled build's verdicts most of what they
    /// catch (on the recorded traces after 250 runs, 7 took every false
    /// regression out, and an upgrade's +50% step on both on `quiet` went
    /// from 87% of trials caught within 10 evaluations to 23%: README,
    /// "How well it detects"), so it is for machines whose rare spells
    /// cost more than a late verdict.
    pub settled_tail_df: f64,
    /// An upgrade judged against the old build's history of at least half
    /// of `noise_runs` runs (one that has shown the machine's slow spells)
    /// is a regression once this many of the last `confirm_window`
    /// evaluations flagged it, from the new build's run after its first
    /// judged (`upgrade_min_candidate_runs`) to its `candidate_window`-th
    /// since warm-up; before and after those, against a younger history,
    /// the new build's own runs, and within one build, `confirm_needed`.
    pub upgrade_confirm_needed: usize,
    /// The new build's completed runs after warm-up that an upgrade
    /// needs before its first evaluation (before them, its first run is
    /// judged alone at `upgrade_first_run_q`); within one build,
    /// `min_candidate_runs`.
    pub upgrade_min_candidate_runs: usize,
    /// In an upgrade's first `candidate_window` runs after its warm-up,
    /// a slowdown with an adjusted p-value at or below this is beyond
    /// doubt (`decisive_q` elsewhere): its change began at a known time,
    /// the upgrade, so less evidence says it is the upgrade's than a
    /// slowdown at any run of one build needs. The recorded traces'
    /// farthest spike at an upgrade's first runs gave an adjusted p of
    /// 1.4e-5, above it; within one build 1e-6 alarmed on a two-run
    /// spike, hence `decisive_q` 1e-9 there. 0 turns it off.
    pub upgrade_decisive_q: f64,
    /// An upgrade's first run after its warm-up, before it has
    /// `upgrade_min_candidate_runs`: judged on that one run only for a
    /// slowdown beyond doubt at this adjusted p-value, a regression at
    /// once; anything less waits for the runs. A single run carries a
    /// spike whole, so the level is far stricter than
    /// `upgrade_decisive_q`, `decisive_q`'s: at that level, a first run
    /// judged like any evaluation alarmed on one-run spikes of `quiet`
    /// (1.9-2.9 per 10,000 on two of four sets of series); at 1e-9 none of
    /// the four sets raised a false regression, and on a server that
    /// strays a tenth as far +50% steps are caught a run sooner. 0 waits
    /// for the runs.
    pub upgrade_first_run_q: f64,
    /// After a version change, probe every scenario back to back until
    /// the new version has enough runs for a verdict.
    pub upgrade_rounds: bool,
    /// Pause between two runs of those rounds.
    pub upgrade_round_gap: Duration,
    /// Probe rounds a fleet is judged over: a build unseen for this many
    /// rounds no longer serves, and a canary compares the builds of this
    /// many recent rounds.
    pub canary_window: usize,
    /// Requests each build needs in those rounds before a canary verdict.
    pub min_canary_requests: usize,
    /// When a drift canary's answers count as changed.
    pub drift: DriftThresholds,
    /// Builds a target may file as first seen in any hour; past it, the
    /// server's identity is not stable enough to name builds by.
    pub max_new_builds_per_hour: u32,
    /// A rollout still open this long ends as `stalled`: both builds then
    /// serve as a mixed fleet and each is judged on its own baseline.
    pub rollout_timeout: Duration,
}

impl Default for VerdictPolicy {
    fn default() -> Self {
        VerdictPolicy {
            detector: DetectorSettings::default(),
            baseline_runs: 30,
            warmup_runs: 2,
            candidate_window: 12,
            upgrade_candidate_window: 48,
            noise_runs: 300,
            spell_runs: 16,
            young_hurst: 0.75,
            settled_tail_df: 0.0,
            upgrade_confirm_needed: 1,
            upgrade_min_candidate_runs: 2,
            upgrade_decisive_q: 1e-6,
            upgrade_first_run_q: 1e-9,
            upgrade_rounds: true,
            upgrade_round_gap: Duration::ZERO,
            drift: Default::default(),
            canary_window: 5,
            min_canary_requests: 30,
            max_new_builds_per_hour: 6,
            rollout_timeout: Duration::from_secs(6 * 3600),
        }
    }
}

impl VerdictPolicy {
    /// Completed runs a new version needs before its verdict can be a
    /// confirmed regression: its warm-up, an upgrade's candidate minimum,
    /// and the confirmations (the young history's, the larger).
    pub fn runs_for_verdict(&self) -> usize {
        let confirmations = self
            .detector
            .confirm_needed
            .max(self.upgrade_confirm_needed);
        self.warmup_runs + self.upgrade_min_candidate_runs + confirmations - 1
    }

    /// Completed runs a new version needs before its verdict can be a
    /// regression at all: its warm-up and its first run, which alone may
    /// be beyond doubt (`upgrade_first_run_q`, asked only while the
    /// candidate is shorter than `upgrade_min_candidate_runs`); else its
    /// warm-up and an upgrade's candidate minimum, beyond doubt at
    /// `upgrade_decisive_q`; without either level, a confirmed verdict's
    /// against a young history ([`Self::runs_for_verdict`]), the bound
    /// the upgrade rounds run to.
    pub fn runs_for_first_verdict(&self) -> usize {
        let first_run_alone = self.upgrade_first_run_q > 0.0 && self.upgrade_min_candidate_runs > 1;
        if first_run_alone {
            self.warmup_runs + 1
        } else if self.upgrade_decisive_q > 0.0 {
            self.warmup_runs + self.upgrade_min_candidate_runs
        } else {
            self.runs_for_verdict()
        }
    }
}

/// Every knob, with the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorSettings {
    /// Smallest relative slowdown that can be a regression.
    pub threshold: f64,
    /// Benjamini-Hochberg false discovery rate across one evaluation's tests.
    pub fdr_q: f64,
    /// Confidence of the Hodges-Lehmann interval.
    pub confidence: f64,
    pub min_candidate_runs: usize,
    pub min_baseline_runs: usize,
    /// A regression is declared when this many of the last `confirm_window`
    /// evaluations flagged it.
    pub confirm_needed: usize,
    pub confirm_window: usize,
    /// KS p-value below which the load distributions differ...
    pub load_ks_alpha: f64,
    /// ...and mean running+waiting requests differ by at least this much
    /// (also the margin beyond the baseline's range of loads that every
    /// candidate run must pass for the loads to differ without KS).
    pub load_min_difference: f64,
    /// Also alert on p99 (reported either way).
    pub alert_on_p99: bool,
    /// Consecutive runs are correlated (load, caches, neighbours): each
    /// test's variance is inflated by (1 + r) / (1 - r), r the baseline's
    /// lag-1 autocorrelation, as if the runs were fewer.
    pub correlation: bool,
    /// Also judge each phase against the other (TTFT p50 over TPOT p50
    /// and the reverse, see `verdict::phases`): the machine's slow spells
    /// move both phases, a change to one alone stands out of their ratio.
    pub phase_ratios: bool,
    /// Also test the candidate's newest runs alone, from this many up to
    /// the whole window (the most significant, its p-value multiplied by
    /// the number of spans tried): a step a few runs ago is not diluted by
    /// the unchanged runs before it. 0 tests the whole window only.
    pub scan_min_runs: usize,
    /// Test the runs' logarithms (the candidate's median against the
    /// baseline's mean, Student's t with the baseline's spread) instead of
    /// their ranks: a step's size counts, not only its order, so a few
    /// runs can show a large step.
    pub log_test: bool,
    /// The Hurst exponent this test takes runs to have: each side's
    /// variance is at least the independent runs' times k^(2H - 1) for its
    /// k runs, unless the history holds `measured_stretches` stretches of
    /// k runs. 0.5 (the default) assumes nothing; the policy sets
    /// `young_hurst` for a young history.
    pub hurst: f64,
    /// A side of k runs (a candidate span, or the baseline) is judged
    /// without that long-memory floor once the history holds at least
    /// this many times k runs: enough stretches of k runs to show how far
    /// k runs stray (the history's own spread of such stretches, which
    /// the test takes whenever it is larger, then stands alone). 0 keeps
    /// the floor for every side.
    pub measured_stretches: usize,
    /// Compare runs measured under a different server load at the
    /// baseline's load, by each metric's rise per request of load in the
    /// history, instead of refusing to judge them (`load_ks_alpha`), when
    /// the history covers their load.
    pub load_covariate: bool,
    /// Judge each span by Student's t with the tails the history shows
    /// for medians of that many runs (its excess kurtosis), where heavier
    /// than the baseline's t.
    pub heavy_tails: bool,
    /// Take a candidate's median of k runs to have its exact
    /// small-sample variance (1.0-1.45 times a run's over k for the spans
    /// tried) instead of the large-sample pi/2 over k. Off: measured on
    /// the recorded traces, it catches more only with false regressions
    /// (benches/detection/RESULTS.md, "The median's exact variance").
    pub exact_median_variance: bool,
    /// Each span is judged by Student's t with at most this many degrees
    /// of freedom, whatever tails the history shows: infinite (the
    /// default) assumes nothing, so the heavier of two is their minimum;
    /// the policy sets `settled_tail_df` for a settled history.
    pub tail_df: f64,
    /// An alerting metric slower with an adjusted p-value at or below this
    /// is a regression at once: no confirmation by later evaluations, and
    /// within a young build no wait for `spell_runs` runs. Both waits are
    /// there for slow spells of the machine, which stray as far as its
    /// runs do; a step this far beyond what the runs' noise allows is no
    /// spell, and on a server whose runs stray little the waits cost most
    /// of the delay. Only on runs measured within the loads the baseline
    /// ran under (a change across loads rests on a fit; a load not read,
    /// on either side, is not known to be within). 0 turns it off.
    pub decisive_q: f64,
    /// A candidate of at least one run but fewer than
    /// `min_candidate_runs` is judged only for a slowdown beyond doubt
    /// at this adjusted p-value (`decisive`), else is too few runs; 0
    /// judges none. Set by the policy for an upgrade's first run after
    /// its warm-up (`upgrade_first_run_q`).
    pub first_run_q: f64,
}

impl Default for DetectorSettings {
    fn default() -> Self {
        DetectorSettings {
            threshold: 0.05,
            fdr_q: 0.001,
            confidence: 0.98,
            min_candidate_runs: 4,
            min_baseline_runs: 30,
            confirm_needed: 2,
            confirm_window: 3,
            load_ks_alpha: 0.01,
            load_min_difference: 1.0,
            alert_on_p99: false,
            correlation: true,
            phase_ratios: true,
            scan_min_runs: 3,
            log_test: true,
            hurst: 0.5,
            measured_stretches: 16,
            load_covariate: true,
            heavy_tails: true,
            exact_median_variance: false,
            tail_df: f64::INFINITY,
            decisive_q: 1e-9,
            first_run_q: 0.0,
        }
    }
}

/// When answers count as drifted (`[detector]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftThresholds {
    /// A prompt diverging before this token position diverges early.
    pub position: usize,
    /// Drift when at least this share of prompts diverge early.
    pub share: f64,
    /// Drift when the mean absolute log-probability difference over the
    /// common prefixes passes this (nats).
    pub logprob_shift: f64,
}

impl Default for DriftThresholds {
    fn default() -> Self {
        DriftThresholds {
            position: 5,
            share: 0.5,
            // A deterministic server repeats its log-probabilities exactly
            // (measured: 0.000 between runs of one build, 0.002 between
            // bfloat16 and float32 on vLLM's CPU build); GPUs batching
            // nondeterministically need more (see the self comparison).
            logprob_shift: 0.001,
        }
    }
}
