//! A wedged engine: the API server answers `/health`, generation requests
//! are accepted and get no token. The simulator wedges on command; the
//! daemon probes on a 5-minute schedule, so only its heartbeats can tell.
//! A real Prometheus loaded with the shipped rules (scrape and evaluation
//! every 15 s) must fire `SentinelEngineNotGenerating` within two minutes
//! and resolve it after the wedge; behind nginx, only the wedged replica
//! is "not generating".

use crate::common;

use std::time::{Duration, Instant};

use common::nginx::start_nginx;
use common::{metrics, temp_dir, until};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

async fn sim() -> SimHandle {
    let config = SimConfig {
        ttft_ms: 20.0,
        itl_ms: 2.0,
        ..SimConfig::default()
    };
    SimHandle::start("127.0.0.1:0", config).await.unwrap()
}

/// One target on a 5-minute schedule with the default heartbeat (every
/// 15 s, 20 s timeout); `replicas` adds a `[targets.replicas]` body.
async fn start_daemon(dir: &std::path::Path, base_url: &str, replicas: &str) -> DaemonHandle {
    let text = format!(
        r#"
[scheduler]
schedule = "0 */5 * * * *"
shutdown_grace = "2s"
[store]
path = "{store}"
[[scenarios]]
name = "chat"
input_len = 16
output_len = 8
concurrency = 2
num_requests = 4
warmup = 0
[[targets]]
name = "llm"
base_url = "{base_url}"
{replicas}
"#,
        store = dir.join("store.db").display()
    );
    common::start_daemon(&text, None).await
}

fn generating(page: &Exposition, replica: &str) -> Option<f64> {
    common::wedge::generating(page, "llm", replica)
}

fn sum(page: &Exposition, name: &str) -> f64 {
    page.scalars(&[name])
        .iter()
        .filter(|s| s.label("target") == Some("llm"))
        .map(|s| s.value)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_engine_is_not_generating_and_alerted_within_two_minutes() {
    if !common::have(&["prometheus"]) {
        return;
    }
    let dir = temp_dir("liveness-wedge");
    let server = sim().await;
    let handle = start_daemon(&dir, &server.base_url(), "").await;
    let (_prometheus, prom_port) = common::wedge::prometheus_for(&dir, &handle);
    let (wedging, unwedging) = (server.state.clone(), server.state.clone());
    let handle_ref = &handle;
    let figures = common::wedge::time_a_wedge(
        handle_ref,
        prom_port,
        "llm",
        move || wedging.set_wedged(true),
        move || unwedging.set_wedged(false),
    )
    .await;
    eprintln!("simulator wedged under a 5-minute schedule: {figures:?}");
    assert!(figures.to_alert <= 120.0, "{figures:?}");
    // Within one heartbeat interval (15 s) of the wedge's end.
    assert!(figures.to_recovery <= 16.0, "{figures:?}");

    // Every request sent to the server is counted: heartbeats and runs'.
    until(
        Duration::from_secs(30),
        "every request counted",
        async || {
            let page = metrics(&handle).await;
            let counted =
                sum(&page, "sentinel_heartbeats_total") + sum(&page, "sentinel_requests_total");
            (server.state.requests_in_flight() == 0
                && counted == server.state.stats().requests as f64)
                .then_some(())
        },
    )
    .await;
    // An outage is not a regression.
    let verdicts = common::get_text(&handle, "/api/v1/verdicts").await;
    assert!(
        !verdicts.contains("\"regression\"") && !verdicts.contains("\"confirming\""),
        "{verdicts}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_balancer_only_the_wedged_replica_is_not_generating() {
    let dir = temp_dir("liveness-nginx");
    let healthy = sim().await;
    let wedged = sim().await;
    let upstreams = [healthy.addr.to_string(), wedged.addr.to_string()];
    let Some((_nginx, base_url)) = start_nginx(&dir, &upstreams).await else {
        return;
    };
    let replicas = format!(
        "[targets.replicas]\nstatic = [\"{}\", \"{}\"]\nprobe = \"both\"\nmax_parallel = 2\n[targets.heartbeat]\ninterval = \"3s\"\ntimeout = \"4s\"",
        healthy.base_url(),
        wedged.base_url()
    );
    let handle = start_daemon(&dir, &base_url, &replicas).await;
    let (a, b) = (healthy.addr.to_string(), wedged.addr.to_string());
    until(
        Duration::from_secs(30),
        "both replicas generating",
        async || {
            let page = metrics(&handle).await;
            (generating(&page, &a) == Some(1.0) && generating(&page, &b) == Some(1.0)).then_some(())
        },
    )
    .await;
    wedged.state.set_wedged(true);
    let since = Instant::now();
    until(
        Duration::from_secs(30),
        "the wedged replica not generating",
        async || (generating(&metrics(&handle).await, &b) == Some(0.0)).then_some(()),
    )
    .await;
    let to_state = since.elapsed().as_secs_f64();
    // The service's heartbeats go to either replica; within a few of them
    // one meets the wedged one and is attributed to it.
    let service = until(
        Duration::from_secs(60),
        "the service attributed",
        async || {
            let targets: serde_json::Value =
                reqwest::get(format!("http://{}/api/v1/targets", handle.addr))
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
            let service = targets["llm"]["liveness"].clone();
            (service["state"] == "not_generating").then_some(service)
        },
    )
    .await;
    assert_eq!(
        service["attributed_to"],
        serde_json::json!([b]),
        "{service}"
    );
    let page = metrics(&handle).await;
    assert_eq!(
        generating(&page, &a),
        Some(1.0),
        "the healthy replica keeps serving"
    );
    let served_before = healthy.state.stats().completed_streams;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(healthy.state.stats().completed_streams > served_before);
    eprintln!(
        "behind nginx: the wedged replica not generating after {to_state:.1} s; the service attributed to it"
    );
    wedged.state.set_wedged(false);
    handle.shutdown();
    handle.wait().await.unwrap();
    healthy.stop().await;
    wedged.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
