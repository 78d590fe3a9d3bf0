//! Open-loop arrival times: Gamma-distributed gaps (shape = burstiness,
//! 1.0 = Poisson) with mean 1/rate, computed before the run starts.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma};

/// Offsets from the run start; the first request goes at zero.
pub fn arrival_offsets(count: usize, rate: f64, burstiness: f64, seed: u64) -> Vec<Duration> {
    let shape = if burstiness > 0.0 { burstiness } else { 1.0 };
    let gamma = Gamma::new(shape, 1.0 / (rate * shape)).expect("shape and scale are positive");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut at = 0.0f64;
    (0..count)
        .map(|i| {
            if i > 0 {
                at += gamma.sample(&mut rng);
            }
            Duration::from_secs_f64(at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_gap_is_one_over_rate_and_offsets_increase() {
        for burstiness in [0.5, 1.0, 4.0] {
            let offsets = arrival_offsets(20_001, 50.0, burstiness, 3);
            assert_eq!(offsets[0], Duration::ZERO);
            assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
            let mean_gap = offsets.last().unwrap().as_secs_f64() / 20_000.0;
            assert!(
                (mean_gap - 0.02).abs() < 0.002,
                "burstiness {burstiness}: mean gap {mean_gap}"
            );
        }
    }

    #[test]
    fn higher_burstiness_means_more_regular_gaps() {
        let cv = |b: f64| {
            let o = arrival_offsets(10_001, 10.0, b, 9);
            let gaps: Vec<f64> = o.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
            crate::stats::std_dev(&gaps) / crate::stats::mean(&gaps)
        };
        assert!(cv(4.0) < cv(1.0));
        assert!(cv(1.0) < cv(0.25));
    }
}
