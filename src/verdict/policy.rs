//! The verdict policy: which runs form a build's baseline, which runs are
//! the candidate, which reference a build is compared with, and what
//! history it is told (when flagged evaluations become a confirmed
//! regression: `confirmation`). The daemon's verdicts and the upgrade
//! report both go through here.

pub use crate::config::verdict_policy::VerdictPolicy;

pub use super::judged::Judged;
use super::warmup::WarmupRule;
use super::{DetectorSettings, Evaluation, METRICS, RunPoint, State, evaluate_with_noise, noise};
use crate::store::baselines::{Baseline, PairKey};
use crate::store::{Store, StoreError};
use crate::vocabulary::records::RunRecord;

/// How far above the baseline's level a run may be and still end a slow
/// stretch, whatever `threshold`: where the history a build is judged by
/// ends is a fact about its runs, not about the smallest slowdown worth a
/// page. Tied to `threshold`, 0.05 (the default) moved it from where
/// 0.10 had put it: on the recorded `competing` trace within one build,
/// one false regression in 10,200 evaluations (+25-40%, far beyond either
/// threshold) where 0.10 had none.
const SLOW_STRETCH: f64 = 0.10;

/// The runs one judgement compares.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// What is judged, and so how (see [`Judged`]).
    pub judged: Judged,
    /// The stored baseline used as the reference, when one is.
    pub reference: Option<Baseline>,
    /// The reference side's runs.
    pub baseline: Vec<RunRecord>,
    /// The candidate side's runs, oldest first: the newest window, or
    /// within one build the whole slow stretch when it began before it.
    pub candidate: Vec<RunRecord>,
    /// Runs whose spread the test is told (`noise_runs`), oldest first:
    /// the reference build's newest outside the candidate, or within one
    /// build its runs before the slow stretch the candidate ends in.
    pub history: Vec<RunRecord>,
    /// Within one build whose history is still short: the runs a slow
    /// stretch must last before it is judged (`spell_runs`); 0 for none.
    pub min_stretch: usize,
    /// The Hurst exponent the test takes runs to have: `young_hurst` while
    /// the history is young (fewer than half of `noise_runs` runs), each
    /// variance then at least what long-memory runs would give, but for
    /// spans the history holds `measured_stretches` stretches of; else 0.5
    /// (nothing assumed).
    pub hurst: f64,
    /// The degrees of freedom of the Student's t whose tails the test
    /// assumes at least: `settled_tail_df` once the history is settled
    /// (at least half of `noise_runs` runs) and it is set, else infinite
    /// (none).
    pub tail_df: f64,
    /// For an upgrade, the new build's completed runs after its warm-up,
    /// however many the candidate holds: how far past the upgrade the
    /// newest run is (see [`VerdictPolicy::confirm_needed`]). Within one
    /// build, which no confirmation asks it of, the runs read for the
    /// candidate.
    pub runs_since_warmup: usize,
}

impl Default for Comparison {
    /// Nothing to compare, nothing assumed.
    fn default() -> Self {
        Comparison {
            judged: Judged::WithinBuild,
            reference: None,
            baseline: Vec::new(),
            candidate: Vec::new(),
            history: Vec::new(),
            min_stretch: 0,
            hurst: 0.5,
            tail_df: f64::INFINITY,
            runs_since_warmup: 0,
        }
    }
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

    /// The detector's settings for this comparison: its Hurst exponent,
    /// the heavier of the two assumed tails, and with a `min_stretch`
    /// only spans of at least that many runs.
    pub fn settings(&self, detector: &DetectorSettings) -> DetectorSettings {
        DetectorSettings {
            scan_min_runs: match self.min_stretch {
                0 => detector.scan_min_runs,
                runs => runs,
            },
            hurst: detector.hurst.max(self.hurst),
            tail_df: detector.tail_df.min(self.tail_df),
            ..detector.clone()
        }
    }

    /// The evaluation of this comparison (see [`Comparison::settings`]).
    /// A candidate shorter than a `min_stretch` flags only a slowdown far
    /// beyond the noise (`decisive_q`) or a phase slower against the other
    /// (see [`super::phases`]); any other slowdown waits, saying why.
    pub fn evaluate(&self, detector: &DetectorSettings) -> Evaluation {
        let (baseline, candidate, history) = (
            self.baseline_points(),
            self.candidate_points(),
            self.history_points(),
        );
        let settings = self.settings(detector);
        let mut evaluation = evaluate_with_noise(&baseline, &candidate, &history, &settings);
        if candidate.len() >= self.min_stretch {
            return evaluation;
        }
        if settings.decisive_q > 0.0 || settings.phase_ratios {
            // The stretch is judged on spans of `min_stretch` runs, which
            // a step of a few runs does not move yet; the detector's own
            // short spans say whether it is beyond doubt already, or
            // whether one phase alone is slower against the other, which
            // the machine's spells, moving both phases, do not make it.
            let short_spans = DetectorSettings {
                scan_min_runs: detector.scan_min_runs,
                ..settings.clone()
            };
            let mut short = evaluate_with_noise(&baseline, &candidate, &history, &short_spans);
            if short.state == State::Ok
                && (short.decisive.is_some() || only_phase_ratios_flagged(&mut short))
            {
                return short;
            }
        }
        if evaluation.state == State::Ok && evaluation.flagged() && evaluation.decisive.is_none() {
            let slower: Vec<String> = evaluation
                .metrics
                .iter_mut()
                .filter(|m| m.flagged && m.alerting)
                .map(|m| {
                    m.flagged = false;
                    format!("{} {:+.1}%", m.metric, m.relative_change * 100.0)
                })
                .collect();
            evaluation.reason = format!(
                "slower for {} runs ({}), not yet a regression: within one build with {} runs of history, a slowdown must last {} runs to be told from a slow spell of the machine",
                candidate.len(),
                slower.join(", "),
                self.history.len(),
                self.min_stretch
            );
        }
        evaluation
    }
}

/// Keeps the flags of the phases against each other and lifts the rest
/// (they wait for the stretch to last), naming only what is slower yet
/// (a load the comparison was put at stays said); whether a phase ratio
/// is flagged.
fn only_phase_ratios_flagged(evaluation: &mut Evaluation) -> bool {
    let before = super::slower_reason(&evaluation.metrics);
    for m in evaluation.metrics.iter_mut() {
        m.flagged &= super::phases::is_ratio(&m.metric);
    }
    if !evaluation.flagged() {
        return false;
    }
    let now = super::slower_reason(&evaluation.metrics);
    evaluation.reason = evaluation.reason.replacen(&before, &now, 1);
    true
}

impl VerdictPolicy {
    /// Which runs are warm-up, by `warmup_runs`: the first of the build,
    /// of each deployment and of each server start.
    pub fn warmup(&self) -> WarmupRule {
        WarmupRule(self.warmup_runs)
    }

    /// What the daemon judges for `build` as runs arrive: the reference
    /// (see [`reference`]) against the build's newest completed runs after
    /// its warm-up and outside the reference, at most a candidate window
    /// (an upgrade told the old build's history, `upgrade_candidate_window`;
    /// within one build, the slow stretch it ends in, however long).
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
        let upgrade = reference.as_ref().is_some_and(|b| b.build != build);
        // An upgrade's candidate may grow (below): read the most it can
        // hold at once, then cut it to the window of how it is judged.
        let limit = match upgrade {
            true => self.window_for(Judged::UpgradeSettled),
            false => self.candidate_window,
        };
        // An upgrade is judged on the new build's runs since it was last
        // deployed: a build deployed again after a rollback, on its runs
        // since, not on those it was rolled back for.
        let since = match upgrade {
            true => store.redeployed_since(&key.target, &key.model, build)?,
            false => None,
        };
        let warmup = self.warmup();
        let mut candidate = store.newest_ok_runs(key, build, &warmup, since, &exclude, limit)?;
        // The candidate holds at most `limit` runs; how far past its
        // warm-up the build is needs counting only beyond that, and only
        // an upgrade's confirmation asks (not every evaluation's).
        let runs_since_warmup = match upgrade && candidate.len() == limit {
            true => store.count_ok_runs_after_warmup(key, build, &warmup, since)?,
            false => candidate.len(),
        };
        let mut min_stretch = 0;
        let mut judged = Judged::WithinBuild;
        let history = match &reference {
            Some(b) if upgrade => {
                let newest = candidate.len().saturating_sub(self.candidate_window);
                let history;
                (history, judged) =
                    self.upgrade_history(store, key, &b.build, build, &candidate[newest..])?;
                // Told the old build's history, the change began at the
                // upgrade: the new build's runs since, up to
                // `upgrade_candidate_window`, are the candidate. Not when
                // the history is the new build's own: its runs outside the
                // candidate window are that history.
                let window = self.window_for(judged);
                candidate.drain(..candidate.len().saturating_sub(window));
                history
            }
            // Within one build the history runs up to the candidate. The
            // slow stretch the candidate ends in is left out of it (else a
            // slowdown not caught before its runs age out of the candidate
            // would pass for noise from then on) and, when it began before
            // the candidate, becomes the candidate: a slowdown that lasts
            // longer than any spell of the history is judged as long as it
            // is. The spells that ended before it stay in the history.
            Some(_) => {
                let mut history = self.history(store, key, build, &candidate)?;
                // The baseline's runs are never part of a stretch.
                let after_baseline = history
                    .iter()
                    .rposition(|r| r.id.is_some_and(|id| exclude.contains(&id)))
                    .map_or(0, |i| i + 1);
                let calm = self
                    .calm_runs(&baseline, &history, &candidate)
                    .max(after_baseline);
                let stretch = history.split_off(calm);
                candidate.splice(0..0, stretch);
                if self.young(history.len()) {
                    min_stretch = self.spell_runs;
                }
                history
            }
            None => Vec::new(),
        };
        Ok(Comparison {
            judged,
            hurst: self.hurst_for(&history),
            tail_df: self.tail_df_for(&history),
            reference,
            baseline,
            candidate,
            history,
            min_stretch,
            runs_since_warmup,
        })
    }

    /// What a report of `to` against `from` judges: `from`'s baseline (its
    /// newest completed runs after warm-up, up to a baseline's worth, while
    /// none has formed yet) against every completed run of `to` after its
    /// warm-up since it was last deployed.
    pub fn across(
        &self,
        store: &Store,
        key: &PairKey,
        from: &str,
        to: &str,
    ) -> Result<Comparison, StoreError> {
        // As the daemon judges an upgrade: on the new build's runs since it
        // was last deployed.
        let since = match from != to {
            true => store.redeployed_since(&key.target, &key.model, to)?,
            false => None,
        };
        self.across_since(store, key, from, to, since)
    }

    /// [`VerdictPolicy::across`] told when `to` was last deployed
    /// (`Store::redeployed_since`; `None` for its first deployment, and
    /// within one build), so that a report of several scenarios reads it
    /// once and counts every scenario's runs from the same return.
    pub fn across_since(
        &self,
        store: &Store,
        key: &PairKey,
        from: &str,
        to: &str,
        since: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Comparison, StoreError> {
        let reference = store.baseline(key, from)?;
        let baseline = match &reference {
            Some(b) => store.runs_by_id(&b.run_ids)?,
            None => {
                store.newest_ok_runs(key, from, &self.warmup(), None, &[], self.baseline_runs)?
            }
        };
        let candidate = store.newest_ok_runs(key, to, &self.warmup(), since, &[], usize::MAX)?;
        // Told what the daemon's last evaluation was: the new build's runs
        // outside its newest candidate window may be the history.
        let newest = &candidate[candidate.len().saturating_sub(self.candidate_window)..];
        let (history, judged) = self.upgrade_history(store, key, from, to, newest)?;
        let runs_since_warmup = candidate.len();
        Ok(Comparison {
            judged: match from == to {
                true => Judged::WithinBuild,
                false => judged,
            },
            hurst: self.hurst_for(&history),
            tail_df: self.tail_df_for(&history),
            reference,
            baseline,
            candidate,
            history,
            min_stretch: 0,
            runs_since_warmup,
        })
    }

    /// A history too short to have shown the machine's slow spells: fewer
    /// than half of `noise_runs` runs (never, with `noise_runs = 0`).
    fn young(&self, history_runs: usize) -> bool {
        history_runs < self.noise_runs / 2
    }

    /// A history that has shown the machine's slow spells: at least half
    /// of `noise_runs` runs (never, with `noise_runs = 0`: no history).
    fn settled(&self, history_runs: usize) -> bool {
        self.noise_runs > 0 && !self.young(history_runs)
    }

    /// The most runs a candidate holds: `upgrade_candidate_window` for an
    /// upgrade judged on every run since the new build's warm-up, else
    /// `candidate_window`.
    pub(super) fn window_for(&self, judged: Judged) -> usize {
        match judged.grows() {
            true => self.upgrade_candidate_window.max(self.candidate_window),
            false => self.candidate_window,
        }
    }

    /// The detector settings of one evaluation, `runs_since_warmup` runs
    /// after the build's warm-up: an upgrade needs
    /// `upgrade_min_candidate_runs` candidate runs (measured on the
    /// recorded traces, against a settled history and a young one alike,
    /// spans of 2 runs raised no false alarm more than 4), within one build
    /// `min_candidate_runs`. An upgrade told a young history is judged on
    /// its whole candidate window, no shorter span: its change began at
    /// the upgrade, so every run of the window shares it, while a spell of
    /// two or three slow runs, which such a history has not shown, can
    /// carry a short span's median (on the recorded traces, 1-2 false
    /// regressions in 7,650 evaluations came from 2-run spells). So is one
    /// told the new build's own runs: the upgrade is long past, and spans
    /// of 3 and 6 with one evaluation alarmed on spells there. In an
    /// upgrade's first runs ([`VerdictPolicy::upgrades_first_runs`]) a
    /// slowdown is beyond doubt at `upgrade_decisive_q`, elsewhere at
    /// `decisive_q`: a slowdown whose change began at the upgrade needs
    /// less evidence to be the upgrade's than one at any run of a build
    /// (there 1e-6 alarmed on a two-run spike of `quiet`); there too, a
    /// candidate shorter than `upgrade_min_candidate_runs` (its first run
    /// after warm-up) is judged alone at `upgrade_first_run_q`.
    pub fn detector_for(&self, judged: Judged, runs_since_warmup: usize) -> DetectorSettings {
        let first_runs = self.upgrades_first_runs(judged, runs_since_warmup);
        DetectorSettings {
            min_candidate_runs: match judged.upgrade() {
                true => self.upgrade_min_candidate_runs,
                false => self.detector.min_candidate_runs,
            },
            scan_min_runs: match judged.whole_window() {
                true => 0,
                false => self.detector.scan_min_runs,
            },
            decisive_q: match first_runs {
                true => self.upgrade_decisive_q,
                false => self.detector.decisive_q,
            },
            first_run_q: match first_runs {
                true => self.upgrade_first_run_q,
                false => 0.0,
            },
            ..self.detector.clone()
        }
    }

    /// An upgrade's first runs: at most `candidate_window` runs after its
    /// warm-up, told the old build's history or none, where a slowdown is
    /// more likely the upgrade's than a spell. Told the new build's own
    /// runs, the upgrade is long past; later, a slowdown first seen is the
    /// new build's newest runs, as likely a spell as a change.
    pub fn upgrades_first_runs(&self, judged: Judged, runs_since_warmup: usize) -> bool {
        judged.upgrade()
            && judged != Judged::UpgradeOwn
            && (1..=self.candidate_window).contains(&runs_since_warmup)
    }

    /// The Hurst exponent a test told `history` assumes (see `young_hurst`).
    fn hurst_for(&self, history: &[RunRecord]) -> f64 {
        if self.young(history.len()) {
            self.young_hurst
        } else {
            0.5
        }
    }

    /// The tails a test told `history` assumes (see `settled_tail_df`):
    /// a young history assumes long memory and waits out spells instead.
    fn tail_df_for(&self, history: &[RunRecord]) -> f64 {
        if self.young(history.len()) || self.settled_tail_df == 0.0 {
            f64::INFINITY
        } else {
            self.settled_tail_df
        }
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
        store.newest_ok_runs(key, build, &self.warmup(), None, &exclude, self.noise_runs)
    }

    /// What an upgrade from `from` to `to` is told of how far runs stray:
    /// `from`'s history; when that is young and `to`'s own runs outside
    /// the candidate, before any slow stretch within `to` (judged against
    /// its own baseline, as within one build), are not, those. The
    /// machine's spells are the same whichever build serves (a step
    /// between builds is no spread within either), so an upgrade from a
    /// short-lived build is judged, once the new build has run a while,
    /// knowing the spells it has shown; a slowdown within the new build
    /// never becomes its noise. With it, how the upgrade is judged
    /// told that history.
    fn upgrade_history(
        &self,
        store: &Store,
        key: &PairKey,
        from: &str,
        to: &str,
        candidate: &[RunRecord],
    ) -> Result<(Vec<RunRecord>, Judged), StoreError> {
        if self.noise_runs == 0 {
            return Ok((Vec::new(), Judged::UpgradeUntold));
        }
        let old = self.history(store, key, from, candidate)?;
        if self.settled(old.len()) {
            return Ok((old, Judged::UpgradeSettled));
        }
        let Some(own) = store.baseline(key, to)? else {
            return Ok((old, Judged::UpgradeYoung));
        };
        let mut new = self.history(store, key, to, candidate)?;
        let calm = self.calm_runs(&store.runs_by_id(&own.run_ids)?, &new, candidate);
        new.truncate(calm);
        Ok(match self.young(new.len()) {
            true => (old, Judged::UpgradeYoung),
            false => (new, Judged::UpgradeOwn),
        })
    }

    /// How many of a build's `history` runs (oldest first, the candidate
    /// right after them) came before the slow stretch the candidate ends
    /// in, on any alerting metric: [`noise::excursion_start`] of each
    /// metric's logarithms against the baseline's mean plus
    /// [`SLOW_STRETCH`].
    fn calm_runs(
        &self,
        baseline: &[RunRecord],
        history: &[RunRecord],
        candidate: &[RunRecord],
    ) -> usize {
        let points: Vec<RunPoint> = history.iter().chain(candidate).map(run_point).collect();
        let base: Vec<RunPoint> = baseline.iter().map(run_point).collect();
        let allowance = SLOW_STRETCH.ln_1p();
        METRICS
            .iter()
            .filter(|(_, alerting)| *alerting || self.detector.alert_on_p99)
            // A stretch is where the phases themselves are slow.
            .filter(|(metric, _)| !super::phases::is_ratio(metric))
            .filter_map(|(metric, _)| {
                let logs = |runs: &[RunPoint]| -> Vec<Option<f64>> {
                    runs.iter()
                        .map(|r| r.get(metric).filter(|v| *v > 0.0).map(f64::ln))
                        .collect()
                };
                let level: Vec<f64> = logs(&base).into_iter().flatten().collect();
                (!level.is_empty()).then(|| {
                    let level = crate::stats::mean(&level);
                    noise::excursion_start(&logs(&points), level, allowance)
                })
            })
            .min()
            .unwrap_or(0)
            .min(history.len())
    }
}

/// The baseline a candidate build is compared with, in order: the pinned
/// baseline; else the baseline of the newest build the target ran before
/// `build`, or after it when `build` is judged late (an upgrade verdict);
/// else `build`'s own baseline (drift within one version).
pub fn reference(
    store: &Store,
    key: &PairKey,
    build: &str,
) -> Result<Option<Baseline>, StoreError> {
    if let Some(pinned) = store.pinned_baseline(key)? {
        return Ok(Some(pinned));
    }
    if let Some(earlier) = store.newest_other_baseline(key, build)? {
        return Ok(Some(earlier));
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
    let mut point = RunPoint {
        values,
        load: (!loads.is_empty()).then(|| crate::stats::mean(&loads)),
    };
    super::phases::add_ratios(&mut point);
    point
}
