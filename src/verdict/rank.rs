//! The rank statistics the detector stands on: the Mann-Whitney p-value,
//! the Hodges-Lehmann shift with its interval, the Benjamini-Hochberg
//! adjustment, and how far correlation between consecutive runs widens
//! them.

use statrs::distribution::{ContinuousCDF, Normal};
use statrs::stats_tests::Alternative;
use statrs::stats_tests::mannwhitneyu::{MannWhitneyUMethod, mannwhitneyu};

/// Hodges-Lehmann shift (median of all candidate - baseline differences)
/// with its distribution-free confidence interval from the normal
/// approximation of the Mann-Whitney statistic.
pub fn hodges_lehmann(baseline: &[f64], candidate: &[f64], confidence: f64) -> (f64, f64, f64) {
    let mut diffs: Vec<f64> = candidate
        .iter()
        .flat_map(|c| baseline.iter().map(move |b| c - b))
        .collect();
    diffs.sort_by(f64::total_cmp);
    let (n, m) = (baseline.len() as f64, candidate.len() as f64);
    let shift = crate::stats::percentile_sorted(&diffs, 50.0);
    let z = Normal::standard().inverse_cdf(1.0 - (1.0 - confidence) / 2.0);
    let k = (n * m / 2.0 - z * (n * m * (n + m + 1.0) / 12.0).sqrt()).floor();
    let k = (k.max(0.0) as usize).min(diffs.len().saturating_sub(1));
    let low = diffs[k];
    let high = diffs[diffs.len() - 1 - k];
    (shift, low, high)
}

/// Benjamini-Hochberg adjusted p-values, in the input order.
pub fn benjamini_hochberg(p: &[f64]) -> Vec<f64> {
    let n = p.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![1.0; n];
    let mut running = 1.0f64;
    for (rank, &i) in order.iter().enumerate().rev() {
        running = running.min(p[i] * n as f64 / (rank + 1) as f64);
        adjusted[i] = running.min(1.0);
    }
    adjusted
}

/// One-sided Mann-Whitney p-value that `candidate` is stochastically
/// greater than `baseline`. statrs 0.19's exact method (small samples
/// without ties) reads the wrong tail when its first sample is the smaller
/// one (8 clearly slower runs against 12 gave p = 0.99999), so the larger
/// sample always goes first: `greater(c, b)` is `less(b, c)`.
pub fn p_greater(candidate: &[f64], baseline: &[f64]) -> f64 {
    // Small samples without ties: the exact distribution, counted once.
    if let Some(p) = crate::stats::rank_sum::exact_p_greater(candidate, baseline) {
        return p;
    }
    let result = if candidate.len() >= baseline.len() {
        mannwhitneyu(
            candidate,
            baseline,
            MannWhitneyUMethod::Automatic,
            Alternative::Greater,
        )
    } else {
        mannwhitneyu(
            baseline,
            candidate,
            MannWhitneyUMethod::Automatic,
            Alternative::Less,
        )
    };
    result.map(|(_, p)| p).unwrap_or(1.0)
}

/// How much correlation between consecutive runs inflates a mean's
/// variance: (1 + r) / (1 - r) for the lag-1 autocorrelation r of the
/// runs in order (AR(1)), r clamped to [0, 0.8]; 1 for independent runs.
pub fn variance_inflation(runs: &[f64]) -> f64 {
    let n = runs.len();
    if n < 8 {
        return 1.0;
    }
    let m = crate::stats::mean(runs);
    let c0: f64 = runs.iter().map(|v| (v - m).powi(2)).sum();
    if c0 <= 0.0 {
        return 1.0;
    }
    let c1: f64 = (1..n).map(|i| (runs[i] - m) * (runs[i - 1] - m)).sum();
    let r = (c1 / c0).clamp(0.0, 0.8);
    (1.0 + r) / (1.0 - r)
}

/// A one-sided p-value as if the samples were `inflation` times fewer:
/// its normal score shrinks by the square root.
pub(super) fn inflate_p(p: f64, inflation: f64) -> f64 {
    if inflation <= 1.0 || !(0.0..0.5).contains(&p) {
        return p;
    }
    let normal = Normal::standard();
    let z = normal.inverse_cdf(1.0 - p) / inflation.sqrt();
    1.0 - normal.cdf(z)
}

/// The interval's confidence widened the same way.
pub(super) fn inflate_confidence(confidence: f64, inflation: f64) -> f64 {
    if inflation <= 1.0 {
        return confidence;
    }
    let normal = Normal::standard();
    let z = normal.inverse_cdf(1.0 - (1.0 - confidence) / 2.0) * inflation.sqrt();
    (2.0 * normal.cdf(z) - 1.0).min(1.0 - 1e-12)
}
