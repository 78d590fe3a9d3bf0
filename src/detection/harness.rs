//! The trials: series resampled from a trace, a change injected at a
//! random run after the baseline formed (or none), every detector run over
//! the same series, and what each caught, how soon, and how often it
//! alerted on untouched data.

use std::collections::HashSet;

use rand::RngExt;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::rules::{self, Hud, Kayenta, Oracle, Perfherder, SeriesRule, WATCHED};
pub use super::score::Score;
use super::trace::{Change, Trace, resummarize};
use crate::verdict::State;
use crate::verdict::policy::VerdictPolicy;
use crate::verdict::replay::Replayer;
use crate::vocabulary::records::RunRecord;

/// Runs before the first evaluation every detector is scored on: the
/// daemon's warm-up (2), baseline (30) and candidate window (12).
pub const FIRST_EVALUATION: usize = 44;
/// A trial's change comes at its first evaluation or up to this many runs
/// after it, at random.
pub const LATEST_CHANGE: usize = 30;
/// Evaluations after a change a trial follows: the table's horizon
/// (`--horizon` follows longer ones).
pub const AFTER: usize = 10;
/// Evaluations of each untouched series: the table's (`--null-evaluations`
/// follows longer ones).
pub const NULL_EVALUATIONS: usize = 60;
/// Evaluations of an untouched series before its no-op upgrade: a series
/// needs more than this many for the upgrade row to score any.
pub const NULL_UPGRADE_AFTER: usize = 15;

/// One series a detector is run over.
#[derive(Debug, Clone)]
pub struct Series {
    pub runs: Vec<RunRecord>,
    /// The first changed run; `None` for untouched data.
    pub change_at: Option<usize>,
    /// The first run scored: untouched history, then the daemon's warm-up,
    /// baseline and candidate window come before it.
    pub first_evaluation: usize,
    /// Each run's id in the recording it was drawn from (empty when not
    /// drawn from one), for `DETECTION_EXPLAIN`.
    pub recorded_ids: Vec<Option<i64>>,
}

/// A detector's alerts on a series: one flag per run (after the run).
pub type Alerts = Vec<bool>;

/// The detectors of the table, in its row order; the external ones
/// (Otava, E-Divisive) are run by `benches/detection/changepoints.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Detector {
    /// This product, the changed runs served by a new build (an upgrade).
    OursUpgrade,
    /// This product, the change within one build.
    OursSameBuild,
    Hud,
    Perfherder,
    Kayenta,
    Oracle,
    /// The oracle leaving out the first `warmup_runs` changed runs, as the
    /// upgrade verdict leaves out a new build's (cold) warm-up runs.
    OracleAfterWarmup,
    /// Each oracle at the lowest level that raises no false regression on
    /// the trace's untouched series: the limit for a verdict that must
    /// raise none (see [`calibrate`]).
    OracleQuiet,
    /// The oracle after warm-up, likewise at no false regression.
    OracleAfterWarmupQuiet,
}

impl Detector {
    pub const ALL: [Detector; 9] = [
        Detector::OursUpgrade,
        Detector::OursSameBuild,
        Detector::Hud,
        Detector::Perfherder,
        Detector::Kayenta,
        Detector::Oracle,
        Detector::OracleAfterWarmup,
        Detector::OracleQuiet,
        Detector::OracleAfterWarmupQuiet,
    ];

    /// The short name `--detectors` takes.
    pub fn key(self) -> &'static str {
        match self {
            Detector::OursUpgrade => "ours-upgrade",
            Detector::OursSameBuild => "ours",
            Detector::Hud => "hud",
            Detector::Perfherder => "perfherder",
            Detector::Kayenta => "kayenta",
            Detector::Oracle => "oracle",
            Detector::OracleAfterWarmup => "oracle-warm",
            Detector::OracleQuiet => "oracle-quiet",
            Detector::OracleAfterWarmupQuiet => "oracle-warm-quiet",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Detector::OursUpgrade => "vllm-sentinel (upgrade)",
            Detector::OursSameBuild => "vllm-sentinel (same build)",
            Detector::Hud => "PyTorch HUD (1.2x median of 3, 2 in a row)",
            Detector::Perfherder => "Perfherder (t >= 7, 12 vs 12)",
            Detector::Kayenta => "Kayenta (Mann-Whitney 98%, 25% tolerance)",
            Detector::Oracle => "oracle (knows the change and the noise at every span)",
            Detector::OracleAfterWarmup => {
                "oracle after warm-up (the same, leaving out the first changed runs as an upgrade's warm-up)"
            }
            Detector::OracleQuiet => {
                "oracle at no false regression (its level at each span the highest z its untouched series reach)"
            }
            Detector::OracleAfterWarmupQuiet => {
                "oracle after warm-up at no false regression (likewise)"
            }
        }
    }
}

/// The changes of the table.
pub fn changes() -> Vec<Change> {
    let mut out = Vec::new();
    for step in [1.05, 1.10, 1.20, 1.50] {
        out.push(Change::Step {
            ttft: step,
            tpot: 1.0,
        });
        out.push(Change::Step {
            ttft: 1.0,
            tpot: step,
        });
        out.push(Change::Step {
            ttft: step,
            tpot: step,
        });
    }
    out.push(Change::Ramp {
        per_run: 0.01,
        max: 0.20,
    });
    out.push(Change::Spread { factor: 2.0 });
    out
}

/// A series with `change` from a random run after the baseline formed,
/// followed for `after` runs, and `history` more untouched runs before (a
/// daemon that has watched the build for a while).
pub fn changed_series(
    trace: &Trace,
    change: Change,
    block: usize,
    history: usize,
    after: usize,
    rng: &mut StdRng,
) -> Series {
    let first_evaluation = FIRST_EVALUATION + history;
    let change_at = first_evaluation + rng.random_range(0..=LATEST_CHANGE);
    let (mut runs, recorded_ids) = trace.resample_with_sources(change_at + after, block, rng);
    for run in &mut runs {
        resummarize(run);
    }
    for (since, run) in runs[change_at..].iter_mut().enumerate() {
        *run = change.apply(run, since);
    }
    Series {
        runs,
        change_at: Some(change_at),
        first_evaluation,
        recorded_ids,
    }
}

/// An untouched series of `evaluations` evaluations, `history` runs longer
/// before them.
pub fn null_series(
    trace: &Trace,
    block: usize,
    history: usize,
    evaluations: usize,
    rng: &mut StdRng,
) -> Series {
    let first_evaluation = FIRST_EVALUATION + history;
    let (mut runs, recorded_ids) =
        trace.resample_with_sources(first_evaluation + evaluations, block, rng);
    for run in &mut runs {
        resummarize(run);
    }
    Series {
        runs,
        change_at: None,
        first_evaluation,
        recorded_ids,
    }
}

/// Where an upgrade is put: a changed series' change, an untouched one's
/// no-op upgrade [`NULL_UPGRADE_AFTER`] evaluations in, so the upgrade
/// row's false alarms count no-op upgrades.
fn null_upgrade_at(series: &Series) -> usize {
    series
        .change_at
        .unwrap_or(series.first_evaluation + NULL_UPGRADE_AFTER)
}

/// This product's verdict after every run, as the daemon gives it.
pub fn ours(series: &Series, policy: &VerdictPolicy, upgrade: bool) -> Alerts {
    let mut replayer =
        Replayer::new(policy.clone(), HashSet::new()).expect("an in-memory store opens");
    let upgrade_at = null_upgrade_at(series);
    // Explained are the alarms the row counts: an upgrade row's from the
    // upgrade on.
    let row = match upgrade {
        true => Detector::OursUpgrade,
        false => Detector::OursSameBuild,
    };
    let counted_from = scored_from(row, series);
    let mut alerts = Vec::with_capacity(series.runs.len());
    for (i, run) in series.runs.iter().enumerate() {
        let mut run = run.clone();
        if upgrade && i >= upgrade_at {
            run.server.version = Some("next".into());
            run.server.system_fingerprint = run.server.system_fingerprint.map(|f| f + "-next");
        }
        let mut verdicts = replayer.push(run).unwrap_or_default();
        verdicts.extend(replayer.flush().unwrap_or_default());
        let alert = verdicts
            .iter()
            .any(|r| r.verdict.state == State::Regression);
        if alert
            && i >= counted_from
            && series.change_at.is_none()
            && std::env::var_os("DETECTION_EXPLAIN").is_some()
        {
            if let Some(drawn) = drawn_from(series, i, policy.candidate_window) {
                eprintln!("false alarm at {i}: {drawn}");
            }
            for r in &verdicts {
                eprintln!(
                    "false alarm at {i}: {} [{:?}]",
                    r.verdict.reason,
                    r.verdict
                        .evaluation
                        .metrics
                        .iter()
                        .filter(|m| m.flagged)
                        .map(|m| format!(
                            "{} {:+.1}% [{:+.1}%, {:+.1}%] p={:.1e}",
                            m.metric,
                            m.relative_change * 100.0,
                            m.ci_low * 100.0,
                            m.ci_high * 100.0,
                            m.p_adjusted
                        ))
                        .collect::<Vec<_>>()
                );
            }
        }
        alerts.push(alert);
    }
    alerts
}

/// Which recorded runs the newest `window` runs up to `at` were (the
/// candidate window's), and which of those the series also drew earlier:
/// an alarm on runs its history never met is a spell it could not know.
fn drawn_from(series: &Series, at: usize, window: usize) -> Option<String> {
    let ids = series.recorded_ids.get(..=at)?;
    let (earlier, newest) = ids.split_at(ids.len().saturating_sub(window));
    let met: Vec<&Option<i64>> = newest.iter().filter(|id| earlier.contains(id)).collect();
    Some(format!(
        "the newest {} runs are recorded runs {}; drawn earlier in the series too: {}",
        newest.len(),
        recorded_names(newest),
        match met.is_empty() {
            true => "none".into(),
            false => recorded_names(met),
        }
    ))
}

/// `66 67 68`: recorded run ids, `?` for a run without one.
fn recorded_names<'a>(ids: impl IntoIterator<Item = &'a Option<i64>>) -> String {
    let names: Vec<String> = ids
        .into_iter()
        .map(|id| id.map_or("?".into(), |id| id.to_string()))
        .collect();
    names.join(" ")
}

/// A field rule's alerts, any watched metric alerting.
pub fn by_rule(series: &Series, rule: &dyn Fn(&str) -> Box<dyn SeriesRule>) -> Alerts {
    let histories: Vec<(Box<dyn SeriesRule>, Vec<f64>)> = watched_values(series)
        .map(|(m, values)| (rule(m), values))
        .collect();
    (0..series.runs.len())
        .map(|i| {
            histories
                .iter()
                .any(|(rule, values)| rule.alerts(&values[..=i]))
        })
        .collect()
}

/// Every in-process detector's alerts on a series.
pub fn run_detector(
    detector: Detector,
    series: &Series,
    policy: &VerdictPolicy,
    noise: &TraceNoise,
) -> Alerts {
    match detector {
        Detector::OursUpgrade => ours(series, policy, true),
        Detector::OursSameBuild => ours(series, policy, false),
        Detector::Hud => by_rule(series, &|_| Box::new(Hud)),
        Detector::Perfherder => by_rule(series, &|_| Box::new(Perfherder)),
        Detector::Kayenta => by_rule(series, &|_| Box::new(Kayenta)),
        Detector::Oracle => oracle(series, 0, &noise.at_change, &[]),
        Detector::OracleAfterWarmup => oracle(series, noise.warmup, &noise.after_warmup, &[]),
        Detector::OracleQuiet => oracle(series, 0, &noise.at_change, &noise.quiet_z.0),
        Detector::OracleAfterWarmupQuiet => {
            oracle(series, noise.warmup, &noise.after_warmup, &noise.quiet_z.1)
        }
    }
}

/// Each watched metric's values on a series, in [`WATCHED`]'s order.
fn watched_values(series: &Series) -> impl Iterator<Item = (&'static str, Vec<f64>)> + '_ {
    WATCHED
        .iter()
        .map(|m| (*m, series.runs.iter().map(|r| rules::value(r, m)).collect()))
}

/// The oracle of one watched metric, leaving out the first `skip`
/// changed runs, told that metric's noise at every span; at `levels` by
/// span, or one in 10,000 where none are given.
fn oracle_of(
    series: &Series,
    metric: &str,
    skip: usize,
    noise: &[Vec<f64>],
    levels: &[f64],
) -> Oracle {
    let i = WATCHED.iter().position(|w| *w == metric).unwrap_or(0);
    Oracle {
        change_at: null_upgrade_at(series),
        skip,
        span_sd: noise.get(i).cloned().unwrap_or_default(),
        critical_z: levels.to_vec(),
    }
}

/// The oracle's alerts above its levels.
fn oracle(series: &Series, skip: usize, noise: &[Vec<f64>], levels: &[f64]) -> Alerts {
    by_rule(series, &|m| {
        Box::new(oracle_of(series, m, skip, noise, levels))
    })
}

/// For each span of 1 to `spans` runs, the highest z the oracle (leaving
/// out `skip` changed runs) reaches at that span on any watched metric at
/// any evaluation of the untouched series, and at least the one in 10,000
/// level: above them the oracle raises no false regression on those
/// series. By span, because a single far run sets the level of span 1
/// and would otherwise blunt the long spans that judge a lasting step.
/// Calibrated on the very series that count its false regressions, so
/// that row's 0 is by construction; what it measures is what such levels
/// still catch.
pub fn quiet_z(untouched: &[Series], skip: usize, noise: &[Vec<f64>], spans: usize) -> Vec<f64> {
    let mut highest = vec![Oracle::one_in_10000_z(); spans.max(1)];
    for series in untouched {
        for (metric, values) in watched_values(series) {
            let oracle = oracle_of(series, metric, skip, noise, &[]);
            for i in series.first_evaluation..values.len() {
                if let Some((span, z)) = oracle.statistic(&values[..=i]) {
                    let at = span.min(highest.len()) - 1;
                    highest[at] = highest[at].max(z);
                }
            }
        }
    }
    highest
}

/// Sets `noise`'s quiet levels from a trace's untouched series (see
/// [`quiet_z`]).
pub fn calibrate(noise: &mut TraceNoise, untouched: &[Series]) {
    let spans = noise.at_change.first().map_or(1, Vec::len);
    noise.quiet_z = (
        quiet_z(untouched, 0, &noise.at_change, spans),
        quiet_z(untouched, noise.warmup, &noise.after_warmup, spans),
    );
}

/// What the oracles are told of a trace: each watched metric's noise over
/// the whole trace, for spans of 1 to `spans` runs (as many as a trial
/// follows), right after the baseline and `warmup` runs after it.
pub struct TraceNoise {
    pub at_change: Vec<Vec<f64>>,
    pub after_warmup: Vec<Vec<f64>>,
    pub warmup: usize,
    /// The quiet oracles' levels by span, without and with the warm-up
    /// left out ([`calibrate`]); until calibrated, none (the plain
    /// oracles' one in 10,000).
    pub quiet_z: (Vec<f64>, Vec<f64>),
}

pub fn trace_noise(trace: &Trace, spans: usize, warmup: usize) -> TraceNoise {
    let mut runs = trace.runs.clone();
    for run in &mut runs {
        resummarize(run);
    }
    let values: Vec<Vec<f64>> = WATCHED
        .iter()
        .map(|m| runs.iter().map(|r| rules::value(r, m)).collect())
        .collect();
    let noise = |gap: usize| -> Vec<Vec<f64>> {
        values
            .iter()
            .map(|v| rules::span_noise(v, spans, gap))
            .collect()
    };
    TraceNoise {
        at_change: noise(0),
        after_warmup: noise(warmup),
        warmup,
        quiet_z: (Vec::new(), Vec::new()),
    }
}

/// The first run a detector's alerts on an untouched series are scored
/// from: for the upgrade row the no-op upgrade (the evaluations before it
/// are the same-build row's), for the others the first evaluation.
pub fn scored_from(detector: Detector, series: &Series) -> usize {
    match detector {
        Detector::OursUpgrade => null_upgrade_at(series),
        _ => series.first_evaluation,
    }
}

/// A seeded generator for one (trace, change) cell, the same for every
/// detector: each detector meets the very same series.
pub fn rng_for(seed: u64, trace: &str, cell: usize) -> StdRng {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for b in trace.bytes() {
        h = h.wrapping_mul(0x100_0000_01b3) ^ b as u64;
    }
    StdRng::seed_from_u64(h ^ (cell as u64).wrapping_mul(0xff51_afd7_ed55_8ccd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quiet oracles raise no false regression on the series they
    /// were calibrated on, and their level is the lowest that does: just
    /// below it, one of those series alarms.
    #[test]
    fn a_quiet_oracles_level_is_the_lowest_with_no_false_regression() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces/quiet.jsonl.gz");
        let file = std::fs::File::open(&path).unwrap();
        let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
        let trace = Trace::parse("quiet", reader).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let untouched: Vec<Series> = (0..40)
            .map(|_| null_series(&trace, 10, 0, NULL_EVALUATIONS, &mut rng))
            .collect();
        let mut noise = trace_noise(&trace, AFTER, 2);
        calibrate(&mut noise, &untouched);
        let plain = Oracle::one_in_10000_z();
        // `quiet`'s far spikes take the plain oracle past its level there.
        assert!(
            noise.quiet_z.0.iter().any(|z| *z > plain),
            "{:?}",
            noise.quiet_z
        );
        for (skip, spans, levels) in [
            (0, &noise.at_change, noise.quiet_z.0.clone()),
            (2, &noise.after_warmup, noise.quiet_z.1.clone()),
        ] {
            assert_eq!(levels.len(), AFTER);
            assert!(levels.iter().all(|z| *z >= plain), "{levels:?}");
            let alarms = |levels: &[f64]| {
                untouched
                    .iter()
                    .map(|s| {
                        oracle(s, skip, spans, levels)[s.first_evaluation..]
                            .iter()
                            .filter(|a| **a)
                            .count()
                    })
                    .sum::<usize>()
            };
            assert_eq!(alarms(&levels), 0, "skip {skip}: {levels:?}");
            // Each span's level is the lowest: just below it, an alarm.
            for (at, z) in levels.iter().enumerate().filter(|(_, z)| **z > plain) {
                let mut lower = levels.clone();
                lower[at] = z - 1e-9;
                assert!(alarms(&lower) > 0, "skip {skip}: span {} at {z}", at + 1);
            }
        }
    }

    #[test]
    fn an_untouched_series_is_as_long_as_the_evaluations_asked_for() {
        use crate::vocabulary::records::RunOutcome;
        let runs = (0..50)
            .map(|i| {
                let at = chrono::DateTime::from_timestamp(1_800_000_000 + i * 60, 0).unwrap();
                let mut run =
                    RunRecord::failed("t", "s", "m", at, 1.0, RunOutcome::Ok, String::new());
                run.id = Some(i);
                run
            })
            .collect();
        let trace = Trace {
            name: "t".into(),
            runs,
        };
        let mut rng = StdRng::seed_from_u64(1);
        for (history, evaluations) in [(0, NULL_EVALUATIONS), (0, 200), (250, 200)] {
            let series = null_series(&trace, 10, history, evaluations, &mut rng);
            assert_eq!(series.first_evaluation, FIRST_EVALUATION + history);
            assert_eq!(series.runs.len(), series.first_evaluation + evaluations);
            // The no-op upgrade falls inside, its evaluations scored.
            assert!(null_upgrade_at(&series) < series.runs.len());
        }
    }

    #[test]
    fn an_alarm_says_which_recorded_runs_it_was_on_and_whether_the_series_met_them_before() {
        // Recorded runs 1-10, a spell at 66-68, then 5-13: the newest 12
        // runs at run 21 are the spell and 5-13, of which 5-10 were met.
        let ids: Vec<Option<i64>> = (1..=10).chain(66..=68).chain(5..=13).map(Some).collect();
        let series = Series {
            runs: Vec::new(),
            change_at: None,
            first_evaluation: 5,
            recorded_ids: ids,
        };
        assert_eq!(
            drawn_from(&series, 21, 12).as_deref(),
            Some(
                "the newest 12 runs are recorded runs 66 67 68 5 6 7 8 9 10 11 12 13; drawn earlier in the series too: 5 6 7 8 9 10"
            )
        );
        assert_eq!(
            drawn_from(&series, 2, 12).as_deref(),
            Some(
                "the newest 3 runs are recorded runs 1 2 3; drawn earlier in the series too: none"
            )
        );
        assert_eq!(drawn_from(&series, 22, 12), None, "past the series' end");
        let unknown = Series {
            runs: Vec::new(),
            change_at: Some(10),
            first_evaluation: 5,
            recorded_ids: Vec::new(),
        };
        assert_eq!(drawn_from(&unknown, 0, 12), None);
    }
}
