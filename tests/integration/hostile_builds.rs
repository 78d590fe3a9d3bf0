//! Servers whose identity cannot be trusted, and fleets that change under
//! the daemon: a `/version` that disagrees with the stream's fingerprints,
//! a fingerprint new on every request, a target removed and re-added while
//! its run is in flight, a replica that hangs after leaving the list. The
//! daemon must name the condition once and never add probe load for it.

use crate::common;

use std::time::{Duration, Instant};

use common::{metrics, temp_dir, until, value};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{Fault, SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

async fn sim(config: SimConfig) -> SimHandle {
    SimHandle::start("127.0.0.1:0", config).await.unwrap()
}

fn fast() -> SimConfig {
    SimConfig {
        ttft_ms: 5.0,
        itl_ms: 1.0,
        ..SimConfig::default()
    }
}

/// One target `t` probed every second through its service with `requests`
/// requests a run, telemetry every second.
fn config(dir: &std::path::Path, base_url: &str, requests: u32, extra: &str) -> String {
    format!(
        r#"
[scheduler]
schedule = "* * * * * *"
shutdown_grace = "2s"
[telemetry]
scrape_interval = "1s"
[store]
path = "{store}"
[[scenarios]]
name = "s"
input_len = 8
output_len = 4
concurrency = 2
num_requests = {requests}
warmup = 0
[[targets]]
name = "t"
base_url = "{base_url}"
scenarios = ["s"]
{extra}
"#,
        store = dir.join("store.db").display()
    )
}

fn sum(page: &Exposition, name: &str) -> f64 {
    page.scalars(&[name])
        .iter()
        .filter(|s| s.label("target") == Some("t"))
        .map(|s| s.value)
        .sum()
}

async fn targets(handle: &DaemonHandle) -> serde_json::Value {
    reqwest::get(format!("http://{}/api/v1/targets", handle.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `sentinel_build_identity_unstable` of target `t` for `reason`.
fn unstable(page: &Exposition, reason: &str) -> Option<f64> {
    value(
        page,
        "sentinel_build_identity_unstable",
        &[("target", "t"), ("reason", reason)],
    )
}

/// Stops the daemon, then the server, and removes the test's directory.
async fn stop(handle: DaemonHandle, server: SimHandle, dir: &std::path::Path) {
    handle.shutdown();
    handle.wait().await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Rollouts the store holds for the target.
fn rollouts(handle: &DaemonHandle, model: &str) -> usize {
    handle.store().rollouts("t", model).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_disagrees_with_the_fingerprints_is_one_condition_not_a_loop() {
    let dir = temp_dir("builds-disagree");
    let server = sim(SimConfig {
        version: "0.33.0".into(),
        version_reported: Some("0.32.0".into()),
        ..fast()
    })
    .await;
    let handle = common::start_daemon(&config(&dir, &server.base_url(), 2, ""), None).await;
    let started = Instant::now();
    // Named after two /version readings (a second apart here); from then
    // on no rollout starts.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let named = rollouts(&handle, "sim-model");
    tokio::time::sleep(Duration::from_secs(12)).await;
    let page = metrics(&handle).await;
    let runs = sum(&page, "sentinel_runs_total");
    let upgrade_runs = sum(&page, "sentinel_upgrade_runs_total").max(0.0);
    let changes = handle.store().version_changes("t", "sim-model").unwrap();
    let rollouts = rollouts(&handle, "sim-model");
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "lying /version, {elapsed:.0} s on a 1 s schedule: {runs} runs ({upgrade_runs:.0} upgrade runs), {} version changes, {rollouts} rollouts ({named} by 8 s)",
        changes.len()
    );
    // Before: 48 rollouts and 96 version changes in 120 s, 4.7x the runs.
    assert!(rollouts <= 3, "{rollouts} rollouts: {changes:?}");
    assert_eq!(
        rollouts, named,
        "none after the condition was named: {changes:?}"
    );
    // At most the schedule times max_rate_factor (2), plus one verdict's
    // worth of upgrade runs.
    let policy = vllm_sentinel::verdict::policy::VerdictPolicy::default();
    let bound = 2.0 * (elapsed + 1.0) + policy.runs_for_verdict() as f64;
    assert!(
        runs <= bound,
        "{runs} runs in {elapsed:.0} s, bound {bound}"
    );
    assert_eq!(unstable(&page, "version_disagrees"), Some(1.0));
    let t = targets(&handle).await;
    assert_eq!(
        t["t"]["build_identity"]["reason"], "version_disagrees",
        "{t}"
    );
    assert_eq!(t["t"]["build_identity"]["fingerprint_version"], "0.33.0");
    // Named on the status page too, once.
    let page = common::get_text(&handle, "/").await;
    assert_eq!(
        page.matches("/version says 0.32.0 but the stream's fingerprints say 0.33.0")
            .count(),
        1,
        "{page}"
    );
    stop(handle, server, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_new_on_every_request_is_one_condition_not_a_build_per_request() {
    let dir = temp_dir("builds-churn");
    let server = sim(SimConfig {
        fingerprint_per_request: true,
        ..fast()
    })
    .await;
    // 8 requests a run: each run's fingerprints churn within it.
    let handle = common::start_daemon(&config(&dir, &server.base_url(), 8, ""), None).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let page = metrics(&handle).await;
    let runs = sum(&page, "sentinel_runs_total");
    let changes = sum(&page, "sentinel_build_changes_total");
    let builds = handle.store().version_changes("t", "sim-model").unwrap();
    let series = page
        .scalars(&["sentinel_run_last_timestamp_seconds"])
        .iter()
        .filter(|s| s.label("target") == Some("t"))
        .count();
    eprintln!(
        "fingerprint per request, 8 requests a run, 12 s: {runs} runs, {changes} build changes, {} builds filed, {series} run series",
        builds.len()
    );
    // Before: a build, a rollout and a "run" per request.
    assert!(
        runs <= 14.0,
        "{runs} runs: one per scheduled tick, not per request"
    );
    assert_eq!(builds.len(), 1, "{builds:?}");
    assert_eq!(changes, 0.0);
    assert_eq!(series, 1, "one build's run series");
    assert_eq!(unstable(&page, "fingerprint_churn"), Some(1.0));
    stop(handle, server, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_builds_are_bounded_per_hour_when_each_run_sees_another_fingerprint() {
    let dir = temp_dir("builds-bound");
    let server = sim(SimConfig {
        fingerprint_per_request: true,
        ..fast()
    })
    .await;
    // One request a run: each run's one fingerprint looks like a build.
    let text = config(&dir, &server.base_url(), 1, "")
        + "[detector]\nmax_new_builds_per_hour = 3\nupgrade_rounds = false\n";
    let handle = common::start_daemon(&text, None).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let page = metrics(&handle).await;
    let builds = handle.store().version_changes("t", "sim-model").unwrap();
    let runs = sum(&page, "sentinel_runs_total");
    eprintln!(
        "fingerprint per request, 1 request a run, 12 s: {runs} runs, {} builds filed (bound 3 an hour)",
        builds.len()
    );
    assert!(builds.len() <= 3, "{builds:?}");
    assert!(runs >= 8.0, "probing went on: {runs} runs");
    assert_eq!(unstable(&page, "fingerprint_churn"), Some(1.0));
    stop(handle, server, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_removed_and_re_added_never_runs_two_workers_at_once() {
    let dir = temp_dir("builds-readd");
    // Slow streams: each run is in flight for about 1.5 s.
    let server = sim(SimConfig {
        ttft_ms: 5.0,
        itl_ms: 120.0,
        ..SimConfig::default()
    })
    .await;
    let file = dir.join("sentinel.toml");
    let with_target =
        config(&dir, &server.base_url(), 4, "").replace("output_len = 4", "output_len = 12");
    // The target removed: another in its place, on a closed port.
    let without = with_target
        .replace("name = \"t\"", "name = \"other\"")
        .replace(&server.base_url(), "http://127.0.0.1:9");
    let handle = common::start_daemon(&with_target, Some(&file)).await;
    let mut cycles = 0;
    let deadline = Instant::now() + Duration::from_secs(12);
    while Instant::now() < deadline {
        // Wait for a run in flight, then remove and re-add the target.
        until(Duration::from_secs(10), "a run in flight", async || {
            (server.state.requests_in_flight() > 0).then_some(())
        })
        .await;
        std::fs::write(&file, &without).unwrap();
        handle.reload().await.unwrap();
        std::fs::write(&file, &with_target).unwrap();
        handle.reload().await.unwrap();
        cycles += 1;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let peak = server.state.stats().max_in_flight;
    eprintln!(
        "{cycles} remove-and-re-add reloads mid-run: at most {peak} requests in flight (concurrency 2)"
    );
    // Before: 6 in flight.
    assert!(peak <= 2, "{peak} in flight");
    stop(handle, server, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_hangs_after_leaving_delays_no_new_replica() {
    let dir = temp_dir("builds-hung");
    let hung = sim(SimConfig {
        fault: Some(Fault::Hang),
        ..fast()
    })
    .await;
    let fresh = sim(fast()).await;
    let file = dir.join("replicas.json");
    let list = |addr: &std::net::SocketAddr| format!(r#"[{{"targets": ["{addr}"]}}]"#);
    std::fs::write(&file, list(&hung.addr)).unwrap();
    let text = config(
        &dir,
        "http://127.0.0.1:9",
        2,
        &format!(
            "[targets.replicas]\nfile_sd = \"{}\"\nrefresh = \"1s\"\nprobe = \"replicas\"\nmax_parallel = 1\n",
            file.display()
        ),
    );
    let handle = common::start_daemon(&text, None).await;
    until(
        Duration::from_secs(10),
        "the hung replica's run",
        async || (hung.state.stats().requests > 0).then_some(()),
    )
    .await;
    // The hung replica leaves the list with its run in flight (it holds
    // the one permit); a new replica appears.
    std::fs::write(&file, list(&fresh.addr)).unwrap();
    let swapped = Instant::now();
    until(
        Duration::from_secs(20),
        "the new replica's first probe",
        async || (fresh.state.stats().requests > 0).then_some(()),
    )
    .await;
    let first_probe = swapped.elapsed().as_secs_f64();
    eprintln!(
        "new replica first probed {first_probe:.1} s after the hung one left (refresh 1 s, tick 1 s)"
    );
    // Before: 124.9 s, the hung run's first-token timeout. Now within a
    // refresh (1 s) and a tick (1 s), with a second for a busy machine.
    assert!(first_probe < 3.0, "{first_probe} s");
    handle.shutdown();
    handle.wait().await.unwrap();
    hung.stop().await;
    fresh.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
