//! How far a few runs stray on their own: the spread of the median of k
//! consecutive runs of a build's history, on logarithms, with every
//! correlation between runs and every slow spell the history holds.

/// Stretches of the history a spread needs before it is trusted.
const MIN_STRETCHES: usize = 10;

/// The variance, over every stretch of `k` consecutive runs of `history`
/// (oldest first), of the stretch's median logarithm about the history's
/// mean logarithm: what the candidate's median of `k` runs varies by when
/// nothing changed. `None` when the history has fewer than 10 stretches
/// or a value that is not positive.
pub fn span_variance(history: &[f64], k: usize) -> Option<f64> {
    if k == 0 || history.len() < k + MIN_STRETCHES - 1 || history.iter().any(|v| *v <= 0.0) {
        return None;
    }
    let logs: Vec<f64> = history.iter().map(|v| v.ln()).collect();
    let mean = crate::stats::mean(&logs);
    let deviations: Vec<f64> = logs
        .windows(k)
        .map(|stretch| {
            let sorted = crate::stats::sorted(stretch);
            crate::stats::percentile_sorted(&sorted, 50.0) - mean
        })
        .collect();
    let n = deviations.len() as f64;
    Some(deviations.iter().map(|d| d * d).sum::<f64>() / (n - 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_spell_in_the_history_widens_the_spread_of_short_stretches() {
        let calm: Vec<f64> = (0..60)
            .map(|i| 1.0 + 0.05 * ((i * 7 % 5) as f64 - 2.0))
            .collect();
        let mut spell = calm.clone();
        for v in &mut spell[20..30] {
            *v *= 1.5;
        }
        let (quiet, loud) = (
            span_variance(&calm, 3).unwrap(),
            span_variance(&spell, 3).unwrap(),
        );
        assert!(loud > 10.0 * quiet, "{quiet} {loud}");
        assert_eq!(span_variance(&calm[..11], 3), None);
        assert!(span_variance(&calm[..12], 3).is_some());
        assert_eq!(
            span_variance(
                &[1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                3
            ),
            None
        );
    }
}
