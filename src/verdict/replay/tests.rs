//! Replay's tests within one build: replayed verdicts against the
//! daemon's rule as a build's history grows, and the runs they replay.

use super::*;
use crate::verdict::State;
use crate::vocabulary::records::{LatencySummary, ServerLoad};
use chrono::TimeZone;

/// A completed run of build 0.32.0 at minute `i`, TTFT `ttft` seconds
/// with a little deterministic noise, on an idle server (its load read).
pub(super) fn run(i: usize, ttft: f64) -> RunRecord {
    on_an_idle_server(run_unread(i, ttft))
}

/// `r` with its load read before and after: an idle server.
fn on_an_idle_server(r: RunRecord) -> RunRecord {
    let idle = ServerLoad {
        running: Some(0.0),
        waiting: Some(0.0),
        ..ServerLoad::default()
    };
    RunRecord {
        load_before: Some(idle),
        load_after: Some(idle),
        ..r
    }
}

/// [`run`] on a server whose `/metrics` could not be read.
fn run_unread(i: usize, ttft: f64) -> RunRecord {
    run_phases_unread(i, ttft, 0.004)
}

/// [`run`] with TPOT `tpot` seconds: its noise is TTFT's (the machine's)
/// and a little of its own, so that the phases' ratio strays too.
fn run_phases(i: usize, ttft: f64, tpot: f64) -> RunRecord {
    let own = 1.0 + 0.02 * ((i * 104_729) % 11) as f64 / 11.0;
    on_an_idle_server(run_phases_unread(i, ttft, tpot * own))
}

/// [`run_unread`] with TPOT `tpot` seconds.
fn run_phases_unread(i: usize, ttft: f64, tpot: f64) -> RunRecord {
    let at =
        Utc.with_ymd_and_hms(2026, 11, 25, 12, 0, 0).unwrap() + chrono::Duration::minutes(i as i64);
    let mut r = RunRecord::failed("t", "s", "m", at, 1.0, RunOutcome::Ok, String::new());
    r.id = Some(i as i64 + 1);
    r.server.version = Some("0.32.0".into());
    r.summary.completed = 8;
    let noise = 1.0 + 0.03 * ((i * 7919) % 13) as f64 / 13.0;
    for (summary, v) in [
        (&mut r.summary.ttft, ttft * noise),
        (&mut r.summary.tpot, tpot * noise),
        (&mut r.summary.itl, tpot * noise),
        (&mut r.summary.e2el, (ttft + 0.06) * noise),
    ] {
        *summary = LatencySummary {
            count: 8,
            mean: v,
            std: 0.0,
            p50: v,
            p90: v * 1.2,
            p95: v * 1.3,
            p99: v * 1.5,
        };
    }
    r
}

use chrono::Utc;

/// The verdicts of `verdicts` ((the run each followed, its state, its
/// reason)) that are confirming or a regression.
pub(super) fn slower(verdicts: &[(i64, State, String)]) -> Vec<(i64, State, String)> {
    verdicts
        .iter()
        .filter(|(_, s, _)| matches!(s, State::Regression | State::Confirming))
        .cloned()
        .collect()
}

/// Every verdict replay gives on `runs` (oldest first).
pub(super) fn replay_all(
    policy: VerdictPolicy,
    runs: impl Iterator<Item = RunRecord>,
) -> Vec<Replayed> {
    let mut replayer = Replayer::new(policy, HashSet::new()).unwrap();
    let mut verdicts = Vec::new();
    for r in runs {
        verdicts.extend(replayer.push(r).unwrap());
    }
    verdicts.extend(replayer.flush().unwrap());
    verdicts
}

/// The verdicts on one build whose TTFT is 30% slower from run `at`
/// of `runs` on.
fn step_within_one_build(runs: usize, at: usize) -> Vec<Replayed> {
    step_within_one_build_under(VerdictPolicy::default(), runs, at)
}

/// [`step_within_one_build`] under `policy`.
fn step_within_one_build_under(policy: VerdictPolicy, runs: usize, at: usize) -> Vec<Replayed> {
    let ttft = move |i: usize| if i >= at { 0.026 } else { 0.020 };
    replay_all(policy, (0..runs).map(|i| run(i, ttft(i))))
}

/// The policy with no slowdown taken as beyond doubt (`decisive_q`).
fn always_waiting() -> VerdictPolicy {
    let mut policy = VerdictPolicy::default();
    policy.detector.decisive_q = 0.0;
    policy
}

#[test]
fn before_its_baseline_forms_a_build_says_how_far_it_has_come() {
    let policy = VerdictPolicy::default();
    let (warmup, needed) = (policy.warmup_runs, policy.baseline_runs);
    let verdicts = replay_all(policy, (0..warmup + needed + 1).map(|i| run(i, 0.020)));
    let reasons: Vec<&str> = verdicts.iter().map(|r| r.verdict.reason.as_str()).collect();
    assert_eq!(
        reasons[0],
        format!(
            "no baseline yet: 0 of the {needed} completed runs past warm-up (the first {warmup} of the build, of each deployment and of each server start) that 0.32.0's baseline forms from"
        )
    );
    // The last run before the baseline: one to go, whatever the
    // candidate window holds.
    assert!(
        reasons[warmup + needed - 2]
            .starts_with(&format!("no baseline yet: {} of the {needed}", needed - 1)),
        "{}",
        reasons[warmup + needed - 2]
    );
    assert!(
        !reasons[warmup + needed - 1].starts_with("no baseline yet"),
        "{}",
        reasons[warmup + needed - 1]
    );
}

#[test]
fn a_change_within_one_build_says_so_and_since_when() {
    let verdicts = step_within_one_build(260, 200);
    let regression = verdicts
        .iter()
        .find(|r| r.verdict.state == State::Regression)
        .expect("the +30% step within the build is found");
    assert!(
        regression
            .verdict
            .reason
            .ends_with("since 15:20 UTC, same build 0.32.0 (not an upgrade)"),
        "{}",
        regression.verdict.reason
    );
    // Nothing before the change, and caught within the window.
    let after = regression.after_run.unwrap();
    assert!(after > 200 && after < 212, "{after}");
}

#[test]
fn a_young_build_waits_for_a_slowdown_to_outlast_a_spell() {
    // 60 runs of history: a slow stretch of both phases, as a slow spell
    // of the machine is, is judged once it has lasted `spell_runs` runs;
    // before that it is named and not flagged. (With runs that stray 3%,
    // a +30% step is beyond doubt: the wait is measured with `decisive_q`
    // off; the next test has it on, as it ships.)
    let spell_runs = VerdictPolicy::default().spell_runs;
    let step = |i: usize| if i >= 60 { 1.3 } else { 1.0 };
    let verdicts = replay_all(
        always_waiting(),
        (0..110).map(|i| run_phases(i, 0.020 * step(i), 0.004 * step(i))),
    );
    let regression = verdicts
        .iter()
        .find(|r| r.verdict.state == State::Regression)
        .expect("the lasting step is found");
    let after = regression.after_run.unwrap() as usize;
    assert!(
        (60 + spell_runs - 2..60 + spell_runs + 4).contains(&after),
        "{after}"
    );
    assert!(
        regression
            .verdict
            .reason
            .ends_with("since 13:00 UTC, same build 0.32.0 (not an upgrade)"),
        "{}",
        regression.verdict.reason
    );
    let waiting = verdicts
        .iter()
        .find(|r| r.after_run.is_some_and(|id| (66..80).contains(&id)))
        .expect("a verdict while the stretch is short");
    assert_eq!(waiting.verdict.state, State::Ok);
    assert!(
        waiting.verdict.reason.contains("not yet a regression")
            && waiting
                .verdict
                .reason
                .contains(&format!("must last {spell_runs} runs")),
        "{}",
        waiting.verdict.reason
    );
}

#[test]
fn a_young_build_judges_one_phase_against_the_other_without_waiting() {
    // The machine's spells slow both phases; a step in one phase alone
    // moves its ratio to the other, which the spells leave be. Within a
    // young build such a step is a regression before `spell_runs` runs,
    // confirmed as any (2 of 3), with `decisive_q` off; the same step in
    // both phases still waits.
    let spell_runs = VerdictPolicy::default().spell_runs;
    let ttft = |i: usize| if i >= 60 { 0.026 } else { 0.020 };
    let one_phase = replay_all(
        always_waiting(),
        (0..110).map(|i| run_phases(i, ttft(i), 0.004)),
    );
    let regression = one_phase
        .iter()
        .find(|r| r.verdict.state == State::Regression)
        .expect("the step in TTFT alone is found");
    let after = regression.after_run.unwrap() as usize;
    assert!((61..60 + spell_runs - 2).contains(&after), "{after}");
    let flagged: Vec<&str> = regression
        .verdict
        .evaluation
        .metrics
        .iter()
        .filter(|m| m.flagged && m.alerting)
        .map(|m| m.metric.as_str())
        .collect();
    assert_eq!(
        flagged,
        ["ttft_p50_over_tpot"],
        "{}",
        regression.verdict.reason
    );
    let reason = &regression.verdict.reason;
    assert!(
        reason.contains("ttft_p50_over_tpot +")
            && reason.ends_with("since 13:00 UTC, same build 0.32.0 (not an upgrade)"),
        "{reason}"
    );
    // Its first flagged evaluation names only what is slower yet: TTFT
    // alone waits for the stretch to last.
    let first = one_phase
        .iter()
        .find(|r| r.verdict.evaluation.flagged())
        .unwrap();
    assert_eq!(
        first.verdict.evaluation.reason,
        "slower: ttft_p50_over_tpot"
    );
    // TPOT faster alone raises the same ratio: no regression.
    let tpot = |i: usize| if i >= 60 { 0.003 } else { 0.004 };
    let faster = replay_all(
        always_waiting(),
        (0..110).map(|i| run_phases(i, 0.020, tpot(i))),
    );
    assert!(
        faster.iter().all(|r| r.verdict.state != State::Regression),
        "a faster decode is no slower prefill"
    );
}

#[test]
fn a_young_build_does_not_wait_for_a_slowdown_far_beyond_its_noise() {
    // The same +30% step on runs that stray 3%: no slow spell of such a
    // machine strays that far, so it is a regression once the median of
    // the newest `scan_min_runs` (3) runs is a changed run: after the
    // step's 2nd run (run id 62), saying why and since when.
    let mut policy = VerdictPolicy::default();
    policy.detector.decisive_q = 1e-9;
    let verdicts = step_within_one_build_under(policy, 110, 60);
    let regression = verdicts
        .iter()
        .find(|r| r.verdict.state == State::Regression)
        .expect("the step is found");
    let after = regression.after_run.unwrap() as usize;
    assert_eq!(VerdictPolicy::default().detector.scan_min_runs, 3);
    assert_eq!(after, 62, "{}", regression.verdict.reason);
    let reason = &regression.verdict.reason;
    assert!(
        reason.starts_with("slower far beyond the runs' noise (p ")
            && reason.contains("ttft_p50 +")
            && reason.ends_with("since 13:00 UTC, same build 0.32.0 (not an upgrade)"),
        "{reason}"
    );
    // No earlier verdict was a regression.
    assert!(
        verdicts
            .iter()
            .filter(|r| r.after_run.is_some_and(|id| (id as usize) < after))
            .all(|r| r.verdict.state != State::Regression)
    );
    // Where the server's load was never read, a load wave cannot be ruled
    // out: the same step waits for its confirmation.
    let mut policy = VerdictPolicy::default();
    policy.detector.decisive_q = 1e-9;
    let ttft = |i: usize| if i >= 60 { 0.026 } else { 0.020 };
    let unread = replay_all(policy, (0..110).map(|i| run_unread(i, ttft(i))));
    let first = unread
        .iter()
        .find(|r| r.verdict.state == State::Regression)
        .expect("the step is found");
    assert!(
        first.after_run.unwrap() as usize > after && first.verdict.reason.starts_with("slower in "),
        "after run {:?}: {}",
        first.after_run,
        first.verdict.reason
    );
    // Every later verdict gives the step's size: of spans equally beyond
    // doubt (p underflows), the one that is all step is reported, not a
    // longer one half unchanged (+14% for this +30% step, before).
    for r in verdicts
        .iter()
        .filter(|r| r.after_run.is_some_and(|id| id as usize >= after))
    {
        let ttft = r.verdict.evaluation.metric("ttft_p50").unwrap();
        assert!(
            (0.25..0.35).contains(&ttft.relative_change),
            "after run {:?}: {ttft:?}",
            r.after_run
        );
    }
}

#[test]
fn a_young_build_takes_its_runs_as_long_memory() {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    // Runs that stray by 8% (log-normal), 15% slower from run 40 on:
    // in a young build, a stretch as a long-memory machine's may be.
    let verdicts = |young_hurst: f64| {
        let policy = VerdictPolicy {
            young_hurst,
            ..VerdictPolicy::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let noise = rand_distr::LogNormal::new(0.0, 0.08).unwrap();
        let runs = (0..76).map(move |i| {
            let step = if i >= 40 { 1.15 } else { 1.0 };
            run(i, 0.020 * noise.sample(&mut rng) * step)
        });
        replay_all(policy, runs)
    };
    let flagged = |verdicts: &[Replayed]| {
        verdicts
            .iter()
            .filter(|r| r.verdict.evaluation.flagged())
            .count()
    };
    // The young build's verdicts are told the assumption: the same
    // runs flag less often with it.
    let independent = flagged(&verdicts(0.5));
    let assumed = flagged(&verdicts(VerdictPolicy::default().young_hurst));
    assert!(independent > 0, "independent runs: a step");
    assert!(assumed < independent, "{assumed} {independent}");
}

#[test]
fn assumed_tails_are_for_a_settled_history_and_long_memory_for_a_young_one() {
    let policy = VerdictPolicy {
        settled_tail_df: 7.0,
        ..VerdictPolicy::default()
    };
    let mut replayer = Replayer::new(policy, HashSet::new()).unwrap();
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let mut told = Vec::new();
    for i in 0..200 {
        replayer.push(run(i, 0.020)).unwrap();
        let comparison = replayer
            .policy
            .latest(&replayer.store, &key, "0.32.0")
            .unwrap();
        told.push((
            comparison.history.len(),
            comparison.hurst,
            comparison.tail_df,
        ));
    }
    // Fewer than half of `noise_runs` (300) runs of history: long
    // memory and no tails assumed; from 150 on, the tails and no more.
    let (young, settled) = (told[100], told[199]);
    assert!(young.0 < 150 && settled.0 >= 150, "{young:?} {settled:?}");
    assert_eq!((young.1, young.2), (0.75, f64::INFINITY));
    assert_eq!((settled.1, settled.2), (0.5, 7.0));
}

/// Replay equals live only if a run file gives back every latency the
/// store holds, bit for bit: a request's TPOT one unit in the last place
/// off moves a canary's interval in its 16th digit.
#[test]
fn a_run_line_gives_back_every_latency_bit_for_bit() {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Uniform};
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let mut uniform = |low: f64, high: f64| Uniform::new(low, high).unwrap().sample(&mut rng);
    let mut record = run(0, 0.1);
    record.samples = (0..2_000)
        .map(|index| crate::vocabulary::records::SampleRow {
            index,
            outcome: crate::vocabulary::Outcome::Ok,
            ttft_s: Some(uniform(0.01, 2.0)),
            tpot_s: Some(uniform(0.001, 0.2) / 3.0),
            e2el_s: Some(uniform(0.0, 1.0) * 30.0),
            itls_s: (0..8).map(|_| uniform(0.001, 0.2)).collect(),
            prompt_tokens: 32,
            output_tokens: 9,
            served_by: None,
        })
        .collect();
    let line = serde_json::to_string(&RunLine {
        run: record.clone(),
        samples: record.samples.clone(),
    })
    .unwrap();
    let back = serde_json::from_str::<RunLine>(&line)
        .unwrap()
        .into_record();
    let bits = |r: &RunRecord| -> Vec<u64> {
        r.samples
            .iter()
            .flat_map(|s| {
                [s.ttft_s, s.tpot_s, s.e2el_s]
                    .into_iter()
                    .flatten()
                    .chain(s.itls_s.iter().copied())
            })
            .map(f64::to_bits)
            .collect()
    };
    assert_eq!(bits(&back).len(), 2_000 * 11);
    let differing = bits(&back)
        .iter()
        .zip(bits(&record))
        .filter(|(a, b)| *a != b)
        .count();
    assert_eq!(differing, 0, "latencies read back other than written");
}
