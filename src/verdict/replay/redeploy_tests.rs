//! Replay's tests of a build deployed again after a rollback: what its
//! comparison judges is its runs since it came back.

use super::tests::{replay_all, run};
use super::*;
use crate::verdict::State;

/// 0.32.0 for 60 runs, 0.33.0 `first` times as slow for 10, back to
/// 0.32.0 for 10 (a rollback), then 0.33.0 again `again` times as slow
/// for 30. Returns 0.33.0's verdicts from its return on: (the run each
/// followed, its state, its reason).
fn rolled_back_and_deployed_again(first: f64, again: f64) -> Vec<(i64, State, String)> {
    let runs = (0..110).map(|i| {
        let (build, slower) = match i {
            _ if i < 60 => ("0.32.0", 1.0),
            _ if i < 70 => ("0.33.0", first),
            _ if i < 80 => ("0.32.0", 1.0),
            _ => ("0.33.0", again),
        };
        let mut r = run(i, 0.020 * slower);
        r.server.version = Some(build.into());
        r
    });
    replay_all(VerdictPolicy::default(), runs)
        .into_iter()
        .filter(|r| r.verdict.build == "0.33.0" && r.after_run > Some(80))
        .map(|r| (r.after_run.unwrap_or(0), r.verdict.state, r.verdict.reason))
        .collect()
}

#[test]
fn a_build_deployed_again_is_judged_on_its_runs_since() {
    let slower = |verdicts: &[(i64, State, String)]| -> Vec<(i64, State, String)> {
        verdicts
            .iter()
            .filter(|(_, s, _)| matches!(s, State::Regression | State::Confirming))
            .cloned()
            .collect()
    };
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
