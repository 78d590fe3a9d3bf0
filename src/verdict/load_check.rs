//! Whether two sides' server loads allow comparing them: the load check
//! that refuses an evaluation, and the range of loads a slowdown must lie
//! within to be a regression without its confirmation.

use super::{DetectorSettings, RunPoint};
use statrs::stats_tests::NaNPolicy;
use statrs::stats_tests::ks_test::{KSTwoSampleAlternativeMethod, ks_twosample};

/// The lowest and highest load `runs` ran under; `None` when none was
/// read.
pub(super) fn load_range(runs: &[RunPoint]) -> Option<(f64, f64)> {
    crate::stats::range(runs.iter().filter_map(|r| r.load))
}

/// The `load_min_difference` of a comparison whose two sides were
/// measured in the same rounds (a canary's requests): one load, read or
/// not, so never refused for load and always within the baseline's.
pub(super) const SAME_ROUNDS: f64 = f64::INFINITY;

/// Whether every run of `runs` ran within the range of loads the
/// baseline's runs ran under (`baseline_loads`), widened by `margin` each
/// side. What was not measured is not known to be within: a run without
/// a load, or any run beside a baseline without loads (a server whose
/// `/metrics` could not be read then), so such a slowdown waits for its
/// confirmation. A margin of [`SAME_ROUNDS`] takes every run as within.
pub(super) fn within_baseline_loads(
    baseline_loads: Option<(f64, f64)>,
    runs: &[&RunPoint],
    margin: f64,
) -> bool {
    if margin == SAME_ROUNDS {
        return true;
    }
    let Some((low, high)) = baseline_loads else {
        return false;
    };
    runs.iter().all(|r| {
        r.load
            .is_some_and(|load| load >= low - margin && load <= high + margin)
    })
}

/// Whether the load the two sides were measured under is comparable: the
/// candidate's runs all beyond the baseline's range of loads (widened by
/// `load_min_difference`) on one side, or a KS test that tells the two
/// apart. A few runs are never enough for KS against a short baseline
/// (2 runs against 12 give at best p = 1/91 > 0.01), yet a young build
/// measured wholly outside its baseline's loads has not been compared.
/// `baseline_loads` is `load_range(baseline)`, found once per evaluation.
pub(super) fn load_differs(
    baseline_loads: Option<(f64, f64)>,
    baseline: &[RunPoint],
    candidate: &[RunPoint],
    cfg: &DetectorSettings,
) -> Option<String> {
    let b: Vec<f64> = baseline.iter().filter_map(|r| r.load).collect();
    let c: Vec<f64> = candidate.iter().filter_map(|r| r.load).collect();
    if b.len() < 2 || c.len() < 2 {
        return None;
    }
    let difference = (crate::stats::mean(&c) - crate::stats::mean(&b)).abs();
    if difference < cfg.load_min_difference {
        return None;
    }
    let (low, high) = baseline_loads?;
    let margin = cfg.load_min_difference;
    if c.iter().all(|&l| l > high + margin) || c.iter().all(|&l| l < low - margin) {
        return Some(format!(
            "server load differs (mean running+waiting differs by {difference:.1}, all {} candidate runs outside the baseline's {low:.1}-{high:.1})",
            c.len()
        ));
    }
    let p = ks_twosample(
        b,
        c,
        KSTwoSampleAlternativeMethod::TwoSidedAsymptotic,
        NaNPolicy::Emit,
    )
    .map(|(_, p)| p)
    .unwrap_or(1.0);
    (p < cfg.load_ks_alpha).then(|| {
        format!(
            "server load differs (mean running+waiting differs by {difference:.1}, KS p = {p:.2e})"
        )
    })
}
