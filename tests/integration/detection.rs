//! The detection harness in CI, on recorded traces of a real vLLM server
//! (`quiet`; `competing` for a daemon started fresh; `idle` for a lasting
//! slowdown): this product's
//! verdicts on untouched resampled series and on series with a large step
//! injected, against bounds with their statistical margins; the full
//! table (every trace, change and detector) is a benchmark
//! (`scripts/detection-table`), not a test. +20% steps
//! within 3 evaluations are beyond any detector on these traces: the
//! oracle, told the change and the noise, catches them in 0-7% of trials
//! (README, "How well it detects"); on `quiet` with its noise scaled to a
//! tenth, a server that strays as a GPU server does, ours must catch them
//! within 3. The bounds below hold the rates measured, with their
//! margins, so they can only improve.

use vllm_sentinel::detection::harness::{self, Score, Series};
use vllm_sentinel::detection::trace::{Change, Trace, resummarize};
use vllm_sentinel::verdict::policy::VerdictPolicy;

fn trace(name: &str) -> Trace {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/traces")
        .join(format!("{name}.jsonl.gz"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    Trace::parse(name, reader).unwrap()
}

/// Untouched runs before the daemon's first evaluation in the rate test:
/// a daemon that has watched the build a while, as the table's "after 250
/// runs of history" section measures it. With fewer than half of
/// `noise_runs` runs of history, a change within one build must last
/// `spell_runs` runs before it is judged (see the next tests).
const HISTORY: usize = 250;

/// How often PyTorch HUD's rule alarms within 10 evaluations of a run of
/// the test's untouched series: measured 49% (609 of 1,240 runs; the
/// series are seeded, so any machine gives the same). The 10-run
/// stretches overlap, 31 to a series, so they rest on its 40 series, not
/// 1,240 trials: under 30% would be a change in the rule or the harness.
const HUD_UNTOUCHED_WITHIN_10: f64 = 0.30;

#[test]
fn on_a_recorded_trace_the_verdicts_stay_within_their_measured_rates() {
    let trace = trace("quiet");
    let policy = VerdictPolicy::default();
    let noise = harness::trace_noise(&trace, harness::AFTER, policy.warmup_runs);

    // Untouched data: 40 series of 60 evaluations (2,400).
    let mut rng = harness::rng_for(7, "ci", 0);
    let mut null = Score::default();
    let mut hud = Score::default();
    for _ in 0..40 {
        let series = harness::null_series(&trace, 10, HISTORY, harness::NULL_EVALUATIONS, &mut rng);
        null.add(&series, &harness::ours(&series, &policy, false));
        hud.add(
            &series,
            &harness::run_detector(harness::Detector::Hud, &series, &policy, &noise),
        );
    }
    // A +50% step on TTFT and TPOT within one build: 40 trials.
    let mut rng = harness::rng_for(7, "ci", 1);
    let mut step = Score::default();
    for _ in 0..40 {
        let series = harness::changed_series(
            &trace,
            Change::Step {
                ttft: 1.5,
                tpot: 1.5,
            },
            10,
            HISTORY,
            harness::AFTER,
            &mut rng,
        );
        step.add(&series, &harness::ours(&series, &policy, false));
    }
    eprintln!(
        "untouched: alarmed within 10 evaluations of {} of {} runs a change could have come at (PyTorch HUD's rule: {})",
        null.untouched_within_horizon, null.untouched_windows, hud.untouched_within_horizon
    );
    eprintln!(
        "untouched: {} false regressions in {} evaluations ({:.1} per 10,000; PyTorch HUD's rule: {:.1}); \
         +50% step: {} of {} caught within 3, {} within 10, median delay {:?}",
        null.false_alerts,
        null.evaluations,
        null.false_per_10k(),
        hud.false_per_10k(),
        step.within_3,
        step.trials,
        step.within_horizon,
        step.median_delay()
    );
    assert_eq!(null.evaluations, 2_400);
    // The table measured, on this trace after 250 runs of history, no
    // false regression in 5,100 evaluations (the oracle 5.9 per 10,000),
    // and of +50% steps 20% caught within 3 evaluations and 93% within
    // 10 (30 trials). False regressions come in spells (a slow
    // stretch of the machine flags several evaluations in a row): 3 or
    // more in 2,400 would be a rate no lower than the worst loaded
    // trace's. Of 40 trials, at 20% 3 or more are caught within 3 with
    // probability 0.99, and at 80% 25 or more within 10 with probability
    // 0.997 (binomial): lower counts are a change in the detector. The
    // series are seeded: the same code gives the same figures on any
    // machine (0 false regressions; 6 and 31 caught).
    assert!(
        null.false_alerts <= 2,
        "{} false regressions in 2,400 evaluations",
        null.false_alerts
    );
    assert!(
        step.within_3 >= 3,
        "{} of 40 caught within 3",
        step.within_3
    );
    assert!(
        step.within_horizon >= 25,
        "{} of 40 caught within 10",
        step.within_horizon
    );
    // The field's fastest rule pays for its speed in false alarms, and
    // its catches within 10 are mostly those: on untouched series it
    // alarms within 10 evaluations of HUD_UNTOUCHED_WITHIN_10 of the runs
    // a change could have come at; ours within none.
    assert!(hud.false_alerts > 100);
    let untouched = |s: &Score| Score::rate(s.untouched_within_horizon, s.untouched_windows);
    assert_eq!(null.untouched_windows, 40 * 31);
    assert_eq!(null.untouched_within_horizon, 0);
    assert!(
        untouched(&hud) >= HUD_UNTOUCHED_WITHIN_10,
        "HUD alarmed within 10 evaluations of {:.0}% of the untouched runs",
        untouched(&hud) * 100.0
    );
}

#[test]
fn at_a_fresh_start_the_verdicts_alarm_at_most_once_on_a_loaded_trace() {
    // A daemon started fresh: a young build's 30-run baseline may fall in
    // a quiet spell, and every later run then looks 20-70% slower on the
    // loaded traces; only the long-memory assumption (`young_hurst`)
    // keeps that from being a regression.
    let trace = trace("competing");
    let mut rng = harness::rng_for(7, "ci-fresh", 0);
    let series: Vec<Series> = (0..60)
        .map(|_| harness::null_series(&trace, 10, 0, harness::NULL_EVALUATIONS, &mut rng))
        .collect();
    let false_alerts = |policy: &VerdictPolicy| {
        let (mut same_build, mut upgrade) = (Score::default(), Score::default());
        for series in &series {
            same_build.add(series, &harness::ours(series, policy, false));
            let from = harness::scored_from(harness::Detector::OursUpgrade, series);
            upgrade.add_scored_from(series, &harness::ours(series, policy, true), from);
        }
        (same_build, upgrade)
    };
    let (same_build, upgrade) = false_alerts(&VerdictPolicy::default());
    let (_, upgrade_independent) = false_alerts(&VerdictPolicy {
        young_hurst: 0.5,
        ..VerdictPolicy::default()
    });
    eprintln!(
        "fresh start: {} false regressions in {} evaluations within one build, {} in {} from a no-op upgrade on ({} without the long-memory assumption)",
        same_build.false_alerts,
        same_build.evaluations,
        upgrade.false_alerts,
        upgrade.evaluations,
        upgrade_independent.false_alerts
    );
    assert_eq!(same_build.evaluations, 3_600);
    // The table measured 0 in 10,200 (same build) and 0 in 7,650
    // (upgrade) on this trace, 26.5 and 43.1 per 10,000 without the
    // long-memory assumption. These 3,600 and 2,700 evaluations: 0 within
    // one build (at the table's 95% upper bound, 2.9 per 10,000, 1.0
    // expected) and, from the upgrade on, 0 (37 without the assumption;
    // one slow spell alarming 5 evaluations in a row while the candidate
    // was the newest 12 runs rather than every run since the upgrade, 36
    // without; 25 when a young history's upgrade was also tested on spans
    // of 3 and 6 runs, each p-value then multiplied by the spans tried,
    // and from 4 runs): one spell (at most 6 evaluations, 2 of 3 must
    // flag) is allowed, a second is a change in the detector. The series
    // are seeded: the same code gives the same counts on any machine.
    assert_eq!(same_build.false_alerts, 0);
    assert!(
        upgrade.false_alerts <= 6,
        "{} false regressions from the upgrade on",
        upgrade.false_alerts
    );
    assert_eq!(upgrade.evaluations, 2_700);
    assert!(
        upgrade_independent.false_alerts >= 3 * upgrade.false_alerts.max(1),
        "{} without the assumption",
        upgrade_independent.false_alerts
    );
}

/// A doubling of TTFT and TPOT from run `at` of `runs` runs of one build:
/// the run after which it was first a regression, and the share of the
/// evaluations from 30 runs after the change on, and the number of the
/// last 20, that were regressions.
fn lasting_doubling(runs: usize, at: usize) -> (Option<usize>, f64, usize) {
    let trace = trace("idle");
    let policy = VerdictPolicy::default();
    let mut rng = harness::rng_for(7, "ci", 2);
    let mut series_runs = trace.resample(runs, 10, &mut rng);
    for run in &mut series_runs {
        resummarize(run);
    }
    let step = Change::Step {
        ttft: 2.0,
        tpot: 2.0,
    };
    for (since, run) in series_runs[at..].iter_mut().enumerate() {
        *run = step.apply(run, since);
    }
    let series = Series {
        runs: series_runs,
        change_at: Some(at),
        first_evaluation: harness::FIRST_EVALUATION,
        recorded_ids: Vec::new(),
    };
    let alerts = harness::ours(&series, &policy, false);
    let caught = alerts[at..].iter().position(|a| *a).map(|p| p + at);
    let standing = |from: usize| alerts[from..].iter().filter(|a| **a).count();
    let after = standing(at + 30) as f64 / (runs - at - 30) as f64;
    let result = (caught, after, standing(runs - 20));
    eprintln!(
        "doubling from run {at} of {runs}: caught after run {:?}; regression in {:.0}% of the evaluations from run {} on, {} of the last 20",
        result.0,
        100.0 * result.1,
        at + 30,
        result.2
    );
    result
}

#[test]
fn a_slowdown_within_one_build_that_lasts_stays_a_regression() {
    // Long after the slow runs have left the candidate window the verdict
    // must still be a regression: the slow stretch is judged as long as it
    // is, and never counted as the build's noise.
    let VerdictPolicy {
        spell_runs,
        candidate_window,
        ..
    } = VerdictPolicy::default();
    // A build with 250 runs of history: caught within the candidate
    // window.
    let (caught, after, last_20) = lasting_doubling(400, 300);
    assert!(
        caught.is_some_and(|at| at < 300 + candidate_window),
        "caught at {caught:?}"
    );
    assert!(after >= 0.95, "{after}");
    assert_eq!(last_20, 20);
    // A young build (60 runs): a stretch shorter than `spell_runs` may be
    // a slow spell, so it is caught no sooner than that, and then for
    // good. On `idle` a young history's long-memory floors keep even a
    // doubling within the noise for a while: this one is caught after
    // run 90 with `spell_runs` 16 (within 81-88 with 24: a 16-run gate
    // tries spans of 16 runs and the whole stretch, each p-value weighed
    // by both; after run 89 before the phases were also judged against
    // each other, which a doubling of both leaves be but which add two
    // tests to the Benjamini-Hochberg correction), so at most 30 runs
    // after the change.
    let (caught, after, last_20) = lasting_doubling(200, 60);
    assert!(
        caught.is_some_and(|at| at >= 60 + spell_runs - 3 && at <= 60 + 30),
        "caught at {caught:?}"
    );
    assert!(after >= 0.95, "{after}");
    assert_eq!(last_20, 20);
}

/// The standard deviation and the lag-1 correlation of the logarithm of
/// one summary's p50 across a trace's runs, and its median.
fn run_to_run(
    trace: &Trace,
    p50: fn(&vllm_sentinel::vocabulary::records::RunRecord) -> f64,
) -> (f64, f64, f64) {
    let logs: Vec<f64> = trace.runs.iter().map(|r| p50(r).ln()).collect();
    let n = logs.len() as f64;
    let mean = logs.iter().sum::<f64>() / n;
    let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let lag1 = logs
        .windows(2)
        .map(|w| (w[0] - mean) * (w[1] - mean))
        .sum::<f64>()
        / (n - 1.0)
        / var;
    let mut sorted = logs.clone();
    sorted.sort_by(f64::total_cmp);
    (var.sqrt(), lag1, sorted[sorted.len() / 2].exp())
}

#[test]
fn a_trace_with_its_noise_scaled_strays_that_much_less_and_keeps_its_shape() {
    // The benchmark's --noise-scale: the same recording as a server that
    // strays a quarter as far. On logarithms every request is brought a
    // quarter of the way from the trace's median run, so a run's p50 (the
    // mean of its two middle requests of 8) strays about a quarter as
    // far, its neighbours stay as correlated and its median stays.
    let recorded = trace("waves");
    let quarter = recorded.with_noise_scaled(0.25);
    assert_eq!(quarter.runs.len(), recorded.runs.len());
    let ttft = |r: &vllm_sentinel::vocabulary::records::RunRecord| r.summary.ttft.p50;
    let tpot = |r: &vllm_sentinel::vocabulary::records::RunRecord| r.summary.tpot.p50;
    for (name, p50) in [("TTFT", ttft as fn(&_) -> f64), ("TPOT", tpot)] {
        let (sd, lag1, median) = run_to_run(&recorded, p50);
        let (sd_q, lag1_q, median_q) = run_to_run(&quarter, p50);
        eprintln!(
            "{name} p50: sd of the log {sd:.3} -> {sd_q:.3}, lag-1 {lag1:.2} -> {lag1_q:.2}, median {median:.5} -> {median_q:.5}"
        );
        // Recorded: 0.2-0.3 on logarithms (the traces' README).
        assert!(sd > 0.15, "{name}: the recording strays {sd}");
        assert!((sd_q / sd - 0.25).abs() < 0.02, "{name}: {sd_q} of {sd}");
        assert!(
            (lag1_q - lag1).abs() < 0.05,
            "{name}: lag-1 {lag1_q} of {lag1}"
        );
        assert!(
            (median_q / median - 1.0).abs() < 0.01,
            "{name}: median {median_q} of {median}"
        );
    }
    // Every request keeps its place: the slowest run stays the slowest.
    let slowest = |t: &Trace| {
        (0..t.runs.len())
            .max_by(|a, b| ttft(&t.runs[*a]).total_cmp(&ttft(&t.runs[*b])))
            .unwrap()
    };
    assert_eq!(slowest(&quarter), slowest(&recorded));
    // As recorded, nothing moves.
    let same = recorded.with_noise_scaled(1.0);
    for (a, b) in same.runs.iter().zip(&recorded.runs) {
        assert!((a.summary.e2el.p90 / b.summary.e2el.p90 - 1.0).abs() < 1e-12);
    }
}

#[test]
fn on_a_server_that_strays_a_tenth_as_far_a_twenty_percent_step_is_caught_within_3() {
    // The bar, +20% within 3 evaluations, is beyond any detector
    // on the recordings themselves (a CPU server whose runs stray 14-17%
    // on `quiet`): the oracle catches 8-17% of such steps within 10. A GPU
    // server strays far less. The same recording with its noise scaled to
    // a tenth on logarithms (`--noise-scale 0.1`: runs 1.3-1.8% apart,
    // its correlation and slow spells kept at a tenth of their size) is
    // such a server, and on it a +20% step on TTFT and TPOT within one
    // build must be caught within 3 evaluations, at a fresh start, with
    // no false regression.
    let quiet = trace("quiet").with_noise_scaled(0.1);
    let policy = VerdictPolicy::default();
    let mut rng = harness::rng_for(7, "ci-tenth", 0);
    let mut null = Score::default();
    for _ in 0..40 {
        let series = harness::null_series(&quiet, 10, 0, harness::NULL_EVALUATIONS, &mut rng);
        null.add(&series, &harness::ours(&series, &policy, false));
    }
    assert_eq!(null.evaluations, 2_400);
    // The table's 10,200 evaluations of this trace at a tenth: none.
    assert_eq!(null.false_alerts, 0, "false regressions in 2,400");
    // Measured on the table's 60 trials at a tenth: TTFT, TPOT and both
    // +20% caught within 3 in 90%, 87% and 85% (the oracle, told the
    // change, in 100% at the first changed run). Of 40 trials, at 85%
    // fewer than 29 are caught with probability 0.012 (binomial): fewer
    // is a change in the detector. What catches them this soon is
    // `decisive_q` and, for a step in one phase, its ratio to the other
    // (`phase_ratios`): a young build otherwise waits `spell_runs` runs
    // for a slow stretch to pass (with both off, none of these is caught
    // within 3; with `decisive_q` off alone, a step in one phase still
    // is). The series are seeded: the same code gives the same counts.
    let steps = [("TTFT", 1.2, 1.0), ("TPOT", 1.0, 1.2), ("both", 1.2, 1.2)];
    for (cell, (name, ttft, tpot)) in steps.into_iter().enumerate() {
        let caught = |policy: &VerdictPolicy| {
            let mut rng = harness::rng_for(7, "ci-tenth", 1 + cell);
            let mut step = Score::default();
            for _ in 0..40 {
                let series = harness::changed_series(
                    &quiet,
                    Change::Step { ttft, tpot },
                    10,
                    0,
                    harness::AFTER,
                    &mut rng,
                );
                step.add(&series, &harness::ours(&series, policy, false));
            }
            step
        };
        let step = caught(&policy);
        let without = |decisive_q: f64, phase_ratios: bool| {
            caught(&VerdictPolicy {
                detector: vllm_sentinel::verdict::DetectorSettings {
                    decisive_q,
                    phase_ratios,
                    ..policy.detector.clone()
                },
                ..policy.clone()
            })
        };
        let without_decisive = without(0.0, true);
        let waiting = without(0.0, false);
        eprintln!(
            "noise at a tenth, {name} +20%: {} of {} caught within 3, {} within 10, median delay {:?} ({} within 3 without decisive_q, {} without it and phase_ratios)",
            step.within_3,
            step.trials,
            step.within_horizon,
            step.median_delay(),
            without_decisive.within_3,
            waiting.within_3
        );
        assert_eq!(step.trials, 40);
        assert!(
            step.within_3 >= 29,
            "{name}: {} of 40 caught within 3",
            step.within_3
        );
        assert!(
            waiting.within_3 < step.within_3,
            "{name}: {} without decisive_q and phase_ratios",
            waiting.within_3
        );
        if name == "both" {
            // Both phases slower: the ratios see nothing.
            assert!(
                without_decisive.within_3 < step.within_3,
                "{name}: {} without decisive_q",
                without_decisive.within_3
            );
        }
    }
    eprintln!(
        "noise at a tenth: {} false regressions in {} evaluations",
        null.false_alerts, null.evaluations
    );
}
