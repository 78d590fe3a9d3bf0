//! Replay's tests of upgrades: what an upgrade's comparison is told of
//! the old build's and the new build's runs, and when it is judged.

use super::tests::{replay_all, run};
use super::*;
use crate::verdict::policy::Judged;

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
                let needed = replayer
                    .policy
                    .confirm_needed(told_now.judged, told_now.runs_since_warmup);
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
            report.runs_since_warmup,
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
    let settled_rule = policy.replay(&base, &cand, &history, Judged::UpgradeSettled, cand.len());
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

#[test]
fn one_server_upgraded_is_judged_without_waiting_for_its_rollouts_rounds() {
    // 60 runs of 0.32.0, then 0.33.0 twice as slow. The two builds never
    // serve in the same round, so the rollout the upgrade opens (held
    // until the old build has been gone `canary_window` rounds) has no
    // canary to show: the upgrade is judged against the old baseline from
    // its first run after warm-up on (`runs_for_first_verdict`).
    let policy = VerdictPolicy::default();
    let first_judged = policy.runs_for_first_verdict();
    assert!(first_judged < policy.warmup_runs + policy.canary_window);
    let runs = || {
        (0..80).map(|i| {
            let mut r = run(i, if i >= 60 { 0.040 } else { 0.020 });
            if i >= 60 {
                r.server.version = Some("0.33.0".into());
            }
            r
        })
    };
    let verdicts = replay_all(policy.clone(), runs());
    let upgrade: Vec<&Replayed> = verdicts
        .iter()
        .filter(|r| r.verdict.build == "0.33.0")
        .collect();
    assert!(
        upgrade
            .iter()
            .all(|r| !r.verdict.reason.contains("rollout")),
        "{:?}",
        upgrade
            .iter()
            .map(|r| &r.verdict.reason)
            .collect::<Vec<_>>()
    );
    // Run ids count from 1: the new build's runs are 61 on; until its
    // first run after warm-up, "too few runs". Twice as slow is beyond
    // doubt on that one run (`upgrade_first_run_q`).
    let first = upgrade
        .iter()
        .find(|r| r.verdict.state != super::super::State::Inconclusive)
        .expect("the upgrade is judged");
    assert_eq!(first.after_run, Some(60 + first_judged as i64));
    assert!(
        first.verdict.reason.starts_with("slower far beyond"),
        "{}",
        first.verdict.reason
    );
    assert_eq!(first.verdict.reference_build.as_deref(), Some("0.32.0"));
    assert_eq!(first.verdict.state, super::super::State::Regression);
    // Without it, from `upgrade_min_candidate_runs` runs on.
    let waiting = VerdictPolicy {
        upgrade_first_run_q: 0.0,
        ..policy
    };
    let waiting_first_judged = waiting.runs_for_first_verdict();
    assert_eq!(waiting_first_judged, first_judged + 1);
    let verdicts = replay_all(waiting, runs());
    let first = verdicts
        .iter()
        .find(|r| {
            r.verdict.build == "0.33.0" && r.verdict.state != super::super::State::Inconclusive
        })
        .expect("the upgrade is judged");
    assert_eq!(first.after_run, Some(60 + waiting_first_judged as i64));
    assert_eq!(first.verdict.reference_build.as_deref(), Some("0.32.0"));
}

/// One evaluation is enough for an upgrade told a settled history only in
/// its first `candidate_window` runs since warm-up, counted, whatever its
/// candidate holds: with `upgrade_candidate_window` at 12 the candidate
/// stays 12 runs long for good, yet 22 runs after the upgrade a slowdown
/// in its 2 newest runs waits for its confirmation, as it does with the
/// candidate grown to 24.
#[test]
fn an_upgrade_long_past_its_first_runs_needs_its_confirmation_whatever_its_candidate_holds() {
    use rand::SeedableRng;
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let policy = VerdictPolicy {
        detector: crate::verdict::DetectorSettings {
            // The confirmation itself: nothing taken as beyond doubt.
            decisive_q: 0.0,
            ..VerdictPolicy::default().detector
        },
        ..VerdictPolicy::default()
    };
    let after_warmup = policy.warmup_runs + 22;
    for upgrade_candidate_window in [12, 48] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut runs = noisy_runs(&mut rng, 0..200, 1.0, "0.32.0");
        runs.extend(noisy_runs(&mut rng, 200..200 + after_warmup, 1.0, "0.33.0"));
        let first_slow = 200 + after_warmup;
        runs.extend(noisy_runs(
            &mut rng,
            first_slow..first_slow + 3,
            3.0,
            "0.33.0",
        ));
        let mut replayer = Replayer::new(
            VerdictPolicy {
                upgrade_candidate_window,
                ..policy.clone()
            },
            HashSet::new(),
        )
        .unwrap();
        let mut verdicts = Vec::new();
        let mut told = None;
        for r in runs {
            verdicts.extend(replayer.push(r).unwrap());
            if told.is_none()
                && verdicts
                    .iter()
                    .any(|v| v.after_run == Some(first_slow as i64 + 2))
            {
                told = Some(
                    replayer
                        .policy
                        .latest(&replayer.store, &key, "0.33.0")
                        .unwrap(),
                );
            }
        }
        verdicts.extend(replayer.flush().unwrap());
        let state_after = |run: usize| {
            verdicts
                .iter()
                .find(|v| v.after_run == Some(run as i64 + 1))
                .map(|v| v.verdict.state)
        };
        let window = format!("upgrade_candidate_window {upgrade_candidate_window}");
        // Before the slowdown: judged against the settled history, no
        // slowdown.
        assert_eq!(
            state_after(first_slow - 1),
            Some(super::super::State::Ok),
            "{window}"
        );
        // Its 2nd slow run: flagged once, confirming; its 3rd: 2 of 3.
        assert_eq!(
            state_after(first_slow + 1),
            Some(super::super::State::Confirming),
            "{window}"
        );
        assert_eq!(
            state_after(first_slow + 2),
            Some(super::super::State::Regression),
            "{window}"
        );
        let told = told.expect("the comparison after the 2nd slow run");
        assert_eq!(told.judged, Judged::UpgradeSettled, "{window}");
        assert_eq!(told.runs_since_warmup, 24, "{window}");
        assert_eq!(
            told.candidate.len(),
            upgrade_candidate_window.min(24),
            "{window}"
        );
    }
}
