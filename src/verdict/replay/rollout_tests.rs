//! Replay's tests of a rollout: the canary while two builds serve, and
//! the upgrade's comparison taking over from it at the rollout's end.

use super::tests::{replay_all, run};
use super::*;
use crate::verdict::State;
use crate::vocabulary::Outcome;
use crate::vocabulary::records::SampleRow;

/// The shipped policy, with a canary judged once each build has 20
/// requests (not 30): these tests' rounds hold 8 requests each.
fn canary_policy() -> VerdictPolicy {
    VerdictPolicy {
        min_canary_requests: 20,
        ..VerdictPolicy::default()
    }
}

/// Round `round`'s run of the service as served by `build`, TTFT `ttft`
/// seconds, with its 8 requests (each straying a little) for the canary.
fn served(round: usize, id: i64, build: &str, ttft: f64) -> RunRecord {
    let mut r = run(round, ttft);
    r.id = Some(id);
    r.server.version = Some(build.into());
    r.samples = (0..8)
        .map(|index| {
            let noise = 1.0 + 0.04 * ((round * 31 + index * 7) % 9) as f64 / 9.0;
            SampleRow {
                index,
                outcome: Outcome::Ok,
                ttft_s: Some(ttft * noise),
                tpot_s: Some(0.004 * noise),
                e2el_s: Some((ttft + 0.06) * noise),
                itls_s: vec![0.004 * noise; 16],
                prompt_tokens: 32,
                output_tokens: 17,
                served_by: None,
            }
        })
        .collect();
    r
}

#[test]
fn a_regression_the_canary_confirmed_holds_when_the_upgrade_takes_over() {
    // The demo's detector: baselines of 12 runs. 30 rounds of 0.32.0, 12
    // rounds served by both builds, 0.33.0 25% slower to first token,
    // then 0.33.0 alone: the rollout ends once the old build has been
    // gone `canary_window` rounds, and the new build is judged against
    // the old one's baseline. Rounds stray by 6% (log-normal), both
    // builds of a round alike: the canary, which sets them side by side,
    // confirms the slowdown; the upgrade's comparison, on 12 baseline
    // runs, finds it beyond the noise but not beyond doubt.
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let policy = VerdictPolicy {
        baseline_runs: 12,
        warmup_runs: 1,
        candidate_window: 8,
        min_canary_requests: 20,
        detector: crate::verdict::DetectorSettings {
            min_baseline_runs: 12,
            min_candidate_runs: 8,
            ..Default::default()
        },
        ..VerdictPolicy::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let spell = rand_distr::LogNormal::new(0.0, 0.06).unwrap();
    let (old, new) = (0.020, 0.025);
    let mut runs = Vec::new();
    let mut id = 0;
    for round in 0..70 {
        let machine = spell.sample(&mut rng);
        for (build, ttft, serves) in [("0.32.0", old, round < 42), ("0.33.0", new, round >= 30)] {
            if serves {
                id += 1;
                runs.push(served(round, id, build, ttft * machine));
            }
        }
    }
    let verdicts = replay_all(policy, runs.into_iter());
    let upgrade: Vec<(bool, State, &str)> = verdicts
        .iter()
        .filter(|r| r.verdict.build == "0.33.0")
        .map(|r| {
            let canary = r.verdict.reason.contains("rollout of 0.33.0 in progress");
            (canary, r.verdict.state, r.verdict.reason.as_str())
        })
        .collect();
    let confirmed = upgrade
        .iter()
        .position(|(_, state, _)| *state == State::Regression)
        .expect("a regression");
    assert!(upgrade[confirmed].0, "the canary confirms it: {upgrade:#?}");
    // The new build's warm-up runs have no canary (none of its requests
    // count yet): the rollout's first evaluation is the upgrade's.
    assert!(!upgrade[0].0, "{upgrade:#?}");
    let canary_from = upgrade.iter().position(|(canary, _, _)| *canary).unwrap();
    let handed_over = canary_from
        + upgrade[canary_from..]
            .iter()
            .position(|(canary, _, _)| !canary)
            .expect("the upgrade's comparison takes over");
    assert!(handed_over > confirmed, "{upgrade:#?}");
    // From its confirmation on, through the handover, a regression in
    // every evaluation: the alert following the state never resolves.
    let after: Vec<&(bool, State, &str)> = upgrade[confirmed..]
        .iter()
        .filter(|(_, state, _)| *state != State::Regression)
        .collect();
    assert!(after.is_empty(), "{after:#?}");
    assert_eq!(
        verdicts.last().unwrap().verdict.reference_build.as_deref(),
        Some("0.32.0")
    );
}

#[test]
fn a_new_builds_cold_first_runs_are_not_its_canary() {
    // 30 rounds of 0.32.0, then 20 served by both builds, 0.33.0 as fast
    // but for its first 2 runs, 3 times slower to first token: a replica
    // just started on the new build is cold. Those runs are its warm-up,
    // left out of the canary as out of any comparison; counted (no
    // warm-up), they read as the new build being slower.
    let canary_states = |warmup_runs: usize| -> Vec<(State, String)> {
        let policy = VerdictPolicy {
            warmup_runs,
            ..canary_policy()
        };
        let mut runs = Vec::new();
        let mut id = 0;
        for round in 0..50 {
            for (build, serves) in [("0.32.0", true), ("0.33.0", round >= 30)] {
                if serves {
                    id += 1;
                    let cold = build == "0.33.0" && round < 32;
                    runs.push(served(round, id, build, if cold { 0.060 } else { 0.020 }));
                }
            }
        }
        replay_all(policy, runs.into_iter())
            .into_iter()
            .filter(|r| r.verdict.reason.contains("rollout of 0.33.0 in progress"))
            .map(|r| (r.verdict.state, r.verdict.reason))
            .collect()
    };
    let warmed = canary_states(2);
    assert!(warmed.len() >= 15, "{warmed:#?}");
    assert!(
        warmed
            .iter()
            .all(|(s, _)| matches!(s, State::Ok | State::Inconclusive)),
        "{warmed:#?}"
    );
    let counted = canary_states(0);
    assert!(
        counted
            .iter()
            .any(|(s, _)| matches!(s, State::Confirming | State::Regression)),
        "{counted:#?}"
    );
}

#[test]
fn a_rollout_again_after_a_rollback_is_judged_on_its_runs_since() {
    // 30 rounds of 0.32.0; a rollout of 0.33.0, 30% slower, for 12
    // rounds; 0.33.0 gone for 20 (rolled back); then rolled out again,
    // fixed (as fast), for 20 rounds.
    let policy = canary_policy();
    let mut runs = Vec::new();
    let mut id = 0;
    for round in 0..82 {
        let new_serves = (30..42).contains(&round) || round >= 62;
        for (build, serves) in [("0.32.0", true), ("0.33.0", new_serves)] {
            if serves {
                id += 1;
                let slower = build == "0.33.0" && round < 42;
                runs.push(served(round, id, build, if slower { 0.026 } else { 0.020 }));
            }
        }
    }
    let verdicts: Vec<(i64, State, String)> = replay_all(policy, runs.into_iter())
        .into_iter()
        .filter(|r| r.verdict.build == "0.33.0")
        .map(|r| (r.after_run.unwrap_or(0), r.verdict.state, r.verdict.reason))
        .collect();
    // Runs are filed as the next one arrives: run 75, round 62's first,
    // is judged after run 76.
    let first_again = 30 + 2 * 12 + 20 + 1;
    let (before, again): (Vec<_>, Vec<_>) = verdicts
        .into_iter()
        .partition(|(after, _, _)| *after < first_again);
    assert!(
        before.iter().any(|(_, s, _)| *s == State::Regression),
        "the first rollout: {before:#?}"
    );
    assert!(again.len() >= 15, "{again:#?}");
    assert!(
        again
            .iter()
            .all(|(_, s, _)| matches!(s, State::Ok | State::Inconclusive)),
        "{again:#?}"
    );
}

/// `rounds` rounds of the service: 0.32.0 (TTFT 20 ms) in those `old`
/// takes, 0.33.0, 30% faster, in those `new` takes; and how many runs
/// came before each round (the id of the last run before it).
fn old_and_faster(
    rounds: usize,
    old: impl Fn(usize) -> bool,
    new: impl Fn(usize) -> bool,
) -> (Vec<RunRecord>, Vec<i64>) {
    let (mut runs, mut before) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        before.push(runs.len() as i64);
        for (build, ttft, serves) in [("0.32.0", 0.020, old(round)), ("0.33.0", 0.014, new(round))]
        {
            if serves {
                runs.push(served(round, runs.len() as i64 + 1, build, ttft));
            }
        }
    }
    (runs, before)
}

/// The verdicts on 0.32.0 filed after run `after`: reference and state.
fn old_build_after(replayed: &[super::Replayed], after: i64) -> Vec<(Option<&str>, State)> {
    replayed
        .iter()
        .filter(|r| r.verdict.build == "0.32.0" && r.after_run.unwrap_or(0) > after)
        .map(|r| (r.verdict.reference_build.as_deref(), r.verdict.state))
        .collect()
}

#[test]
fn an_abandoned_canary_leaves_the_old_build_judged_as_before() {
    // 40 rounds of 0.32.0; a canary of 0.33.0, 30% faster to first
    // token, beside it for 45 rounds (more than a baseline's worth of its
    // runs), then abandoned; 0.32.0 alone for 55 more. The old build never
    // stopped serving: judged against the canary it was rolled back from,
    // it would be 43% slower, a page for a rollback nobody should hear of.
    // It is not, because a canary is judged side by side with the old
    // build and its runs never form a baseline: this guards that.
    let policy = canary_policy();
    let (runs, before) = old_and_faster(140, |_| true, |round| (40..85).contains(&round));
    let replayed = replay_all(policy, runs.into_iter());
    let canary_verdicts = replayed
        .iter()
        .filter(|r| r.verdict.build == "0.33.0" && r.verdict.reason.starts_with("rollout"))
        .count();
    assert!(canary_verdicts >= 40, "{replayed:#?}");
    let after = old_build_after(&replayed, before[85]);
    assert!(after.len() >= 50, "{after:#?}");
    assert!(
        after
            .iter()
            .all(|judged| *judged == (Some("0.32.0"), State::Ok)),
        "{after:#?}"
    );
}

#[test]
fn a_build_rolled_back_to_is_judged_against_the_build_it_replaced() {
    // The same, but the rollout finishes: 0.32.0 gone for 40 rounds, so
    // 0.33.0, 30% faster, is current and forms its baseline; then a
    // rollback to 0.32.0, alone for 15 rounds. Like any change of build,
    // the rollback is judged against the build it replaced, and is slower:
    // what the verdict says, and where the other test's would differ.
    let policy = canary_policy();
    let old = |round| !(85..125).contains(&round);
    let (runs, before) = old_and_faster(140, old, |round| (40..125).contains(&round));
    let replayed = replay_all(policy, runs.into_iter());
    let after = old_build_after(&replayed, before[125]);
    assert!(after.len() >= 10, "{after:#?}");
    assert!(
        after
            .iter()
            .all(|(reference, _)| *reference == Some("0.33.0")),
        "{after:#?}"
    );
    // While 0.33.0 is still in the fleet's window, a canary of the old
    // build beside it; then the upgrade's comparison, which the alert
    // names "version 0.32.0 compared with 0.33.0".
    let (canary, upgrade): (Vec<_>, Vec<_>) = replayed
        .iter()
        .filter(|r| r.verdict.build == "0.32.0" && r.verdict.state == State::Regression)
        .partition(|r| r.verdict.reason.starts_with("rollout of 0.32.0"));
    assert!(
        canary.len() + upgrade.len() >= 10,
        "{canary:#?} {upgrade:#?}"
    );
    let last_canary = canary.iter().filter_map(|r| r.after_run).max();
    let first_upgrade = upgrade.iter().filter_map(|r| r.after_run).min();
    assert!(
        last_canary.is_some() && first_upgrade.is_some() && last_canary < first_upgrade,
        "{canary:#?} {upgrade:#?}"
    );
    assert!(
        canary.iter().all(|r| {
            r.verdict.reason.contains("TTFT p50 +43% [+42%, +44%]")
                && r.verdict
                    .reason
                    .ends_with("against 0.33.0 measured at the same time")
        }),
        "{canary:#?}"
    );
    for r in &upgrade {
        assert!(r.verdict.is_upgrade(), "{r:#?}");
        let ttft = r.verdict.reason.split("ttft_p50 +").nth(1);
        let ttft: Option<f64> = ttft.and_then(|t| t.split('%').next()?.parse().ok());
        assert!(
            ttft.is_some_and(|t| (42.7..=42.9).contains(&t)),
            "{}",
            r.verdict.reason
        );
    }
}
