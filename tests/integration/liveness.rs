//! A wedged engine: the API server answers `/health`, generation requests
//! are accepted and get no token. The simulator wedges on command; the
//! daemon probes on a 5-minute schedule, so only its heartbeats can tell.
//! A real Prometheus loaded with the shipped rules (scrape and evaluation
//! every 15 s) must fire `SentinelEngineNotGenerating` within two minutes
//! and resolve it after the wedge; behind nginx, only the wedged replica
//! is "not generating".

use crate::common;

use std::time::Duration;

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
    let text = common::wedge::daemon_config(
        &dir.join("store.db"),
        "0 */5 * * * *",
        (16, 8),
        ("llm", base_url),
        replicas,
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

/// Every request the server got is counted, once: as a heartbeat or as a
/// run's request (a run's silent request is evidence like a failed
/// heartbeat, and still only the run's). Waits for requests in flight.
async fn every_request_counted_once(handle: &DaemonHandle, server: &SimHandle) {
    common::until_equal(
        Duration::from_secs(30),
        "every request counted once",
        &Ok(()),
        async || {
            let page = metrics(handle).await;
            let counted =
                sum(&page, "sentinel_heartbeats_total") + sum(&page, "sentinel_requests_total");
            let served = server.state.stats().requests;
            let in_flight = server.state.requests_in_flight();
            if in_flight == 0 && counted == served as f64 {
                return Ok(());
            }
            let runs = common::get_text(handle, "/api/v1/runs?target=llm&limit=5").await;
            Err(format!(
                "{counted} requests counted, {served} served, {in_flight} in flight: {}; the last runs: {runs}",
                by_outcome(&page)
            ))
        },
    )
    .await;
}

/// The target's heartbeats and requests by outcome, for a failure's message.
fn by_outcome(page: &Exposition) -> String {
    let mut counts = Vec::new();
    for name in ["sentinel_heartbeats_total", "sentinel_requests_total"] {
        for s in page.scalars(&[name]) {
            if s.label("target") == Some("llm") && s.value > 0.0 {
                let outcome = s.label("outcome").unwrap_or_default();
                counts.push(format!("{name}{{{outcome}}} {}", s.value));
            }
        }
    }
    counts.join(", ")
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
        ("llm", ""),
        move || wedging.set_wedged(true),
        move || unwedging.set_wedged(false),
    )
    .await;
    eprintln!("simulator wedged under a 5-minute schedule: {figures:?}");
    assert!(figures.to_alert <= 120.0, "{figures:?}");
    // Within one heartbeat interval (15 s) of the wedge's end.
    assert!(figures.to_recovery <= 16.0, "{figures:?}");

    every_request_counted_once(&handle, &server).await;
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
    if !common::have(&["prometheus"]) {
        return;
    }
    let dir = temp_dir("liveness-nginx");
    let healthy = sim().await;
    let wedged = sim().await;
    let upstreams = [healthy.addr.to_string(), wedged.addr.to_string()];
    let Some((_nginx, base_url)) = start_nginx(&dir, &upstreams).await else {
        return;
    };
    // The default heartbeat (every 15 s, 20 s timeout), as in production.
    let replicas = format!(
        "[targets.replicas]\nstatic = [\"{}\", \"{}\"]\nprobe = \"both\"\nmax_parallel = 2",
        healthy.base_url(),
        wedged.base_url()
    );
    let handle = start_daemon(&dir, &base_url, &replicas).await;
    let (_prometheus, prom_port) = common::wedge::prometheus_for(&dir, &handle);
    let (a, b) = (healthy.addr.to_string(), wedged.addr.to_string());
    let (wedging, unwedging) = (wedged.state.clone(), wedged.state.clone());
    // The wedge lasts until the service's silence is seen: nginx sends a
    // service heartbeat to either replica, so the wedged one may get none
    // of them before the replica's own alert fires.
    let (seen, seen_by_the_wedge) = tokio::sync::oneshot::channel::<()>();
    // While the wedge lasts: only the wedged replica is "not generating",
    // the healthy one keeps serving, and the service's silence is put on
    // the wedged replica.
    let during = async {
        // From the test's start: the first heartbeat, the wedge and the
        // replica's alert come first (up to 330 s), then the hold.
        let service = until(
            Duration::from_secs(480),
            "the service not generating, attributed",
            async || {
                let targets = common::get_json(&handle, "/api/v1/targets").await?;
                let service = targets["llm"]["liveness"].clone();
                // The service may go silent before the wedged replica is
                // told: its attribution follows once it is.
                (service["state"] == "not_generating" && !service["attributed_to"].is_null())
                    .then_some(service)
            },
        )
        .await;
        let _ = seen.send(());
        let page = metrics(&handle).await;
        let served_before = healthy.state.stats().completed_streams;
        until(
            Duration::from_secs(60),
            "the healthy replica serving",
            async || (healthy.state.stats().completed_streams > served_before).then_some(()),
        )
        .await;
        (service, generating(&page, &a))
    };
    let figures = common::wedge::time_a_held_wedge(
        &handle,
        prom_port,
        ("llm", &b),
        move || wedging.set_wedged(true),
        async {
            let _ = seen_by_the_wedge.await;
        },
        move || unwedging.set_wedged(false),
    );
    let (figures, (service, healthy_generating)) = tokio::join!(figures, during);
    eprintln!("behind nginx, one replica wedged: {figures:?}; service {service}");
    assert_eq!(
        service["attributed_to"],
        serde_json::json!([b]),
        "{service}"
    );
    assert_eq!(
        healthy_generating,
        Some(1.0),
        "the healthy replica keeps serving"
    );
    assert!(figures.to_alert <= 120.0, "{figures:?}");
    assert!(figures.to_recovery <= 16.0, "{figures:?}");
    handle.shutdown();
    handle.wait().await.unwrap();
    healthy.stop().await;
    wedged.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run in flight when the engine wedges: its requests are the
/// heartbeat. The run is cut and failed as "not generating" with its
/// reason, in `/api/v1/runs` and on the page (a failed run never enters a
/// baseline), no verdict takes it, and the requests it sent are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_during_a_wedge_is_an_outage_not_a_measurement() {
    let dir = temp_dir("liveness-run");
    let server = sim().await;
    let text = common::wedge::daemon_config(
        &dir.join("store.db"),
        "*/2 * * * * *",
        (16, 8),
        ("llm", &server.base_url()),
        "[targets.heartbeat]\ninterval = \"30s\"\ntimeout = \"2s\"",
    );
    let handle = common::start_daemon(&text, None).await;
    let runs = async || {
        let page = common::get_json(&handle, "/api/v1/runs?target=llm").await?;
        Some(page["runs"].clone())
    };
    until(Duration::from_secs(30), "a first run", async || {
        runs().await?.as_array()?.first().map(|_| ())
    })
    .await;
    server.state.set_wedged(true);
    // The heartbeat is every 30 s: a run's requests tell first.
    let wedged_run = until(
        Duration::from_secs(30),
        "a run failed as not generating",
        async || {
            let runs = runs().await?;
            runs.as_array()?
                .iter()
                .find(|r| r["outcome"] == "not_generating")
                .cloned()
        },
    )
    .await;
    let reason = wedged_run["error"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("generated no token for 2s"), "{wedged_run}");
    assert_eq!(
        generating(&metrics(&handle).await, ""),
        Some(0.0),
        "the run's requests told the state"
    );
    let page = common::get_text(&handle, "/").await;
    assert!(page.contains("not generating"), "on the status page");
    server.state.set_wedged(false);
    until(Duration::from_secs(30), "generating again", async || {
        (generating(&metrics(&handle).await, "") == Some(1.0)).then_some(())
    })
    .await;
    // The requests the cut run had sent are counted, as no first token.
    assert_eq!(wedged_run["summary"]["failed"], 2, "{wedged_run}");
    let page = metrics(&handle).await;
    let silent: f64 = page
        .scalars(&["sentinel_requests_total"])
        .iter()
        .filter(|s| s.label("outcome") == Some("no_first_token"))
        .map(|s| s.value)
        .sum();
    assert!(silent >= 2.0, "{silent} requests counted as no_first_token");
    every_request_counted_once(&handle, &server).await;
    // No verdict takes the wedged run.
    let verdicts = common::get_text(&handle, "/api/v1/verdicts").await;
    assert!(
        !verdicts.contains("\"regression\"") && !verdicts.contains("\"confirming\""),
        "{verdicts}"
    );
    eprintln!("a run during a wedge: {reason}");
    handle.shutdown();
    handle.wait().await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
