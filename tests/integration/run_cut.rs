//! A run cut at its deadline stops at once: the requests it had in flight
//! are dropped, none of its other requests reaches the server later (where
//! it would overlap the next probe and go uncounted), and each request it
//! sent is counted once.

use crate::common;

use std::time::Duration;

use common::{metrics, temp_dir, until};
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::total;

/// The first run of target `llm` the daemon stored.
async fn first_run(handle: &vllm_sentinel::daemon::DaemonHandle) -> serde_json::Value {
    until(
        Duration::from_secs(60),
        "a run cut at its deadline",
        async || {
            let page = common::get_json(handle, "/api/v1/runs?target=llm").await?;
            page["runs"].as_array()?.first().cloned()
        },
    )
    .await
}

/// A simulator whose first token comes after `ttft_ms`, the next ones
/// `itl_ms` apart; and a daemon configuration that probes it with one
/// scenario every 30 s (`scenario`: its fields), heartbeats off so that
/// every request the simulator gets is a run's, and `more` after.
async fn server_and_config(
    (ttft_ms, itl_ms): (f64, f64),
    dir: &std::path::Path,
    scenario: &str,
    more: &str,
) -> (SimHandle, String) {
    let config = SimConfig {
        ttft_ms,
        itl_ms,
        ..SimConfig::default()
    };
    let server = SimHandle::start("127.0.0.1:0", config).await.unwrap();
    let text = format!(
        "[scheduler]\nschedule = \"*/30 * * * * *\"\nshutdown_grace = \"2s\"\n\
[store]\npath = \"{}\"\n\
[[scenarios]]\nname = \"chat\"\n{scenario}\n\
[[targets]]\nname = \"llm\"\nbase_url = \"{}\"\n[targets.heartbeat]\nenabled = false\n{more}",
        dir.join("store.db").display(),
        server.base_url()
    );
    (server, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_at_its_deadline_sends_nothing_after() {
    // 16 tokens 300 ms apart: each request takes about 5 s. Six requests
    // two at a time, cut at 2 s.
    let dir = temp_dir("run-cut");
    let (server, text) = server_and_config(
        (20.0, 300.0),
        &dir,
        "input_len = 16\noutput_len = 16\nconcurrency = 2\nnum_requests = 6\nwarmup = 0\ndeadline = \"2s\"",
        "",
    )
    .await;
    let handle = common::start_daemon(&text, None).await;
    let run = first_run(&handle).await;
    assert_eq!(run["outcome"], "deadline", "{run}");
    assert_eq!(run["summary"]["failed"], 2, "{run}");
    // Left running, the run's two requests would end about 5 s in and the
    // next two would be sent; the next scheduled run is 30 s away.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let page = metrics(&handle).await;
    // The daemon watches this one target only.
    let counted = total(&page.scalars(&["sentinel_requests_total"]));
    let served = server.state.stats().requests;
    assert_eq!(
        served, 2,
        "the server got only the two requests sent before the cut"
    );
    assert_eq!(counted, Some(2.0), "each counted once");
    handle.shutdown();
    handle.wait().await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run cut at its deadline counts toward its objectives what it
/// measured: each request that ended, with its own latency (a first token
/// after 600 ms misses a 500 ms objective), and each still in flight as
/// bad; its warm-up counts toward none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_runs_requests_count_toward_objectives_by_their_own_latency() {
    // Two warm-up requests, then one at a time until the cut at 3.5 s:
    // a few measured requests end (each about 0.65 s), one is in flight.
    let dir = temp_dir("run-cut-slo");
    let (server, text) = server_and_config(
        (600.0, 10.0),
        &dir,
        "input_len = 16\noutput_len = 4\nconcurrency = 1\nnum_requests = 20\nwarmup = 2\ndeadline = \"3500ms\"",
        "[[slos]]\nname = \"fast\"\nsli = \"ttft\"\nthreshold = \"500ms\"\nobjective = 99\nwindow = \"1h\"\n\
[[slos]]\nname = \"up\"\nsli = \"success\"\nobjective = 99\nwindow = \"1h\"\n",
    )
    .await;
    let handle = common::start_daemon(&text, None).await;
    let run = first_run(&handle).await;
    assert_eq!(run["outcome"], "deadline", "{run}");
    let measured = run["summary"]["failed"].as_u64().unwrap();
    let ([(fast_good, fast_total), (up_good, up_total)], slos) =
        common::slo_counts(&handle, ["fast", "up"]).await;
    assert!(measured >= 2, "{run}");
    assert_eq!(
        (fast_good, fast_total),
        (0, measured),
        "every measured request missed 500 ms: {slos}"
    );
    assert_eq!(up_total, measured, "{slos}");
    assert_eq!(
        up_good,
        measured - 1,
        "the requests that ended succeeded; the one in flight did not: {slos}"
    );
    assert_eq!(
        server.state.stats().requests,
        measured + 2,
        "the server got the warm-up too, which no objective counts"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
