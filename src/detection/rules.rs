//! The regression rules used in the field, each applied as its authors
//! apply it, to one metric series at a time: PyTorch HUD's vLLM rule,
//! Mozilla Perfherder's t-test, Netflix Kayenta's Mann-Whitney classifier;
//! and the oracle, told when the change happened and how noisy the trace
//! is at every span of runs. A rule alerts on a series when it alerts on
//! any of its metrics.

use statrs::distribution::{ContinuousCDF, Normal};

use crate::vocabulary::records::RunRecord;

/// The metrics the field's rules watch: the medians and p90s of time to
/// first token and time per output token of each run.
pub const WATCHED: [&str; 4] = ["ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"];

/// The change-point detectors run outside the process, by
/// `benches/detection/changepoints.py` over fewer trials (they are slow):
/// the script's key for each, and its row's name in the table.
pub const EXTERNAL: [(&str, &str); 2] = [
    ("otava", "Apache Otava (E-Divisive means)"),
    ("edivisive", "MongoDB E-Divisive"),
];

/// A run's value of one watched metric, in seconds.
pub fn value(run: &RunRecord, metric: &str) -> f64 {
    let s = &run.summary;
    match metric {
        "ttft_p50" => s.ttft.p50,
        "ttft_p90" => s.ttft.p90,
        "tpot_p50" => s.tpot.p50,
        "tpot_p90" => s.tpot.p90,
        _ => f64::NAN,
    }
}

/// A rule over one metric's series: whether it alerts at the newest value.
pub trait SeriesRule {
    fn alerts(&self, history: &[f64]) -> bool;
}

/// PyTorch HUD's vLLM benchmark rule: the baseline is the median of the
/// previous 3 runs; a regression when 2 consecutive runs are each at
/// least 1.2x their baseline.
pub struct Hud;

impl SeriesRule for Hud {
    fn alerts(&self, h: &[f64]) -> bool {
        let over = |i: usize| {
            if i < 3 {
                return false;
            }
            let base = median(&h[i - 3..i]);
            h[i] >= 1.2 * base
        };
        let n = h.len();
        n >= 5 && over(n - 1) && over(n - 2)
    }
}

/// Mozilla Perfherder (Treeherder's `perfalert.detect_changes`, one value
/// per push): for each point a t statistic between the values before it
/// (12, growing to 24 while no change is seen) and the 12 from it on, both
/// linearly weighted toward the point; a change where |t| > 7, both
/// neighbours' |t| are not higher and both windows are full; an alert when
/// it is an increase of at least 2% (`PERFHERDER_REGRESSION_THRESHOLD`).
/// Online, an evaluation alerts when a change appears that the previous
/// evaluation did not find.
pub struct Perfherder;

impl Perfherder {
    const MIN_BACK: usize = 12;
    const MAX_BACK: usize = 24;
    const FORE: usize = 12;
    const T: f64 = 7.0;
    const MIN_CHANGE: f64 = 0.02;

    /// The points where `detect_changes` marks a regression.
    fn regressions(h: &[f64]) -> Vec<usize> {
        let n = h.len();
        let mut t = vec![0.0; n];
        let mut full = vec![false; n];
        let mut means = vec![(0.0, 0.0); n];
        let mut last_seen_regression = 0usize;
        for i in 1..n {
            // Backwards from i - 1, as far as the growing window allows.
            let reach = last_seen_regression.clamp(Self::MIN_BACK, Self::MAX_BACK);
            let back: Vec<f64> = (0..i).rev().take(reach).map(|j| h[j]).collect();
            let fore: Vec<f64> = h[i..(i + Self::FORE).min(n)].to_vec();
            full[i] = back.len() >= Self::MIN_BACK && fore.len() >= Self::FORE;
            means[i] = (crate::stats::mean(&back), crate::stats::mean(&fore));
            t[i] = calc_t(&back, &fore).abs();
            if t[i] > Self::T {
                last_seen_regression = 0;
            } else {
                last_seen_regression += 1;
            }
        }
        (1..n)
            .filter(|&i| {
                full[i]
                    && t[i] > Self::T
                    && t[i - 1] <= t[i]
                    && (i + 1 >= n || t[i + 1] <= t[i])
                    && means[i].0 > 0.0
                    && (means[i].1 - means[i].0) / means[i].0 >= Self::MIN_CHANGE
            })
            .collect()
    }
}

/// `analyze` with `linear_weights`: the weighted mean, and the sample
/// variance around it.
fn weighted(values: &[f64]) -> (f64, f64, usize) {
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0, 0);
    }
    let weights: Vec<f64> = (0..n).map(|i| (n - i) as f64 / n as f64).collect();
    let total: f64 = weights.iter().sum();
    let avg = values.iter().zip(&weights).map(|(v, w)| v * w).sum::<f64>() / total;
    let variance = if n > 1 {
        values.iter().map(|v| (v - avg).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    (avg, variance, n)
}

/// `calc_t(w1, w2, linear_weights)`; each window starts at the point.
fn calc_t(back: &[f64], fore: &[f64]) -> f64 {
    if back.is_empty() || fore.is_empty() {
        return 0.0;
    }
    let (a1, v1, n1) = weighted(back);
    let (a2, v2, n2) = weighted(fore);
    let delta = a2 - a1;
    if delta == 0.0 {
        return 0.0;
    }
    if v1 == 0.0 && v2 == 0.0 {
        return f64::INFINITY;
    }
    delta / (v1 / n1 as f64 + v2 / n2 as f64).sqrt()
}

impl SeriesRule for Perfherder {
    fn alerts(&self, h: &[f64]) -> bool {
        if h.len() < Self::MIN_BACK + Self::FORE + 1 {
            return false;
        }
        let now = Self::regressions(h);
        let before = Self::regressions(&h[..h.len() - 1]);
        now.iter().any(|i| !before.contains(i))
    }
}

/// Netflix Kayenta's Mann-Whitney classifier as its ACA judge builds it
/// (tolerance 0.25, confidence 0.98): the experiment (the newest 12 runs)
/// against the control (the 30 before them); High when the lower end of
/// the shift's 98% interval lies above 25% of the Hodges-Lehmann shift
/// itself and the experiment's mean is at least the control's. (Kayenta
/// finds the interval by root-finding on the normal approximation; this
/// uses the distribution-free interval of the same test.)
pub struct Kayenta;

impl SeriesRule for Kayenta {
    fn alerts(&self, h: &[f64]) -> bool {
        const EXPERIMENT: usize = 12;
        const CONTROL: usize = 30;
        let n = h.len();
        if n < EXPERIMENT + CONTROL {
            return false;
        }
        let control = &h[n - EXPERIMENT - CONTROL..n - EXPERIMENT];
        let experiment = &h[n - EXPERIMENT..];
        let (estimate, low, _) = crate::verdict::hodges_lehmann(control, experiment, 0.98);
        let ratio = crate::stats::mean(experiment) / crate::stats::mean(control);
        low > 0.25 * estimate.abs() && (ratio.is_nan() || ratio >= 1.0)
    }
}

/// Runs the oracle's baseline holds: the 30 before the change.
pub const ORACLE_BASELINE: usize = 30;

/// The oracle: told the change's run and the trace's noise, it compares
/// the mean logarithm of the runs since the change with that of the 30
/// before it by a z test. The noise it is told is, for every span of k
/// runs, the spread that very difference (k runs after a point against
/// the 30 before it) shows across the whole untouched trace: every
/// correlation between runs, slow spells included, is in it. Its level
/// allows one false alarm in 10,000 evaluations over the watched metrics.
/// With a `skip` it leaves out the first changed runs, as a new build's
/// warm-up is left out: the limit for a verdict that may not use them.
pub struct Oracle {
    pub change_at: usize,
    /// Changed runs it leaves out before its span.
    pub skip: usize,
    /// Standard deviation of the difference for spans of 1, 2, ... runs,
    /// `skip` runs after the baseline (see [`span_noise`]).
    pub span_sd: Vec<f64>,
    /// The z it alarms above, by span (1, 2, ... runs; the last for any
    /// longer): [`Oracle::one_in_10000_z`] at every span, or levels
    /// calibrated on untouched series (see
    /// [`crate::detection::harness::calibrate`]).
    pub critical_z: Vec<f64>,
}

impl Oracle {
    /// One false alarm in 10,000 evaluations over the watched metrics.
    pub fn one_in_10000_z() -> f64 {
        Normal::standard().inverse_cdf(1.0 - 1e-4 / WATCHED.len() as f64)
    }

    /// The span (runs since the change, after `skip`) and the z of those
    /// runs against the 30 before the change, once there are such runs.
    pub fn statistic(&self, h: &[f64]) -> Option<(usize, f64)> {
        let n = h.len();
        let first = self.change_at + self.skip;
        if n <= first || self.change_at < ORACLE_BASELINE || self.span_sd.is_empty() {
            return None;
        }
        let logs = |v: &[f64]| v.iter().map(|x| x.ln()).collect::<Vec<f64>>();
        let before = logs(&h[self.change_at - ORACLE_BASELINE..self.change_at]);
        let after = logs(&h[first..]);
        let span = after.len().min(self.span_sd.len());
        let sd = self.span_sd[span - 1];
        let difference = crate::stats::mean(&after) - crate::stats::mean(&before);
        (sd > 0.0).then(|| (span, difference / sd))
    }

    /// The level at a span of `span` runs.
    fn level(&self, span: usize) -> f64 {
        match self.critical_z.len() {
            0 => Self::one_in_10000_z(),
            n => self.critical_z[span.min(n) - 1],
        }
    }
}

impl SeriesRule for Oracle {
    fn alerts(&self, h: &[f64]) -> bool {
        self.statistic(h)
            .is_some_and(|(span, z)| z > self.level(span))
    }
}

/// For spans of 1 to `spans` runs, the standard deviation across a trace
/// (read as a circle, so every run starts a span) of the mean logarithm of
/// the k runs from `gap` runs after a point less that of the 30 runs
/// before it.
pub fn span_noise(values: &[f64], spans: usize, gap: usize) -> Vec<f64> {
    let n = values.len();
    if n == 0 || values.iter().any(|v| *v <= 0.0 || !v.is_finite()) {
        return Vec::new();
    }
    let logs: Vec<f64> = values.iter().map(|v| v.ln()).collect();
    let at = |i: usize| logs[i % n];
    (1..=spans)
        .map(|k| {
            let differences: Vec<f64> = (0..n)
                .map(|p| {
                    let p = p + n * (ORACLE_BASELINE / n + 1);
                    let after = (0..k).map(|i| at(p + gap + i)).sum::<f64>() / k as f64;
                    let before = (1..=ORACLE_BASELINE).map(|i| at(p - i)).sum::<f64>()
                        / ORACLE_BASELINE as f64;
                    after - before
                })
                .collect();
            crate::stats::std_dev(&differences)
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    crate::stats::percentile_sorted(&crate::stats::sorted(v), 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_after_warm_up_leaves_the_first_changed_runs_out() {
        // A slow wave: runs further apart differ more.
        let values: Vec<f64> = (0..200)
            .map(|i| (0.2 * (i as f64 / 8.0).sin()).exp())
            .collect();
        let (near, gapped) = (span_noise(&values, 3, 0), span_noise(&values, 3, 2));
        assert_eq!((near.len(), gapped.len()), (3, 3));
        assert!(gapped[0] > near[0], "{gapped:?} {near:?}");
        // 30 calm runs, then every run 1.5 times slower.
        let mut series = vec![1.0; 30];
        series.extend([1.5; 5]);
        let oracle = |skip| Oracle {
            change_at: 30,
            skip,
            span_sd: vec![0.05; 5],
            critical_z: vec![Oracle::one_in_10000_z()],
        };
        assert!(oracle(0).alerts(&series[..31]));
        assert!(
            !oracle(2).alerts(&series[..32]),
            "both changed runs left out"
        );
        assert!(oracle(2).alerts(&series[..33]));
    }
}
