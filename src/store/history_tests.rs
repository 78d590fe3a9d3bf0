//! The store's tests of reading a target's history: a build's changes
//! to and from are sought by index, the earlier baseline a candidate is
//! judged against is found without reading the history, and the newest
//! evaluation of each pair without reading each pair's rows per row.

use rusqlite::params;

use super::*;

/// SQLite's plan of `sql`, on parameters target "a", model "m", build
/// "b": one line per step.
fn query_plan(conn: &Connection, sql: &str) -> String {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let rows = stmt
        .query_map(["a", "m", "b"], |r| r.get::<_, String>(3))
        .unwrap();
    rows.map(Result::unwrap).collect::<Vec<_>>().join("\n")
}

/// A build's changes to and from are sought by index: an identity that
/// flips between two builds files a change on each flip, and the warm-up
/// reading, which asks for a build's returns on every evaluation, read
/// them all for each (360 ms per reading at 10,000 changes).
#[test]
fn a_builds_changes_are_sought_by_index() {
    let store = Store::in_memory().unwrap();
    let conn = store.lock();
    let plan = |sql: &str| query_plan(&conn, sql);
    let since = plan(&format!(
        "SELECT {}",
        starts::redeployed_since_sql("?1", "?2", "?3")
    ));
    let returns = plan(&starts::returns_sql("?1", "?2", "?3"));
    for (what, plan) in [("return's start", &since), ("returns", &returns)] {
        assert!(
            plan.contains("INDEX version_changes_from ("),
            "{what}: {plan}"
        );
        assert!(
            plan.contains("INDEX version_changes_to ("),
            "{what}: {plan}"
        );
        assert!(
            !plan.contains("version_changes_by_target"),
            "{what}: {plan}"
        );
    }
}

/// The reference's earlier baseline, by the walk it replaced: the
/// target's version changes newest first, each change's new build before
/// its old, the first build other than `build` that has a baseline.
fn newest_other_by_walk(store: &Store, key: &baselines::PairKey, build: &str) -> Option<String> {
    let changes = store.version_changes(&key.target, &key.model).unwrap();
    changes
        .into_iter()
        .flat_map(|c| [Some(c.to_build), c.from_build])
        .flatten()
        .filter(|b| b != build)
        .find(|b| store.baseline(key, b).unwrap().is_some())
}

#[test]
fn the_earlier_baseline_is_that_of_the_build_named_last() {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let key = baselines::PairKey {
        target: "a".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let builds = ["b0", "b1", "b2", "b3", "b4", "b5"];
    let mut compared = 0;
    for history in 0..200 {
        let store = Store::in_memory().unwrap();
        let conn = store.lock();
        let changes = rng.random_range(0..12);
        let mut current: Option<&str> = None;
        for _ in 0..changes {
            let to = builds[rng.random_range(0..builds.len())];
            conn.execute(
                "INSERT INTO version_changes (target, model, at, from_build, to_build)
                 VALUES ('a', 'm', ?1, ?2, ?3)",
                // Times in any order, some shared: a run filed after it
                // ends dates its change by its start, which may come
                // before a change the watcher filed meanwhile.
                params![f64::from(rng.random_range(0..6)), current, to],
            )
            .unwrap();
            current = Some(to);
        }
        // Baselines of some builds, one of them perhaps never named.
        for b in builds.iter().filter(|_| rng.random_bool(0.4)) {
            baselines::insert_baseline(&conn, &key, b, Utc::now(), "first-runs", &[]).unwrap();
        }
        drop(conn);
        for build in builds {
            let walked = newest_other_by_walk(&store, &key, build);
            let found = store.newest_other_baseline(&key, build).unwrap();
            assert_eq!(found.map(|b| b.build), walked, "history {history}, {build}");
            compared += usize::from(walked.is_some());
        }
    }
    // The histories must put the rule to work, not only agree on none.
    assert!(compared > 300, "{compared}");
}

#[test]
fn where_a_build_was_last_named_is_one_step_down_an_index() {
    let store = Store::in_memory().unwrap();
    let conn = store.lock();
    for (column, index) in [
        ("to_build", "version_changes_to_in_order"),
        ("from_build", "version_changes_from_in_order"),
    ] {
        let plan = query_plan(&conn, &builds::last_named_sql(column));
        assert!(
            plan.contains(&format!("INDEX {index} (")),
            "{column}: {plan}"
        );
        // Read in the index's order: no sort of the build's changes.
        assert!(!plan.contains("TEMP B-TREE"), "{column}: {plan}");
    }
}

/// The newest evaluation of each pair is one walk of an index: the query
/// it replaced read all of a pair's rows for each of them (83 s at 40,000
/// evaluations of one pair).
#[test]
fn the_newest_evaluation_of_each_pair_is_one_index_walk() {
    let store = Store::in_memory().unwrap();
    {
        let mut conn = store.lock();
        let tx = conn.transaction().unwrap();
        for i in 0..40_000 {
            let scenario = ["chat", "batch", "long"][i % 3];
            tx.execute(
                "INSERT INTO evaluations (target, model, scenario, build, baseline_id, at,
                   flagged, state, detail) VALUES ('a', 'm', ?1, 'b', 1, ?2, 0, ?3, '{}')",
                params![scenario, i as f64, format!("state-{i}")],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        let plan: String = conn
            .query_row(
                "EXPLAIN QUERY PLAN SELECT MAX(id) FROM evaluations
                 GROUP BY target, model, scenario",
                [],
                |r| r.get(3),
            )
            .unwrap();
        assert!(
            plan.contains("COVERING INDEX evaluations_in_order"),
            "{plan}"
        );
    }
    let started = std::time::Instant::now();
    let latest = store.latest_evaluations().unwrap();
    eprintln!(
        "newest of 3 pairs among 40,000 evaluations: {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let newest: Vec<(&str, &str)> = latest
        .iter()
        .map(|e| (e.key.scenario.as_str(), e.state.as_str()))
        .collect();
    assert_eq!(
        newest,
        vec![
            ("batch", "state-39997"),
            ("chat", "state-39999"),
            ("long", "state-39998")
        ]
    );
}

/// A store migrated from before version changes were kept has runs but
/// no changes: the models of a target are then those its runs name, so
/// `report` and `baseline` find them.
#[test]
fn a_targets_models_come_from_its_runs_when_no_change_was_kept() {
    let store = Store::in_memory().unwrap();
    store
        .insert_run(&super::tests::run("t", "chat", 10, 0.1))
        .unwrap();
    store
        .lock()
        .execute("DELETE FROM version_changes", [])
        .unwrap();
    assert_eq!(store.models_of("t").unwrap(), ["m"]);
    assert!(store.models_of("other").unwrap().is_empty());
}
