//! The daemon binary fed a hostile file_sd file: a byte order mark, 10,000
//! replicas that refuse connections and a few entries that are not
//! addresses (`#`, `?`, quotes, markup, a bidi override). At most
//! `max_replicas` are probed, the rest are counted, each kind of drop is
//! logged once (escaped), and memory, series and log lines stay bounded.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Killed, free_port, temp_dir, until, value, wait_for_port};
use vllm_sentinel::telemetry::exposition::Exposition;

const ENTRIES: usize = 10_000;
const MAX_REPLICAS: usize = 16;
/// Entries that are not `host:port`; the first three are named in the log.
const HOSTILE: [&str; 5] = [
    "evil\u{202e}txt.example:80",
    "a#b:80",
    "h?q=1:80",
    "q\":80",
    "<script>:80",
];

async fn page(port: u16, path: &str) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_file_sd_entries_give_at_most_the_cap_and_few_log_lines() {
    let dir = temp_dir("hostile-discovery");
    // 127.x.y.z:9: every address distinct, every one refusing connections.
    let mut entries: Vec<String> = HOSTILE.iter().map(|h| h.to_string()).collect();
    entries.extend(
        (0..ENTRIES).map(|i| format!("127.{}.{}.{}:9", 1 + i / 62_500, i / 250 % 250, i % 250 + 1)),
    );
    let groups = serde_json::json!([{ "targets": entries, "labels": {"job": "vllm"} }]);
    let file_sd = dir.join("replicas.json");
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend(groups.to_string().as_bytes());
    std::fs::write(&file_sd, bytes).unwrap();

    let port = free_port();
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[exporter]
listen = "127.0.0.1:{port}"
[store]
path = "{}"
[scheduler]
schedule = "* * * * * *"
backoff_initial = "1h"
backoff_max = "1h"
[telemetry]
nvml = false
[[targets]]
name = "fleet"
base_url = "http://127.0.0.1:9"
server_metrics = false
[targets.replicas]
file_sd = "{}"
probe = "replicas"
refresh = "1s"
max_parallel = 8
max_replicas = {MAX_REPLICAS}
[[scenarios]]
name = "s"
input_len = 16
output_len = 4
num_requests = 1
warmup = 0
"#,
            dir.join("store.db").display(),
            file_sd.display()
        ),
    )
    .unwrap();
    let log_path = dir.join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let started = Instant::now();
    let child = Killed(
        Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove("RUST_LOG")
            // The daemon logs to standard output.
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    wait_for_port(port, "the daemon").await;

    // Every replica kept has failed once, by its first heartbeat or run
    // (then backs off for an hour).
    let connect_failures = |page: &Exposition| -> f64 {
        ["sentinel_runs_total", "sentinel_heartbeats_total"]
            .iter()
            .flat_map(|name| page.scalars(&[name]))
            .filter(|s| s.label("outcome") == Some("connect"))
            .map(|s| s.value)
            .sum()
    };
    let metrics = until(
        Duration::from_secs(60),
        "every kept replica probed",
        async || {
            let metrics = Exposition::parse(&page(port, "/metrics").await).unwrap();
            (connect_failures(&metrics) >= MAX_REPLICAS as f64).then_some(metrics)
        },
    )
    .await;
    let probed_after = started.elapsed().as_secs_f64();
    let gauge = |reason: &str| {
        value(
            &metrics,
            "sentinel_replicas_dropped",
            &[("target", "fleet"), ("reason", reason)],
        )
    };
    assert_eq!(
        value(&metrics, "sentinel_replicas", &[("target", "fleet")]),
        Some(MAX_REPLICAS as f64)
    );
    assert_eq!(gauge("over_limit"), Some((ENTRIES - MAX_REPLICAS) as f64));
    assert_eq!(gauge("invalid"), Some(HOSTILE.len() as f64));
    let targets: serde_json::Value =
        serde_json::from_str(&page(port, "/api/v1/targets").await).unwrap();
    let listed = targets["fleet"]["replicas"].as_object().unwrap().len();
    assert_eq!(listed, MAX_REPLICAS);

    // A few more refreshes: nothing more is said of the same drops.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let metrics_text = page(port, "/metrics").await;
    let status = page(port, "/").await;
    let series = metrics_text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let resident_kib = common::hostile::peak_rss_kib(pid).unwrap();
    let seconds = started.elapsed().as_secs_f64();
    drop(child);

    let log = std::fs::read_to_string(&log_path).unwrap();
    let warns: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    let count = |what: &str| warns.iter().filter(|l| l.contains(what)).count();
    assert_eq!(
        count("more replicas listed than max_replicas"),
        1,
        "{warns:#?}"
    );
    assert_eq!(count("not host:port addresses skipped"), 1, "{warns:#?}");
    // Each kept replica: one failed run, one back-off, and no more.
    assert!(
        warns.len() <= 2 * MAX_REPLICAS + 4,
        "{} WARN lines: {warns:#?}",
        warns.len()
    );
    // The bad entries are named escaped, never raw.
    assert!(!log.contains('\u{202e}'), "a raw bidi override in the log");
    let skipped = warns
        .iter()
        .find(|l| l.contains("not host:port addresses skipped"))
        .unwrap();
    assert!(
        skipped.contains(r"evil\u{202e}txt.example:80") && skipped.contains("a#b:80"),
        "{skipped}"
    );
    assert!(!status.contains('\u{202e}') && !status.contains("<script>:80"));
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2000, "a log line of {longest} bytes");
    assert!(
        resident_kib < 100 * 1024,
        "peak resident {resident_kib} KiB"
    );
    println!(
        "{ENTRIES} file_sd entries, max_replicas {MAX_REPLICAS}: every kept replica probed after {probed_after:.1} s; \
in {seconds:.1} s {} WARN lines ({:.1} per second), {} log lines, longest {longest} bytes; \
peak resident {} MiB; {series} series; status page {} bytes",
        warns.len(),
        warns.len() as f64 / seconds,
        log.lines().count(),
        resident_kib / 1024,
        status.len()
    );
}
