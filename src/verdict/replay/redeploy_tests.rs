//! Replay's tests of a build deployed again after a rollback: what its
//! comparison judges is its runs since it came back.

use super::tests::{replay_all, run, slower};
use super::*;
use crate::verdict::State;

/// 0.32.0 for 60 runs, 0.33.0 `first` times as slow for 10, back to
/// 0.32.0 for 10 (a rollback), then 0.33.0 again `again` times as slow
/// for 30.
fn runs(first: f64, again: f64) -> impl Iterator<Item = RunRecord> {
    (0..110).map(move |i| {
        let (build, slower) = match i {
            _ if i < 60 => ("0.32.0", 1.0),
            _ if i < 70 => ("0.33.0", first),
            _ if i < 80 => ("0.32.0", 1.0),
            _ => ("0.33.0", again),
        };
        let mut r = run(i, 0.020 * slower);
        r.server.version = Some(build.into());
        r
    })
}

/// [`runs`]' verdicts on 0.33.0 from its return on: (the run each
/// followed, its state, its reason).
fn rolled_back_and_deployed_again(first: f64, again: f64) -> Vec<(i64, State, String)> {
    replay_all(VerdictPolicy::default(), runs(first, again))
        .into_iter()
        .filter(|r| r.verdict.build == "0.33.0" && r.after_run > Some(80))
        .map(|r| (r.after_run.unwrap_or(0), r.verdict.state, r.verdict.reason))
        .collect()
}

#[test]
fn a_build_deployed_again_is_judged_on_its_runs_since() {
    // Slow the first time, fixed (the same build name, a new start) the
    // second: its old runs are not its verdict now.
    let fixed = rolled_back_and_deployed_again(1.3, 1.0);
    assert!(fixed.len() >= 20, "{fixed:#?}");
    assert_eq!(slower(&fixed), [], "{fixed:#?}");
    // Runs 80 and 81 are the new deployment's warm-up; from run 82 on it
    // is judged on its own runs (ids are runs + 1).
    let judged = |verdicts: &[(i64, State, String)]| -> Vec<State> {
        verdicts
            .iter()
            .filter(|(after, _, _)| *after > 83)
            .map(|(_, s, _)| *s)
            .collect()
    };
    assert!(judged(&fixed).iter().all(|s| *s == State::Ok), "{fixed:#?}");
    // Slow again: caught on its first run past the new warm-up, alone
    // (beyond doubt), as a first deployment's would be.
    let again = rolled_back_and_deployed_again(1.3, 1.3);
    let first_regression = again
        .iter()
        .find(|(_, s, _)| *s == State::Regression)
        .map(|(after, _, _)| after - 1);
    assert_eq!(first_regression, Some(82), "{again:#?}");
}

#[test]
fn a_report_of_a_build_deployed_again_covers_its_runs_since() {
    let mut replayer = Replayer::new(VerdictPolicy::default(), HashSet::new()).unwrap();
    for r in runs(1.3, 1.0) {
        replayer.push(r).unwrap();
    }
    replayer.flush().unwrap();
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let report = replayer
        .policy
        .across(&replayer.store, &key, "0.32.0", "0.33.0")
        .unwrap();
    // Runs 82-109: the return's 30 but its warm-up (ids are runs + 1).
    let ids: Vec<i64> = report.candidate.iter().filter_map(|r| r.id).collect();
    assert_eq!(ids, (83..=110).collect::<Vec<i64>>());
}
