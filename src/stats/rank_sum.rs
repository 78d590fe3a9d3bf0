//! The exact null distribution of the Mann-Whitney U statistic for small
//! samples, counted once per pair of sample sizes and kept: statrs'
//! exact method enumerates every combination (1.9 million for 6 runs
//! against 30), too slow to test a few spans of runs on every evaluation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest smaller sample the exact distribution is kept for; beyond it
/// the normal approximation is good.
pub const EXACT_MAX_SMALLER: usize = 8;
/// Largest larger sample it is kept for (the tables stay small).
pub const EXACT_MAX_LARGER: usize = 200;

type Tail = Arc<Vec<f64>>;

/// `P(U >= u)` for each `u` in `0..=m*n`, for samples of `m` and `n`
/// without ties, `m <= n`.
fn upper_tail(m: usize, n: usize) -> Tail {
    static TABLES: OnceLock<Mutex<HashMap<(usize, usize), Tail>>> = OnceLock::new();
    let tables = TABLES.get_or_init(Default::default);
    if let Some(t) = tables
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(m, n))
    {
        return t.clone();
    }
    // ways[i][u] for the first j values of the second sample: the
    // arrangements of i and j values with statistic u, by the recurrence
    // on the largest value (from the first sample it exceeds all j of the
    // second, u - j; else u). One column of j is kept at a time.
    let max_u = m * n;
    let mut ways = vec![vec![0f64; max_u + 1]; m + 1];
    for row in ways.iter_mut() {
        row[0] = 1.0; // j = 0: every value is the first sample's, u = 0
    }
    for j in 1..=n {
        for i in 1..=m {
            let (below, rest) = ways.split_at_mut(i);
            let (previous_i, current) = (&below[i - 1], &mut rest[0]);
            // current holds ways[i][j - 1]; previous_i already ways[i - 1][j].
            for u in (j..=i * j).rev() {
                current[u] += previous_i[u - j];
            }
        }
    }
    let counts = &ways[m];
    let total: f64 = counts.iter().sum();
    let mut tail = vec![0.0; max_u + 1];
    let mut above = 0.0;
    for u in (0..=max_u).rev() {
        above += counts[u];
        tail[u] = above / total;
    }
    let tail = Arc::new(tail);
    tables
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((m, n), tail.clone());
    tail
}

/// The exact one-sided p-value that `greater` is stochastically greater
/// than `other`, when the samples are small enough and have no ties:
/// `P(U >= u)` for U counting pairs where `greater`'s value is larger.
/// `None` when the normal approximation should be used instead.
pub fn exact_p_greater(greater: &[f64], other: &[f64]) -> Option<f64> {
    let (m, n) = (greater.len(), other.len());
    if m == 0 || n == 0 || m.min(n) > EXACT_MAX_SMALLER || m.max(n) > EXACT_MAX_LARGER {
        return None;
    }
    let mut u = 0usize;
    for g in greater {
        for o in other {
            match g.partial_cmp(o)? {
                std::cmp::Ordering::Greater => u += 1,
                std::cmp::Ordering::Equal => return None,
                std::cmp::Ordering::Less => {}
            }
        }
    }
    // U's distribution is symmetric in the samples' roles: the table for
    // (smaller, larger) serves both orders.
    let tail = upper_tail(m.min(n), m.max(n));
    Some(tail[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_tails_match_enumeration() {
        // 3 values all above 30: 1 arrangement of C(33, 3) = 5456.
        let base: Vec<f64> = (0..30).map(f64::from).collect();
        let high = [100.0, 101.0, 102.0];
        let p = exact_p_greater(&high, &base).unwrap();
        assert!((p - 1.0 / 5456.0).abs() < 1e-12, "{p}");
        // The same two samples, the other way round: certain.
        assert!((exact_p_greater(&base, &high).unwrap() - 1.0).abs() < 1e-12);
        assert!((exact_p_greater(&[-1.0, -2.0, -3.0], &base).unwrap() - 1.0).abs() < 1e-12);
        // Against statrs' own exact enumeration on a small case.
        let a = [1.5, 7.5, 3.2, 9.9];
        let b = [2.0, 4.0, 6.0, 8.0, 10.0, 0.5];
        let ours = exact_p_greater(&a, &b).unwrap();
        // (statrs reads the right tail when its first sample is the larger.)
        let theirs = statrs::stats_tests::mannwhitneyu::mannwhitneyu(
            &b,
            &a,
            statrs::stats_tests::mannwhitneyu::MannWhitneyUMethod::Exact,
            statrs::stats_tests::Alternative::Less,
        )
        .unwrap()
        .1;
        assert!((ours - theirs).abs() < 1e-12, "{ours} vs {theirs}");
    }

    #[test]
    fn ties_and_large_samples_fall_back() {
        assert_eq!(exact_p_greater(&[1.0, 2.0], &[2.0, 3.0]), None);
        let many: Vec<f64> = (0..20).map(f64::from).collect();
        assert_eq!(exact_p_greater(&many, &many), None);
    }
}
