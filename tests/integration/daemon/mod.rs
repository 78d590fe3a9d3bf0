//! The whole daemon in-process against simulated vLLM servers on port 0:
//! its metrics, its store and its API agree with each other and with what
//! the simulators served; broken targets are counted with the right label
//! while the healthy one stays on schedule; a restart restores the last
//! runs. `lifecycle`: a reload swaps the configuration only when it is
//! valid; a shutdown lets a run finish within its grace period.

mod lifecycle;

use std::time::Duration;

use crate::common::{free_port, start_daemon, temp_dir};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{Fault, SimConfig, SimHandle};
use vllm_sentinel::store::{RunFilter, Store};
use vllm_sentinel::telemetry::exposition::Exposition;

async fn get(handle: &DaemonHandle, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("http://{}{path}", handle.addr))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The value of one series, matched on the given labels.
fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let e = Exposition::parse(page).unwrap();
    let matching: Vec<f64> = e
        .scalars(&[name])
        .into_iter()
        .filter(|s| labels.iter().all(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
        .collect();
    if matching.is_empty() {
        None
    } else {
        Some(matching.iter().sum())
    }
}

/// Reads a series from `/metrics` every 100 ms until `done` holds (at most
/// 5 s); returns the last value read.
async fn poll(
    handle: &DaemonHandle,
    name: &str,
    labels: &[(&str, &str)],
    done: impl Fn(Option<f64>) -> bool,
) -> Option<f64> {
    let mut last = None;
    for _ in 0..50 {
        let (_, page) = get(handle, "/metrics").await;
        last = value(&page, name, labels);
        if done(last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// Waits (at most 5 s) until the simulator has received a request.
async fn first_request(sim: &SimHandle) {
    for _ in 0..100 {
        if sim.state.stats().requests > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sim_config(ttft_ms: f64, itl_ms: f64) -> SimConfig {
    SimConfig {
        ttft_ms,
        itl_ms,
        ..SimConfig::default()
    }
}

const SCENARIOS: &str = r#"
[[scenarios]]
name = "tiny"
input_len = 16
output_len = 4
concurrency = 2
num_requests = 3
warmup = 0
[scenarios.slo]
ttft = "1s"
"#;

#[tokio::test]
async fn metrics_store_and_api_agree_with_what_the_simulators_served() {
    let a = SimHandle::start("127.0.0.1:0", sim_config(20.0, 2.0))
        .await
        .unwrap();
    let b = SimHandle::start("127.0.0.1:0", sim_config(30.0, 3.0))
        .await
        .unwrap();
    let dir = temp_dir("daemon-agree");
    let path = dir.join("store.db");
    let config = format!(
        r#"
[store]
path = "{}"
[scheduler]
schedule = "* * * * * *"
[telemetry]
scrape_interval = "500ms"
nvml = false
[[targets]]
name = "a"
base_url = "{}"
[[targets]]
name = "b"
base_url = "{}"
endpoint = "chat"
{SCENARIOS}"#,
        path.display(),
        a.base_url(),
        b.base_url()
    );
    let handle = start_daemon(&config, None).await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (status, readyz) = get(&handle, "/readyz").await;
    assert_eq!((status, readyz.as_str()), (200, "ready\n"));
    let metrics = handle.metrics().clone();
    handle.shutdown();
    handle.wait().await.unwrap();
    let page = metrics.encode();

    let store = Store::open(&path).unwrap();
    for (name, sim) in [("a", &a), ("b", &b)] {
        let runs = store
            .runs(&RunFilter {
                target: Some(name.into()),
                ..Default::default()
            })
            .unwrap();
        assert!(
            runs.len() >= 3,
            "target {name}: only {} runs in 4.5 s at one per second",
            runs.len()
        );
        assert!(runs.iter().all(|r| r.success()), "{runs:?}");
        let completed: usize = runs.iter().map(|r| r.summary.completed).sum();
        let output: u64 = runs.iter().map(|r| r.summary.total_output_tokens).sum();
        // The server also answered the target's heartbeats: one token each.
        let heartbeats = value(
            &page,
            "sentinel_heartbeats_total",
            &[("target", name), ("outcome", "ok")],
        )
        .unwrap_or(0.0) as u64;
        let served = sim.state.stats();
        assert_eq!(
            completed as u64 + heartbeats,
            served.completed_streams,
            "target {name}"
        );
        assert_eq!(output + heartbeats, served.output_tokens, "target {name}");
        let ok_runs = value(
            &page,
            "sentinel_runs_total",
            &[("target", name), ("outcome", "ok")],
        )
        .unwrap();
        assert_eq!(ok_runs as usize, runs.len(), "target {name}");
        let ok_requests = value(
            &page,
            "sentinel_requests_total",
            &[("target", name), ("outcome", "ok")],
        )
        .unwrap();
        assert_eq!(ok_requests as usize, completed, "target {name}");
        let ttft_count = page
            .lines()
            .find(|l| {
                l.starts_with("sentinel_ttft_seconds_count{")
                    && l.contains(&format!("target=\"{name}\""))
            })
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok());
        assert_eq!(ttft_count, Some(completed as f64), "target {name}");
        // The last-run gauges are the newest stored run's exact numbers.
        let newest = &runs[0];
        let p50 = value(
            &page,
            "sentinel_run_latency_seconds",
            &[("target", name), ("metric", "ttft"), ("stat", "p50")],
        )
        .unwrap();
        assert_eq!(p50, newest.summary.ttft.p50, "target {name}");
        assert_eq!(
            value(&page, "sentinel_run_goodput_ratio", &[("target", name)]),
            Some(1.0)
        );
        assert_eq!(
            value(&page, "sentinel_target_up", &[("target", name)]),
            Some(1.0)
        );
        assert_eq!(
            value(
                &page,
                "sentinel_server_info",
                &[
                    ("target", name),
                    ("version", "0.32.0"),
                    ("model", "sim-model")
                ]
            ),
            Some(1.0)
        );
        // The load read around every run is stored with it.
        assert!(
            newest.load_before.is_some_and(|l| l.running.is_some()),
            "{newest:?}"
        );
        assert_eq!(store.samples(newest.id.unwrap()).unwrap().len(), 3);
    }
    let b_ttft = value(
        &page,
        "sentinel_run_latency_seconds",
        &[("target", "b"), ("metric", "ttft"), ("stat", "mean")],
    )
    .unwrap();
    assert!(
        (0.030..0.100).contains(&b_ttft),
        "b's injected TTFT is 30 ms, measured {b_ttft}"
    );

    // Restart on the same store with a schedule that will not fire: the
    // exporter shows every pair's last run again and the API lists them all.
    let idle = config.replace("schedule = \"* * * * * *\"", "schedule = \"0 0 1 1 *\"");
    let again = start_daemon(&idle, None).await;
    let (_, page2) = get(&again, "/metrics").await;
    for name in ["a", "b"] {
        let newest = &store
            .runs(&RunFilter {
                target: Some(name.into()),
                limit: 1,
                ..Default::default()
            })
            .unwrap()[0];
        let ts = value(
            &page2,
            "sentinel_run_last_timestamp_seconds",
            &[("target", name)],
        )
        .unwrap();
        assert!((ts - newest.started_at.timestamp_millis() as f64 / 1000.0).abs() < 1e-6);
        let p50 = value(
            &page2,
            "sentinel_run_latency_seconds",
            &[("target", name), ("metric", "tpot"), ("stat", "p50")],
        )
        .unwrap();
        assert_eq!(p50, newest.summary.tpot.p50);
    }
    let (_, json) = get(&again, "/api/v1/runs?target=a&limit=200").await;
    let listed: serde_json::Value = serde_json::from_str(&json).unwrap();
    let listed = listed["runs"].as_array().unwrap();
    let stored = store
        .runs(&RunFilter {
            target: Some("a".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(listed.len(), stored.len());
    assert_eq!(listed[0]["id"].as_i64(), stored[0].id);
    let times: Vec<&str> = listed
        .iter()
        .map(|r| r["started_at"].as_str().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {times:?}"
    );
    let (_, html) = get(&again, "/").await;
    assert!(
        html.contains("<td>tiny</td>") && html.contains("sim-model"),
        "{html}"
    );
    again.shutdown();
    again.wait().await.unwrap();
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn broken_targets_are_counted_while_the_healthy_one_stays_on_schedule() {
    let good = SimHandle::start("127.0.0.1:0", sim_config(5.0, 1.0))
        .await
        .unwrap();
    let hang = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            fault: Some(Fault::Hang),
            ..sim_config(5.0, 1.0)
        },
    )
    .await
    .unwrap();
    let garbage = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            fault: Some(Fault::Garbage),
            ..sim_config(5.0, 1.0)
        },
    )
    .await
    .unwrap();
    // Each request takes about 2 s: the server goes away mid-run.
    let dies = SimHandle::start("127.0.0.1:0", sim_config(5.0, 500.0))
        .await
        .unwrap();
    let refused = format!("127.0.0.1:{}", free_port());
    let target = |name: &str, url: String| {
        format!(
            "[[targets]]\nname = \"{name}\"\nbase_url = \"{url}\"\n[targets.timeouts]\nconnect = \"1s\"\nfirst_token = \"700ms\"\nrequest = \"3s\"\n"
        )
    };
    let dir = temp_dir("daemon-faults");
    let config = format!(
        "[store]\npath = \"{}\"\n[scheduler]\nschedule = \"* * * * * *\"\nbackoff_initial = \"2s\"\nbackoff_max = \"4s\"\n[telemetry]\nscrape_interval = \"500ms\"\nnvml = false\n{}{}{}{}{}{SCENARIOS}",
        dir.join("store.db").display(),
        target("good", good.base_url()),
        target("refused", format!("http://{refused}")),
        target("hang", hang.base_url()),
        target("garbage", garbage.base_url()),
        target("dies", dies.base_url()),
    );
    let handle = start_daemon(&config, None).await;
    // Let the dying target's first run get going, then take it away.
    first_request(&dies).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    dies.stop().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (status, page) = get(&handle, "/metrics").await;
    assert_eq!(status, 200, "/metrics still answers");

    let good_runs = value(
        &page,
        "sentinel_runs_total",
        &[("target", "good"), ("outcome", "ok")],
    )
    .unwrap();
    assert!(
        good_runs >= 4.0,
        "the healthy target kept its schedule: {good_runs} runs"
    );
    assert_eq!(
        value(&page, "sentinel_target_up", &[("target", "good")]),
        Some(1.0)
    );

    let refused_runs = value(
        &page,
        "sentinel_runs_total",
        &[("target", "refused"), ("outcome", "connect")],
    )
    .unwrap();
    assert!(refused_runs >= 1.0, "{page}");
    assert_eq!(
        value(&page, "sentinel_target_up", &[("target", "refused")]),
        Some(0.0)
    );
    let backed_off = value(
        &page,
        "sentinel_scheduler_skipped_runs_total",
        &[("target", "refused"), ("reason", "backoff")],
    )
    .unwrap();
    assert!(
        backed_off >= 1.0,
        "a target found down is backed off, not hammered"
    );
    assert!(
        refused_runs <= 3.0,
        "at most one attempt per back-off period: {refused_runs}"
    );

    let timeouts = value(
        &page,
        "sentinel_requests_total",
        &[("target", "hang"), ("outcome", "no_first_token")],
    )
    .unwrap();
    // The first run's two requests in flight; after a run whose server
    // went silent a heartbeat goes at once, and the back-off holds the rest.
    assert!(timeouts >= 2.0, "{timeouts}");
    let garbled = value(
        &page,
        "sentinel_requests_total",
        &[("target", "garbage"), ("outcome", "stream_error")],
    )
    .unwrap();
    assert!(garbled >= 3.0, "{garbled}");
    let cut = value(&page, "sentinel_requests_total", &[("target", "dies")]).unwrap()
        - value(
            &page,
            "sentinel_requests_total",
            &[("target", "dies"), ("outcome", "ok")],
        )
        .unwrap();
    assert!(
        cut >= 1.0,
        "requests cut by the server going away are failures"
    );
    let dies_down = value(
        &page,
        "sentinel_runs_total",
        &[("target", "dies"), ("outcome", "connect")],
    )
    .unwrap();
    assert!(dies_down >= 1.0, "later runs find it gone");
    for t in ["hang", "garbage", "dies"] {
        assert_eq!(
            value(&page, "sentinel_run_success", &[("target", t)]),
            Some(0.0),
            "{t}"
        );
    }
    let store = handle.store().clone();
    handle.shutdown();
    handle.wait().await.unwrap();
    let runs = store.runs(&RunFilter::default()).unwrap();
    assert!(
        runs.iter()
            .any(|r| r.target == "hang" && r.error.as_deref().is_some_and(|e| !e.is_empty()))
    );
    good.stop().await;
    hang.stop().await;
    garbage.stop().await;
}
