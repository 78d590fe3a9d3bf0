//! A real vLLM restarted with another configuration is a new build, told
//! by its `system_fingerprint`, and recorded once; restarted with the
//! same one it is the same build, and each start's first runs are its
//! warm-up, told by its `process_start_time_seconds`. Slow (two server starts
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
use vllm_sentinel::store::starts::NoWarmup;
use vllm_sentinel::verdict::warmup::WarmupRule;

/// The daemon probing the server on `port` every 3 s, its store in `dir`.
fn config(dir: &std::path::Path, port: u16) -> String {
    format!(
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
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real vLLM install: SENTINEL_REAL_VLLM_SERVE=../shared/real-vllm/serve.sh cargo test --release --test integration real_vllm_restart:: -- --ignored"]
async fn a_restart_with_another_max_num_seqs_is_one_new_build_from_the_fingerprint() {
    let script = common::real_vllm::script();
    let port = common::real_vllm::port("SENTINEL_REAL_VLLM_RESTART_PORT", 8102);
    let dir = temp_dir("real-vllm-restart");
    let first = Served(serve(&script, port, 8));
    let text = config(&dir, port);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real vLLM install: SENTINEL_REAL_VLLM_SERVE=../shared/real-vllm/serve.sh cargo test --release --test integration real_vllm_restart:: -- --ignored"]
async fn a_restart_with_the_same_configuration_is_the_same_build_warmed_up_again() {
    use vllm_sentinel::store::Store;
    use vllm_sentinel::store::baselines::PairKey;
    let script = common::real_vllm::script();
    let port = common::real_vllm::port("SENTINEL_REAL_VLLM_RESTART_PORT", 8102);
    let dir = temp_dir("real-vllm-same-restart");
    let first = Served(serve(&script, port, 8));
    let handle = common::start_daemon(&config(&dir, port), None).await;
    let store = Store::open(&dir.join("store.db")).unwrap();
    let key = PairKey {
        target: "real".into(),
        model: "tiny".into(),
        scenario: "small".into(),
    };
    // Every completed run of the one build, oldest first.
    let runs = || -> Vec<vllm_sentinel::vocabulary::records::RunRecord> {
        let builds = store.version_changes("real", "tiny").unwrap();
        let Some(build) = builds.last().map(|c| c.to_build.clone()) else {
            return Vec::new();
        };
        store
            .newest_ok_runs(&key, &build, &NoWarmup, None, &[], 1000)
            .unwrap()
    };
    let started = until(Duration::from_secs(120), "6 runs", async || {
        let runs = runs();
        (runs.len() >= 6).then(|| runs[0].server_started_s())
    })
    .await
    .expect("the start time read from vLLM's /metrics");
    drop(first);
    let second = Served(serve(&script, port, 8));
    let restarted = until(
        Duration::from_secs(180),
        "6 runs after the restart",
        async || {
            let runs = runs();
            let after: Vec<_> = runs
                .iter()
                .filter(|r| r.server_started_s() != Some(started))
                .collect();
            (after.len() >= 6).then(|| after[0].server_started_s())
        },
    )
    .await
    .expect("the new start time read");
    drop(second);
    handle.shutdown();
    handle.wait().await.unwrap();

    let changes = store.version_changes("real", "tiny").unwrap();
    assert_eq!(changes.len(), 1, "one build: {changes:?}");
    let build = &changes[0].to_build;
    let all = runs();
    assert!(restarted > started, "{restarted} after {started}");
    let of = |start: f64| -> Vec<&vllm_sentinel::vocabulary::records::RunRecord> {
        all.iter()
            .filter(|r| r.server_started_s() == Some(start))
            .collect()
    };
    let median = |runs: &[&vllm_sentinel::vocabulary::records::RunRecord]| {
        let mut t: Vec<f64> = runs.iter().map(|r| r.summary.ttft.p50).collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    for start in [started, restarted] {
        let runs = of(start);
        let later = median(&runs[2..]);
        eprintln!(
            "start {start}: {} runs, TTFT p50 of its first 3 against its later runs' median {:.1} ms: {:?}",
            runs.len(),
            later * 1e3,
            runs.iter()
                .take(3)
                .map(|r| format!("{:.2}x", r.summary.ttft.p50 / later))
                .collect::<Vec<_>>()
        );
    }
    let warm_up: Vec<i64> = [started, restarted]
        .iter()
        .flat_map(|s| of(*s).into_iter().take(2))
        .filter_map(|r| r.id)
        .collect();
    let judged: Vec<i64> = store
        .newest_ok_runs(&key, build, &WarmupRule(2), None, &[], 1000)
        .unwrap()
        .iter()
        .filter_map(|r| r.id)
        .collect();
    assert_eq!(judged.len(), all.len() - 4);
    assert!(judged.iter().all(|id| !warm_up.contains(id)));
    let slower: Vec<_> = store
        .evaluations_after(0, 1000)
        .unwrap()
        .into_iter()
        .filter(|(_, e)| e.state == "regression" || e.state == "confirming")
        .collect();
    assert!(slower.is_empty(), "{slower:#?}");
}
