//! Pure statistics over raw samples: numpy-compatible percentiles, mean,
//! median and population standard deviation.

pub mod bench;
pub mod fisher;
pub mod rank_sum;

/// Linear-interpolated percentile of already sorted samples, as numpy's
/// default (`method="linear"`): rank `(n-1)·p/100` between the two nearest
/// order statistics. Returns 0 for an empty slice, as `vllm bench serve`
/// does (`np.percentile(x or 0, p)`).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (n - 1) as f64 * (p / 100.0).clamp(0.0, 1.0);
            let lower = rank.floor() as usize;
            let upper = (lower + 1).min(n - 1);
            let fraction = rank - lower as f64;
            sorted[lower] + (sorted[upper] - sorted[lower]) * fraction
        }
    }
}

/// Arithmetic mean; 0 for an empty slice.
pub fn mean(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// The lowest and highest of `values`, NaNs left out; `None` when none is
/// left.
pub fn range(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| !v.is_nan())
        .fold(None, |seen, v| match seen {
            None => Some((v, v)),
            Some((low, high)) => Some((low.min(v), high.max(v))),
        })
}

/// Population standard deviation (numpy's default `ddof=0`); 0 when empty.
pub fn std_dev(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let m = mean(samples);
    let variance = samples.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / samples.len() as f64;
    variance.sqrt()
}

/// Sorts a copy of the samples for percentile look-ups; NaNs sort last.
pub fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut copy = samples.to_vec();
    copy.sort_by(|a, b| a.total_cmp(b));
    copy
}

/// Mean, median, standard deviation and requested percentiles of one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    pub count: usize,
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    /// `(percentile, value)` in the order requested.
    pub percentiles: Vec<(f64, f64)>,
}

impl Distribution {
    pub fn of(samples: &[f64], percentiles: &[f64]) -> Self {
        let sorted = sorted(samples);
        Distribution {
            count: samples.len(),
            mean: mean(samples),
            median: percentile_sorted(&sorted, 50.0),
            std: std_dev(samples),
            percentiles: percentiles
                .iter()
                .map(|&p| (p, percentile_sorted(&sorted, p)))
                .collect(),
        }
    }

    /// The value at percentile `p` if it was requested.
    pub fn at(&self, p: f64) -> Option<f64> {
        self.percentiles
            .iter()
            .find(|(q, _)| (*q - p).abs() < 1e-9)
            .map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_leaves_out_nans_and_is_none_when_nothing_is_left() {
        assert_eq!(range([3.0, f64::NAN, -1.0, 2.0]), Some((-1.0, 3.0)));
        assert_eq!(range([f64::NAN]), None);
        assert_eq!(range(Vec::new()), None);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_match_numpy_linear() {
        // np.percentile([1, 2, 3, 4], [0, 25, 50, 90, 99, 100])
        // -> [1.0, 1.75, 2.5, 3.7, 3.97, 4.0]
        let s = [1.0, 2.0, 3.0, 4.0];
        let expected = [
            (0.0, 1.0),
            (25.0, 1.75),
            (50.0, 2.5),
            (90.0, 3.7),
            (99.0, 3.97),
            (100.0, 4.0),
        ];
        for (p, v) in expected {
            assert!(
                close(percentile_sorted(&s, p), v),
                "p{p}: {}",
                percentile_sorted(&s, p)
            );
        }
    }

    #[test]
    fn percentile_of_empty_and_single() {
        assert_eq!(percentile_sorted(&[], 99.0), 0.0);
        assert_eq!(percentile_sorted(&[7.5], 1.0), 7.5);
    }

    #[test]
    fn mean_and_population_std() {
        // np.std([2, 4, 4, 4, 5, 5, 7, 9]) == 2.0
        let s = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert!(close(mean(&s), 5.0));
        assert!(close(std_dev(&s), 2.0));
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(std_dev(&[]), 0.0);
    }

    #[test]
    fn distribution_sorts_unsorted_input() {
        let d = Distribution::of(&[4.0, 1.0, 3.0, 2.0], &[50.0, 90.0]);
        assert!(close(d.median, 2.5));
        assert!(close(d.at(90.0).unwrap(), 3.7));
        assert_eq!(d.at(99.0), None);
        assert_eq!(d.count, 4);
    }
}
