//! Server load as a covariate: how much each metric's logarithm rises per
//! running+waiting request, fitted on the reference build's history, so
//! that runs measured under a different load are compared at the
//! baseline's load instead of being refused.

use super::RunPoint;

/// Runs with a load the history needs before it can tell how load
/// matters: as many as a baseline.
const MIN_RUNS: usize = 30;

/// How many standard errors a slope must be above zero before runs are
/// adjusted by it: a slope the history barely shows would move the
/// values by its own noise (and latency does not fall with load; a phase
/// against the other may, by its phases' slopes: `ratio_slope`).
const MIN_SLOPE_T: f64 = 3.0;

/// Loads the history must span (running+waiting requests): a history
/// that always ran at one load cannot say what another one does.
const MIN_LOAD_RANGE: f64 = 1.0;

/// What the history shows of load: the loads it covers and the load the
/// comparison is made at (the baseline's mean).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadCovariate {
    /// The lowest load the history's runs were measured under...
    pub low: f64,
    /// ...and the highest.
    pub high: f64,
    /// The baseline's mean load: every run is compared as if under it.
    pub reference: f64,
}

/// How one metric's runs were put at the reference load: the load, and
/// the metric's rise per request of it (on logarithms; below zero for a
/// phase against the other that falls with load).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AtLoad {
    /// Running+waiting requests: the baseline's mean.
    pub reference: f64,
    pub per_request: f64,
}

impl AtLoad {
    /// `value`, measured under `load`, as if measured at the reference.
    pub fn value_at_reference(&self, value: f64, load: f64) -> f64 {
        value * (-self.per_request * (load - self.reference)).exp()
    }
}

/// One metric's rise per request of load, on logarithms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSlope {
    pub per_request: f64,
    /// Its variance (ordinary least squares, inflated for correlated runs).
    pub variance: f64,
}

impl LoadCovariate {
    /// `None` when the history has fewer than 30 runs with a load, spans
    /// less than one request of load, or the baseline has no load.
    pub fn new(history: &[RunPoint], baseline: &[RunPoint]) -> Option<Self> {
        let loads: Vec<f64> = history.iter().filter_map(|r| r.load).collect();
        let baseline_loads: Vec<f64> = baseline.iter().filter_map(|r| r.load).collect();
        if loads.len() < MIN_RUNS || baseline_loads.is_empty() {
            return None;
        }
        let (low, high) = crate::stats::range(loads.iter().copied())?;
        (high - low >= MIN_LOAD_RANGE).then(|| LoadCovariate {
            low,
            high,
            reference: crate::stats::mean(&baseline_loads),
        })
    }

    /// Whether every run of `candidate` that has a load (one at least)
    /// was measured within the loads the history covers: an adjustment
    /// there is read off the history, not extrapolated from it.
    pub fn covers(&self, candidate: &[RunPoint]) -> bool {
        let mut loads = candidate.iter().filter_map(|r| r.load).peekable();
        loads.peek().is_some() && loads.all(|load| (self.low..=self.high).contains(&load))
    }

    /// One metric's runs compared at the reference load: each value
    /// times exp(-slope x its distance in load), runs without a load left
    /// out (they cannot be put at the reference); as measured when the
    /// slope is not clearly above zero (the history shows no rise with
    /// load to correct), a phase against the other when neither of its
    /// phases' is. `None` when the history cannot say: fewer than 30
    /// of its runs have both the metric and a load, or their loads span
    /// less than one request.
    pub fn adjust(
        &self,
        metric: &str,
        baseline: &[RunPoint],
        candidate: &[RunPoint],
        history: &[RunPoint],
    ) -> Option<MetricRuns> {
        let applied = match super::phases::parts(metric) {
            Some((phase, against)) => self.ratio_slope(history, metric, phase, against)?,
            None => self.applied_slope(history, metric)?,
        };
        let Some(slope) = applied else {
            return Some(MetricRuns::as_measured(
                metric, baseline, candidate, history,
            ));
        };
        let at_load = AtLoad {
            reference: self.reference,
            per_request: slope.per_request,
        };
        let at_reference = |runs: &[RunPoint]| -> Vec<(f64, f64)> {
            runs.iter()
                .filter_map(|r| {
                    let load = r.load?;
                    let value = at_load.value_at_reference(r.get(metric)?, load);
                    Some((value, load - self.reference))
                })
                .collect()
        };
        let (candidate, load_shifts) = at_reference(candidate).into_iter().unzip();
        Some(MetricRuns {
            baseline: at_reference(baseline).into_iter().map(|p| p.0).collect(),
            candidate,
            load_shifts,
            history: at_reference(history).into_iter().map(|p| p.0).collect(),
            slope_variance: slope.variance,
            at_load: Some(at_load),
        })
    }

    /// The slope a metric's runs are put at the reference load by:
    /// `Some(None)` when the history shows no clear rise with load (they
    /// are compared as measured), `None` when it cannot say.
    fn applied_slope(&self, history: &[RunPoint], metric: &str) -> Option<Option<LoadSlope>> {
        let slope = self.slope(history, metric)?;
        Some((slope.per_request >= MIN_SLOPE_T * slope.variance.sqrt()).then_some(slope))
    }

    /// A phase over the other is put at the reference load as its two
    /// phases are, so that it compares what they compare: its slope is
    /// the difference of theirs (either 0 where not applied), and may be
    /// below zero. Fitted on its own, a ratio that falls with load (TTFT
    /// rises with queueing more than TPOT) was compared as measured, and
    /// a candidate under less load than the baseline's looked slower by
    /// that ratio.
    fn ratio_slope(
        &self,
        history: &[RunPoint],
        ratio: &str,
        phase: &str,
        against: &str,
    ) -> Option<Option<LoadSlope>> {
        let (phase, against) = (
            self.applied_slope(history, phase)?,
            self.applied_slope(history, against)?,
        );
        match (phase, against) {
            (None, None) => Some(None),
            // Both applied: least squares is linear, so the ratio's own fit
            // is the difference of theirs, with its variance as it is (the
            // phases rise together: far less than the sum of theirs).
            (Some(_), Some(_)) => self.slope(history, ratio).map(Some),
            (Some(one), None) => Some(Some(one)),
            (None, Some(other)) => Some(Some(LoadSlope {
                per_request: -other.per_request,
                variance: other.variance,
            })),
        }
    }

    /// The metric's slope on the history's runs that have both a load and
    /// the metric. `None` when fewer than 30 do or their loads span less
    /// than one request.
    fn slope(&self, history: &[RunPoint], metric: &str) -> Option<LoadSlope> {
        let points: Vec<(f64, f64)> = history
            .iter()
            .filter_map(|r| Some((r.load?, r.get(metric).filter(|v| *v > 0.0)?.ln())))
            .collect();
        let (low, high) = crate::stats::range(points.iter().map(|p| p.0))?;
        (high - low >= MIN_LOAD_RANGE)
            .then(|| fit(&points))
            .flatten()
    }
}

/// One metric's values as the test compares them, oldest first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricRuns {
    pub baseline: Vec<f64>,
    pub candidate: Vec<f64>,
    /// How far each candidate run's load was from the reference (0 when
    /// not adjusted).
    pub load_shifts: Vec<f64>,
    pub history: Vec<f64>,
    /// The variance of the slope the values were adjusted by (0 when not).
    pub slope_variance: f64,
    /// How the values were put at the reference load (`None`: as measured).
    pub at_load: Option<AtLoad>,
}

impl MetricRuns {
    /// The metric's values as measured, whatever the load.
    pub fn as_measured(
        metric: &str,
        baseline: &[RunPoint],
        candidate: &[RunPoint],
        history: &[RunPoint],
    ) -> Self {
        let values =
            |runs: &[RunPoint]| -> Vec<f64> { runs.iter().filter_map(|r| r.get(metric)).collect() };
        let candidate = values(candidate);
        MetricRuns {
            baseline: values(baseline),
            load_shifts: vec![0.0; candidate.len()],
            candidate,
            history: values(history),
            slope_variance: 0.0,
            at_load: None,
        }
    }
}

/// What the reason says when the candidate's runs were measured under a
/// load differing from the baseline's by at least `load_min_difference`:
/// that they were compared at the baseline's.
pub fn compared_at(
    covariate: &LoadCovariate,
    candidate: &[RunPoint],
    cfg: &super::DetectorSettings,
) -> Option<String> {
    let loads: Vec<f64> = candidate.iter().filter_map(|r| r.load).collect();
    if loads.is_empty() {
        return None;
    }
    let load = crate::stats::mean(&loads);
    ((load - covariate.reference).abs() >= cfg.load_min_difference).then(|| {
        format!(
            "compared at the baseline's server load, {:.1} running+waiting; the candidate ran at {load:.1}",
            covariate.reference
        )
    })
}

/// Ordinary least squares of `(load, log value)`; the slope's variance is
/// inflated by the residuals' lag-1 correlation, as the runs' is.
fn fit(points: &[(f64, f64)]) -> Option<LoadSlope> {
    let n = points.len();
    if n < MIN_RUNS {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n as f64;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n as f64;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let per_request = sxy / sxx;
    let residuals: Vec<f64> = points
        .iter()
        .map(|p| p.1 - mean_y - per_request * (p.0 - mean_x))
        .collect();
    let residual_variance = residuals.iter().map(|r| r * r).sum::<f64>() / (n - 2) as f64;
    Some(LoadSlope {
        per_request,
        variance: residual_variance / sxx * super::variance_inflation(&residuals),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(load: f64, ttft: f64) -> RunPoint {
        RunPoint {
            values: vec![("ttft_p50".into(), ttft)],
            load: Some(load),
        }
    }

    #[test]
    fn the_slope_is_the_rise_per_request_and_is_read_only_within_the_loads_seen() {
        // TTFT x1.2 per request of load, with a little noise.
        let history: Vec<RunPoint> = (0..60)
            .map(|i| {
                let load = (i % 4) as f64;
                let noise = 1.0 + 0.02 * ((i * 7 % 5) as f64 - 2.0);
                run(load, 0.010 * 1.2_f64.powf(load) * noise)
            })
            .collect();
        let baseline: Vec<RunPoint> = (0..30).map(|_| run(1.0, 0.012)).collect();
        let covariate = LoadCovariate::new(&history, &baseline).unwrap();
        assert_eq!(
            (covariate.low, covariate.high, covariate.reference),
            (0.0, 3.0, 1.0)
        );
        let slope = covariate.slope(&history, "ttft_p50").unwrap();
        assert!((slope.per_request - 1.2_f64.ln()).abs() < 0.01, "{slope:?}");
        assert!(
            slope.variance > 0.0 && slope.variance.sqrt() < 0.01,
            "{slope:?}"
        );
        assert_eq!(covariate.slope(&history, "tpot_p50"), None);
        // Every run with a load must lie within the history's loads.
        let unknown = RunPoint {
            load: None,
            ..run(0.0, 0.1)
        };
        assert!(covariate.covers(&[run(2.5, 0.1), run(3.0, 0.1), unknown.clone()]));
        assert!(!covariate.covers(&[run(2.0, 0.1), run(5.0, 0.1)]));
        assert!(!covariate.covers(std::slice::from_ref(&unknown)));
        // At the reference load (1): x1.2^-2 at load 3; the run without a
        // load is left out; a metric without a slope is not adjusted.
        let candidate = [run(3.0, 0.0144), unknown];
        let runs = covariate
            .adjust("ttft_p50", &baseline, &candidate, &history)
            .unwrap();
        assert_eq!(runs.candidate.len(), 1);
        assert!((runs.candidate[0] - 0.01).abs() < 0.0002, "{runs:?}");
        assert_eq!(runs.load_shifts, [2.0]);
        assert_eq!(runs.baseline.len(), 30);
        assert!(runs.slope_variance > 0.0);
        assert_eq!(
            covariate.adjust("tpot_p50", &baseline, &candidate, &history),
            None
        );
        // A history whose latency does not rise with load leaves the
        // values as measured.
        let steady: Vec<RunPoint> = (0..60)
            .map(|i| {
                run(
                    (i % 4) as f64,
                    0.010 * (1.0 + 0.02 * ((i * 7 % 5) as f64 - 2.0)),
                )
            })
            .collect();
        let runs = LoadCovariate::new(&steady, &baseline)
            .unwrap()
            .adjust("ttft_p50", &baseline, &candidate, &steady)
            .unwrap();
        assert_eq!((runs.candidate.len(), runs.candidate[0]), (2, 0.0144));
        assert_eq!((runs.load_shifts, runs.slope_variance), (vec![0.0; 2], 0.0));
        // A history at one load, or too short, tells nothing of load.
        let flat: Vec<RunPoint> = (0..60).map(|_| run(2.0, 0.01)).collect();
        assert_eq!(LoadCovariate::new(&flat, &baseline), None);
        assert_eq!(LoadCovariate::new(&history[..29], &baseline), None);
    }
}
