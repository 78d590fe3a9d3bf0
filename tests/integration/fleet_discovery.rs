//! Replicas found by DNS (an in-process DNS server on 127.0.0.1 whose A
//! records change mid-test) and by a Prometheus file_sd file (rewritten
//! mid-test), each replica a simulator probed directly. New replicas get a
//! worker and series within one refresh; vanished ones lose their series;
//! a failed read keeps the last list and is counted.

use crate::common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::dns::DnsServer;
use common::{metrics, temp_dir, until, until_equal, value};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

/// A simulated replica serving `version`, listening on `addr`.
async fn sim_at(addr: &str, version: &str) -> SimHandle {
    let config = SimConfig {
        ttft_ms: 10.0,
        itl_ms: 1.0,
        version: version.into(),
        ..SimConfig::default()
    };
    SimHandle::start(addr, config).await.unwrap()
}

/// One target whose replicas come from `replicas` (a TOML body), probed
/// every second, replicas only.
async fn start_daemon(dir: &std::path::Path, replicas: &str) -> DaemonHandle {
    let text = format!(
        r#"
[scheduler]
schedule = "* * * * * *"
[store]
path = "{}"
[[scenarios]]
name = "interactive"
input_len = 16
output_len = 4
concurrency = 2
num_requests = 4
warmup = 0
[[targets]]
name = "fleet"
base_url = "http://127.0.0.1:9"
scenarios = ["interactive"]
[targets.replicas]
refresh = "1s"
probe = "replicas"
max_parallel = 2
{replicas}
"#,
        dir.join("store.db").display()
    );
    common::start_daemon(&text, None).await
}

/// The replicas whose run series are on the page.
fn replica_series(page: &Exposition) -> Vec<String> {
    common::run_label_values(page, "replica")
}

/// The replicas the daemon lists for the target now.
async fn replicas_found(handle: &DaemonHandle) -> Vec<String> {
    let targets: serde_json::Value = reqwest::get(format!("http://{}/api/v1/targets", handle.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    targets["fleet"]["replicas"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Waits until both the list and the run series are `expected`; returns
/// how long each took. A timeout says which of the two lagged and what it
/// was.
async fn follow(handle: &DaemonHandle, expected: &[String], what: &str) -> (f64, f64) {
    let started = Instant::now();
    let expected = expected.to_vec();
    until_equal(
        LIMIT,
        &format!("{what} (the list)"),
        &expected,
        async || replicas_found(handle).await,
    )
    .await;
    let listed = started.elapsed().as_secs_f64();
    until_equal(
        LIMIT,
        &format!("{what} (the series)"),
        &expected,
        async || replica_series(&metrics(handle).await),
    )
    .await;
    (listed, started.elapsed().as_secs_f64())
}

/// How long a change may take to be followed.
const LIMIT: Duration = Duration::from_secs(30);

fn failures(page: &Exposition) -> f64 {
    value(
        page,
        "sentinel_replica_discovery_failures_total",
        &[("target", "fleet")],
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_replicas_are_followed_as_the_answers_change() {
    let dir = temp_dir("fleet-dns");
    // Three replicas on one port, at 127.0.0.1, .2 and .3: DNS gives
    // addresses, the port is the configuration's.
    let first = sim_at("127.0.0.1:0", "0.32.0").await;
    let port = first.addr.port();
    let second = sim_at(&format!("127.0.0.2:{port}"), "0.32.0").await;
    let third = sim_at(&format!("127.0.0.3:{port}"), "0.33.0").await;
    let ip = |n: u8| Ipv4Addr::new(127, 0, 0, n);
    let label = |n: u8| format!("127.0.0.{n}:{port}");
    let dns = DnsServer::start(&[ip(1), ip(2)]).await;
    let handle = start_daemon(
        &dir,
        &format!(
            "dns = \"replicas.test.:{port}\"\nname_server = \"{}\"",
            dns.addr
        ),
    )
    .await;
    follow(&handle, &[label(1), label(2)], "the first two replicas").await;

    // The answers change: .1 goes, .3 comes.
    dns.set(&[ip(2), ip(3)]);
    let (listed, series) = follow(&handle, &[label(2), label(3)], "the new replica list").await;
    eprintln!(
        "DNS change followed: listed after {listed:.1} s, series after {series:.1} s (refresh 1 s)"
    );
    let page = metrics(&handle).await;
    assert!(
        value(
            &page,
            "sentinel_run_last_timestamp_seconds",
            &[("replica", &label(3)), ("build", "0.33.0")]
        )
        .is_some(),
        "the new replica's runs are filed under its build"
    );
    assert!(
        value(&page, "sentinel_fleet_builds", &[("build", "0.33.0")]).is_some(),
        "the new replica's build serves"
    );
    assert_eq!(
        value(&page, "sentinel_replicas", &[("target", "fleet")]),
        Some(2.0)
    );

    // The name server fails: the last list is kept, the failures counted.
    dns.fail();
    let before = failures(&page);
    until(Duration::from_secs(30), "a counted failure", async || {
        (failures(&metrics(&handle).await) >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(replicas_found(&handle).await, [label(2), label(3)]);
    let page = metrics(&handle).await;
    assert_eq!(replica_series(&page), [label(2), label(3)]);
    drop((first, second, third));
    handle.shutdown();
    handle.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sd_replicas_are_followed_as_the_file_is_rewritten() {
    let dir = temp_dir("fleet-file-sd");
    let a = sim_at("127.0.0.1:0", "0.32.0").await;
    let b = sim_at("127.0.0.1:0", "0.32.0").await;
    let c = sim_at("127.0.0.1:0", "0.32.0").await;
    let [la, lb, lc] = [&a, &b, &c].map(|s| s.addr.to_string());
    let path = dir.join("replicas.json");
    let write = |labels: &[&String]| {
        let groups = serde_json::json!([{"targets": labels, "labels": {"job": "vllm"}}]);
        // Written whole, then renamed: a reader never sees half a file.
        let partial = dir.join("replicas.json.tmp");
        std::fs::write(&partial, groups.to_string()).unwrap();
        std::fs::rename(&partial, &path).unwrap();
    };
    write(&[&la, &lb]);
    let handle = start_daemon(&dir, &format!("file_sd = \"{}\"", path.display())).await;
    let mut expected = vec![la.clone(), lb.clone()];
    expected.sort();
    follow(&handle, &expected, "the first two replicas").await;

    write(&[&lb, &lc]);
    let mut expected = vec![lb.clone(), lc.clone()];
    expected.sort();
    let (listed, series) = follow(&handle, &expected, "the rewritten list").await;
    eprintln!(
        "file_sd rewrite followed: listed after {listed:.1} s, series after {series:.1} s (refresh 1 s)"
    );

    // A file that cannot be read keeps the last list; the failure counts.
    std::fs::write(&path, "[{\"targets\": [\"http://not-an-address/\"]}]").unwrap();
    let before = failures(&metrics(&handle).await);
    until(Duration::from_secs(30), "a counted failure", async || {
        (failures(&metrics(&handle).await) >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(replicas_found(&handle).await, expected);
    handle.shutdown();
    handle.wait().await.unwrap();
}
