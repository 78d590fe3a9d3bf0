//! Workloads on a real vLLM server, with prefix caching on (the default:
//! `../shared/real-vllm/serve.sh 8100`). Ignored by default; run with
//! `SENTINEL_REAL_VLLM_URL=http://127.0.0.1:8100 cargo test --release
//! --test integration real_vllm_workloads:: -- --ignored --test-threads 1
//! --nocapture`.
//!
//! - A run whose requests share a 128-token prefix raises the server's
//!   prefix-cache hits by at least half of (requests - 1) x 128; the same
//!   run without a shared prefix by about nothing.
//! - A dataset of 20 prompts completes 20 requests, each with the input
//!   length the server's own tokenizer gives its prompt.

use crate::common;

use std::sync::Arc;

use vllm_sentinel::client::server_api::ServerApi;
use vllm_sentinel::client::{Endpoint, http};
use vllm_sentinel::probe::{self, ProbeSpec};
use vllm_sentinel::vocabulary::records::ServerLoad;
use vllm_sentinel::workload::dataset::Dataset;

fn url() -> String {
    common::real_vllm::url("SENTINEL_REAL_VLLM_URL")
}

fn spec(url: &str) -> ProbeSpec {
    ProbeSpec {
        base_url: url.to_owned(),
        metrics_url: Some(format!("{url}/metrics")),
        input_len: 256,
        output_len: 8,
        num_requests: 8,
        concurrency: Some(1),
        warmup: 1,
        run_id: "real-workloads".into(),
        ..ProbeSpec::default()
    }
}

async fn load(url: &str) -> ServerLoad {
    let http = http::client_builder().build().unwrap();
    vllm_sentinel::telemetry::read_load(
        &http,
        &format!("{url}/metrics"),
        url,
        None,
        std::time::Duration::from_secs(10),
        None,
    )
    .await
    .unwrap()
}

#[tokio::test]
#[ignore = "needs a real vLLM server: SENTINEL_REAL_VLLM_URL=... cargo test --release --test integration real_vllm_workloads:: -- --ignored"]
async fn a_shared_prefix_raises_a_real_servers_prefix_cache_hits() {
    let url = url();
    let mut shared = spec(&url);
    shared.shared_prefix_len = 128;
    shared.seed = rand::random();
    let result = probe::run(&shared, None).await.unwrap();
    assert_eq!(result.metrics.completed, 8);
    let used = result.prefix_cache.expect("vLLM counts its prefix cache");
    let floor = 0.5 * 7.0 * 128.0;
    println!(
        "shared prefix 128: hits {} of {} queried tokens (floor {floor}); inputs {:?}",
        used.hits,
        used.queries,
        result
            .records
            .iter()
            .map(|r| r.prompt_tokens)
            .collect::<Vec<_>>()
    );
    assert!(used.hits >= floor, "{used:?}: is prefix caching on?");
    let mut distinct = spec(&url);
    distinct.seed = rand::random();
    let before = load(&url).await;
    let result = probe::run(&distinct, None).await.unwrap();
    let after = load(&url).await;
    assert_eq!(result.metrics.completed, 8);
    let hits = after.prefix_cache_hits.unwrap() - before.prefix_cache_hits.unwrap();
    let queries = after.prefix_cache_queries.unwrap() - before.prefix_cache_queries.unwrap();
    println!("no shared prefix: hits {hits} of {queries} queried tokens (warm-up included)");
    assert!(hits <= 32.0, "distinct prompts hit {hits} tokens");
}

#[tokio::test]
#[ignore = "needs a real vLLM server: SENTINEL_REAL_VLLM_URL=... cargo test --release --test integration real_vllm_workloads:: -- --ignored"]
async fn a_dataset_completes_with_the_real_servers_token_counts() {
    let url = url();
    let dir = common::temp_dir("real-dataset");
    let path = dir.join("prompts.jsonl");
    let prompts: Vec<String> = (0..20)
        .map(|i| {
            format!(
                "Question {i}: what is the capital of country number {}?",
                i * 7
            )
        })
        .collect();
    let text: Vec<String> = prompts
        .iter()
        .map(|p| serde_json::json!({ "prompt": p, "max_tokens": 6 }).to_string())
        .collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    let mut s = spec(&url);
    s.dataset = Some(Arc::new(Dataset::load(&path).unwrap()));
    s.num_requests = 20;
    s.warmup = 0;
    s.concurrency = Some(4);
    s.endpoint = Endpoint::Completions;
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(
        result.metrics.completed, 20,
        "{:?}",
        result.records[0].error
    );
    let api = ServerApi::new(&url, None, std::time::Duration::from_secs(10)).unwrap();
    let mut counted = Vec::new();
    for p in &prompts {
        counted.push(
            api.count_tokens(&result.model.id, Endpoint::Completions, p)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let mut sent: Vec<u32> = result
        .records
        .iter()
        .map(|r| r.prompt_tokens.unwrap())
        .collect();
    sent.sort();
    counted.sort();
    println!("dataset of 20: input tokens {sent:?}");
    assert_eq!(
        sent, counted,
        "usage.prompt_tokens is the server's count of each line"
    );
    assert_eq!(result.metrics.total_output_tokens, 20 * 6);
}

/// The greedy answers of the drift canary's prompts on the server at `url`.
async fn drift_answers(url: &str) -> Vec<vllm_sentinel::verdict::drift::Answer> {
    use vllm_sentinel::workload::kinds::ScenarioKind;
    let mut s = spec(url);
    s.kind = ScenarioKind::Drift;
    s.output_len = 24;
    s.warmup = 0;
    s.concurrency = Some(2);
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(result.metrics.completed, 8, "{:?}", result.records[0].error);
    let run = vllm_sentinel::vocabulary::records::RunRecord::from_probe(
        "t",
        "drift",
        chrono::Utc::now(),
        &result,
        false,
        vllm_sentinel::client::RequestRecord::sample_row,
    );
    assert_eq!(run.answers.len(), 8);
    assert!(
        run.answers
            .iter()
            .all(|a| a.tokens.len() == 24 && a.logprobs.iter().all(|l| l.is_finite()))
    );
    run.answers
}

/// Needs a second server of another dtype:
/// `VLLM_ARGS="--dtype float32" serve.sh 8101` and
/// `SENTINEL_REAL_VLLM_OTHER_URL=http://127.0.0.1:8101`.
#[tokio::test]
#[ignore = "needs real vLLM servers: SENTINEL_REAL_VLLM_URL and SENTINEL_REAL_VLLM_OTHER_URL (another --dtype)"]
async fn the_drift_canary_tells_a_dtype_change_and_not_a_rerun() {
    use vllm_sentinel::verdict::drift::{DriftThresholds, compare};
    let url = url();
    let other = common::real_vllm::url("SENTINEL_REAL_VLLM_OTHER_URL");
    let first = drift_answers(&url).await;
    let again = drift_answers(&url).await;
    let same = compare(&first, &again, &DriftThresholds::default());
    println!("same build twice: {}", same.sentence("bfloat16"));
    assert_eq!(same.diverged, 0, "{same:?}");
    assert!(!same.drift);
    let changed = drift_answers(&other).await;
    let report = compare(&first, &changed, &DriftThresholds::default());
    println!("bfloat16 -> float32: {}", report.sentence("float32"));
    for p in &report.prompts {
        println!(
            "  prompt {}: first divergence {:?}, mean |d logprob| {:.4}",
            p.prompt, p.first_divergence, p.mean_abs_logprob_diff
        );
    }
    assert!(
        report.diverged > 0 || report.logprob_shift > 0.0,
        "{report:?}"
    );
    assert!(report.drift, "{report:?}");
}
