//! A store held by another writer does not hold up the schedule: runs keep
//! starting on their ticks while their filing waits for the store, and
//! every one of them is filed once it is free (writes wait for the lock,
//! and one refused with "database is locked" after the busy timeout is
//! written again).

use crate::common;

use std::time::Duration;

use vllm_sentinel::sim::{SimConfig, SimHandle};

/// Runs in the store, read on a connection of the test's own (the store
/// is in WAL mode: a reader is never blocked by the writer).
fn stored(db: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap()
}

/// A daemon probing a simulator every second (with `scheduler`, a
/// `[scheduler]` section's lines), once its first run is filed.
struct Probing {
    sim: SimHandle,
    _dir: common::TempDir,
    db: std::path::PathBuf,
    handle: vllm_sentinel::daemon::DaemonHandle,
}

async fn probing_every_second(name: &str, scheduler: &str) -> Probing {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir(name);
    let db = dir.join("store.db");
    let text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n[scheduler]\n{scheduler}\n\
[[targets]]\nname = \"a\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 4\nnum_requests = 1\nwarmup = 0\n\
[[slos]]\nname = \"ok\"\nsli = \"success\"\nobjective = 99\nwindow = \"1d\"\n",
        db.display(),
        sim.base_url()
    );
    let handle = common::start_daemon(&text, None).await;
    common::until(Duration::from_secs(20), "a first run filed", async || {
        (stored(&db) >= 1).then_some(())
    })
    .await;
    Probing {
        sim,
        _dir: dir,
        db,
        handle,
    }
}

/// Once the daemon's first run is filed, another writer holds the store
/// for `time`. Runs keep their ticks, none is filed meanwhile, and every
/// one is filed after it, with no store error counted (a write refused
/// is written again, not lost: the run's and its objective's counts).
async fn held_runs_are_all_filed_after(name: &str, time: Duration) {
    let Probing {
        sim,
        _dir,
        db,
        handle,
    } = probing_every_second(name, "").await;

    let holder = rusqlite::Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (served_before, filed_before) = (sim.state.stats().completed_streams, stored(&db));
    tokio::time::sleep(time).await;
    let started = sim.state.stats().completed_streams - served_before;
    let filed_while_held = stored(&db) - filed_before;
    holder.execute_batch("COMMIT").unwrap();

    // Ticks every second: a worker waiting for its own filing would have
    // probed once at most while the store was held.
    assert!(
        started >= 3,
        "{started} runs probed while the store was held"
    );
    assert_eq!(filed_while_held, 0, "the store was really held");
    let want = filed_before + started as i64;
    common::until(Duration::from_secs(20), "the held runs filed", async || {
        (stored(&db) >= want).then_some(())
    })
    .await;
    let page = common::metrics(&handle).await;
    assert_eq!(
        common::value(&page, "sentinel_store_errors_total", &[]),
        Some(0.0)
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}

/// Held within the store's 5 s busy timeout: the daemon's writes wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_keep_their_ticks_while_the_store_is_held_and_are_all_filed_after() {
    held_runs_are_all_filed_after("store-busy", Duration::from_millis(3500)).await;
}

/// Held past the busy timeout: the first write is refused after 5 s and
/// written again once the store is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_write_is_refused_while_the_store_is_held_is_written_after() {
    held_runs_are_all_filed_after("store-held", Duration::from_secs(8)).await;
}

/// Stopped while another writer holds the store: a run's write is waited
/// for and tried again only within `shutdown_grace` (1 s here), so the
/// daemon stops within about that plus SQLite's 5 s busy timeout, not
/// after the about 35 s of a write's tries (the bound below is between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_stopped_while_the_store_is_held_stops_within_its_grace() {
    let probing = probing_every_second("store-held-stop", "shutdown_grace = \"1s\"").await;
    let holder = rusqlite::Connection::open(&probing.db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let served = probing.sim.state.stats().completed_streams;
    common::until(
        Duration::from_secs(20),
        "a run probed while held",
        async || (probing.sim.state.stats().completed_streams > served).then_some(()),
    )
    .await;
    probing.handle.shutdown();
    let stopped = tokio::time::timeout(Duration::from_secs(25), probing.handle.wait()).await;
    holder.execute_batch("COMMIT").unwrap();
    stopped
        .expect("the daemon still waiting for the store 25 s after SIGTERM")
        .unwrap();
}
