//! Recorded traces of an unchanged server, resampled in blocks so that the
//! correlation between consecutive runs is kept, and changes injected into
//! them request by request.

use std::io::BufRead;

use rand::RngExt;
use rand::rngs::StdRng;

use crate::stats::Distribution;
use crate::verdict::replay::RunLine;
use crate::vocabulary::records::{LatencySummary, RunOutcome, RunRecord, SampleRow};

/// The gap between runs of a resampled series (the traces' schedule).
const RUN_GAP_MS: i64 = 3_000;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: not a run object: {source}")]
    Parse {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}: {runs} completed runs, a trace needs at least {need}")]
    TooShort {
        path: String,
        runs: usize,
        need: usize,
    },
}

/// One recorded trace: its completed runs, oldest first.
#[derive(Debug, Clone)]
pub struct Trace {
    pub name: String,
    pub runs: Vec<RunRecord>,
}

impl Trace {
    /// Reads a trace written by `export` (JSON Lines; the caller
    /// decompresses); failed runs are left out. `name` names it in tables
    /// and errors.
    pub fn parse(name: &str, reader: impl BufRead) -> Result<Trace, TraceError> {
        let mut runs = Vec::new();
        for (index, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| TraceError::Read {
                path: name.to_owned(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let run: RunLine = serde_json::from_str(&line).map_err(|source| TraceError::Parse {
                path: name.to_owned(),
                line: index + 1,
                source,
            })?;
            let run = run.into_record();
            if run.outcome == RunOutcome::Ok && !run.samples.is_empty() {
                runs.push(run);
            }
        }
        const NEED: usize = 100;
        if runs.len() < NEED {
            return Err(TraceError::TooShort {
                path: name.to_owned(),
                runs: runs.len(),
                need: NEED,
            });
        }
        Ok(Trace {
            name: name.to_owned(),
            runs,
        })
    }

    /// A series of `len` runs drawn as a circular block bootstrap: blocks
    /// of `block` consecutive runs from random starts, so the correlation
    /// within a block (load waves, caches) is kept. Runs are renumbered
    /// and re-timed one schedule gap apart.
    pub fn resample(&self, len: usize, block: usize, rng: &mut StdRng) -> Vec<RunRecord> {
        self.resample_with_sources(len, block, rng).0
    }

    /// The same recording with its noise shrunk: every request's TTFT and
    /// TPOT brought toward the trace's median run by the power `factor` on
    /// logarithms (`t` becomes `m (t / m)^factor`), its inter-token gaps
    /// with its TPOT and its end-to-end latency recomputed from both. The
    /// order of requests and runs is kept, so every correlation, slow
    /// spell and tail keeps its shape at `factor` times its size: how the
    /// detectors would do on a server that strays less than this one
    /// (a GPU server varies far less than the CPU build recorded here).
    pub fn with_noise_scaled(&self, factor: f64) -> Trace {
        let center = |values: Vec<f64>| {
            crate::stats::percentile_sorted(&crate::stats::sorted(&values), 50.0)
        };
        let of = |summary: fn(&RunRecord) -> &LatencySummary| {
            center(
                self.runs
                    .iter()
                    .map(summary)
                    .filter(|s| s.count > 0)
                    .map(|s| s.p50)
                    .collect(),
            )
        };
        let ttft_center = of(|r| &r.summary.ttft);
        let tpot_center = of(|r| &r.summary.tpot);
        let toward = |value: f64, center: f64| {
            if value > 0.0 && center > 0.0 {
                (center / value).powf(1.0 - factor)
            } else {
                1.0
            }
        };
        let runs = self
            .runs
            .iter()
            .map(|run| {
                let mut out = run.clone();
                for s in &mut out.samples {
                    let ttft = s.ttft_s.map_or(1.0, |t| toward(t, ttft_center));
                    let tpot = s.tpot_s.map_or(1.0, |p| toward(p, tpot_center));
                    scale(s, ttft, tpot);
                }
                resummarize(&mut out);
                out
            })
            .collect();
        Trace {
            name: self.name.clone(),
            runs,
        }
    }

    /// [`Trace::resample`], with each run's id in the recording (its
    /// line's `id`): where a series' alarms came from.
    pub fn resample_with_sources(
        &self,
        len: usize,
        block: usize,
        rng: &mut StdRng,
    ) -> (Vec<RunRecord>, Vec<Option<i64>>) {
        let n = self.runs.len();
        let block = block.clamp(1, n);
        let start_at = self.runs[0].started_at;
        let mut out = Vec::with_capacity(len);
        let mut sources = Vec::with_capacity(len);
        while out.len() < len {
            let start = rng.random_range(0..n);
            for offset in 0..block {
                if out.len() == len {
                    break;
                }
                let mut run = self.runs[(start + offset) % n].clone();
                sources.push(run.id);
                let index = out.len() as i64;
                run.id = Some(index + 1);
                run.started_at = start_at + chrono::Duration::milliseconds(index * RUN_GAP_MS);
                out.push(run);
            }
        }
        (out, sources)
    }
}

/// A change injected into a series from one run on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// TTFT and time per output token multiplied by these factors.
    Step { ttft: f64, tpot: f64 },
    /// Both slower by `per_run` more each run, up to `max`.
    Ramp { per_run: f64, max: f64 },
    /// Requests slower than their run's median move `factor` times as far
    /// from it (TTFT and TPOT): p90 up, p50 the same.
    Spread { factor: f64 },
}

impl Change {
    /// A short name for tables: `ttft+10%`, `ramp+1%/run`, `spread x2`.
    pub fn label(&self) -> String {
        let pct = |f: f64| format!("{:+.0}%", (f - 1.0) * 100.0);
        match *self {
            Change::Step { ttft, tpot: 1.0 } => format!("TTFT {}", pct(ttft)),
            Change::Step { ttft: 1.0, tpot } => format!("TPOT {}", pct(tpot)),
            Change::Step { ttft, .. } => format!("both {}", pct(ttft)),
            Change::Ramp { per_run, max } => {
                format!("ramp {:+.0}%/run to {}", per_run * 100.0, pct(1.0 + max))
            }
            Change::Spread { factor } => format!("spread x{factor}"),
        }
    }

    /// The run as it would have been `since` runs after the change (0: the
    /// first changed run): its requests changed, its summary recomputed.
    pub fn apply(&self, run: &RunRecord, since: usize) -> RunRecord {
        let mut out = run.clone();
        match *self {
            Change::Step { ttft, tpot } => {
                for s in &mut out.samples {
                    scale(s, ttft, tpot);
                }
            }
            Change::Ramp { per_run, max } => {
                let f = 1.0 + (per_run * (since + 1) as f64).min(max);
                for s in &mut out.samples {
                    scale(s, f, f);
                }
            }
            Change::Spread { factor } => {
                let median_of = |values: Vec<f64>| {
                    crate::stats::percentile_sorted(&crate::stats::sorted(&values), 50.0)
                };
                let ttft_median = median_of(out.samples.iter().filter_map(|s| s.ttft_s).collect());
                let tpot_median = median_of(out.samples.iter().filter_map(|s| s.tpot_s).collect());
                for s in &mut out.samples {
                    let stretch = |v: f64, m: f64| if v > m { m + (v - m) * factor } else { v };
                    let (Some(t), Some(p)) = (s.ttft_s, s.tpot_s) else {
                        continue;
                    };
                    let (t2, p2) = (stretch(t, ttft_median), stretch(p, tpot_median));
                    scale(s, t2 / t, if p > 0.0 { p2 / p } else { 1.0 });
                }
            }
        }
        resummarize(&mut out);
        out
    }
}

/// One request with its first token `ttft` times later and every later
/// token `tpot` times slower.
fn scale(s: &mut SampleRow, ttft: f64, tpot: f64) {
    let (Some(t), Some(e)) = (s.ttft_s, s.e2el_s) else {
        return;
    };
    s.ttft_s = Some(t * ttft);
    s.tpot_s = s.tpot_s.map(|v| v * tpot);
    for gap in &mut s.itls_s {
        *gap *= tpot;
    }
    s.e2el_s = Some(t * ttft + (e - t) * tpot);
}

/// The run's latency summaries recomputed from its requests, as the probe
/// computes them (ITL pooled over the requests).
pub fn resummarize(run: &mut RunRecord) {
    const PERCENTILES: [f64; 4] = [50.0, 90.0, 95.0, 99.0];
    let of = |values: Vec<f64>| LatencySummary::of(&Distribution::of(&values, &PERCENTILES));
    let s = &run.samples;
    run.summary.ttft = of(s.iter().filter_map(|r| r.ttft_s).collect());
    run.summary.tpot = of(s.iter().filter_map(|r| r.tpot_s).collect());
    run.summary.itl = of(s.iter().flat_map(|r| r.itls_s.iter().copied()).collect());
    run.summary.e2el = of(s.iter().filter_map(|r| r.e2el_s).collect());
}
