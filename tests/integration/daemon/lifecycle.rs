//! The daemon's configuration reload, which swaps only a valid
//! configuration and leaves nothing of a removed target on `/metrics`
//! once its run has ended; its shutdown, which lets a run finish within
//! the grace period and then aborts and counts it; and one daemon per
//! store.

use std::path::Path;
use std::time::Duration;

use super::{SCENARIOS, first_request, get, poll, sim_config, value};
use crate::common::{start_daemon, temp_dir};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::SimHandle;
use vllm_sentinel::store::{RunFilter, Store};

/// Writes `text` to the daemon's configuration file and asks it to reload.
async fn rewrite_and_reload(handle: &DaemonHandle, file: &Path, text: &str) -> reqwest::Response {
    std::fs::write(file, text).unwrap();
    reqwest::Client::new()
        .post(format!("http://{}/-/reload", handle.addr))
        .send()
        .await
        .unwrap()
}

/// A configuration the daemon reloads on `POST /-/reload`, storing in
/// `store`, with `targets` (yearly runs unless they say otherwise).
fn reloadable(store: &Path, targets: &str) -> String {
    format!(
        "[exporter]\nenable_lifecycle = true\n[store]\npath = \"{}\"\n[scheduler]\nschedule = \"0 0 1 1 *\"\n[telemetry]\nnvml = false\n{targets}{SCENARIOS}",
        store.display()
    )
}

/// A target of `sim` run on `schedule`, without heartbeats.
fn target_on(sim: &SimHandle, name: &str, schedule: &str) -> String {
    format!(
        "[[targets]]\nname = \"{name}\"\nbase_url = \"{}\"\nschedule = \"{schedule}\"\n[targets.heartbeat]\nenabled = false\n",
        sim.base_url()
    )
}

/// The runs of target `name` in the daemon's store.
fn runs_of(handle: &DaemonHandle, name: &str) -> usize {
    handle
        .store()
        .runs(&RunFilter {
            target: Some(name.into()),
            ..Default::default()
        })
        .unwrap()
        .len()
}

/// Whether the page declares `target`'s schedule.
fn scheduled(page: &str, target: &str) -> bool {
    let label = format!("target=\"{target}\"");
    page.lines()
        .any(|l| l.starts_with("sentinel_schedule_interval_seconds{") && l.contains(&label))
}

#[tokio::test]
async fn reload_swaps_only_a_valid_configuration() {
    let sim = SimHandle::start("127.0.0.1:0", sim_config(5.0, 1.0))
        .await
        .unwrap();
    let dir = temp_dir("daemon-reload");
    let store = dir.join("store.db");
    let file = dir.join("sentinel.toml");
    let config = |targets: &str| reloadable(&store, targets);
    let one = format!(
        "[[targets]]\nname = \"a\"\nbase_url = \"{}\"\n",
        sim.base_url()
    );
    std::fs::write(&file, config(&one)).unwrap();
    let handle = start_daemon(&config(&one), Some(&file)).await;

    let r = rewrite_and_reload(&handle, &file, &config(&format!("{one}bogus = 1\n"))).await;
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("targets[0].bogus: unknown key")
    );
    let (_, page) = get(&handle, "/metrics").await;
    assert_eq!(
        value(&page, "sentinel_config_last_reload_successful", &[]),
        Some(0.0)
    );
    assert_eq!(handle.config().targets.len(), 1);

    // A store path only a restart can change: refused whole, named, and
    // the new target in the same file is not half applied.
    let moved = config(&format!(
        "{one}[[targets]]\nname = \"b\"\nbase_url = \"{}\"\n",
        sim.base_url()
    ))
    .replace(".db\"", "-moved.db\"");
    let r = rewrite_and_reload(&handle, &file, &moved).await;
    assert_eq!(r.status().as_u16(), 409);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("store.path cannot change while the daemon runs"),
        "{text}"
    );
    assert_eq!(handle.config().targets.len(), 1);
    // SIGHUP takes the same path.
    assert!(handle.reload().await.is_err());
    assert_eq!(handle.config().targets.len(), 1);

    // Target a now runs every second instead of once a year; b is new.
    let two = format!(
        "{one}schedule = \"* * * * * *\"\n[[targets]]\nname = \"b\"\nbase_url = \"{}\"\n",
        sim.base_url()
    );
    let r = rewrite_and_reload(&handle, &file, &config(&two)).await;
    assert_eq!(r.status().as_u16(), 200);
    let (_, page) = get(&handle, "/metrics").await;
    assert_eq!(
        value(&page, "sentinel_config_last_reload_successful", &[]),
        Some(1.0)
    );
    assert_eq!(handle.config().targets.len(), 2);
    // The new target gets a worker and a watcher.
    let up = poll(&handle, "sentinel_target_up", &[("target", "b")], |v| {
        v.is_some()
    })
    .await;
    assert_eq!(up, Some(1.0));
    // The waiting worker of a re-plans with its new schedule.
    let a_runs = poll(
        &handle,
        "sentinel_runs_total",
        &[("target", "a"), ("outcome", "ok")],
        |v| v.is_some_and(|n| n >= 1.0),
    )
    .await;
    assert!(
        a_runs.is_some_and(|n| n >= 1.0),
        "a did not run after the reload: {a_runs:?}"
    );

    // A target removed by a reload no longer shows its verdict, which
    // its alert rule would page on until a restart.
    let a_state = poll(
        &handle,
        "sentinel_regression_state",
        &[("target", "a")],
        |v| v.is_some(),
    )
    .await;
    assert!(a_state.is_some(), "no verdict for a");
    let a_row = "<tr><td>a</td><td>tiny</td>";
    let (_, status) = get(&handle, "/").await;
    assert!(status.contains(a_row), "{status}");
    let only_b = format!(
        "[[targets]]\nname = \"b\"\nbase_url = \"{}\"\n",
        sim.base_url()
    );
    let r = rewrite_and_reload(&handle, &file, &config(&only_b)).await;
    assert_eq!(r.status().as_u16(), 200);
    let (_, page) = get(&handle, "/metrics").await;
    assert_eq!(
        value(&page, "sentinel_regression_state", &[("target", "a")]),
        None,
        "{page}"
    );
    let (_, status) = get(&handle, "/").await;
    let verdicts = status.split("<h2>Verdicts</h2>").nth(1).unwrap();
    assert!(!verdicts.contains(a_row), "{verdicts}");
    handle.shutdown();
    handle.wait().await.unwrap();
    sim.stop().await;
}

/// A target removed while its run is in flight: the run ends and is
/// stored (history), but neither its series, nor its row on the status
/// page, nor a verdict come back with it.
#[tokio::test]
async fn a_run_in_flight_of_a_removed_target_is_stored_and_shown_no_more() {
    // Each request streams for about 4 s.
    let sim = SimHandle::start("127.0.0.1:0", sim_config(5.0, 1000.0))
        .await
        .unwrap();
    let dir = temp_dir("daemon-removed-in-flight");
    let store = dir.join("store.db");
    let file = dir.join("sentinel.toml");
    let config = |targets: &str| reloadable(&store, targets);
    let idle = target_on(&sim, "b", "0 0 1 1 *");
    let both = config(&format!("{}{idle}", target_on(&sim, "a", "* * * * * *")));
    let handle = start_daemon(&both, Some(&file)).await;
    first_request(&sim).await;
    assert!(sim.state.stats().requests > 0, "a's run never started");

    let r = rewrite_and_reload(&handle, &file, &config(&idle)).await;
    assert_eq!(r.status().as_u16(), 200);
    // `b` is idle (its schedule is yearly): its declared series do not
    // move (its telemetry's may).
    let b_lines = |page: &str| -> Vec<String> {
        page.lines()
            .filter(|l| {
                l.contains("target=\"b\"")
                    && (l.starts_with("sentinel_schedule_") || l.starts_with("sentinel_runs_total"))
            })
            .map(str::to_owned)
            .collect()
    };
    let b_before = b_lines(&get(&handle, "/metrics").await.1);
    crate::common::until(Duration::from_secs(30), "a's run stored", async || {
        (runs_of(&handle, "a") > 0).then_some(())
    })
    .await;
    // Once its tasks have ended, nothing of `a` is left on the page: not
    // what the run would have put back (its verdict, which pages, its
    // latencies and counts: the filing's own test shows it puts none back)
    // nor the zero counters, server gauges and `up` series its tasks had
    // written. `b`'s series stay.
    crate::common::until(Duration::from_secs(30), "a's series gone", async || {
        let (_, page) = get(&handle, "/metrics").await;
        (!page.contains("target=\"a\"")).then_some(())
    })
    .await;
    assert_eq!(runs_of(&handle, "a"), 1);
    let (_, status) = get(&handle, "/").await;
    assert!(!status.contains("<td>a</td>"), "{status}");
    let (_, page) = get(&handle, "/metrics").await;
    assert!(scheduled(&page, "b"), "{page}");
    assert!(!b_before.is_empty());
    assert_eq!(b_lines(&page), b_before, "b's series stay");
    // Configured again, it is declared again.
    let r = rewrite_and_reload(&handle, &file, &both).await;
    assert_eq!(r.status().as_u16(), 200);
    let (_, page) = get(&handle, "/metrics").await;
    assert!(scheduled(&page, "a"), "{page}");
    handle.shutdown();
    handle.wait().await.unwrap();
    sim.stop().await;
}

/// A target removed and configured again while its run is in flight keeps
/// its series: once that run is filed, the cleanup after the old tasks
/// finds it configured and removes nothing, and its new worker starts.
#[tokio::test]
async fn a_target_configured_again_while_its_run_ends_keeps_its_series() {
    // Each request streams for about 4 s.
    let sim = SimHandle::start("127.0.0.1:0", sim_config(5.0, 1000.0))
        .await
        .unwrap();
    let dir = temp_dir("daemon-configured-again");
    let store = dir.join("store.db");
    let file = dir.join("sentinel.toml");
    let idle = target_on(&sim, "b", "0 0 1 1 *");
    let both = reloadable(
        &store,
        &format!("{}{idle}", target_on(&sim, "a", "* * * * * *")),
    );
    let handle = start_daemon(&both, Some(&file)).await;
    first_request(&sim).await;
    assert!(sim.state.stats().requests > 0, "a's run never started");

    for text in [reloadable(&store, &idle), both] {
        let r = rewrite_and_reload(&handle, &file, &text).await;
        assert_eq!(r.status().as_u16(), 200);
    }
    assert_eq!(runs_of(&handle, "a"), 0, "the reloads came within the run");
    crate::common::until(Duration::from_secs(30), "a's run stored", async || {
        (runs_of(&handle, "a") > 0).then_some(())
    })
    .await;
    // The new worker starts only after the old tasks and their cleanup.
    let served = sim.state.stats().requests;
    crate::common::until(Duration::from_secs(30), "a's next run", async || {
        (sim.state.stats().requests > served).then_some(())
    })
    .await;
    let (_, page) = get(&handle, "/metrics").await;
    assert!(scheduled(&page, "a"), "{page}");
    handle.shutdown();
    handle.wait().await.unwrap();
    sim.stop().await;
}

#[tokio::test]
async fn shutdown_lets_a_run_finish_within_the_grace_period_then_aborts_and_counts_it() {
    // Each request streams for about 3 s; the grace period is 300 ms.
    let sim = SimHandle::start("127.0.0.1:0", sim_config(5.0, 200.0))
        .await
        .unwrap();
    let dir = temp_dir("daemon-abort");
    let path = dir.join("store.db");
    let config = format!(
        "[store]\npath = \"{}\"\n[scheduler]\nschedule = \"* * * * * *\"\nshutdown_grace = \"300ms\"\n[telemetry]\nnvml = false\n[[targets]]\nname = \"slow\"\nbase_url = \"{}\"\n[targets.heartbeat]\nenabled = false\n[[scenarios]]\nname = \"long\"\ninput_len = 16\noutput_len = 16\nnum_requests = 2\nwarmup = 0\n",
        path.display(),
        sim.base_url()
    );
    let handle = start_daemon(&config, None).await;
    first_request(&sim).await;
    let metrics = handle.metrics().clone();
    let asked = std::time::Instant::now();
    handle.shutdown();
    handle.wait().await.unwrap();
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "drained in {took:?}, grace 300 ms"
    );
    let page = metrics.encode();
    assert_eq!(
        value(
            &page,
            "sentinel_probes_aborted_total",
            &[("reason", "shutdown")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&page, "sentinel_runs_total", &[("outcome", "aborted")]),
        Some(1.0)
    );
    let runs = Store::open(&path)
        .unwrap()
        .runs(&RunFilter::default())
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].outcome.as_str(), "aborted");
    sim.stop().await;
}

/// A second daemon on a store in use is refused at start, as a separate
/// process would be: it names the store and the holder, exits 1, and has
/// neither probed the servers nor touched the store; once the first has
/// stopped, the store is free again.
#[tokio::test]
async fn a_second_daemon_on_one_store_is_refused_until_the_first_has_stopped() {
    let sim = SimHandle::start("127.0.0.1:0", sim_config(5.0, 1.0))
        .await
        .unwrap();
    let dir = temp_dir("daemon-one-store");
    let store = dir.join("store.db");
    let file = dir.join("sentinel.toml");
    let config = format!(
        "[exporter]\nlisten = \"127.0.0.1:0\"\n[store]\npath = \"{}\"\n[scheduler]\nschedule = \"* * * * * *\"\n[telemetry]\nnvml = false\n\
[[targets]]\nname = \"a\"\nbase_url = \"{}\"\n{SCENARIOS}",
        store.display(),
        sim.base_url()
    );
    let first = start_daemon(&config, Some(&file)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = vllm_sentinel::daemon::start(
        vllm_sentinel::config::Config::from_text(&config, "test").unwrap(),
        None,
        listener,
        tokio_util::sync::CancellationToken::new(),
        vllm_sentinel::clock::Clock::System,
    )
    .await
    .err()
    .expect("a second daemon on the same store");
    let message = refused.to_string();
    assert!(
        message.contains(&format!(
            "store {} is in use by another vllm-sentinel daemon (pid {})",
            store.display(),
            std::process::id()
        )),
        "{message}"
    );

    // The same from another process, its exporter on a port of its own.
    let other = tokio::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["serve", "--config"])
        .arg(&file)
        .output();
    let other = tokio::time::timeout(Duration::from_secs(30), other)
        .await
        .expect("a refused daemon exits at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is in use by another vllm-sentinel daemon"),
        "{stderr}"
    );

    // Every stream the simulator served is one the first daemon stored
    // or counted as a heartbeat: the refused ones probed nothing.
    crate::common::until(Duration::from_secs(20), "a run filed", async || {
        let filed = first.store().runs(&RunFilter::default()).unwrap();
        (!filed.is_empty()).then_some(())
    })
    .await;
    let metrics = first.metrics().clone();
    first.shutdown();
    first.wait().await.unwrap();
    let runs = Store::open(&store)
        .unwrap()
        .runs(&RunFilter::default())
        .unwrap();
    let completed: usize = runs.iter().map(|r| r.summary.completed).sum();
    let heartbeats = value(
        &metrics.encode(),
        "sentinel_heartbeats_total",
        &[("target", "a"), ("outcome", "ok")],
    )
    .unwrap_or(0.0) as usize;
    assert_eq!(
        sim.state.stats().completed_streams as usize,
        completed + heartbeats
    );
    let again = start_daemon(&config, None).await;
    again.shutdown();
    again.wait().await.unwrap();
    sim.stop().await;
}
