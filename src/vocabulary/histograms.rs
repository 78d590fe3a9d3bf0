//! How finely the per-request latency histograms are kept.

/// How finely the per-request latency histograms are kept: the series
/// budget per (target, scenario) is set here. The exact statistics of each
/// run (`sentinel_run_latency_seconds`) are exported at every resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HistogramResolution {
    /// No histograms: quantiles come from the last run's exact statistics.
    Off,
    /// TTFT only, 10 buckets from 5 ms to 5 minutes: 60 series per pair
    /// in all (with one SLO), enough for `histogram_quantile` of TTFT over
    /// any window.
    #[default]
    Coarse,
    /// TTFT, TPOT, ITL and end-to-end latency, 32 buckets each from
    /// 0.5 ms to 700 s: 184 series per pair (with one SLO).
    Fine,
}

impl std::str::FromStr for HistogramResolution {
    type Err = String;

    fn from_str(text: &str) -> Result<HistogramResolution, String> {
        match text {
            "off" => Ok(HistogramResolution::Off),
            "coarse" => Ok(HistogramResolution::Coarse),
            "fine" => Ok(HistogramResolution::Fine),
            _ => Err(format!("{text:?} is not \"off\", \"coarse\" or \"fine\"")),
        }
    }
}
