//! How far a few runs stray on their own: the spread of the median of k
//! consecutive runs of a build's history, on logarithms, with every
//! correlation between runs and every slow spell the history holds; and
//! where a build's current slow stretch began, so that the stretch being
//! judged is never its own noise.

/// Stretches of the history a spread needs before it is trusted.
const MIN_STRETCHES: usize = 10;

/// How the medians of the stretches of `k` consecutive runs of a history
/// (logarithms, oldest first) stray about the history's mean: what the
/// candidate's median of `k` runs does when nothing changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpanStrays {
    /// Their variance; `None` with fewer than 10 stretches.
    pub variance: Option<f64>,
    /// The degrees of freedom of the Student's t with their excess
    /// kurtosis, 6 / (df - 4): how much heavier than normal their tails
    /// are, a few far slow spells among many calm stretches. `None` when
    /// no heavier than normal, or with fewer than 60 stretches.
    pub tail_df: Option<f64>,
}

/// [`SpanStrays`] of `history` for stretches of `k` runs, in one pass.
pub fn span_strays(history: &[f64], k: usize) -> SpanStrays {
    let deviations = stretch_deviations(history, k, |stretch| {
        crate::stats::percentile_sorted(&crate::stats::sorted(stretch), 50.0)
    });
    SpanStrays {
        variance: variance_about_zero(&deviations),
        tail_df: tail_df(&deviations),
    }
}

/// The same with each stretch's mean: what a baseline of `k` runs (the
/// test takes its mean) varies by when nothing changed.
pub fn span_mean_variance(history: &[f64], k: usize) -> Option<f64> {
    variance_about_zero(&stretch_deviations(history, k, crate::stats::mean))
}

/// Stretches of the history a tail's weight needs before it is trusted:
/// kurtosis rests on the fourth power, so far more than a variance.
const MIN_TAIL_STRETCHES: usize = 60;

/// Each stretch's `statistic` less the history's mean.
fn stretch_deviations(history: &[f64], k: usize, statistic: fn(&[f64]) -> f64) -> Vec<f64> {
    if k == 0 || history.len() < k {
        return Vec::new();
    }
    let mean = crate::stats::mean(history);
    history.windows(k).map(|s| statistic(s) - mean).collect()
}

/// The deviations' mean square (they are about the history's mean);
/// `None` with fewer than 10.
fn variance_about_zero(deviations: &[f64]) -> Option<f64> {
    if deviations.len() < MIN_STRETCHES {
        return None;
    }
    let n = deviations.len() as f64;
    Some(deviations.iter().map(|d| d * d).sum::<f64>() / (n - 1.0))
}

/// See [`SpanStrays::tail_df`].
fn tail_df(deviations: &[f64]) -> Option<f64> {
    if deviations.len() < MIN_TAIL_STRETCHES {
        return None;
    }
    let n = deviations.len() as f64;
    let centre = deviations.iter().sum::<f64>() / n;
    let moment = |p: i32| deviations.iter().map(|d| (d - centre).powi(p)).sum::<f64>() / n;
    let variance = moment(2);
    if variance <= 0.0 {
        return None;
    }
    let excess = moment(4) / (variance * variance) - 3.0;
    (excess > 0.0).then(|| 4.0 + 6.0 / excess)
}

/// Consecutive runs whose median, at most the level, ends a slow stretch.
const CALM_RUNS: usize = 5;

/// Where the slow stretch that `series` (logarithms, oldest first) ends
/// in began: after the last calm run of the newest 5 consecutive runs
/// whose median is at most `level + allowance` (a calm run is one at most
/// that); 0 when no 5 are. A spell that ended has calm runs after it, so
/// it stays before the index; a slowdown that lasts has none (a median of
/// 5 rarely dips under the level while it lasts), so its runs stay after
/// it however long it lasts. `None` values (a metric a run lacks) are
/// left out.
pub fn excursion_start(series: &[Option<f64>], level: f64, allowance: f64) -> usize {
    let calm = |v: &f64| *v <= level + allowance;
    let Some(end) = (CALM_RUNS..=series.len()).rev().find(|&end| {
        let window: Vec<f64> = series[end - CALM_RUNS..end]
            .iter()
            .flatten()
            .copied()
            .collect();
        !window.is_empty()
            && calm(&crate::stats::percentile_sorted(
                &crate::stats::sorted(&window),
                50.0,
            ))
    }) else {
        return 0;
    };
    // The slow runs that close the calm window are the stretch's first.
    (end - CALM_RUNS..end)
        .rev()
        .find(|&i| series[i].as_ref().is_some_and(calm))
        .map_or(end, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slowdown_that_lasts_is_one_stretch_and_a_spell_that_ended_is_not() {
        let calm = |i: usize| 0.05 * ((i * 7 % 5) as f64 - 2.0);
        // A spell at runs 20..30, calm again until 60, slow from 60 on.
        let series: Vec<Option<f64>> = (0..100)
            .map(|i| {
                let spell = if (20..30).contains(&i) { 0.5 } else { 0.0 };
                let lasting = if i >= 60 { 0.4 } else { 0.0 };
                Some(calm(i) + spell + lasting)
            })
            .collect();
        assert_eq!(excursion_start(&series, 0.0, 0.05), 60);
        assert_eq!(
            excursion_start(&series[..40], 0.0, 0.05),
            40,
            "the spell ended"
        );
        assert_eq!(
            excursion_start(&series[..25], 0.0, 0.05),
            20,
            "inside the spell"
        );
        let mut gaps = series.clone();
        gaps[80] = None;
        assert_eq!(excursion_start(&gaps, 0.0, 0.05), 60);
        assert_eq!(excursion_start(&series[60..], 0.0, 0.05), 0, "never calm");
    }

    #[test]
    fn rare_far_spells_give_the_stretches_heavy_tails_and_even_noise_does_not() {
        let calm: Vec<f64> = (0..200)
            .map(|i| 0.05 * ((i * 7 % 5) as f64 - 2.0))
            .collect();
        assert_eq!(span_strays(&calm, 3).tail_df, None, "lighter than normal");
        let mut spells = calm.clone();
        for i in (50..56).chain(140..146) {
            spells[i] += 0.6;
        }
        let df = span_strays(&spells, 3).tail_df.unwrap();
        assert!((4.0..8.0).contains(&df), "{df}");
        // Fewer than 60 stretches of 3 runs say nothing.
        assert_eq!(span_strays(&spells[..61], 3).tail_df, None);
        assert!(span_strays(&spells[40..102], 3).tail_df.is_some());
    }

    #[test]
    fn a_slow_spell_in_the_history_widens_the_spread_of_short_stretches() {
        let calm: Vec<f64> = (0..60)
            .map(|i| (1.0 + 0.05 * ((i * 7 % 5) as f64 - 2.0)).ln())
            .collect();
        let mut spell = calm.clone();
        for v in &mut spell[20..30] {
            *v += 1.5_f64.ln();
        }
        let (quiet, loud) = (
            span_strays(&calm, 3).variance.unwrap(),
            span_strays(&spell, 3).variance.unwrap(),
        );
        assert!(loud > 10.0 * quiet, "{quiet} {loud}");
        assert_eq!(span_strays(&calm[..11], 3).variance, None);
        assert!(span_strays(&calm[..12], 3).variance.is_some());
        // A baseline's 30-run mean strays less than a 3-run median.
        assert!(span_mean_variance(&spell, 30).unwrap() < loud);
    }
}
