//! The regression detector, pure: candidate runs against baseline runs,
//! per metric, with a one-sided Mann-Whitney U test, the Hodges-Lehmann
//! shift and its confidence interval as a relative change, a
//! Benjamini-Hochberg correction across the evaluation's tests, a load
//! check that refuses to judge runs measured under different server load
//! unless the history shows how load matters (the runs are then compared
//! at the baseline's load), and three states as Chromium's Pinpoint has them.

use load_check::{load_differs, load_range, within_baseline_loads};
use load_covariate::{LoadCovariate, MetricRuns};
use log_test::{Difference, LogTest, LongMemory};
use rank::{inflate_confidence, inflate_p};

pub use crate::config::verdict_policy::DetectorSettings;
pub use rank::{benjamini_hochberg, hodges_lehmann, p_greater, variance_inflation};

/// Verdict states; the numbers are what `sentinel_regression_state` exports
/// (confirming came later, hence its number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok = 0,
    Inconclusive = 1,
    Regression = 2,
    /// Flagged, but not yet in enough evaluations to alert.
    Confirming = 3,
}

/// One run as the detector sees it: per-metric values and the load.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunPoint {
    /// `(metric name such as "ttft_p50", seconds)`.
    pub values: Vec<(String, f64)>,
    /// Running + waiting requests on the server around the run.
    pub load: Option<f64>,
}

impl RunPoint {
    pub fn get(&self, metric: &str) -> Option<f64> {
        self.values
            .iter()
            .find(|(m, _)| m == metric)
            .map(|(_, v)| *v)
            .filter(|v| v.is_finite())
    }
}

/// The metrics tested, and whether each may raise an alert by default.
pub const METRICS: [(&str, bool); 14] = [
    ("ttft_p50", true),
    ("ttft_p90", true),
    ("tpot_p50", true),
    ("tpot_p90", true),
    ("itl_p50", true),
    ("itl_p90", true),
    ("e2el_p50", true),
    ("e2el_p90", true),
    ("ttft_p99", false),
    ("tpot_p99", false),
    ("itl_p99", false),
    ("e2el_p99", false),
    ("ttft_p50_over_tpot", true),
    ("tpot_p50_over_ttft", true),
];

/// The comparison of one metric.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetricResult {
    pub metric: String,
    pub baseline_median: f64,
    pub candidate_median: f64,
    /// The change relative to the baseline median: the logarithmic test's
    /// ratio less one, or the Hodges-Lehmann shift over the baseline
    /// median with `log_test = false`.
    pub relative_change: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// One-sided p-value that the candidate is slower (the logarithmic
    /// test's, or Mann-Whitney's with `log_test = false`).
    pub p_value: f64,
    /// After Benjamini-Hochberg across the evaluation.
    pub p_adjusted: f64,
    /// This evaluation alone says slower, by enough, with confidence.
    pub flagged: bool,
    pub improvement: bool,
    pub alerting: bool,
    /// The candidate's newest runs the comparison rests on (the whole
    /// window unless a shorter span of them was more significant).
    #[serde(default)]
    pub runs: usize,
    /// Compared at the baseline's load (the load covariate): both medians
    /// are as if measured under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_load: Option<load_covariate::AtLoad>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Evaluation {
    pub state: State,
    pub reason: String,
    pub metrics: Vec<MetricResult>,
    /// Slower far beyond the runs' noise, on runs measured within the
    /// loads the baseline ran under: the adjusted p-value of the most
    /// significant flagged alerting metric, at most `decisive_q` (see
    /// [`DetectorSettings::decisive_q`]). Such an evaluation is a
    /// regression at once, without a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisive: Option<f64>,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Inconclusive => "inconclusive",
            State::Regression => "regression",
            State::Confirming => "confirming",
        }
    }
}

impl Evaluation {
    /// Some alerting metric flagged in this evaluation alone; never in an
    /// inconclusive one, which neither confirms a regression nor counts
    /// toward one.
    pub fn flagged(&self) -> bool {
        self.slower().next().is_some()
    }

    /// The alerting metrics this evaluation finds slower; none when it is
    /// inconclusive (a load it refuses to judge across may leave flagged
    /// metrics it does not act on: no evidence, no message, no gauge).
    pub fn slower(&self) -> impl Iterator<Item = &MetricResult> {
        let judged = self.state != State::Inconclusive;
        self.metrics
            .iter()
            .filter(move |m| judged && m.flagged && m.alerting)
    }

    /// The comparison of one metric ("ttft_p50"), when it was compared.
    pub fn metric(&self, name: &str) -> Option<&MetricResult> {
        self.metrics.iter().find(|m| m.metric == name)
    }
}

/// The adjusted p-value of the most significant flagged alerting metric,
/// when it is at or below `decisive_q` (0: never) and the candidate runs
/// it rests on ran within the loads the baseline ran under: a slowdown
/// across loads rests on the fitted rise with load, or on a history that
/// showed no clear rise, and no p-value holds their misfit.
fn beyond_doubt(
    results: &[MetricResult],
    baseline_loads: Option<(f64, f64)>,
    candidate: &[RunPoint],
    cfg: &DetectorSettings,
) -> Option<f64> {
    if cfg.decisive_q <= 0.0 {
        return None;
    }
    results
        .iter()
        .filter(|m| m.flagged && m.alerting && m.p_adjusted <= cfg.decisive_q)
        .filter(|m| {
            // The newest runs of its span: those that have the metric.
            let measured: Vec<&RunPoint> = candidate
                .iter()
                .filter(|r| r.get(&m.metric).is_some())
                .collect();
            let newest = &measured[measured.len().saturating_sub(m.runs)..];
            within_baseline_loads(baseline_loads, newest, cfg.load_min_difference)
        })
        .map(|m| m.p_adjusted)
        .min_by(f64::total_cmp)
}

fn median(v: &[f64]) -> f64 {
    crate::stats::percentile_sorted(&crate::stats::sorted(v), 50.0)
}

/// The span of the candidate's newest runs found slowest against the
/// baseline.
struct Span {
    runs: usize,
    /// Its p-value multiplied by the spans tried (Bonferroni).
    p: f64,
    tried: usize,
    /// Its difference on logarithms, for the interval.
    difference: Option<Difference>,
}

/// Which of the candidate's newest spans is slowest against the baseline.
/// The spans double from `scan_min_runs` up to the whole window (3, 6,
/// 12), so a step a few runs ago is seen without a test for every length.
/// Without a scan, the whole window. `log` is the logarithmic test
/// (`None` when the baseline cannot have one).
fn most_significant_span(
    baseline: &[f64],
    candidate: &[f64],
    load_shifts: &[f64],
    log: Option<&LogTest>,
    cfg: &DetectorSettings,
    inflation: f64,
) -> Span {
    let whole = candidate.len();
    let mut spans = vec![whole];
    if cfg.scan_min_runs > 0 {
        let mut k = cfg.scan_min_runs.max(2);
        while k < whole {
            spans.push(k);
            k *= 2;
        }
    }
    let tried = spans.len();
    let best = spans
        .into_iter()
        .map(|k| {
            let newest = &candidate[whole - k..];
            let (p, difference) = if cfg.log_test {
                let shift = crate::stats::mean(&load_shifts[whole - k..]);
                let difference = log.and_then(|test| test.difference(newest, shift));
                (difference.map_or(1.0, |d| d.p_greater()), difference)
            } else {
                (inflate_p(p_greater(newest, baseline), inflation), None)
            };
            Span {
                runs: k,
                p,
                tried,
                difference,
            }
        })
        .min_by(|a, b| {
            // Of spans equally significant (p underflows, or rounds to 1
            // for one far faster), the one more standard errors away: the
            // span that is all step, so the change reported is the step's.
            let t = |span: &Span| span.difference.map_or(0.0, |d| d.t_statistic().abs());
            a.p.total_cmp(&b.p)
                .then_with(|| t(b).total_cmp(&t(a)))
                .then(b.runs.cmp(&a.runs))
        })
        .expect("the whole window is always tried");
    Span {
        p: (best.p * tried as f64).min(1.0),
        ..best
    }
}

/// Compares candidate runs with baseline runs.
pub fn evaluate(
    baseline: &[RunPoint],
    candidate: &[RunPoint],
    cfg: &DetectorSettings,
) -> Evaluation {
    evaluate_with_noise(baseline, candidate, &[], cfg)
}

/// Compares candidate runs with baseline runs, told how far the reference
/// build's own runs stray at each span (`history`, oldest first; the
/// logarithmic test uses it, the rank test does not).
pub fn evaluate_with_noise(
    baseline: &[RunPoint],
    candidate: &[RunPoint],
    history: &[RunPoint],
    cfg: &DetectorSettings,
) -> Evaluation {
    if candidate.len() < cfg.min_candidate_runs || baseline.len() < cfg.min_baseline_runs {
        if let Some(beyond) = first_runs_beyond_doubt(baseline, candidate, history, cfg) {
            return beyond;
        }
        return Evaluation {
            state: State::Inconclusive,
            reason: format!(
                "too few runs: {} candidate (need {}), {} baseline (need {})",
                candidate.len(),
                cfg.min_candidate_runs,
                baseline.len(),
                cfg.min_baseline_runs
            ),
            metrics: Vec::new(),
            decisive: None,
        };
    }
    // The load covariate, where the history can say how load matters at
    // every load the candidate ran under.
    let covering = cfg
        .load_covariate
        .then(|| LoadCovariate::new(history, baseline))
        .flatten()
        .filter(|covariate| covariate.covers(candidate));
    // Whether a metric tested had no history to say how load moves it:
    // the load check then stands.
    let mut unexplained_by_history = false;
    let mut results = Vec::new();
    let memory = LongMemory {
        hurst: cfg.hurst,
        measured_stretches: cfg.measured_stretches,
    };
    for (metric, alerting) in METRICS {
        if !cfg.phase_ratios && phases::is_ratio(metric) {
            continue;
        }
        let at_reference = covering
            .as_ref()
            .and_then(|covariate| covariate.adjust(metric, baseline, candidate, history));
        let history_speaks = at_reference.is_some();
        let MetricRuns {
            baseline: b,
            candidate: c,
            load_shifts,
            history: h,
            slope_variance,
            at_load,
        } = at_reference
            .unwrap_or_else(|| MetricRuns::as_measured(metric, baseline, candidate, history));
        if b.len() < cfg.min_baseline_runs || c.len() < cfg.min_candidate_runs {
            continue;
        }
        let base = median(&b);
        if base <= 0.0 {
            continue;
        }
        unexplained_by_history |= !history_speaks;
        let inflation = if cfg.correlation {
            variance_inflation(&b)
        } else {
            1.0
        };
        let log = cfg
            .log_test
            .then(|| {
                LogTest::new(&b, &h, inflation, memory).map(|test| {
                    test.with_load_slope_variance(slope_variance)
                        .with_heavy_tails(cfg.heavy_tails)
                        .with_assumed_tails(cfg.tail_df)
                        .with_exact_median(cfg.exact_median_variance)
                })
            })
            .flatten();
        let Span {
            runs,
            p,
            tried,
            difference,
        } = most_significant_span(&b, &c, &load_shifts, log.as_ref(), cfg, inflation);
        let newest = &c[c.len() - runs..];
        // The interval widened as the p-value was, for the spans tried.
        let confidence = 1.0 - (1.0 - cfg.confidence) / tried as f64;
        // Relative to the baseline median: the change and its interval.
        let (change, low, high) = if cfg.log_test {
            difference.map_or((0.0, f64::NEG_INFINITY, f64::INFINITY), |d| {
                d.interval(confidence)
            })
        } else {
            let (shift, low, high) =
                hodges_lehmann(&b, newest, inflate_confidence(confidence, inflation));
            (shift / base, low / base, high / base)
        };
        results.push(MetricResult {
            metric: metric.to_owned(),
            baseline_median: base,
            candidate_median: median(newest),
            relative_change: change,
            ci_low: low,
            ci_high: high,
            p_value: p,
            p_adjusted: 1.0,
            flagged: false,
            improvement: false,
            alerting: alerting || cfg.alert_on_p99,
            runs,
            at_load,
        });
    }
    let adjusted = benjamini_hochberg(&results.iter().map(|r| r.p_value).collect::<Vec<_>>());
    for (r, p) in results.iter_mut().zip(adjusted) {
        r.p_adjusted = p;
        r.flagged = r.relative_change >= cfg.threshold && r.ci_low > 0.0 && p <= cfg.fdr_q;
        r.improvement = r.relative_change <= -cfg.threshold && r.ci_high < 0.0;
    }
    phases::judge_ratios_by_their_phase(&mut results, cfg.threshold);
    // With every metric compared at the baseline's load (the history
    // shows how load matters, at loads it covers), nothing to refuse.
    let covering = covering.filter(|_| !unexplained_by_history);
    let baseline_loads = load_range(baseline);
    if let Some(reason) =
        load_differs(baseline_loads, baseline, candidate, cfg).filter(|_| covering.is_none())
    {
        return Evaluation {
            state: State::Inconclusive,
            reason,
            metrics: results,
            decisive: None,
        };
    }
    let decisive = beyond_doubt(&results, baseline_loads, candidate, cfg);
    let reason = if results.iter().any(|r| r.flagged && r.alerting) {
        slower_reason(&results)
    } else {
        unflagged_reason(&results, cfg.threshold)
    };
    Evaluation {
        state: State::Ok,
        reason: match covering.and_then(|c| load_covariate::compared_at(&c, candidate, cfg)) {
            Some(load) => format!("{reason} ({load})"),
            None => reason,
        },
        metrics: results,
        decisive,
    }
}

/// A candidate of fewer than `min_candidate_runs` runs judged on its
/// runs at `first_run_q` (see [`DetectorSettings::first_run_q`]): the
/// evaluation when a slowdown is beyond doubt at that level, else `None`
/// (too few runs for anything less).
fn first_runs_beyond_doubt(
    baseline: &[RunPoint],
    candidate: &[RunPoint],
    history: &[RunPoint],
    cfg: &DetectorSettings,
) -> Option<Evaluation> {
    if cfg.first_run_q <= 0.0 || candidate.is_empty() || baseline.len() < cfg.min_baseline_runs {
        return None;
    }
    let few = DetectorSettings {
        min_candidate_runs: candidate.len(),
        decisive_q: cfg.first_run_q,
        first_run_q: 0.0,
        ..cfg.clone()
    };
    let evaluation = evaluate_with_noise(baseline, candidate, history, &few);
    evaluation.decisive.is_some().then_some(evaluation)
}

/// What is slower: the flagged alerting metrics, named.
fn slower_reason(results: &[MetricResult]) -> String {
    let flagged: Vec<&str> = results
        .iter()
        .filter(|r| r.flagged && r.alerting)
        .map(|r| r.metric.as_str())
        .collect();
    format!("slower: {}", flagged.join(", "))
}

/// Why nothing was flagged, in one sentence: no alerting metric is slower
/// by the threshold, or those that are lie within what the runs' noise
/// allows (their interval reaches below zero, or the test is not sure).
fn unflagged_reason(results: &[MetricResult], threshold: f64) -> String {
    let within: Vec<String> = results
        .iter()
        .filter(|r| r.alerting && r.relative_change >= threshold)
        .filter(|r| phases::phase_is_slower(results, &r.metric, threshold))
        .map(|r| {
            format!(
                "{} {:+.1}% [{:+.1}%, {:+.1}%]",
                r.metric,
                r.relative_change * 100.0,
                r.ci_low * 100.0,
                r.ci_high * 100.0
            )
        })
        .collect();
    if within.is_empty() {
        "no metric slower beyond the threshold".into()
    } else {
        format!(
            "slower within the noise, not a regression: {}",
            within.join(", ")
        )
    }
}

pub mod canary;
pub mod confirmation;
pub mod drift;
pub mod filed;
mod judged;
pub mod liveness;
mod load_check;
pub mod load_covariate;
mod log_test;
pub mod noise;
pub mod pair;
pub mod phases;
pub mod policy;
mod rank;
pub mod replay;
pub mod warmup;

#[cfg(test)]
mod tests;
