//! A real vLLM restarted with another configuration is a new build, told
//! by its `system_fingerprint`, and recorded once. Slow (two server starts
//! of about a minute each), so ignored by default; it runs with
//! `-- --ignored` when `SENTINEL_REAL_VLLM_SERVE` names the script that
//! starts the server (`../shared/real-vllm/serve.sh`), which it calls with
//! `VLLM_ARGS="--max-num-seqs 8"`, then again with 4, on port
//! `SENTINEL_REAL_VLLM_RESTART_PORT` (default 8102).

use crate::common;

use std::time::Duration;

use common::{metrics, temp_dir, until, value};

/// Starts the real server with `max_num_seqs`; returns its process group.
fn serve(script: &str, port: u16, max_num_seqs: u32) -> i32 {
    common::real_vllm::serve(
        script,
        port,
        &format!("--no-enable-prefix-caching --max-num-seqs {max_num_seqs}"),
    )
}

use common::real_vllm::Served;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real vLLM install: SENTINEL_REAL_VLLM_SERVE=../shared/real-vllm/serve.sh cargo test --release --test integration real_vllm_restart:: -- --ignored"]
async fn a_restart_with_another_max_num_seqs_is_one_new_build_from_the_fingerprint() {
    let script = common::real_vllm::script();
    let port = common::real_vllm::port("SENTINEL_REAL_VLLM_RESTART_PORT", 8102);
    let dir = temp_dir("real-vllm-restart");
    let first = Served(serve(&script, port, 8));
    let text = format!(
        r#"
[scheduler]
schedule = "*/3 * * * * *"
backoff_initial = "1s"
backoff_max = "4s"
[store]
path = "{}"
[[scenarios]]
name = "small"
input_len = 16
output_len = 8
concurrency = 2
num_requests = 4
warmup = 0
[[targets]]
name = "real"
base_url = "http://127.0.0.1:{port}"
scenarios = ["small"]
"#,
        dir.join("store.db").display()
    );
    let handle = common::start_daemon(&text, None).await;
    let store_path = dir.join("store.db");
    let fingerprints = || {
        let store = vllm_sentinel::store::Store::open(&store_path).unwrap();
        let runs = store
            .runs(&vllm_sentinel::store::RunFilter {
                target: Some("real".into()),
                limit: 1000,
                ..Default::default()
            })
            .unwrap();
        let mut seen: Vec<(String, String)> = runs
            .iter()
            .filter(|r| r.summary.completed > 0)
            .filter_map(|r| Some((r.build.clone()?, r.server.system_fingerprint.clone()?)))
            .collect();
        seen.sort();
        seen.dedup();
        seen
    };
    let before = until(
        Duration::from_secs(120),
        "runs of the first build",
        async || {
            let seen = fingerprints();
            (!seen.is_empty()).then_some(seen)
        },
    )
    .await;
    eprintln!("first configuration: {before:?}");

    drop(first);
    let second = Served(serve(&script, port, 4));
    let after = until(
        Duration::from_secs(180),
        "runs of the second build",
        async || {
            let seen = fingerprints();
            (seen.len() >= 2).then_some(seen)
        },
    )
    .await;
    // A few more rounds: still exactly one change.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let page = metrics(&handle).await;
    let seen = fingerprints();
    let changes = vllm_sentinel::store::Store::open(&store_path)
        .unwrap()
        .version_changes("real", "tiny")
        .unwrap();
    eprintln!("after the restart: {after:?}\nversion changes: {changes:?}");
    drop(second);
    handle.shutdown();
    handle.wait().await.unwrap();

    assert_eq!(seen.len(), 2, "two builds, one fingerprint each: {seen:?}");
    assert_ne!(seen[0].1, seen[1].1, "the fingerprints differ");
    assert_ne!(seen[0].0, seen[1].0, "the builds differ");
    assert_eq!(
        changes.iter().filter(|c| c.from_build.is_some()).count(),
        1,
        "one build change: {changes:?}"
    );
    assert_eq!(
        value(&page, "sentinel_build_changes_total", &[("target", "real")]),
        Some(1.0)
    );
}
