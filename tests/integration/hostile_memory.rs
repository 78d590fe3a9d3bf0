//! The daemon's own binary against a server that sends without end: a
//! stream line that never ends, an event that never ends, a model list
//! that never ends, a stream that never stops, and `/metrics` and DCGM
//! pages that never end. Each is cut off with a bounded outcome, and the
//! daemon's resident memory comes back close to what it was before within
//! seconds of each.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::hostile::{HostileServer, Mode, peak_rss_kib, rss_kib, run_outcome};

/// How much resident memory one oversized case may leave behind. A case
/// that held the body it was sent would cost hundreds of MiB.
const GROWTH_KIB: u64 = 48 * 1024;
/// The highest resident memory the daemon may reach during one case. The
/// largest body read is a 32 MiB model list, and three reads of it may run
/// at once (the telemetry's, a run's and a heartbeat's), each holding at
/// most the limit and a block: with the baseline and pages freed less
/// than a second before, about 130 MiB at worst.
const PEAK_KIB: u64 = 160 * 1024;

/// Starts a new measure of the daemon's peak resident memory. Where the
/// kernel does not let the mark be reset, the peak measured is the whole
/// test's, which is stricter.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}
/// How long freed memory may stay resident: the daemon's allocator gives
/// pages unused for a second back to the kernel.
const GIVEN_BACK_WITHIN: Duration = Duration::from_secs(5);

/// The daemon's resident memory once it is under `limit` KiB, or when
/// [`GIVEN_BACK_WITHIN`] has passed.
async fn resident_settled(pid: u32, limit: u64) -> u64 {
    let deadline = std::time::Instant::now() + GIVEN_BACK_WITHIN;
    loop {
        let now = rss_kib(pid).unwrap();
        if now < limit || std::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn get_json(url: &str) -> Option<serde_json::Value> {
    reqwest::get(url).await.ok()?.json().await.ok()
}

/// The newest run of the hostile target whose id is above `after`.
async fn run_after(base: &str, after: i64, what: &str) -> serde_json::Value {
    let url = format!("{base}/api/v1/runs?target=hostile&limit=1");
    common::until(Duration::from_secs(60), what, async || {
        let page = get_json(&url).await?;
        let run = page["runs"].as_array()?.first()?.clone();
        (run["id"].as_i64()? > after).then_some(run)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_answers_are_cut_off_and_cost_bounded_memory() {
    let hostile = HostileServer::start(Mode::Normal).await;
    let dir = common::temp_dir("hostile-memory");
    let port = common::free_port();
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            r#"[exporter]
listen = "127.0.0.1:{port}"
[store]
path = "{store}"
[scheduler]
backoff_initial = "1s"
backoff_max = "1s"
[telemetry]
scrape_interval = "1s"
nvml = false
[[targets]]
name = "hostile"
base_url = "{url}"
metrics_url = "{url}/metrics"
dcgm_url = "{url}/dcgm"
schedule = "* * * * * *"
[targets.timeouts]
first_token = "5s"
stall = "2s"
request = "10s"
[[scenarios]]
name = "s"
input_len = 16
output_len = 8
num_requests = 2
concurrency = 1
warmup = 0
"#,
            store = dir.join("store.db").display(),
            url = hostile.url
        ),
    )
    .unwrap();
    let daemon = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = daemon.id();
    let _daemon = common::Killed(daemon);
    let base = format!("http://127.0.0.1:{port}");

    // Settled: a good run and a few telemetry reads behind it.
    let mut last = run_after(&base, 0, "a first run").await;
    while run_outcome(&last) != "ok" {
        last = run_after(&base, last["id"].as_i64().unwrap(), "a good run").await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = rss_kib(pid).unwrap();
    println!("resident before the oversized cases: {before} KiB");

    let cases = [
        (
            "a line without end",
            Mode::EndlessLine,
            "stream_error",
            "line longer than 1 MiB",
        ),
        (
            "an event without end",
            Mode::EndlessEvent,
            "stream_error",
            "event larger than 1 MiB",
        ),
        (
            "a stream that never stops",
            Mode::Runaway,
            "stream_error",
            "more output than requested",
        ),
        (
            "a model list without end",
            Mode::EndlessModels,
            "stream_error",
            "longer than 32 MiB",
        ),
        (
            "a model list without end, a model per chunk",
            Mode::EndlessModelsInPieces,
            "stream_error",
            "longer than 32 MiB",
        ),
    ];
    for (what, mode, expected, says) in cases {
        reset_peak(pid);
        hostile.set(mode);
        // The run under way when the mode changed may have begun before it.
        let first = run_after(&base, last["id"].as_i64().unwrap(), what).await;
        last = run_after(&base, first["id"].as_i64().unwrap(), what).await;
        let error = last["error"].as_str().unwrap_or("");
        assert_eq!(run_outcome(&last), expected, "{what}: {last}");
        assert!(error.contains(says), "{what}: {error}");
        let after = resident_settled(pid, before + GROWTH_KIB).await;
        // Up to the next case: the reads of the case still going count.
        let peak = peak_rss_kib(pid).unwrap();
        println!(
            "{what}: outcome {expected}, \"{error}\"; peak {peak} KiB, resident after {after} KiB"
        );
        assert!(
            after < before + GROWTH_KIB,
            "{what}: {before} -> {after} KiB"
        );
        assert!(peak < PEAK_KIB, "{what}: peak {peak} KiB");
    }

    // Pages without end: each read is cut off and counted, several times.
    reset_peak(pid);
    hostile.set(Mode::EndlessPages);
    let status = common::until(Duration::from_secs(30), "both pages refused", async || {
        let page = reqwest::get(&base).await.ok()?.text().await.ok()?;
        (page.matches("the answer is longer than 8 MiB").count() >= 2).then_some(page)
    })
    .await;
    assert!(status.contains("/dcgm"), "the DCGM source is named");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for source in ["server", "dcgm"] {
        let line = format!("sentinel_telemetry_up{{source=\"{source}\",target=\"hostile\"}} 0");
        assert!(metrics.contains(&line), "{line} missing");
    }
    let after = resident_settled(pid, before + GROWTH_KIB).await;
    let peak = peak_rss_kib(pid).unwrap();
    println!("pages without end: peak {peak} KiB, resident after {after} KiB");
    assert!(
        after < before + GROWTH_KIB,
        "pages: {before} -> {after} KiB"
    );
    assert!(peak < PEAK_KIB, "pages: peak {peak} KiB");
}
