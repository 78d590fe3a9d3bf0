//! Replay's tests: replayed verdicts against the daemon's rule, and what
//! each comparison is told as a build's history grows.

use super::*;
use crate::verdict::policy::Judged;
use crate::vocabulary::records::{LatencySummary, ServerLoad};
use chrono::TimeZone;

/// A completed run of build 0.32.0 at minute `i`, TTFT `ttft` seconds
/// with a little deterministic noise, on an idle server (its load read).
fn run(i: usize, ttft: f64) -> RunRecord {
    let idle = ServerLoad {
        running: Some(0.0),
        waiting: Some(0.0),
        ..ServerLoad::default()
    };
    RunRecord {
        load_before: Some(idle),
        load_after: Some(idle),
        ..run_unread(i, ttft)
    }
}

/// [`run`] on a server whose `/metrics` could not be read.
fn run_unread(i: usize, ttft: f64) -> RunRecord {
    let at =
        Utc.with_ymd_and_hms(2026, 11, 25, 12, 0, 0).unwrap() + chrono::Duration::minutes(i as i64);
    let mut r = RunRecord::failed("t", "s", "m", at, 1.0, RunOutcome::Ok, String::new());
    r.id = Some(i as i64 + 1);
    r.server.version = Some("0.32.0".into());
    r.summary.completed = 8;
    let noise = 1.0 + 0.03 * ((i * 7919) % 13) as f64 / 13.0;
    for (summary, v) in [
        (&mut r.summary.ttft, ttft * noise),
        (&mut r.summary.tpot, 0.004 * noise),
        (&mut r.summary.itl, 0.004 * noise),
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

/// Every verdict replay gives on `runs` (oldest first).
fn replay_all(policy: VerdictPolicy, runs: impl Iterator<Item = RunRecord>) -> Vec<Replayed> {
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
fn a_change_within_one_build_says_so_and_since_when() {
    let verdicts = step_within_one_build(260, 200);
    let regression = verdicts
        .iter()
        .find(|r| r.verdict.state == super::super::State::Regression)
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
    // 60 runs of history: a slow stretch is judged once it has lasted
    // `spell_runs` runs; before that it is named and not flagged.
    // (With runs that stray 3%, a +30% step is beyond doubt: the wait is
    // measured with `decisive_q` off; the next test has it on, as it ships.)
    let spell_runs = VerdictPolicy::default().spell_runs;
    let verdicts = step_within_one_build_under(always_waiting(), 110, 60);
    let regression = verdicts
        .iter()
        .find(|r| r.verdict.state == super::super::State::Regression)
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
    assert_eq!(waiting.verdict.state, super::super::State::Ok);
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
        .find(|r| r.verdict.state == super::super::State::Regression)
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
            .all(|r| r.verdict.state != super::super::State::Regression)
    );
    // Where the server's load was never read, a load wave cannot be ruled
    // out: the same step waits for its confirmation.
    let mut policy = VerdictPolicy::default();
    policy.detector.decisive_q = 1e-9;
    let ttft = |i: usize| if i >= 60 { 0.026 } else { 0.020 };
    let unread = replay_all(policy, (0..110).map(|i| run_unread(i, ttft(i))));
    let first = unread
        .iter()
        .find(|r| r.verdict.state == super::super::State::Regression)
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

#[test]
fn an_upgrade_from_a_young_build_is_judged_by_the_new_builds_spells_once_shown() {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    // 50 runs of 0.32.0, too few to show the machine's spells, then
    // 0.33.0 30% slower, and 30% slower again within itself from run
    // 320 on; runs stray by 8% (log-normal).
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let noise = rand_distr::LogNormal::new(0.0, 0.08).unwrap();
    let mut replayer = Replayer::new(VerdictPolicy::default(), HashSet::new()).unwrap();
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let mut verdicts = Vec::new();
    let mut told = Vec::new();
    for i in 0..360 {
        let step = match i {
            _ if i >= 320 => 1.69,
            _ if i >= 50 => 1.3,
            _ => 1.0,
        };
        let mut r = run(i, 0.020 * step * noise.sample(&mut rng));
        if i >= 50 {
            r.server.version = Some("0.33.0".into());
        }
        verdicts.extend(replayer.push(r).unwrap());
        let told_now = replayer
            .policy
            .latest(&replayer.store, &key, "0.33.0")
            .unwrap();
        let from = told_now
            .history
            .first()
            .and_then(|r| r.server.version.clone());
        let newest = told_now.history.iter().filter_map(|r| r.id).max();
        // The new build's own history is its runs outside the candidate
        // window: the candidate is its newest 12, judged whole, and one
        // evaluation is not enough. Told the old build's young history,
        // the candidate is every run since warm-up, up to 48.
        // `push` files the run before this one.
        let upgraded = i > 50 + replayer.policy.warmup_runs;
        match from.as_deref() {
            Some("0.33.0") => {
                assert_eq!(told_now.judged, Judged::UpgradeOwn);
                assert_eq!(told_now.candidate.len(), replayer.policy.candidate_window);
                let needed = replayer.policy.confirm_needed(told_now.judged);
                assert_eq!(needed, replayer.policy.detector.confirm_needed);
            }
            _ if upgraded => {
                assert_eq!(told_now.judged, Judged::UpgradeYoung);
                let since_warmup = i - 50 - replayer.policy.warmup_runs;
                let window = replayer.policy.upgrade_candidate_window;
                assert_eq!(told_now.candidate.len(), since_warmup.min(window));
            }
            _ => {}
        }
        told.push((i, from, told_now.hurst, newest));
    }
    verdicts.extend(replayer.flush().unwrap());
    let old = Some("0.32.0".to_owned());
    let new = Some("0.33.0".to_owned());
    // While the new build is young too: the old build's 48 runs, taken
    // as long-memory; once it has 150 runs outside the candidate, its
    // own, as they are.
    assert!(
        told.iter()
            .any(|(i, from, h, _)| *i == 100 && *from == old && *h == 0.75)
    );
    assert!(
        told.iter()
            .any(|(i, from, h, _)| *i == 300 && *from == new && *h == 0.5)
    );
    // The slowdown within the new build never becomes its noise: the
    // history stops where it began.
    let (_, from, _, newest) = told.last().unwrap();
    assert_eq!(*from, new);
    assert!(newest.is_some_and(|id| id <= 321), "{newest:?}");
    // A report of the upgrade is told what the daemon was.
    let report = replayer
        .policy
        .across(&replayer.store, &key, "0.32.0", "0.33.0")
        .unwrap();
    assert_eq!(report.hurst, 0.5);
    assert_eq!(report.judged, Judged::UpgradeOwn);
    let within = replayer
        .policy
        .across(&replayer.store, &key, "0.33.0", "0.33.0")
        .unwrap();
    assert_eq!(within.judged, Judged::WithinBuild);
    assert_eq!(
        report
            .history
            .first()
            .and_then(|r| r.server.version.clone()),
        new
    );
    // Judged against spells it cannot rule out, the step is still a
    // regression in every evaluation: the candidate is every run since
    // the upgrade (up to 48), so its evidence grew; knowing the spells,
    // on the newest 12 runs, in every evaluation too.
    let share = |runs: std::ops::Range<i64>| {
        let judged: Vec<bool> = verdicts
            .iter()
            .filter(|r| r.verdict.build == "0.33.0")
            .filter(|r| r.after_run.is_some_and(|id| runs.contains(&id)))
            .map(|r| r.verdict.state == super::super::State::Regression)
            .collect();
        judged.iter().filter(|r| **r).count() as f64 / judged.len() as f64
    };
    let (young, shown) = (share(60..200), share(230..321));
    assert_eq!((young, shown), (1.0, 1.0));
}

/// The verdicts on a new build that starts with `first` runs `slower`
/// (0.028 for 40% slower) and then serves as the old one did, after
/// 120 runs of the old build: its baseline calm, then a slow spell of
/// 6 runs in every 20, 40% slower.
fn upgrade_after_spells(noise_runs: usize, first: usize, slower: f64) -> Vec<Replayed> {
    let policy = VerdictPolicy {
        noise_runs,
        ..VerdictPolicy::default()
    };
    let runs = (0..160).map(|i| {
        let ttft = match i {
            _ if (40..120).contains(&i) && i % 20 >= 14 => 0.028,
            _ if i >= 120 && i - 120 < first => slower,
            _ => 0.020,
        };
        let mut r = run(i, ttft);
        if i >= 120 {
            r.server.version = Some("0.33.0".into());
        }
        r
    });
    replay_all(policy, runs)
}

/// Regression verdicts on the new build.
fn regressions(verdicts: &[Replayed]) -> usize {
    verdicts
        .iter()
        .filter(|r| r.verdict.build == "0.33.0")
        .filter(|r| r.verdict.state == super::super::State::Regression)
        .count()
}

#[test]
fn an_upgrade_is_judged_knowing_the_old_builds_slow_spells() {
    // A new build's first runs in a spell like the old build's: the
    // old build's history says it is one; without it, a regression.
    assert_eq!(regressions(&upgrade_after_spells(300, 8, 0.028)), 0);
    assert!(regressions(&upgrade_after_spells(0, 8, 0.028)) > 0);
    // A new build that stays slower than any spell is a regression
    // either way. (One that stays exactly as slow as the old build
    // was 30% of the time looks, in 12 runs, like one of its spells.)
    assert!(regressions(&upgrade_after_spells(300, 40, 0.036)) > 0);
    assert!(regressions(&upgrade_after_spells(0, 40, 0.036)) > 0);
}

/// Runs of `version` at minutes `from..to`, every latency `factor` times
/// the level with log-normal noise of 15% (seeded).
fn noisy_runs(
    rng: &mut rand::rngs::StdRng,
    range: std::ops::Range<usize>,
    factor: f64,
    version: &str,
) -> Vec<RunRecord> {
    use rand_distr::Distribution;
    let noise = rand_distr::LogNormal::new(0.0, 0.15).unwrap();
    range
        .map(|i| {
            let mut r = run(i, 0.020);
            r.server.version = Some(version.into());
            let f = factor * noise.sample(rng);
            for s in [
                &mut r.summary.ttft,
                &mut r.summary.tpot,
                &mut r.summary.itl,
                &mut r.summary.e2el,
            ] {
                for v in [&mut s.mean, &mut s.p50, &mut s.p90, &mut s.p95, &mut s.p99] {
                    *v *= f;
                }
            }
            r
        })
        .collect()
}

/// An upgrade from a settled build is judged on every run of the new
/// build since its warm-up, up to `upgrade_candidate_window`: a lasting
/// slowdown too small to show in 12 runs is caught as its runs add up,
/// where a candidate of the newest 12 never would. Against a young
/// history the candidate grows too, judged whole; told no history
/// (`noise_runs = 0`) it stays the newest 12. The report replays the
/// daemon's rule on the same windows, so it says regression too.
#[test]
fn an_upgrade_from_a_settled_build_keeps_gathering_evidence_past_the_candidate_window() {
    use rand::SeedableRng;
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let series = |old_runs: usize| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut runs = noisy_runs(&mut rng, 0..old_runs, 1.0, "0.32.0");
        runs.extend(noisy_runs(
            &mut rng,
            old_runs..old_runs + 60,
            1.18,
            "0.33.0",
        ));
        runs
    };
    let judge = |policy: VerdictPolicy, runs: Vec<RunRecord>| {
        let mut replayer = Replayer::new(policy, HashSet::new()).unwrap();
        let mut verdicts = Vec::new();
        for r in runs {
            verdicts.extend(replayer.push(r).unwrap());
        }
        verdicts.extend(replayer.flush().unwrap());
        let told = replayer
            .policy
            .latest(&replayer.store, &key, "0.33.0")
            .unwrap();
        // The report's verdict: the daemon's rule replayed over every run
        // of the new build, on the windows the daemon judged.
        let report = (replayer.policy)
            .across(&replayer.store, &key, "0.32.0", "0.33.0")
            .unwrap();
        let reported = replayer.policy.replay(
            &report.baseline_points(),
            &report.candidate_points(),
            &report.history_points(),
            report.judged,
        );
        (
            verdicts,
            (told.candidate.len(), told.judged),
            reported.state,
        )
    };
    let regressions = |verdicts: &[Replayed]| -> Vec<usize> {
        verdicts
            .iter()
            .filter(|v| v.verdict.state == super::super::State::Regression)
            .flat_map(|v| v.verdict.evaluation.metrics.iter())
            .filter(|m| m.flagged)
            .map(|m| m.runs)
            .collect()
    };
    let policy = VerdictPolicy::default();
    assert_eq!(policy.upgrade_candidate_window, 48);
    let (grown, candidate, reported) = judge(policy.clone(), series(200));
    assert_eq!(candidate, (48, Judged::UpgradeSettled));
    assert_eq!(reported, super::super::State::Regression);
    let caught = regressions(&grown);
    assert!(
        caught.iter().any(|&runs| runs > policy.candidate_window),
        "{caught:?}"
    );
    let newest_12 = VerdictPolicy {
        upgrade_candidate_window: 12,
        ..policy.clone()
    };
    let (capped, candidate, reported) = judge(newest_12, series(200));
    assert_eq!(candidate, (12, Judged::UpgradeSettled));
    assert_eq!(regressions(&capped), Vec::<usize>::new());
    assert_ne!(reported, super::super::State::Regression);
    // Settled from half of `noise_runs` runs after warm-up on (the old
    // build's 2 warm-up runs are no history); below, young.
    let settled_from = policy.warmup_runs + policy.noise_runs / 2;
    let (_, candidate, _) = judge(policy.clone(), series(settled_from));
    assert_eq!(candidate, (48, Judged::UpgradeSettled));
    let (_, candidate, _) = judge(policy.clone(), series(settled_from - 1));
    assert_eq!(candidate, (48, Judged::UpgradeYoung));
    // Told no history, the newest 12 and every span, as before.
    let untold = VerdictPolicy {
        noise_runs: 0,
        ..policy
    };
    let (_, candidate, _) = judge(untold, series(200));
    assert_eq!(candidate, (12, Judged::UpgradeUntold));
}

/// Told the new build's own settled runs, an upgrade is long past and
/// what is left is the new build drifting: a spell of 3 slow runs then,
/// which the settled old history's rule (every span, one evaluation)
/// calls a regression, is judged on the newest 12 whole and needs 2 of 3
/// evaluations (as within one build): no regression.
#[test]
fn an_upgrade_told_the_new_builds_own_runs_is_not_paged_for_a_late_spell() {
    use rand::SeedableRng;
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut runs = noisy_runs(&mut rng, 0..50, 1.0, "0.32.0");
    runs.extend(noisy_runs(&mut rng, 50..230, 1.0, "0.33.0"));
    runs.extend(noisy_runs(&mut rng, 230..233, 2.5, "0.33.0"));
    let mut replayer = Replayer::new(VerdictPolicy::default(), HashSet::new()).unwrap();
    let mut verdicts = Vec::new();
    for r in runs {
        verdicts.extend(replayer.push(r).unwrap());
    }
    verdicts.extend(replayer.flush().unwrap());
    let policy = &replayer.policy;
    let told = policy.latest(&replayer.store, &key, "0.33.0").unwrap();
    assert_eq!(told.judged, Judged::UpgradeOwn);
    assert_eq!(told.candidate.len(), policy.candidate_window);
    let (base, cand, history) = (
        told.baseline_points(),
        told.candidate_points(),
        told.history_points(),
    );
    let settled_rule = policy.replay(&base, &cand, &history, Judged::UpgradeSettled);
    assert_eq!(
        settled_rule.state,
        super::super::State::Regression,
        "{}",
        settled_rule.reason
    );
    let late: Vec<&Replayed> = verdicts
        .iter()
        .filter(|v| v.verdict.build == "0.33.0" && v.after_run.is_some_and(|id| id > 200))
        .collect();
    assert_eq!(late.len(), 33);
    for v in late {
        assert_ne!(
            v.verdict.state,
            super::super::State::Regression,
            "{}",
            v.verdict.reason
        );
    }
}
