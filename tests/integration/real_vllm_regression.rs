//! On a real vLLM, the shipped detector against real regressions: a
//! daemon watches the server, which is then restarted slower: with
//! `--max-num-seqs 1` (an engine that takes one sequence at a time: with
//! the probe's concurrency 2, every other request queues behind the one in
//! flight), or prefilling in chunks of 16 tokens (`--max-num-batched-tokens
//! 16`: TTFT about +65%, TPOT faster). The restart is a new build (its
//! `system_fingerprint`), judged against the first build's baseline with
//! the `[detector]` defaults, and must be a regression within a few of its
//! runs; the first build must raise none. Then the daemon's runs are
//! exported and replayed: every stored verdict comes out again, on real
//! runs. Slow (two server starts of about a minute each and 50-80 runs),
//! so ignored by default; they run with `-- --ignored --test-threads 1`
//! when `SENTINEL_REAL_VLLM_SERVE` names the script that starts the server
//! (`../shared/real-vllm/serve.sh`), on port
//! `SENTINEL_REAL_VLLM_REGRESSION_PORT` (default 8104).

use crate::common;

use std::time::Duration;

use common::real_vllm::{Served, serve};
use common::{temp_dir, until};
use vllm_sentinel::store::Store;
use vllm_sentinel::store::baselines::PairKey;
use vllm_sentinel::verdict::State;
use vllm_sentinel::vocabulary::records::RunRecord;

/// Runs of the first build before the restart: its warm-up (2), baseline
/// (30) and a candidate window (12) judged against it.
const FIRST_BUILD_RUNS: usize = 44;

/// The first build's flags.
const FIRST_ARGS: &str = "--no-enable-prefix-caching --max-num-seqs 8";

/// Watches the real server started with `FIRST_ARGS` for
/// [`FIRST_BUILD_RUNS`] runs, restarts it with `slower_args`, and asserts
/// the restarted build's regression by its `within_runs`-th run with
/// TTFT flagged at least `ttft_at_least` slower, none on the first build,
/// and replay giving every stored verdict again.
async fn restarted_slower(slower_args: &str, within_runs: usize, ttft_at_least: f64) {
    let script = common::real_vllm::script();
    let port = common::real_vllm::port("SENTINEL_REAL_VLLM_REGRESSION_PORT", 8104);
    let dir = temp_dir("real-vllm-regression");
    let store_path = dir.join("store.db");
    let config_path = dir.join("sentinel.toml");
    let first = Served(serve(&script, port, FIRST_ARGS));
    // The recorded traces' probe (benches/traces), every 2 s; the
    // detector as it ships.
    let text = format!(
        r#"
[scheduler]
schedule = "*/2 * * * * *"
backoff_initial = "1s"
backoff_max = "4s"
[store]
path = "{}"
[[scenarios]]
name = "probe"
input_len = 64
output_len = 16
concurrency = 2
num_requests = 8
warmup = 1
[[targets]]
name = "real"
base_url = "http://127.0.0.1:{port}"
scenarios = ["probe"]
"#,
        store_path.display()
    );
    let handle = common::start_daemon(&text, Some(&config_path)).await;
    let store = Store::open(&store_path).unwrap();
    let key = PairKey {
        target: "real".into(),
        model: "tiny".into(),
        scenario: "probe".into(),
    };
    // The target's completed runs, oldest first (the store gives the
    // newest first).
    let completed_runs = || -> Vec<RunRecord> {
        let mut runs = store
            .runs(&vllm_sentinel::store::RunFilter {
                target: Some("real".into()),
                limit: 1000,
                ..Default::default()
            })
            .unwrap();
        runs.retain(|r| r.summary.completed > 0);
        runs.reverse();
        runs
    };
    // The builds the runs were of, in the order they first served.
    let builds = || -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for build in completed_runs().into_iter().filter_map(|r| r.build) {
            if !seen.contains(&build) {
                seen.push(build);
            }
        }
        seen
    };
    let first_build = until(
        Duration::from_secs(300),
        "the first build's runs",
        async || {
            let build = builds().into_iter().next()?;
            (store.count_ok_runs(&key, &build).unwrap() >= FIRST_BUILD_RUNS).then_some(build)
        },
    )
    .await;
    let before_restart = common::replayed::stored(&store);

    drop(first);
    let restarted = Served(serve(&script, port, slower_args));
    let (second_build, regression) = until(
        Duration::from_secs(300),
        "the restarted build's regression",
        async || {
            let second = builds().into_iter().find(|b| *b != first_build)?;
            let regression = common::replayed::stored(&store)
                .into_iter()
                .find(|v| v.build == second && v.state == State::Regression);
            match regression {
                Some(v) => Some((second, Some(v))),
                None if store.count_ok_runs(&key, &second).unwrap() > within_runs + 4 => {
                    Some((second, None))
                }
                None => None,
            }
        },
    )
    .await;
    handle.shutdown();
    handle.wait().await.unwrap();
    drop(restarted);

    let runs = completed_runs();
    // The median over a build's completed runs of their TTFT and TPOT
    // p50, in milliseconds.
    let medians = |build: &str| {
        let runs: Vec<_> = runs
            .iter()
            .filter(|r| r.build.as_deref() == Some(build))
            .collect();
        let median = |values: Vec<f64>| {
            1000.0
                * vllm_sentinel::stats::percentile_sorted(
                    &vllm_sentinel::stats::sorted(&values),
                    50.0,
                )
        };
        (
            median(runs.iter().map(|r| r.summary.ttft.p50).collect()),
            median(runs.iter().map(|r| r.summary.tpot.p50).collect()),
        )
    };
    let (first_ttft, first_tpot) = medians(&first_build);
    let (second_ttft, second_tpot) = medians(&second_build);
    eprintln!(
        "first build {first_build}: {} runs before the restart, {} verdicts, TTFT p50 {first_ttft:.1} ms, \
         TPOT p50 {first_tpot:.2} ms (medians of its runs); restarted build {second_build}: \
         TTFT p50 {second_ttft:.1} ms, TPOT p50 {second_tpot:.2} ms",
        store.count_ok_runs(&key, &first_build).unwrap(),
        before_restart.len(),
    );
    let false_regressions: Vec<_> = before_restart
        .iter()
        .filter(|v| v.state == State::Regression)
        .map(|v| v.reason.clone())
        .collect();
    assert!(
        false_regressions.is_empty(),
        "the unchanged first build raised regressions: {false_regressions:?}"
    );
    let verdict = regression
        .unwrap_or_else(|| panic!("no regression within the restarted build's {within_runs} runs"));
    // The restarted build's runs up to the one the regression followed
    // (judged once that run was filed, so it started before).
    let runs_to_regression = runs
        .iter()
        .filter(|r| r.build.as_ref() == Some(&second_build) && r.started_at <= verdict.at)
        .count();
    eprintln!(
        "restarted with {slower_args}: regression stored after {runs_to_regression} completed \
         run(s) of the restarted build ({} judged after warm-up): {}",
        verdict.candidate_runs, verdict.reason
    );
    assert_eq!(
        verdict.reference_build.as_deref(),
        Some(first_build.as_str())
    );
    assert!(
        runs_to_regression <= within_runs,
        "{runs_to_regression} runs"
    );
    assert!(
        verdict
            .evaluation
            .metrics
            .iter()
            .any(|m| m.metric.starts_with("ttft")
                && m.flagged
                && m.relative_change > ttft_at_least),
        "TTFT not flagged: {}",
        verdict.reason
    );

    common::replayed::assert_replay_equals_stored(&store_path, &config_path, &dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real vLLM install: SENTINEL_REAL_VLLM_SERVE=../shared/real-vllm/serve.sh cargo test --release --test integration real_vllm_regression:: -- --ignored --test-threads 1"]
async fn a_real_server_restarted_to_take_one_sequence_at_a_time_is_a_regression_at_once() {
    // Every other request queues behind the one in flight: TTFT p50
    // 4-5 times as long (measured 14 ms, then 62-73 ms).
    restarted_slower("--no-enable-prefix-caching --max-num-seqs 1", 10, 0.5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real vLLM install: SENTINEL_REAL_VLLM_SERVE=../shared/real-vllm/serve.sh cargo test --release --test integration real_vllm_regression:: -- --ignored --test-threads 1"]
async fn a_real_server_restarted_to_prefill_in_chunks_of_16_tokens_is_a_regression() {
    // The probe's 64-token prompts are prefilled in 4 steps: TTFT p50
    // about +65% (measured with `probe`, 8 runs each: median 18.8 ms,
    // then 31.0 ms), TPOT about 20% faster. Against a young history
    // the upgrade verdict catches a +50% TTFT step on the recorded
    // `quiet` trace within 10 runs in 43% of trials, half of them by the
    // 14th within 40 (README, "How well it detects"): 30 runs leave room.
    restarted_slower(
        "--no-enable-prefix-caching --max-num-seqs 8 --max-num-batched-tokens 16",
        30,
        0.2,
    )
    .await;
}
