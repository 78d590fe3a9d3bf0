//! Users' own prompts and shared prefixes against the simulator: a JSONL
//! dataset completes with the server's token counts, a bad line is one
//! clear error, and a shared prefix shows in the server's prefix-cache
//! counters, on the console, in the result file and on `/metrics`.

use crate::common;

use std::time::Duration;

use vllm_sentinel::client::Endpoint;
use vllm_sentinel::probe::{self, ProbeSpec};
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::workload::dataset::Dataset;

fn fast() -> SimConfig {
    SimConfig {
        ttft_ms: 2.0,
        itl_ms: 1.0,
        ..SimConfig::default()
    }
}

fn spec(base_url: String) -> ProbeSpec {
    ProbeSpec {
        metrics_url: Some(format!("{base_url}/metrics")),
        base_url,
        input_len: 96,
        output_len: 4,
        num_requests: 8,
        concurrency: Some(1),
        run_id: "p".into(),
        ..ProbeSpec::default()
    }
}

#[tokio::test]
async fn a_dataset_of_twenty_prompts_completes_with_the_servers_counts() {
    let sim = SimHandle::start("127.0.0.1:0", fast()).await.unwrap();
    let dir = common::temp_dir("dataset");
    let path = dir.join("prompts.jsonl");
    let lines: Vec<String> = (0..20)
        .map(|i| {
            let words = vec!["word"; i + 1].join(" ");
            match i % 2 {
                0 => format!("{{\"prompt\":\"{words}\",\"max_tokens\":{}}}", 2 + i % 3),
                _ => format!("{{\"messages\":[{{\"role\":\"user\",\"content\":\"{words}\"}}]}}"),
            }
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let dataset = std::sync::Arc::new(Dataset::load(&path).unwrap());
    let mut s = spec(sim.base_url());
    s.num_requests = 20;
    s.endpoint = Endpoint::Chat;
    s.dataset = Some(dataset.clone());
    s.seed = 11;
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(
        result.metrics.completed, 20,
        "{:?}",
        result.records[0].error
    );
    // Every line once: the simulator counts 1 + words for a prompt sent as
    // one user message, and the chat template adds 3.
    let mut inputs: Vec<u32> = result
        .records
        .iter()
        .map(|r| r.prompt_tokens.unwrap())
        .collect();
    inputs.sort();
    let want: Vec<u32> = (0..20).map(|i| 2 + 1 + 1 + i).collect();
    assert_eq!(inputs, want);
    // Lines with max_tokens get theirs; the rest the output length.
    let outputs: u64 = result
        .records
        .iter()
        .map(|r| u64::from(r.output_tokens()))
        .sum();
    let expected: u64 = (0..20u64)
        .map(|i| if i % 2 == 0 { 2 + i % 3 } else { 4 })
        .sum();
    assert_eq!(outputs, expected);
    assert_eq!(result.metrics.total_output_tokens, expected);
    // Messages need the chat endpoint: said before anything is sent.
    s.endpoint = Endpoint::Completions;
    let e = probe::run(&s, None).await.unwrap_err().to_string();
    assert!(
        e.contains("line 2 has chat messages: use the chat endpoint"),
        "{e}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn a_bad_dataset_line_is_one_clear_error() {
    let dir = common::temp_dir("dataset-bad");
    let path = dir.join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"prompt\":\"a\"}\n{\"prompt\":\"b\"}\n{\"prompt\":[1,2]}\n",
    )
    .unwrap();
    let (out, _) = common::run_limited(
        &[
            "probe",
            "--base-url",
            "http://127.0.0.1:9",
            "--dataset-path",
            path.to_str().unwrap(),
        ],
        4 << 30,
        None,
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let want = format!("{} line 3: \"prompt\" must be a string", path.display());
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(stderr.matches("must be a string").count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn a_shared_prefix_shows_in_the_servers_prefix_cache() {
    let sim = SimHandle::start("127.0.0.1:0", fast()).await.unwrap();
    let mut s = spec(sim.base_url());
    s.warmup = 2;
    s.shared_prefix_len = 64;
    let shared = probe::run(&s, None).await.unwrap();
    assert_eq!(shared.metrics.completed, 8);
    let used = shared.prefix_cache.expect("counters read around the run");
    // 64 prefix tokens and the start token: four whole blocks of 16 hit in
    // each request after the first; the warm-up's prefix is another.
    assert_eq!(used.hits, 7.0 * 64.0, "{used:?}");
    assert_eq!(used.queries, 8.0 * 96.0, "{used:?}");
    assert!(shared.records.iter().all(|r| r.prompt_tokens == Some(96)));
    // A new run has a new prefix: nothing left over from the last one.
    s.seed = 99;
    let next = probe::run(&s, None).await.unwrap();
    assert_eq!(next.prefix_cache.unwrap().hits, 7.0 * 64.0);
    s.shared_prefix_len = 0;
    let distinct = probe::run(&s, None).await.unwrap();
    assert!(
        distinct.prefix_cache.is_none(),
        "counters read only for shared prefixes"
    );
    sim.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_exports_each_runs_prefix_cache_use() {
    let sim = SimHandle::start("127.0.0.1:0", fast()).await.unwrap();
    let dir = common::temp_dir("prefix-daemon");
    let text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[[targets]]\nname = \"a\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 48\noutput_len = 4\nnum_requests = 5\nconcurrency = 1\n\
warmup = 0\nshared_prefix_len = 32\n",
        dir.join("s.db").display(),
        sim.base_url()
    );
    let handle = common::start_daemon(&text, None).await;
    let hits = common::until(
        Duration::from_secs(30),
        "a run's prefix-cache use",
        async || {
            let page = common::metrics(&handle).await;
            common::value(
                &page,
                "sentinel_run_prefix_cache_hit_tokens",
                &[("scenario", "s")],
            )
        },
    )
    .await;
    let page = common::metrics(&handle).await;
    let queries = common::value(
        &page,
        "sentinel_run_prefix_cache_query_tokens",
        &[("scenario", "s")],
    );
    assert_eq!(hits, 4.0 * 32.0);
    assert_eq!(queries, Some(5.0 * 48.0));
    handle.shutdown();
    handle.wait().await.unwrap();
    sim.stop().await;
}
