//! A fleet behind a real load balancer: two simulators, one at 0.32.0 and
//! one at 0.33.0, behind Debian's nginx (round robin), one target pointed
//! at nginx and probed every second. Every request is filed under the build
//! that served it: the runs split per build, no build that no replica is
//! (such as `0.32.0+2`) appears, the fleet's shares are exported, and a
//! build change is counted once per real change, not once per run.

use crate::common;

use common::nginx::start_nginx;
use common::{metrics, temp_dir, until, value};

use std::time::{Duration, Instant};

use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

/// A simulated replica serving `version`, listening on `addr`.
async fn sim_at(addr: &str, version: &str) -> SimHandle {
    let config = SimConfig {
        ttft_ms: 20.0,
        itl_ms: 2.0,
        jitter: 0.03,
        version: version.into(),
        ..SimConfig::default()
    };
    SimHandle::start(addr, config).await.unwrap()
}

/// One target through the balancer, probed every second; `detector`,
/// `num_requests` and the target's `extra` lines are what each test needs.
/// The configuration is written to `dir` so reloads read it.
async fn start_daemon(
    dir: &std::path::Path,
    base_url: &str,
    detector: &str,
    num_requests: usize,
    extra: &str,
) -> DaemonHandle {
    let text = format!(
        r#"
[scheduler]
schedule = "* * * * * *"
[store]
path = "{}"
[detector]
{detector}
[[scenarios]]
name = "interactive"
input_len = 32
output_len = 8
concurrency = 2
num_requests = {num_requests}
warmup = 0
[[targets]]
name = "fleet"
base_url = "{base_url}"
scenarios = ["interactive"]
{extra}
"#,
        dir.join("store.db").display()
    );
    common::start_daemon(&text, Some(&dir.join("sentinel.toml"))).await
}

/// The target's own series (labelled only `target`).
fn of_fleet(page: &Exposition, name: &str) -> Option<f64> {
    value(page, name, &[("target", "fleet")])
}

/// The builds the run series of the target carry.
fn run_builds(page: &Exposition) -> Vec<String> {
    common::run_label_values(page, "build")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_through_a_load_balancer_are_split_per_build_and_changes_counted_once() {
    let dir = temp_dir("fleet-nginx");
    let old = sim_at("127.0.0.1:0", "0.32.0").await;
    let new = sim_at("127.0.0.1:0", "0.33.0").await;
    let upstreams = [old.addr.to_string(), new.addr.to_string()];
    let Some((_nginx, base_url)) = start_nginx(&dir, &upstreams).await else {
        return;
    };
    let handle = start_daemon(&dir, &base_url, "canary_window = 3", 8, "").await;

    // Both builds serve from the first runs: each is filed as itself.
    let page = until(Duration::from_secs(60), "runs of both builds", async || {
        let page = metrics(&handle).await;
        (run_builds(&page) == ["0.32.0", "0.33.0"]).then_some(page)
    })
    .await;
    for build in ["0.32.0", "0.33.0"] {
        let share = value(&page, "sentinel_fleet_builds", &[("build", build)]).unwrap();
        assert!((0.2..=0.8).contains(&share), "{build} share {share}");
    }
    // Ten more rounds: requests alternate between the builds on every run,
    // and still only one build change (0.33.0 first seen beside 0.32.0).
    common::after_runs(&handle, 10).await;
    let page = metrics(&handle).await;
    assert_eq!(run_builds(&page), ["0.32.0", "0.33.0"]);
    assert_eq!(of_fleet(&page, "sentinel_build_changes_total"), Some(1.0));
    assert_eq!(of_fleet(&page, "sentinel_rollout_in_progress"), Some(1.0));

    // The status page shows the builds serving and the rollout.
    let status = common::get_text(&handle, "/").await;
    assert!(
        status.contains("0.32.0 (") && status.contains("rollout 0.32.0 to 0.33.0 in progress"),
        "{status}"
    );

    // A restart in the rollout keeps it: the rollout state and the fleet
    // come back from the store, and the builds already known are not
    // counted again.
    handle.shutdown();
    handle.wait().await.unwrap();
    let handle = start_daemon(&dir, &base_url, "canary_window = 3", 8, "").await;
    let page = metrics(&handle).await;
    assert_eq!(of_fleet(&page, "sentinel_rollout_in_progress"), Some(1.0));
    assert!(value(&page, "sentinel_fleet_builds", &[("build", "0.33.0")]).is_some());
    // A reload in the rollout keeps it too.
    handle.reload().await.unwrap();
    let page = metrics(&handle).await;
    assert_eq!(
        of_fleet(&page, "sentinel_rollout_in_progress"),
        Some(1.0),
        "a reload keeps the rollout in progress"
    );
    common::after_runs(&handle, 4).await;
    let page = metrics(&handle).await;
    assert_eq!(
        of_fleet(&page, "sentinel_build_changes_total"),
        Some(0.0),
        "no build change after a restart"
    );
    assert_eq!(run_builds(&page), ["0.32.0", "0.33.0"]);

    // The old replica is upgraded: 0.32.0 leaves within the window (three
    // rounds), the rollout finishes, and nothing new is counted.
    old.state
        .update(serde_json::json!({"version": "0.33.0"}))
        .unwrap();
    let page = until(
        Duration::from_secs(30),
        "the rollout to finish",
        async || {
            let page = metrics(&handle).await;
            (of_fleet(&page, "sentinel_rollout_in_progress") == Some(0.0)).then_some(page)
        },
    )
    .await;
    assert_eq!(of_fleet(&page, "sentinel_build_changes_total"), Some(0.0));
    assert_eq!(
        value(&page, "sentinel_fleet_builds", &[("build", "0.33.0")]),
        Some(1.0)
    );
    assert_eq!(
        run_builds(&page),
        ["0.33.0"],
        "the old build's run series go"
    );
    assert!(of_fleet(&page, "sentinel_rollout_end_timestamp_seconds").is_some());
    // The report of the latest upgrade (no builds named) tells the rollout.
    let report = common::get_text(&handle, "/report?target=fleet&format=markdown").await;
    assert!(
        report.contains("version 0.33.0 compared with 0.32.0")
            && report.contains("Rollout: started")
            && report.contains(", finished "),
        "{report}"
    );

    // A new build on one replica is one more change.
    new.state
        .update(serde_json::json!({"version": "0.34.0"}))
        .unwrap();
    until(Duration::from_secs(30), "the second rollout", async || {
        let page = metrics(&handle).await;
        (of_fleet(&page, "sentinel_build_changes_total") == Some(1.0)).then_some(())
    })
    .await;
    common::after_runs(&handle, 4).await;
    let page = metrics(&handle).await;
    assert_eq!(of_fleet(&page, "sentinel_build_changes_total"), Some(1.0));

    // The store holds each run per build, none under a mixed label.
    let store = vllm_sentinel::store::Store::open(&dir.join("store.db")).unwrap();
    let runs = store
        .runs(&vllm_sentinel::store::RunFilter {
            target: Some("fleet".into()),
            limit: 1000,
            ..Default::default()
        })
        .unwrap();
    let mut builds: Vec<String> = runs.iter().filter_map(|r| r.build.clone()).collect();
    builds.sort();
    builds.dedup();
    assert_eq!(builds, ["0.32.0", "0.33.0", "0.34.0"]);
    let changes = store.version_changes("fleet", "sim-model").unwrap();
    assert_eq!(
        changes.len(),
        3,
        "first seen, then two rollouts: {changes:?}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slower_build_in_a_rollout_is_a_canary_regression_until_it_recovers() {
    let dir = temp_dir("fleet-canary");
    let old = sim_at("127.0.0.1:0", "0.32.0").await;
    // Both replicas start at 0.32.0; once it serves, one rolls to 0.33.0.
    let new = sim_at("127.0.0.1:0", "0.32.0").await;
    let upstreams = [old.addr.to_string(), new.addr.to_string()];
    let Some((_nginx, base_url)) = start_nginx(&dir, &upstreams).await else {
        return;
    };
    let detector =
        "canary_window = 5\nmin_canary_requests = 30\nconfirm_needed = 2\nconfirm_window = 3";
    // The service and each replica: two probes at most at once.
    let replicas = format!(
        "[targets.replicas]\nstatic = [\"http://{}\", \"http://{}\"]\nprobe = \"both\"\nmax_parallel = 1",
        old.addr, new.addr
    );
    let handle = start_daemon(&dir, &base_url, detector, 16, &replicas).await;
    until(Duration::from_secs(30), "0.32.0 serving", async || {
        let page = metrics(&handle).await;
        value(&page, "sentinel_fleet_builds", &[("build", "0.32.0")]).map(|_| ())
    })
    .await;
    let started = Instant::now();
    new.state
        .update(serde_json::json!({"version": "0.33.0", "ttft_ms": 28.0}))
        .unwrap();
    let state = |page: &Exposition| {
        value(
            page,
            "sentinel_regression_state",
            &[("target", "fleet"), ("scenario", "interactive")],
        )
    };
    until(
        Duration::from_secs(60),
        "the canary regression",
        async || (state(&metrics(&handle).await) == Some(2.0)).then_some(()),
    )
    .await;
    let regression_after = started.elapsed();
    // Both replicas' own series, each under its build, beside the service's.
    let page = metrics(&handle).await;
    for (replica, build) in [(old.addr, "0.32.0"), (new.addr, "0.33.0")] {
        let labels = [
            ("replica", replica.to_string()),
            ("build", build.to_owned()),
        ];
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert!(
            value(&page, "sentinel_run_last_timestamp_seconds", &labels).is_some(),
            "{replica} at {build}"
        );
    }
    assert!(
        value(
            &page,
            "sentinel_run_last_timestamp_seconds",
            &[("replica", "")]
        )
        .is_some(),
        "the service's runs"
    );
    // The replica that rolled keeps only its new build's series.
    let rolled = new.addr.to_string();
    assert!(
        value(
            &page,
            "sentinel_run_last_timestamp_seconds",
            &[("replica", &rolled), ("build", "0.32.0")]
        )
        .is_none(),
        "{rolled} at 0.32.0 is gone"
    );
    let verdicts: serde_json::Value =
        reqwest::get(format!("http://{}/api/v1/verdicts", handle.addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let reason = verdicts.to_string();
    assert!(
        reason.contains("rollout of 0.33.0 in progress")
            && reason.contains("TTFT p50 +")
            && reason.contains("(1 of 2 replicas)")
            && reason.contains("against 0.32.0 measured at the same time"),
        "{reason}"
    );
    let status = common::get_text(&handle, "/").await;
    assert!(
        status.contains("<h2>Replicas</h2>") && status.contains(&new.addr.to_string()),
        "{status}"
    );
    let runs = vllm_sentinel::store::Store::open(&dir.join("store.db"))
        .unwrap()
        .runs(&vllm_sentinel::store::RunFilter {
            target: Some("fleet".into()),
            limit: 1000,
            ..Default::default()
        })
        .unwrap();
    eprintln!(
        "canary regression after {:.1} s, {} rounds",
        regression_after.as_secs_f64(),
        runs.iter()
            .map(|r| r.started_at)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );

    // The new build recovers: the verdict resolves once the window holds
    // only recovered rounds.
    new.state
        .update(serde_json::json!({"ttft_ms": 20.0}))
        .unwrap();
    until(
        Duration::from_secs(60),
        "the canary to resolve",
        async || (state(&metrics(&handle).await) == Some(0.0)).then_some(()),
    )
    .await;
    handle.shutdown();
    handle.wait().await.unwrap();
}
