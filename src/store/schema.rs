//! The store's schema: migrations applied in order, each moving the
//! `user_version` one step; a file newer than this program is refused.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// Each entry moves the schema one version up; never edit a shipped one.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: runs and their request samples.
    "CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        target TEXT NOT NULL,
        scenario TEXT NOT NULL,
        model TEXT NOT NULL,
        started_at REAL NOT NULL,
        duration_s REAL NOT NULL,
        outcome TEXT NOT NULL,
        error TEXT,
        server_version TEXT,
        model_root TEXT,
        system_fingerprint TEXT,
        max_model_len INTEGER,
        summary TEXT NOT NULL,
        load_before TEXT,
        load_after TEXT
    );
    CREATE INDEX runs_by_pair ON runs (target, scenario, started_at);
    CREATE INDEX runs_by_time ON runs (started_at);
    CREATE TABLE samples (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        ttft_s REAL,
        tpot_s REAL,
        e2el_s REAL,
        itls TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        PRIMARY KEY (run_id, idx)
    ) WITHOUT ROWID;",
    // 2: server builds, version changes, baselines and verdicts.
    "ALTER TABLE runs ADD COLUMN build TEXT;
    UPDATE runs SET build = COALESCE(server_version, 'unknown');
    CREATE INDEX runs_by_build ON runs (target, model, scenario, build, started_at);
    CREATE TABLE builds (
        target TEXT NOT NULL,
        model TEXT NOT NULL,
        label TEXT NOT NULL,
        server_version TEXT,
        model_root TEXT,
        system_fingerprint TEXT,
        first_seen REAL NOT NULL,
        PRIMARY KEY (target, model, label)
    );
    CREATE TABLE version_changes (
        id INTEGER PRIMARY KEY,
        target TEXT NOT NULL,
        model TEXT NOT NULL,
        at REAL NOT NULL,
        from_build TEXT,
        to_build TEXT NOT NULL
    );
    CREATE INDEX version_changes_by_target ON version_changes (target, model, id);
    CREATE TABLE baselines (
        id INTEGER PRIMARY KEY,
        target TEXT NOT NULL,
        model TEXT NOT NULL,
        scenario TEXT NOT NULL,
        build TEXT NOT NULL,
        created_at REAL NOT NULL,
        pinned_at REAL,
        origin TEXT NOT NULL,
        UNIQUE (target, model, scenario, build)
    );
    CREATE TABLE baseline_runs (
        baseline_id INTEGER NOT NULL REFERENCES baselines (id) ON DELETE CASCADE,
        run_id INTEGER NOT NULL REFERENCES runs (id),
        PRIMARY KEY (baseline_id, run_id)
    ) WITHOUT ROWID;
    CREATE INDEX baseline_runs_by_run ON baseline_runs (run_id);
    CREATE TABLE evaluations (
        id INTEGER PRIMARY KEY,
        target TEXT NOT NULL,
        model TEXT NOT NULL,
        scenario TEXT NOT NULL,
        build TEXT NOT NULL,
        baseline_id INTEGER NOT NULL,
        at REAL NOT NULL,
        flagged INTEGER NOT NULL,
        state TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX evaluations_by_pair ON evaluations (target, model, scenario, build, baseline_id, id);",
    // 3: fleets: the replica a run probed, and rollouts from one build to
    // another.
    "ALTER TABLE runs ADD COLUMN replica TEXT NOT NULL DEFAULT '';
    CREATE INDEX runs_by_round ON runs (target, model, replica, started_at);
    CREATE TABLE rollouts (
        id INTEGER PRIMARY KEY,
        target TEXT NOT NULL,
        model TEXT NOT NULL,
        from_build TEXT NOT NULL,
        to_build TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        outcome TEXT
    );
    CREATE INDEX rollouts_by_target ON rollouts (target, model, id);",
    // 4: the drift canary's greedy answers, per run and prompt.
    "CREATE TABLE answers (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        prompt INTEGER NOT NULL,
        tokens TEXT NOT NULL,
        logprobs TEXT NOT NULL,
        PRIMARY KEY (run_id, prompt)
    ) WITHOUT ROWID;",
    // 5: builds found by fingerprint, by version and by when they were
    // first seen without reading every build of the target.
    "CREATE INDEX builds_by_fingerprint ON builds (target, model, system_fingerprint, first_seen);
    CREATE INDEX builds_by_version ON builds
        (target, model, server_version, model_root, system_fingerprint, first_seen);
    CREATE INDEX builds_by_version_seen ON builds
        (target, model, server_version, model_root, first_seen);
    CREATE INDEX builds_by_first_seen ON builds (target, model, first_seen);",
    // 6: objectives' counts (good and total events per objective, when
    // counted, for which target and replica), and the endpoint a gateway
    // named for each request.
    "CREATE TABLE slo_counts (
        slo TEXT NOT NULL,
        at REAL NOT NULL,
        target TEXT NOT NULL,
        replica TEXT NOT NULL,
        good INTEGER NOT NULL,
        total INTEGER NOT NULL
    );
    CREATE INDEX slo_counts_by_time ON slo_counts (slo, at);
    ALTER TABLE samples ADD COLUMN served_by TEXT;",
    // 7: the image each run's server ran and each build is, so two images
    // of one version are two builds.
    "ALTER TABLE runs ADD COLUMN image TEXT;
    ALTER TABLE runs ADD COLUMN image_digest TEXT;
    ALTER TABLE builds ADD COLUMN image TEXT;
    ALTER TABLE builds ADD COLUMN image_digest TEXT;
    CREATE INDEX builds_by_image ON builds (target, model, image_digest, first_seen);",
    // 8: when the server that served each run last started
    // (`process_start_time_seconds`), so each start's first runs are a
    // warm-up, and the runs of each start found without reading them all;
    // a build's evaluations by time, so those since its latest deployment
    // are found without reading the ones before.
    "ALTER TABLE runs ADD COLUMN server_started REAL;
    CREATE INDEX runs_by_server_start ON runs
        (target, model, scenario, build, outcome, server_started, started_at);
    CREATE INDEX evaluations_by_time ON evaluations (target, model, scenario, build, at);",
    // 9: a build's changes to and from, by time, so each warm-up reading
    // and the start of a build's return seek them rather than read every
    // change of the target (an identity that flips between two builds
    // files one on each flip: with 10,000 changes of a target, a warm-up
    // reading took 360 ms, its return's start 1.0 ms; seeking, 0.24 and
    // 0.008 ms).
    "CREATE INDEX version_changes_from ON version_changes (target, model, from_build, at);
    CREATE INDEX version_changes_to ON version_changes (target, model, to_build, at);",
    // 10: a build's changes to and from in the order they were filed, so
    // the reference of a comparison (the build other than the judged one
    // named last) is one step per build with a baseline rather than a
    // reading of the target's whole history (with 10,000 changes, 2.2 ms
    // per evaluation; seeking, 0.03 ms).
    "CREATE INDEX version_changes_to_in_order ON version_changes (target, model, to_build, id);
    CREATE INDEX version_changes_from_in_order ON version_changes (target, model, from_build, id);",
    // 11: each pair's evaluations in the order they were made, so the
    // newest of every pair (at start, for the verdicts page and reports)
    // is one index walk, not a reading of the pair's rows for each of its
    // rows (with 40,000 evaluations of one pair, 83 s).
    "CREATE INDEX evaluations_in_order ON evaluations (target, model, scenario, id);",
];

pub(super) fn migrate(conn: &mut Connection, path: &str) -> Result<(), StoreError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if current > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found: current,
            known,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read again under the write lock: another process opening the
        // same file may have applied this step since.
        let applied: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if applied > i as i64 {
            continue;
        }
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes that open a new (or old) store at once both migrate
    /// it: the second finds the steps applied under the write lock, where
    /// it once applied them again ("table runs already exists").
    #[test]
    fn two_openers_at_once_apply_each_step_once() {
        let dir = std::env::temp_dir().join(format!("sentinel-migrate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..20 {
            let path = dir.join(format!("store-{round}.db"));
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
            let openers: Vec<_> = (0..2)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        super::super::Store::open(&path).map(|_| ())
                    })
                })
                .collect();
            for opener in openers {
                opener.join().unwrap().unwrap();
            }
            let conn = Connection::open(&path).unwrap();
            let version: i64 = conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .unwrap();
            assert_eq!(version, MIGRATIONS.len() as i64);
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
