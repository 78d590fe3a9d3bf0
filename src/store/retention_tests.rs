//! Retention of a target's history: what it deletes and that every
//! answer the daemon reads of the history is the same after it.

use chrono::{TimeZone, Utc};
use rusqlite::{Connection, params};
use std::time::Duration;

use crate::store::Store;
use crate::store::baselines::PairKey;
use crate::store::builds::{Named, current, last_named};
use crate::store::starts::BuildRuns;

const BUILDS: [&str; 4] = ["b0", "b1", "b2", "b3"];

fn key() -> PairKey {
    PairKey {
        target: "a".into(),
        model: "m".into(),
        scenario: "s".into(),
    }
}

/// Everything the daemon reads of one build's history.
#[derive(Debug, PartialEq)]
struct Answers {
    last_named: Option<Named>,
    redeployed_since: Option<f64>,
    last_changed_to: Option<f64>,
}

fn answers(store: &Store, build: &str) -> Answers {
    let conn = store.lock();
    let last_changed_to = conn
        .query_row(
            "SELECT MAX(at) FROM version_changes WHERE target = 'a' AND model = 'm'
             AND to_build = ?1",
            [build],
            |r| r.get(0),
        )
        .unwrap();
    let named = last_named(&conn, "a", "m", build).unwrap();
    drop(conn);
    Answers {
        last_named: named,
        redeployed_since: store
            .redeployed_since("a", "m", build)
            .unwrap()
            .map(|t| t.timestamp_micros() as f64 / 1e6),
        last_changed_to,
    }
}

fn returns(store: &Store, build: &str) -> Vec<f64> {
    let key = key();
    let conn = store.lock();
    BuildRuns::new(&conn, &key, build).returns(1000).unwrap()
}

/// The newest time `build` was changed away from before `cutoff`.
fn left_before(conn: &Connection, build: &str, cutoff: f64) -> Option<f64> {
    conn.query_row(
        "SELECT MAX(at) FROM version_changes WHERE target = 'a' AND model = 'm'
         AND from_build = ?1 AND at < ?2",
        params![build, cutoff],
        |r| r.get(0),
    )
    .unwrap()
}

fn count(store: &Store, table: &str) -> i64 {
    store
        .lock()
        .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

/// Files one version change of target `a`, model `m`.
fn insert_change(conn: &Connection, at: f64, from: Option<&str>, to: &str) {
    conn.execute(
        "INSERT INTO version_changes (target, model, at, from_build, to_build)
         VALUES ('a', 'm', ?1, ?2, ?3)",
        params![at, from, to],
    )
    .unwrap();
}

/// Files `n` version changes of target `a`, model `m`, the first at
/// `start` seconds, one a minute, each to the build `to(i)`, with a
/// rollout for each change between builds (ended by the next).
fn file_changes(store: &Store, start: f64, n: usize, to: impl Fn(usize) -> &'static str) {
    let conn = store.lock();
    let mut from: Option<&str> = None;
    for i in 0..n {
        let (at, build) = (start + 60.0 * i as f64, to(i));
        insert_change(&conn, at, from, build);
        if let Some(from) = from {
            conn.execute(
                "UPDATE rollouts SET ended_at = ?1, outcome = 'superseded' WHERE ended_at IS NULL",
                [at],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO rollouts (target, model, from_build, to_build, started_at)
                 VALUES ('a', 'm', ?1, ?2, ?3)",
                params![from, build, at],
            )
            .unwrap();
        }
        from = Some(build);
    }
}

#[test]
fn a_flapping_targets_history_is_bounded_and_reads_the_same() {
    let store = Store::in_memory().unwrap();
    // A day of a target that serves another build on every run, a minute
    // apart: 1,440 changes, 1,439 rollouts.
    let start = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    let start_s = start.timestamp() as f64;
    file_changes(&store, start_s, 1440, |i| BUILDS[i % 2]);
    let before: Vec<Answers> = BUILDS.iter().map(|b| answers(&store, b)).collect();
    let current_before = current(&store.lock(), "a", "m").unwrap();
    let open_before = store.open_rollout("a", "m").unwrap();
    // An hour kept: the last 60 changes and what the rest still answer.
    let now = start + chrono::Duration::minutes(1440);
    store.prune(now, Duration::from_secs(3600)).unwrap();
    let changes = count(&store, "version_changes");
    assert!(
        (60..=60 + 7).contains(&changes),
        "{changes} changes left of 1,440"
    );
    let rollouts = count(&store, "rollouts");
    assert!((59..=61).contains(&rollouts), "{rollouts} rollouts left");
    let after: Vec<Answers> = BUILDS.iter().map(|b| answers(&store, b)).collect();
    assert_eq!(after, before);
    assert_eq!(current(&store.lock(), "a", "m").unwrap(), current_before);
    assert_eq!(store.open_rollout("a", "m").unwrap(), open_before);
    assert!(open_before.is_some());
    assert_eq!(store.models_of("a").unwrap(), vec!["m".to_string()]);
    // Pruning again deletes nothing more.
    store.prune(now, Duration::from_secs(3600)).unwrap();
    assert_eq!(count(&store, "version_changes"), changes);
}

#[test]
fn retention_keeps_every_answer_of_random_histories() {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut pruned = 0;
    for history in 0..300 {
        let store = Store::in_memory().unwrap();
        let n: i32 = rng.random_range(1..40);
        let conn = store.lock();
        let mut from: Option<&str> = None;
        // Times mostly in order, some out of it or shared: a run filed
        // after it ends dates its change by its start.
        let mut t = 0.0;
        for _ in 0..n {
            let to = BUILDS[rng.random_range(0..BUILDS.len())];
            t += f64::from(rng.random_range(-1..4));
            insert_change(&conn, t, from, to);
            from = Some(to);
        }
        let cutoff = f64::from(rng.random_range(0..n * 2));
        let straddling: Vec<Option<f64>> = BUILDS
            .iter()
            .map(|b| left_before(&conn, b, cutoff))
            .collect();
        let current_before = current(&conn, "a", "m").unwrap();
        drop(conn);
        let latest_before = (
            store.latest_version_change("a", "m").unwrap(),
            store.latest_upgrade("a", "m").unwrap(),
        );
        let before: Vec<(Answers, Vec<f64>)> = BUILDS
            .iter()
            .map(|b| (answers(&store, b), returns(&store, b)))
            .collect();
        let rows = count(&store, "version_changes");
        let now = Utc.timestamp_opt(0, 0).unwrap() + chrono::Duration::seconds(cutoff as i64);
        store.prune(now, Duration::ZERO).unwrap();
        pruned += rows - count(&store, "version_changes");
        assert_eq!(
            current(&store.lock(), "a", "m").unwrap(),
            current_before,
            "history {history}"
        );
        let latest_after = (
            store.latest_version_change("a", "m").unwrap(),
            store.latest_upgrade("a", "m").unwrap(),
        );
        assert_eq!(latest_after, latest_before, "history {history}");
        for (i, build) in BUILDS.iter().enumerate() {
            let (answers_before, returns_before) = &before[i];
            assert_eq!(
                &answers(&store, build),
                answers_before,
                "history {history}, {build}"
            );
            // Every return whose runs may be kept is still read: those
            // that began after the cutoff, and the newest before it.
            let returns_after = returns(&store, build);
            let kept: Vec<f64> = returns_before
                .iter()
                .copied()
                .filter(|&r| r >= cutoff || Some(r) == straddling[i])
                .collect();
            let mut read: Vec<f64> = returns_after
                .iter()
                .copied()
                .filter(|r| kept.contains(r))
                .collect();
            // Two returns that began at one time are one: their runs are
            // the same.
            let mut kept = kept;
            kept.dedup();
            read.dedup();
            assert_eq!(read, kept, "history {history}, {build}");
        }
    }
    // The histories must put retention to work, not only keep everything.
    assert!(pruned > 1000, "{pruned} rows pruned");
}
