//! Agreement with `vllm bench serve` on a real vLLM server. Slow, so the
//! tests are ignored by default and run with `-- --ignored` when
//! `SENTINEL_REAL_VLLM_URL` names the server (for example
//! the one `../shared/real-vllm/serve.sh 8100` starts). The reference
//! client is `SENTINEL_VLLM_BIN` (default `$HOME/.cache/real-vllm/venv/bin/vllm`)
//! with the tokenizer in `SENTINEL_VLLM_TOKENIZER` (default
//! `$HOME/.cache/real-vllm/tiny-model`).
//!
//! Both clients run the same workload (input 128, output 64, concurrency 8,
//! 64 requests, ignore_eos), pinned to CPU 1, interleaved, after one
//! discarded warm-up run each; the medians of seven runs must agree within
//! 10% for mean and median TTFT (or 5 ms, whichever is larger), TPOT, ITL
//! and E2EL; output token totals
//! must be identical, and input totals within 1% (ours is exactly the
//! requested length per request, calibrated through `/tokenize`; vLLM's
//! random dataset decodes random ids and re-encodes them, which drifts by a
//! fraction of a token per prompt). The table is printed and written to
//! `target/real-vllm-comparison-<endpoint>.md`.
//!
//! The server must run with prefix caching off
//! (`VLLM_ARGS=--no-enable-prefix-caching serve.sh 8100`): on a small
//! vocabulary (the tiny model has 413 tokens) `vllm bench serve`'s random
//! prompts share whole KV blocks, so about 40% of its prompt tokens are
//! served from the prefix cache and its TTFT halves, while our prompts are
//! distinct by design. The test reads the server's prefix-cache hits around
//! every run and says so instead of comparing unlike workloads.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{self, TempDir};

/// TTFT agrees within 10% or this many milliseconds, whichever is larger.
const TTFT_TOLERANCE_MS: f64 = 5.0;

const KEYS: [&str; 8] = [
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
];
/// On a 2-core machine shared by the server and both clients, one run's
/// median TTFT at concurrency 8 moves by about 20% from run to run for either
/// client (whether a new prompt's prefill waits for a decode step), so the
/// comparison takes the median of seven interleaved rounds.
const ROUNDS: usize = 7;

struct Setup {
    url: String,
    vllm: PathBuf,
    tokenizer: PathBuf,
    model: String,
    work: TempDir,
}

fn setup() -> Setup {
    let url = common::real_vllm::url("SENTINEL_REAL_VLLM_URL");
    let home = std::env::var("HOME").unwrap_or_default();
    let cache = Path::new(&home).join(".cache/real-vllm");
    let work = common::temp_dir("real-vllm");
    Setup {
        url,
        vllm: std::env::var("SENTINEL_VLLM_BIN").map_or(cache.join("venv/bin/vllm"), PathBuf::from),
        tokenizer: std::env::var("SENTINEL_VLLM_TOKENIZER")
            .map_or(cache.join("tiny-model"), PathBuf::from),
        model: std::env::var("SENTINEL_VLLM_MODEL").unwrap_or_else(|_| "tiny".into()),
        work,
    }
}

fn pinned(program: &Path) -> Command {
    if Path::new("/usr/bin/taskset").exists() {
        let mut c = Command::new("/usr/bin/taskset");
        c.arg("-c").arg("1").arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run_vllm(s: &Setup, chat: bool, tag: &str) -> Value {
    let file = format!("vb-{tag}.json");
    let mut c = pinned(&s.vllm);
    c.env("HF_HUB_OFFLINE", "1")
        .env("VLLM_TARGET_DEVICE", "cpu")
        .current_dir(&s.work)
        .args(["bench", "serve"]);
    if chat {
        c.args([
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
        ]);
    } else {
        c.args(["--backend", "vllm"]);
    }
    c.args([
        "--model",
        &s.model,
        "--base-url",
        &s.url,
        "--dataset-name",
        "random",
    ])
    .arg("--tokenizer")
    .arg(&s.tokenizer)
    .args([
        "--random-input-len",
        "128",
        "--random-output-len",
        "64",
        "--num-prompts",
        "64",
    ])
    .args([
        "--max-concurrency",
        "8",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
    ])
    .args([
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
    ])
    .arg(s.work.as_os_str())
    .args(["--result-filename", &file]);
    let out = c.output().expect("running vllm bench serve");
    assert!(
        out.status.success(),
        "vllm bench serve failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(s.work.join(&file)).unwrap()).unwrap()
}

fn run_ours(s: &Setup, chat: bool, tag: &str) -> Value {
    let file = s.work.join(format!("ours-{tag}.json"));
    let out = pinned(Path::new(env!("CARGO_BIN_EXE_vllm-sentinel")))
        .args(["probe", "--base-url", &s.url, "--model", &s.model])
        .args(["--endpoint", if chat { "chat" } else { "completions" }])
        .args([
            "--input-len",
            "128",
            "--output-len",
            "64",
            "--concurrency",
            "8",
            "--num-requests",
            "64",
        ])
        .arg("--result-json")
        .arg(&file)
        .output()
        .expect("running vllm-sentinel probe");
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

/// The server's cumulative prefix-cache hits, in tokens.
fn prefix_cache_hits(s: &Setup) -> f64 {
    let page = tokio::runtime::Runtime::new().unwrap().block_on(async {
        reqwest::get(format!("{}/metrics", s.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    page.lines()
        .filter(|l| l.starts_with("vllm:prefix_cache_hits_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn compare(chat: bool) {
    let s = setup();
    let name = if chat { "chat" } else { "completions" };
    // The first run after a start warms the server's caches: discard it.
    run_vllm(&s, chat, &format!("{name}-warm"));
    run_ours(&s, chat, &format!("{name}-warm"));
    let (mut theirs, mut ours) = (Vec::new(), Vec::new());
    let mut cached = [0.0f64; 2];
    for round in 0..ROUNDS {
        let before = prefix_cache_hits(&s);
        theirs.push(run_vllm(&s, chat, &format!("{name}-{round}")));
        let between = prefix_cache_hits(&s);
        ours.push(run_ours(&s, chat, &format!("{name}-{round}")));
        cached[0] += between - before;
        cached[1] += prefix_cache_hits(&s) - between;
    }
    let mut table = format!(
        "endpoint {name}: median of {ROUNDS} interleaved runs (input 128, output 64, concurrency 8, 64 requests)\n\n\
         | metric | vllm bench serve | vllm-sentinel | difference |\n|---|---:|---:|---:|\n"
    );
    let mut failures = Vec::new();
    for key in KEYS {
        let t = median(theirs.iter().map(|v| v[key].as_f64().unwrap()).collect());
        let o = median(ours.iter().map(|v| v[key].as_f64().unwrap()).collect());
        let diff = (o - t) / t;
        table.push_str(&format!(
            "| {key} | {t:.3} | {o:.3} | {:+.1}% |\n",
            diff * 100.0
        ));
        // TTFT also within 5 ms: the tiny model's TTFT is about 40 ms, so
        // a few milliseconds of one client's own scheduling (Python's event
        // loop serving eight streams) are over 10% of it; ours measured
        // 3-5 ms lower in most runs on this 2-core machine. TPOT and ITL
        // (about 5 ms) keep the relative bound alone.
        let within_ms = key.contains("ttft") && (o - t).abs() <= TTFT_TOLERANCE_MS;
        if diff.abs() > 0.10 && !within_ms {
            failures.push(format!(
                "{key}: vllm {t:.3} vs ours {o:.3} ({:+.1}%)",
                diff * 100.0
            ));
        }
    }
    for key in ["total_input_tokens", "total_output_tokens", "completed"] {
        let t: Vec<u64> = theirs.iter().map(|v| v[key].as_u64().unwrap()).collect();
        let o: Vec<u64> = ours.iter().map(|v| v[key].as_u64().unwrap()).collect();
        table.push_str(&format!("| {key} | {t:?} | {o:?} | |\n"));
        let agree = if key == "total_input_tokens" {
            t.iter()
                .zip(&o)
                .all(|(t, o)| (*o as f64 - *t as f64).abs() <= 0.01 * *t as f64)
        } else {
            t == o
        };
        if !agree {
            failures.push(format!("{key}: vllm {t:?} vs ours {o:?}"));
        }
    }
    if !chat {
        let exact = 64 * 128;
        if ours
            .iter()
            .any(|v| v["total_input_tokens"].as_u64() != Some(exact))
        {
            failures.push(format!(
                "our prompts are not exactly {exact} tokens in total"
            ));
        }
    }
    table.push_str(&format!(
        "| prefix-cache hits (tokens, all rounds) | {} | {} | |\n",
        cached[0], cached[1]
    ));
    if cached[0] > 0.0 || cached[1] > 0.0 {
        failures.push(format!(
            "the server served {} (vllm bench serve) and {} (ours) prompt tokens from its prefix cache: \
             restart it with VLLM_ARGS=--no-enable-prefix-caching to compare the same work",
            cached[0], cached[1]
        ));
    }
    println!("{table}");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let _ = std::fs::write(
        target.join(format!("real-vllm-comparison-{name}.md")),
        &table,
    );
    assert!(
        failures.is_empty(),
        "disagreements:\n{}\n\n{table}",
        failures.join("\n")
    );
}

#[test]
#[ignore = "needs a real vLLM server: SENTINEL_REAL_VLLM_URL=... cargo test --release --test integration real_vllm:: -- --ignored"]
fn completions_agree_with_vllm_bench_serve() {
    compare(false);
}

#[test]
#[ignore = "needs a real vLLM server: SENTINEL_REAL_VLLM_URL=... cargo test --release --test integration real_vllm:: -- --ignored"]
fn chat_agrees_with_vllm_bench_serve() {
    compare(true);
}

/// The watcher against the real server: known as vLLM with its version,
/// and its `/metrics` (today's names, `engine` label) gives the load of the
/// probed model.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real vLLM server: SENTINEL_REAL_VLLM_URL=... cargo test --release --test integration real_vllm:: -- --ignored"]
async fn the_watcher_knows_a_real_vllm_and_reads_its_load() {
    use vllm_sentinel::client::server_api::ServerKind;
    use vllm_sentinel::telemetry::TargetWatch;
    let s = setup();
    let text = format!(
        "[[targets]]\nname = \"real\"\nbase_url = \"{}\"\n[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\n",
        s.url
    );
    let config = vllm_sentinel::config::Config::parse(&text, "test").unwrap();
    let target = config.target("real").unwrap().clone();
    let watch = TargetWatch::new(
        reqwest::Client::new(),
        target,
        None,
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    let server = watch.identity().await.unwrap();
    eprintln!("real vLLM: {server:?}");
    assert_eq!(server.kind, ServerKind::Vllm);
    assert!(server.identity.version.is_some());
    let load = watch.load(Some(&server.model)).await.unwrap().unwrap();
    eprintln!("real vLLM load: {load:?}");
    assert!(load.running.is_some() && load.waiting.is_some());
    let kv = load.kv_cache_usage.unwrap();
    assert!((0.0..=1.0).contains(&kv), "{kv}");
}
