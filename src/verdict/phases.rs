//! Each phase of a request measured against the other: TTFT p50 over TPOT
//! p50 and the reverse. The machine's slow spells slow prefill and decode
//! alike (on the recorded traces the two p50s' logarithms correlate
//! 0.76-0.89 run to run), so their ratio strays about half as far as
//! either, and a change to one phase alone stands out of it sooner.

use super::{MetricResult, RunPoint};

/// `(ratio metric, the phase it judges, the phase it is measured against)`.
pub const RATIOS: [(&str, &str, &str); 2] = [
    ("ttft_p50_over_tpot", "ttft_p50", "tpot_p50"),
    ("tpot_p50_over_ttft", "tpot_p50", "ttft_p50"),
];

/// The phase a ratio metric judges (`ttft_p50` for `ttft_p50_over_tpot`),
/// or `None` for a metric measured as it is.
fn judged_phase(metric: &str) -> Option<&'static str> {
    parts(metric).map(|(phase, _)| phase)
}

/// Whether `metric` is a phase against the other.
pub fn is_ratio(metric: &str) -> bool {
    judged_phase(metric).is_some()
}

/// A ratio's two phases, `(the phase it judges, the one it is measured
/// against)`, or `None` for a metric measured as it is.
pub fn parts(metric: &str) -> Option<(&'static str, &'static str)> {
    RATIOS
        .iter()
        .find(|(ratio, _, _)| *ratio == metric)
        .map(|(_, phase, against)| (*phase, *against))
}

/// Adds each ratio a run has both phases of, positive, to its values.
pub fn add_ratios(point: &mut RunPoint) {
    for (ratio, phase, against) in RATIOS {
        if let (Some(p), Some(a)) = (point.get(phase), point.get(against))
            && p > 0.0
            && a > 0.0
        {
            point.values.push((ratio.to_owned(), p / a));
        }
    }
}

/// Whether `metric`, when a ratio, has its phase itself slower by the
/// threshold (a ratio rises too when the other phase got faster); true
/// for any other metric.
pub fn phase_is_slower(results: &[MetricResult], metric: &str, threshold: f64) -> bool {
    judged_phase(metric).is_none_or(|phase| {
        results
            .iter()
            .any(|r| r.metric == phase && r.relative_change >= threshold)
    })
}

/// A ratio flags a slowdown only where its phase is itself slower by the
/// threshold (a ratio also rises when the other phase got faster), and
/// never an improvement (it falls as far when the other phase got slower).
pub fn judge_ratios_by_their_phase(results: &mut [MetricResult], threshold: f64) {
    for i in 0..results.len() {
        if is_ratio(&results[i].metric) {
            let slower = phase_is_slower(results, &results[i].metric, threshold);
            results[i].flagged &= slower;
            results[i].improvement = false;
        }
    }
}

/// A metric's baseline and candidate medians for people: a latency in
/// milliseconds, a phase against the other as the ratio it is.
pub fn medians_text(metric: &str, baseline: f64, candidate: f64) -> String {
    match is_ratio(metric) {
        true => format!(
            "median ratio {} -> {}",
            ratio_text(baseline),
            ratio_text(candidate)
        ),
        false => format!(
            "median {:.1} ms -> {:.1} ms",
            baseline * 1e3,
            candidate * 1e3
        ),
    }
}

/// A ratio's value with three significant digits: TPOT over TTFT is
/// often a few hundredths or less.
fn ratio_text(value: f64) -> String {
    let decimals = if value > 0.0 && value < 1.0 {
        (2.0 - value.log10().floor()) as usize
    } else {
        2
    };
    format!("{value:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(metric: &str, change: f64, flagged: bool) -> MetricResult {
        MetricResult {
            metric: metric.into(),
            baseline_median: 1.0,
            candidate_median: 1.0 + change,
            relative_change: change,
            ci_low: change / 2.0,
            ci_high: change * 2.0,
            p_value: 1e-6,
            p_adjusted: 1e-5,
            flagged,
            improvement: change < 0.0,
            alerting: true,
            runs: 6,
            at_load: None,
        }
    }

    #[test]
    fn a_ratio_is_written_with_three_significant_digits() {
        assert_eq!(ratio_text(3.921), "3.92");
        assert_eq!(ratio_text(0.01234), "0.0123");
        assert_eq!(ratio_text(0.255), "0.255");
        assert_eq!(ratio_text(12.5), "12.50");
    }

    #[test]
    fn a_run_gets_each_ratio_it_has_both_phases_of() {
        let mut point = RunPoint {
            values: vec![("ttft_p50".into(), 0.020), ("tpot_p50".into(), 0.004)],
            load: None,
        };
        add_ratios(&mut point);
        assert_eq!(point.get("ttft_p50_over_tpot"), Some(5.0));
        assert_eq!(point.get("tpot_p50_over_ttft"), Some(0.2));
        let mut one_phase = RunPoint {
            values: vec![("ttft_p50".into(), 0.020), ("tpot_p50".into(), 0.0)],
            load: None,
        };
        add_ratios(&mut one_phase);
        assert_eq!(one_phase.values.len(), 2, "no ratio to a phase of 0");
    }

    #[test]
    fn a_ratio_flags_only_where_its_phase_is_slower_itself() {
        // TTFT +30% against TPOT: flagged. TPOT 25% faster raises the
        // same ratio with TTFT unchanged: not flagged, and a falling
        // ratio is never an improvement.
        let mut slower = vec![
            result("ttft_p50", 0.30, false),
            result("tpot_p50", 0.0, false),
            result("ttft_p50_over_tpot", 0.30, true),
            result("tpot_p50_over_ttft", -0.23, false),
        ];
        judge_ratios_by_their_phase(&mut slower, 0.05);
        assert!(slower[2].flagged && !slower[3].improvement);
        let mut faster_decode = vec![
            result("ttft_p50", 0.01, false),
            result("tpot_p50", -0.25, false),
            result("ttft_p50_over_tpot", 0.33, true),
        ];
        judge_ratios_by_their_phase(&mut faster_decode, 0.05);
        assert!(!faster_decode[2].flagged);
        assert!(!phase_is_slower(&faster_decode, "ttft_p50_over_tpot", 0.05));
        assert!(phase_is_slower(&faster_decode, "tpot_p50", 0.05));
        assert_eq!(judged_phase("tpot_p50_over_ttft"), Some("tpot_p50"));
        assert_eq!(judged_phase("tpot_p50"), None);
    }
}
