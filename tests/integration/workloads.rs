//! Workloads beyond random prompts: reasoning models (TTFT keeps vLLM's
//! meaning, TTFO is the first answer token), real reasoning and tool-call
//! streams decoded from captures, and the result file keeping every key.

use crate::common;

use std::time::Duration;

use axum::body::{Body, Bytes};
use vllm_sentinel::client::{
    Capture, ClientConfig, Endpoint, Outcome, PreparedRequest, StreamingClient, Timeouts,
};
use vllm_sentinel::probe::{self, ProbeSpec};
use vllm_sentinel::sim::{SimConfig, SimHandle};

fn spec(base_url: String) -> ProbeSpec {
    ProbeSpec {
        base_url,
        input_len: 16,
        num_requests: 8,
        concurrency: Some(2),
        run_id: "w".into(),
        calibrate: false,
        ..ProbeSpec::default()
    }
}

#[tokio::test]
async fn ttfo_is_ttft_plus_the_reasoning_gaps() {
    let itl_ms = 4.0;
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 20.0,
            itl_ms,
            reasoning_tokens: 20,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.endpoint = Endpoint::Chat;
    s.output_len = 30;
    sim.state.enable_traces();
    let result = probe::run(&s, None).await.unwrap();
    let traces = sim.state.take_traces();
    let m = &result.metrics;
    assert_eq!(m.completed, 8, "{:?}", result.records[0].error);
    assert_eq!(m.reasoning_requests, 8);
    assert_eq!(m.total_reasoning_tokens, 8 * 20);
    // The simulator schedules the answer 20 gaps after the first reasoning
    // token; a busy machine may wake it late, so the client's TTFO - TTFT is
    // compared with the gap the simulator really left between its writes.
    let mut client_error_ms: Vec<f64> = result
        .records
        .iter()
        .map(|r| {
            // Role chunk and first reasoning token share the first write;
            // 20 reasoning gaps later the answer starts.
            assert_eq!(r.reasoning_chunks, 20);
            assert_eq!(r.first_answer, Some(r.chunk_times[21]));
            let trace = &traces[&format!("sentinel-w-{}", s.warmup + r.index)];
            let scheduled = trace.due[20] - trace.due[0];
            assert_eq!(scheduled.as_secs_f64() * 1e3, 20.0 * itl_ms);
            let emitted = trace.emitted[20] - trace.emitted[0];
            let measured = r.ttfo().unwrap() - r.ttft().unwrap();
            (measured.as_secs_f64() - emitted.as_secs_f64()).abs() * 1e3
        })
        .collect();
    client_error_ms.sort_by(f64::total_cmp);
    let median = client_error_ms[client_error_ms.len() / 2];
    assert!(
        median < 1.0,
        "TTFO - TTFT off the 20 emitted gaps by {client_error_ms:?} ms"
    );
    let ttfo = m.ttfo.as_ref().expect("a TTFO distribution");
    assert!(
        ttfo.mean > m.ttft.mean + 0.07,
        "{} vs {}",
        ttfo.mean,
        m.ttft.mean
    );
    // Without reasoning there is no TTFO section at all.
    sim.state
        .update(serde_json::json!({"reasoning_tokens": 0}))
        .unwrap();
    let plain = probe::run(&s, None).await.unwrap();
    assert!(plain.metrics.ttfo.is_none());
    sim.stop().await;
}

/// The keys `--result-json` wrote before TTFO existed: none may go.
const RESULT_KEYS: &[&str] = &[
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "errors",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "std_e2el_ms",
    "p99_e2el_ms",
    "outcomes",
    "server_version",
    "prompt_lengths_calibrated",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
];

#[tokio::test]
async fn the_result_file_keeps_its_keys_and_adds_ttfo() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 5.0,
            itl_ms: 1.0,
            reasoning_tokens: 6,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let dir = common::temp_dir("workloads-result");
    let json = dir.join("result.json");
    let url = sim.base_url();
    let (out, _) = common::run_limited(
        &[
            "probe",
            "--base-url",
            &url,
            "--endpoint",
            "chat",
            "--num-requests",
            "4",
            "--concurrency",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "10",
            "--no-calibrate",
            "--metric-percentiles",
            "50,90,99",
            "--result-json",
            json.to_str().unwrap(),
        ],
        4 << 30,
        None,
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Time to First Output Token"), "{stdout}");
    assert!(stdout.contains("Median TTFO (ms):"), "{stdout}");
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for key in RESULT_KEYS {
        assert!(result.get(key).is_some(), "the result lost {key:?}");
    }
    for key in [
        "mean_ttfo_ms",
        "median_ttfo_ms",
        "std_ttfo_ms",
        "p90_ttfo_ms",
        "p99_ttfo_ms",
    ] {
        let ttfo = result[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing"));
        assert!(ttfo > 0.0, "{key} {ttfo}");
    }
    assert_eq!(result["total_reasoning_tokens"], 4 * 6);
    assert!(result["mean_ttfo_ms"].as_f64() > result["mean_ttft_ms"].as_f64());
    sim.stop().await;
}

/// Serves `lines` as one SSE stream, each as its own `data:` event a few
/// milliseconds apart, ending with `[DONE]`.
async fn serve_stream(lines: Vec<String>) -> (String, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let lines = lines.clone();
            async move {
                let events = futures_util::stream::unfold(0usize, move |i| {
                    let lines = lines.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let event = match lines.get(i) {
                            Some(line) => format!("data: {line}\n\n"),
                            None if i == lines.len() => "data: [DONE]\n\n".to_owned(),
                            None => return None,
                        };
                        Some((Ok::<_, std::io::Error>(Bytes::from(event)), i + 1))
                    }
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(events))
                    .unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    (url, task)
}

/// What a capture holds, counted from its lines.
struct Expected {
    choice_chunks: usize,
    reasoning_chunks: u32,
    first_answer: usize,
    reasoning_tokens: u32,
    completion_tokens: u32,
}

fn expected(lines: &[String]) -> Expected {
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let with_choices: Vec<&serde_json::Value> = parsed
        .iter()
        .filter(|v| v["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .collect();
    let delta = |v: &serde_json::Value| v["choices"][0]["delta"].clone();
    let usage = parsed
        .iter()
        .rev()
        .find(|v| v["usage"].is_object())
        .unwrap()["usage"]
        .clone();
    Expected {
        choice_chunks: with_choices.len(),
        reasoning_chunks: with_choices
            .iter()
            .filter(|v| {
                delta(v)["reasoning_content"]
                    .as_str()
                    .is_some_and(|r| !r.is_empty())
            })
            .count() as u32,
        first_answer: with_choices
            .iter()
            .position(|v| {
                delta(v)["tool_calls"].is_array()
                    || delta(v)["content"].as_str().is_some_and(|c| !c.is_empty())
            })
            .unwrap(),
        reasoning_tokens: usage["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap() as u32,
        completion_tokens: usage["completion_tokens"].as_u64().unwrap() as u32,
    }
}

#[tokio::test]
async fn real_reasoning_and_tool_call_streams_decode() {
    for name in [
        "chunks_deepseek-reasoner_reasoning-then-tool-call_ai-sdk-fixture.jsonl",
        "chunks_xai-grok-3-mini_reasoning-content_tool-call_ai-sdk-fixture.jsonl",
    ] {
        let Some(path) = common::skip::realworld_file(name) else {
            return;
        };
        let lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        let want = expected(&lines);
        let (url, server) = serve_stream(lines).await;
        let client = StreamingClient::new(ClientConfig {
            base_url: url,
            endpoint: Endpoint::Chat,
            model: "m".into(),
            api_key: None,
            timeouts: Timeouts::default(),
            ignore_eos: false,
            min_tokens: false,
            capture: Capture::Text,
            extra: None,
            check: None,
            progress: None,
            headers: Default::default(),
            gateway: Default::default(),
            build_header: None,
        })
        .unwrap();
        // The request asks for what the whole answer came to (xAI counts
        // reasoning apart from completion tokens).
        let asked = want.completion_tokens.max(want.choice_chunks as u32);
        let request = PreparedRequest {
            request_id: "fixture".into(),
            prompt: "weather?".into(),
            max_tokens: asked,
            ..Default::default()
        };
        let r = client.send(&request, None).await;
        assert_eq!(
            r.chunk_times.len(),
            want.choice_chunks,
            "{name}: {:?}",
            r.error
        );
        assert_eq!(r.reasoning_chunks, want.reasoning_chunks, "{name}");
        assert_eq!(r.reasoning_tokens, Some(want.reasoning_tokens), "{name}");
        assert_eq!(r.completion_tokens, Some(want.completion_tokens), "{name}");
        assert_eq!(
            r.first_answer,
            Some(r.chunk_times[want.first_answer]),
            "{name}"
        );
        assert!(r.ttfo().unwrap() > r.ttft().unwrap(), "{name}");
        let calls = &r.output.as_ref().unwrap().tool_calls;
        assert_eq!(calls.len(), 1, "{name}");
        assert_eq!(calls[0].0, "weather", "{name}");
        let arguments: serde_json::Value = serde_json::from_str(&calls[0].1).unwrap();
        assert_eq!(arguments["location"], "San Francisco", "{name}");
        // Without ignore_eos a shorter answer is no failure.
        assert_eq!(r.outcome, Outcome::Ok, "{name}: {:?}", r.error);
        server.abort();
    }
}

#[tokio::test]
async fn structured_output_and_tool_calls_are_measured_and_checked() {
    use vllm_sentinel::workload::kinds::ScenarioKind;
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 5.0,
            itl_ms: 1.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.output_len = 64;
    for (kind, endpoint) in [
        (ScenarioKind::JsonSchema, Endpoint::Completions),
        (ScenarioKind::JsonSchema, Endpoint::Chat),
        (ScenarioKind::ToolCall, Endpoint::Chat),
    ] {
        s.kind = kind;
        s.endpoint = endpoint;
        let result = probe::run(&s, None).await.unwrap();
        let what = format!("{kind:?} on {endpoint:?}");
        assert_eq!(
            result.metrics.completed, 8,
            "{what}: {:?}",
            result.records[0].error
        );
        // The answer ends with its structure, well before 64 tokens, and
        // that is no short output.
        let r = &result.records[0];
        assert!(
            r.output_tokens() < 20 && r.output_tokens() > 3,
            "{what}: {}",
            r.output_tokens()
        );
        assert!(
            result.metrics.tpot.count == 8 && result.metrics.ttft.mean > 0.0,
            "{what}"
        );
    }
    // Cut short by max_tokens, the answer is no longer valid JSON.
    s.output_len = 3;
    for kind in [ScenarioKind::JsonSchema, ScenarioKind::ToolCall] {
        s.kind = kind;
        let result = probe::run(&s, None).await.unwrap();
        assert_eq!(result.metrics.completed, 0, "{kind:?}");
        for r in &result.records {
            assert_eq!(r.outcome, Outcome::InvalidOutput, "{kind:?}");
            assert!(
                r.error.as_deref().unwrap().contains("is not JSON"),
                "{:?}",
                r.error
            );
        }
    }
    s.endpoint = Endpoint::Completions;
    let e = probe::run(&s, None).await.unwrap_err().to_string();
    assert!(
        e.contains("a tool_call scenario needs the chat endpoint"),
        "{e}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn multi_turn_conversations_send_their_history_and_report_each_turn() {
    use vllm_sentinel::workload::kinds::ScenarioKind;
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 5.0,
            prefill_ms_per_token: 0.5,
            itl_ms: 1.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.kind = ScenarioKind::MultiTurn;
    s.endpoint = Endpoint::Chat;
    s.num_requests = 4;
    s.turns = 3;
    s.input_len = 8;
    s.output_len = 5;
    let result = probe::run(&s, None).await.unwrap();
    let m = &result.metrics;
    assert_eq!(m.completed, 12, "{:?}", result.records[0].error);
    assert_eq!(m.turns.len(), 3);
    for conversation in result.records.chunks(3) {
        let turns: Vec<Option<u32>> = conversation.iter().map(|r| r.turn).collect();
        assert_eq!(turns, [Some(1), Some(2), Some(3)]);
        // Each turn carries the turns and answers before it: the prompt
        // grows by at least a user message and a 5-token answer.
        let inputs: Vec<u32> = conversation
            .iter()
            .map(|r| r.prompt_tokens.unwrap())
            .collect();
        assert!(
            inputs[1] >= inputs[0] + 8 + 5 && inputs[2] >= inputs[1] + 8 + 5,
            "{inputs:?}"
        );
        // A turn starts only after the previous answer ended.
        assert!(conversation[1].start >= conversation[0].end);
    }
    // Longer prompts take longer to prefill: TTFT grows with the turn.
    assert!(m.turns[2].ttft.mean > m.turns[0].ttft.mean, "{:?}", m.turns);
    assert_eq!(m.turns[1].itl.count, 4 * 5);
    // The warm-up is sent, apart, before the conversations.
    let served = sim.state.stats().requests;
    s.warmup = 2;
    let warmed = probe::run(&s, None).await.unwrap();
    assert_eq!(warmed.metrics.completed, 12);
    assert_eq!(sim.state.stats().requests - served, 2 + 12);
    // A dataset's lines are the users' turns: conversations x turns of them.
    let dir = common::temp_dir("multi-turn-dataset");
    let path = dir.join("turns.jsonl");
    std::fs::write(&path, "{\"prompt\":\"a b c\"}\n{\"prompt\":\"d e f\"}\n").unwrap();
    s.dataset = Some(std::sync::Arc::new(
        vllm_sentinel::workload::dataset::Dataset::load(&path).unwrap(),
    ));
    s.warmup = 0;
    let from_dataset = probe::run(&s, None).await.unwrap();
    assert_eq!(from_dataset.metrics.completed, 12);
    assert_eq!(from_dataset.metrics.turns.len(), 3);
    s.dataset = None;
    s.endpoint = Endpoint::Completions;
    let e = probe::run(&s, None).await.unwrap_err().to_string();
    assert!(
        e.contains("a multi_turn scenario needs the chat endpoint"),
        "{e}"
    );
    sim.stop().await;
}
