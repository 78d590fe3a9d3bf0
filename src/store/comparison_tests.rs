//! The store's tests of which stored evaluations one confirmation
//! counts: a rollout's canary for its upgrade, and nothing from before a
//! build's latest deployment.

use super::tests::fleet_run;
use super::*;

#[test]
fn an_upgrades_confirmation_counts_its_rollouts_canary_against_the_same_old_build() {
    use baselines::{CANARY_BASELINE_ID, Comparison, PairKey, StoredEvaluation};
    let store = Store::in_memory().unwrap();
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let evaluation = |baseline_id: i64, against: &str, flagged: bool, state: &str| {
        store
            .insert_evaluation(&StoredEvaluation {
                key: key.clone(),
                build: "0.33.0".into(),
                baseline_id,
                at: Utc::now(),
                flagged,
                state: state.into(),
                detail: serde_json::json!({ "reference_build": against }).to_string(),
            })
            .unwrap()
    };
    // The canary against 0.32.0 confirmed; one against another build
    // flagged nothing, and came last.
    evaluation(CANARY_BASELINE_ID, "0.32.0", true, "confirming");
    evaluation(CANARY_BASELINE_ID, "0.32.0", true, "regression");
    evaluation(CANARY_BASELINE_ID, "0.31.0", false, "ok");
    let upgrade = Comparison {
        build: "0.33.0",
        baseline_id: 7,
        canary_against: Some("0.32.0"),
    };
    assert_eq!(store.recent_flags(&key, &upgrade, 5).unwrap(), [true, true]);
    assert!(store.was_regression(&key, &upgrade).unwrap());
    // Then its own evaluations, in the order they were made.
    evaluation(7, "0.32.0", false, "regression");
    assert_eq!(
        store.recent_flags(&key, &upgrade, 2).unwrap(),
        [true, false]
    );
    // Without the canary, its own only; the canary's own, all of them.
    let own = Comparison {
        canary_against: None,
        ..upgrade
    };
    assert_eq!(store.recent_flags(&key, &own, 5).unwrap(), [false]);
    let canary = Comparison {
        baseline_id: CANARY_BASELINE_ID,
        ..own
    };
    assert_eq!(
        store.recent_flags(&key, &canary, 5).unwrap(),
        [true, true, false]
    );
    assert!(!store.was_regression(&key, &canary).unwrap());
}

#[test]
fn a_build_deployed_again_after_a_rollback_is_confirmed_afresh() {
    use baselines::{Comparison, PairKey, StoredEvaluation};
    let store = Store::in_memory().unwrap();
    let scope = fleet::FleetScope::service(1);
    let key = PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let evaluation = |seconds_ago: i64| StoredEvaluation {
        key: key.clone(),
        build: "0.33.0".into(),
        baseline_id: 7,
        at: Utc::now() - chrono::Duration::seconds(seconds_ago),
        flagged: true,
        state: "regression".into(),
        detail: "{}".into(),
    };
    let upgrade = Comparison {
        build: "0.33.0",
        baseline_id: 7,
        canary_against: Some("0.32.0"),
    };
    // 0.32.0, then 0.33.0 confirmed slower, rolled back to 0.32.0.
    store
        .insert_run_filed(&fleet_run("0.32.0", 400, "", 4), &scope)
        .unwrap();
    store
        .insert_run_filed(&fleet_run("0.33.0", 300, "", 4), &scope)
        .unwrap();
    store.insert_evaluation(&evaluation(250)).unwrap();
    assert!(store.was_regression(&key, &upgrade).unwrap());
    store
        .insert_run_filed(&fleet_run("0.32.0", 200, "", 4), &scope)
        .unwrap();
    // Deployed again: its flags from before the rollback are not counted.
    let back = store.insert_run_filed(&fleet_run("0.33.0", 100, "", 4), &scope);
    assert!(back.unwrap().1.change.is_some(), "a change to 0.33.0 again");
    assert!(store.recent_flags(&key, &upgrade, 5).unwrap().is_empty());
    assert!(!store.was_regression(&key, &upgrade).unwrap());
    store.insert_evaluation(&evaluation(50)).unwrap();
    assert_eq!(store.recent_flags(&key, &upgrade, 5).unwrap(), [true]);
}
