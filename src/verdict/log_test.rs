//! The logarithmic test of one metric, prepared once per evaluation: the
//! baseline's mean logarithm, its spread and its part of the standard
//! error, and the history's logarithms, from which each span tried gets
//! the candidate's part.

use statrs::distribution::{ContinuousCDF, StudentsT};

use super::{median, noise};

/// What a test assumes of stretches of runs: that k runs stray at least
/// k^(2H - 1) times as far as independent runs would (`hurst`; 0.5
/// assumes nothing), unless the history holds `measured_stretches`
/// stretches of k runs (0: never), whose spread then tells instead: a
/// young history of 64 runs cannot show how far 30 runs stray, but its
/// 16 stretches of 4 runs show how far 4 do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongMemory {
    pub hurst: f64,
    pub measured_stretches: usize,
}

/// One metric's test against its baseline, for any candidate span.
pub struct LogTest {
    baseline_mean: f64,
    /// The baseline runs' variance on logarithms, as if independent.
    run_variance: f64,
    /// The same, inflated for correlated runs.
    variance: f64,
    /// The history's logarithms (empty when it has a value that is not
    /// positive: it then tells nothing).
    history: Vec<f64>,
    memory: LongMemory,
    baseline_part: f64,
    /// The variance of the load slope the values were adjusted by: a
    /// candidate measured `shift` requests of load from the baseline's
    /// carries `shift^2` times it.
    slope_variance: f64,
    /// Student's t with the baseline's degrees of freedom.
    t: StudentsT,
    /// Whether a span's t takes the history's tails (see [`LogTest::with_heavy_tails`]).
    heavy_tails: bool,
    /// The degrees of freedom of the tails assumed at least, whatever the
    /// history shows (infinite: none; see [`LogTest::with_assumed_tails`]).
    assumed_tail_df: f64,
    /// Whether a candidate's median of k runs is taken to have its exact
    /// small-sample variance instead of the large-sample pi/2 (see
    /// [`median_variance_factor`]).
    exact_median: bool,
}

/// k times the variance of the median of k independent normal values of
/// unit variance: pi/2 for many, as the test takes it by default; with
/// `exact`, each k's own, within 0.02 of 60,000 simulated medians for
/// every k measured (1.00 at 2, the mean of two; 1.35 at 3; 1.20 at 4;
/// 1.45 at 5; 1.28 at 6; 1.34 at 8; 1.39 at 10; 1.41 at 12; 1.53 at 48):
/// an even span's median, the mean of the middle two, strays less than
/// the odd span's around it.
pub fn median_variance_factor(k: usize, exact: bool) -> f64 {
    use std::f64::consts::{FRAC_PI_2, PI};
    match (exact, k) {
        (false, _) => FRAC_PI_2,
        (true, 0..=2) => 1.0,
        (true, 3) => 3.0 * (1.0 - 3f64.sqrt() / PI),
        (true, k) => {
            let c = if k % 2 == 1 { 0.43 } else { 1.3 };
            FRAC_PI_2 * k as f64 / (k as f64 + c)
        }
    }
}

impl LogTest {
    /// `None` when the baseline has fewer than 3 runs or a value that is
    /// not positive. `inflation` is the lag-1 correlation's, `memory` the
    /// long-memory floor's.
    pub fn new(
        baseline: &[f64],
        history: &[f64],
        inflation: f64,
        memory: LongMemory,
    ) -> Option<Self> {
        if baseline.len() < 3 || baseline.iter().any(|v| *v <= 0.0) {
            return None;
        }
        let b: Vec<f64> = baseline.iter().map(|x| x.ln()).collect();
        let history: Vec<f64> = match history.iter().all(|v| *v > 0.0) {
            true => history.iter().map(|x| x.ln()).collect(),
            false => Vec::new(),
        };
        let run_variance = crate::stats::std_dev(&b).powi(2);
        let mut test = LogTest {
            baseline_mean: crate::stats::mean(&b),
            run_variance,
            variance: inflation.max(1.0) * run_variance,
            history,
            memory,
            baseline_part: 0.0,
            slope_variance: 0.0,
            t: StudentsT::new(0.0, 1.0, (b.len() - 1) as f64)
                .expect("degrees of freedom are positive"),
            heavy_tails: false,
            assumed_tail_df: f64::INFINITY,
            exact_median: false,
        };
        // The baseline is a stretch of runs too: where the history shows
        // that stretches of its length stray further than its own spread
        // predicts (it fell in a quiet or a slow spell), that is its part.
        let modelled = test.floored(b.len()) / b.len() as f64;
        test.baseline_part = noise::span_mean_variance(&test.history, b.len())
            .map_or(modelled, |seen| seen.max(modelled));
        Some(test)
    }

    /// The same test, the values having been adjusted to the baseline's
    /// load by a slope with this variance.
    pub fn with_load_slope_variance(self, slope_variance: f64) -> Self {
        LogTest {
            slope_variance,
            ..self
        }
    }

    /// The same test, a span of k runs judged by Student's t with the
    /// tails the history's k-run medians show, where heavier than the
    /// baseline's t: a trace whose rare slow spells stray five standard
    /// deviations is not judged as if they were Gaussian. The difference
    /// over its standard error (which already holds the history's
    /// spread) is read against that t as it is, not rescaled to unit
    /// variance: the spread is counted wider again by sqrt(df / (df - 2)),
    /// up to about 1.4x as df nears 4. A conservative overcount, and the
    /// form the detection table measured.
    pub fn with_heavy_tails(self, heavy_tails: bool) -> Self {
        LogTest {
            heavy_tails,
            ..self
        }
    }

    /// The same test, every span judged by Student's t with at most
    /// `assumed_tail_df` degrees of freedom (infinite: none), or the
    /// history's heavier tails with `heavy_tails`: a history of a few
    /// hundred runs need not have met the machine's rarest spells, and a
    /// Gaussian tail calls a spell it has not met one in millions.
    pub fn with_assumed_tails(self, assumed_tail_df: f64) -> Self {
        LogTest {
            assumed_tail_df,
            ..self
        }
    }

    /// The same test, a candidate's median taken to have its exact
    /// small-sample variance (`exact_median_variance`; see
    /// [`median_variance_factor`]).
    pub fn with_exact_median(self, exact_median: bool) -> Self {
        LogTest {
            exact_median,
            ..self
        }
    }

    /// The variance of k runs, per run: the inflated variance, at least
    /// what long-memory runs would give. A young history cannot show how
    /// far long stretches stray (the recorded traces' stretches of 24
    /// runs stray 1.4-2.5 times what independent runs would, more than
    /// one lag's correlation says): k^(2H - 1) times independent. Not
    /// where the history holds `measured_stretches` stretches of k runs:
    /// their spread, which the test takes where larger, shows it.
    fn floored(&self, k: usize) -> f64 {
        let stretches = self.memory.measured_stretches;
        if stretches > 0 && self.history.len() >= stretches.saturating_mul(k) {
            return self.variance;
        }
        let long_memory = self.run_variance * (k as f64).powf(2.0 * self.memory.hurst - 1.0);
        self.variance.max(long_memory)
    }

    /// The candidate's median logarithm less the baseline's mean one, and
    /// its standard error. The candidate's part comes from the baseline's
    /// spread (its few runs say little of their own); the median
    /// (variance pi/2 that of a mean) lets one slow run in three pass.
    /// Where the history shows that medians of as many runs stray further
    /// (a slow spell of the machine), that spread is its part instead, and
    /// with `heavy_tails` their tails the t's (see
    /// [`LogTest::with_heavy_tails`]). `load_shift`: how far the
    /// candidate's mean load was from the baseline's (its adjustment's
    /// error grows with it).
    pub fn difference(&self, candidate: &[f64], load_shift: f64) -> Option<Difference> {
        if candidate.iter().any(|v| *v <= 0.0) {
            return None;
        }
        let c: Vec<f64> = candidate.iter().map(|x| x.ln()).collect();
        let factor = median_variance_factor(c.len(), self.exact_median);
        let modelled = self.floored(c.len()) * factor / c.len() as f64;
        let strays = noise::span_strays(&self.history, c.len());
        let candidate_part = strays.variance.map_or(modelled, |seen| seen.max(modelled));
        let adjustment = self.slope_variance * load_shift * load_shift;
        let shown = strays.tail_df.filter(|_| self.heavy_tails);
        let tail = shown.unwrap_or(f64::INFINITY).min(self.assumed_tail_df);
        // Student's t has a variance only above 2 degrees of freedom.
        let t = match tail {
            tail if tail > 2.0 && tail < self.t.freedom() => {
                StudentsT::new(0.0, 1.0, tail).expect("degrees of freedom are positive")
            }
            _ => self.t,
        };
        Some(Difference {
            log_ratio: median(&c) - self.baseline_mean,
            se: (candidate_part + self.baseline_part + adjustment).sqrt(),
            t,
        })
    }
}

/// One candidate span against the baseline, on logarithms.
#[derive(Debug, Clone, Copy)]
pub struct Difference {
    pub log_ratio: f64,
    pub se: f64,
    /// The Student's t it is judged by.
    t: StudentsT,
}

impl Difference {
    /// One-sided p-value that the candidate is slower: Student's t on the
    /// logarithms (so a change is a ratio).
    pub fn p_greater(&self) -> f64 {
        match (self.log_ratio, self.se) {
            (d, se) if se <= 0.0 && d > 0.0 => 0.0,
            (_, se) if se <= 0.0 => 1.0,
            (d, se) => 1.0 - self.t.cdf(d / se),
        }
    }

    /// How many standard errors slower (negative: faster): what tells
    /// apart two spans whose p-values are both 0 or both 1 in floating
    /// point.
    pub fn t_statistic(&self) -> f64 {
        match (self.log_ratio, self.se) {
            (d, se) if se > 0.0 => d / se,
            (d, _) if d > 0.0 => f64::INFINITY,
            (d, _) if d < 0.0 => f64::NEG_INFINITY,
            // No spread and no change: no standard error away at all.
            _ => 0.0,
        }
    }

    /// The relative change and its interval at `confidence`.
    pub fn interval(&self, confidence: f64) -> (f64, f64, f64) {
        let (d, se) = (self.log_ratio, self.se);
        let q = self.t.inverse_cdf(1.0 - (1.0 - confidence) / 2.0);
        (d.exp_m1(), (d - q * se).exp_m1(), (d + q * se).exp_m1())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact factor is what medians of k normal values give: 40,000
    /// simulated medians for each span the detector tries, k times their
    /// variance within 0.04 of it (its standard error there is about
    /// 0.01); the default is pi/2 whatever k.
    #[test]
    fn the_exact_median_variance_is_what_simulated_medians_show() {
        use rand::SeedableRng;
        use rand_distr::{Distribution, StandardNormal};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for k in [2, 3, 4, 5, 6, 8, 10, 12, 48] {
            let medians: Vec<f64> = (0..40_000)
                .map(|_| {
                    let draws: Vec<f64> = (0..k).map(|_| StandardNormal.sample(&mut rng)).collect();
                    median(&draws)
                })
                .collect();
            let simulated = k as f64 * crate::stats::std_dev(&medians).powi(2);
            let factor = median_variance_factor(k, true);
            assert!(
                (simulated - factor).abs() < 0.04,
                "k = {k}: simulated {simulated:.3}, factor {factor:.3}"
            );
            assert_eq!(
                median_variance_factor(k, false),
                std::f64::consts::FRAC_PI_2
            );
        }
    }

    /// Without spread, a change is infinitely many standard errors away
    /// and no change none: a span that moved nothing never wins a tie.
    #[test]
    fn without_spread_only_a_change_is_standard_errors_away() {
        let difference = |log_ratio: f64, se: f64| Difference {
            log_ratio,
            se,
            t: StudentsT::new(0.0, 1.0, 29.0).unwrap(),
        };
        assert_eq!(difference(0.2, 0.1).t_statistic(), 2.0);
        assert_eq!(difference(0.2, 0.0).t_statistic(), f64::INFINITY);
        assert_eq!(difference(-0.2, 0.0).t_statistic(), f64::NEG_INFINITY);
        assert_eq!(difference(0.0, 0.0).t_statistic(), 0.0);
    }

    /// A young history (long memory assumed) that holds 16 stretches of a
    /// span's length judges that span by the spread it shows, the
    /// baseline's 30 runs as a candidate's; a longer span, or with no
    /// stretches asked for, keeps the floor.
    #[test]
    fn a_span_the_history_holds_enough_stretches_of_drops_the_long_memory_floor() {
        let wobble = |i: usize| 1.0 + 0.05 * ((i * 7 % 5) as f64 - 2.0);
        let baseline: Vec<f64> = (0..30).map(wobble).collect();
        let memory = |measured_stretches| LongMemory {
            hurst: 0.75,
            measured_stretches,
        };
        let se = |runs: usize, stretches: usize, candidate: &[f64]| {
            let history: Vec<f64> = (0..runs).map(wobble).collect();
            LogTest::new(&baseline, &history, 1.0, memory(stretches))
                .unwrap()
                .difference(candidate, 0.0)
                .unwrap()
                .se
        };
        let (four, five) = ([1.1; 4], [1.1; 5]);
        assert!(se(64, 16, &four) < 0.9 * se(64, 0, &four));
        // 64 runs hold 12 stretches of 5, not 16: the floor stays.
        assert_eq!(se(64, 16, &five), se(64, 0, &five));
        // 480 runs hold 16 stretches of the baseline's 30, not of a
        // 31-run candidate: only the baseline's part drops its floor.
        let long = [1.1; 31];
        assert!(se(480, 16, &long) < se(480, 0, &long));
        assert_eq!(se(479, 16, &long), se(479, 0, &long));
        // Where the history's 4-run medians stray further than the runs'
        // spread says (a slow spell), that spread still stands.
        let mut spells: Vec<f64> = (0..64).map(wobble).collect();
        for v in spells.iter_mut().skip(20).take(8) {
            *v *= 1.6;
        }
        let logs: Vec<f64> = spells.iter().map(|v| v.ln()).collect();
        let seen = noise::span_strays(&logs, 4).variance.unwrap();
        let told = LogTest::new(&baseline, &spells, 1.0, memory(16))
            .unwrap()
            .difference(&four, 0.0)
            .unwrap()
            .se;
        assert!(told * told >= seen, "{} {seen}", told * told);
    }

    /// A stray of 4.5 standard errors is rarer under the baseline's t
    /// than under the t of a history whose rare spells stray that far;
    /// a history with even noise changes nothing.
    #[test]
    fn heavy_tailed_history_makes_a_far_stray_less_surprising() {
        let wobble = |i: usize| 1.0 + 0.05 * ((i * 7 % 5) as f64 - 2.0);
        let baseline: Vec<f64> = (0..30).map(wobble).collect();
        let even: Vec<f64> = (0..200).map(wobble).collect();
        let mut spells = even.clone();
        for i in (50..56).chain(140..146) {
            spells[i] *= 1.8;
        }
        let difference = |history: &[f64], heavy: bool| {
            let test = LogTest::new(
                &baseline,
                history,
                1.0,
                LongMemory {
                    hurst: 0.5,
                    measured_stretches: 0,
                },
            )
            .unwrap()
            .with_heavy_tails(heavy);
            // A stray of 4.5 standard errors, whatever the history's spread.
            let d = test.difference(&[1.0, 1.0, 1.0], 0.0).unwrap();
            Difference {
                log_ratio: d.se * 4.5,
                ..d
            }
        };
        let p = |history: &[f64], heavy: bool| difference(history, heavy).p_greater();
        assert_eq!(p(&even, true), p(&even, false));
        let (gaussian, heavy) = (p(&spells, false), p(&spells, true));
        assert!(heavy > 10.0 * gaussian, "{gaussian:e} {heavy:e}");
        let narrow = difference(&spells, false).interval(0.98);
        let wide = difference(&spells, true).interval(0.98);
        assert!(
            wide.1 < narrow.1 && wide.2 > narrow.2,
            "{narrow:?} {wide:?}"
        );
    }
}
