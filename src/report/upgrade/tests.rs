//! The report's tests on a store filed round by round.

use chrono::Utc;

use super::build;
use crate::store::Store;
use crate::store::fleet::FleetScope;
use crate::store::tests::fleet_run;
use crate::verdict::policy::VerdictPolicy;

/// A build rolled out, rolled back and returned to all at once: the report
/// of the return compares the runs since the return and lists the change
/// that brought them (each change at once is filed as a rollout started
/// and finished at one instant), not the first rollout.
#[test]
fn a_build_returned_to_is_reported_from_its_return() {
    let store = Store::in_memory().unwrap();
    // Judged over one round: a round served by another build alone is a
    // change at once.
    let scope = FleetScope::service(1);
    let mut ago = 100_000;
    let mut rounds = |n: usize, builds: &[&str]| {
        for _ in 0..n {
            for b in builds {
                store
                    .insert_run_filed(&fleet_run(b, ago, "", 4), &scope)
                    .unwrap();
            }
            ago -= 60;
        }
    };
    let report = |store: &Store| {
        build(
            store,
            &VerdictPolicy::default(),
            "t",
            None,
            "0.32.0",
            "0.33.0",
            Utc::now(),
        )
        .unwrap()
    };
    rounds(12, &["0.32.0"]);
    rounds(1, &["0.32.0", "0.33.0"]);
    rounds(12, &["0.33.0"]);
    let first = report(&store);
    let first_rollout = first.rollout.expect("the rollout that brought it");
    assert_eq!(first_rollout.outcome.as_deref(), Some("finished"));

    rounds(12, &["0.32.0"]);
    rounds(6, &["0.33.0"]);
    let returned = report(&store);
    let rollout = returned.rollout.expect("the return");
    let left = store.redeployed_since("t", "m", "0.33.0").unwrap().unwrap();
    assert!(
        rollout.started_at > left && rollout.started_at > first_rollout.started_at,
        "{rollout:?}, left at {left}"
    );
    // The new side holds the runs since the return only.
    let after: Vec<usize> = returned.scenarios.iter().map(|s| s.after.runs).collect();
    let before: Vec<usize> = first.scenarios.iter().map(|s| s.after.runs).collect();
    assert!(
        !after.is_empty() && after.iter().all(|&n| n <= 6),
        "{after:?}"
    );
    assert!(
        !before.is_empty() && before.iter().all(|&n| n > 6),
        "{before:?}"
    );
}
