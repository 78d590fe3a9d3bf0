//! Fisher's exact test of two counts of successes, one-sided: how likely
//! the first sample would catch as many as it did, or more, were both
//! drawn alike (the hypergeometric tail).

use statrs::distribution::{DiscreteCDF, Hypergeometric};

/// `P(X >= caught_a)` for `X` the first sample's successes when the
/// `caught_a + caught_b` successes fall at random among the
/// `trials_a + trials_b` trials: small when the first catches more.
/// Counts beyond their trials are taken as all the trials.
pub fn more_in_first(caught_a: u64, trials_a: u64, caught_b: u64, trials_b: u64) -> f64 {
    let (a, b) = (caught_a.min(trials_a), caught_b.min(trials_b));
    if a == 0 {
        return 1.0;
    }
    match Hypergeometric::new(trials_a + trials_b, a + b, trials_a) {
        // sf(x) is P(X > x).
        Ok(tail) => tail.sf(a - 1),
        Err(_) => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_gives_the_hypergeometric_tail() {
        // C(60,5) / C(120,5): five catches of 60 against none of 60.
        assert!((more_in_first(5, 60, 0, 60) - 0.028_657_6).abs() < 1e-6);
        // 13 against 5 of 60 each, and 12 against 6 (checked by summing
        // the binomials directly).
        assert!((more_in_first(13, 60, 5, 60) - 0.035_690_6).abs() < 1e-6);
        assert!((more_in_first(12, 60, 6, 60) - 0.100_155_9).abs() < 1e-6);
        assert_eq!(more_in_first(0, 60, 0, 60), 1.0);
        assert_eq!(more_in_first(60, 60, 0, 60), more_in_first(99, 60, 0, 60));
        // Fewer in the first: no sign that it catches more.
        assert!(more_in_first(1, 60, 10, 60) > 0.99);
    }
}
