//! `--result-json`: one JSON object with the keys of
//! `vllm bench serve --save-result`, so tools that read vLLM's result files
//! read ours unchanged, plus a few `sentinel_`-free extras at the end.

use serde_json::{Map, Value, json};

use super::console::percentile_word;
use crate::client::Endpoint;
use crate::probe::{ProbeResult, ProbeSpec};
use crate::stats::Distribution;

fn put_metric(obj: &mut Map<String, Value>, name: &str, d: &Distribution) {
    obj.insert(format!("mean_{name}_ms"), json!(d.mean * 1000.0));
    obj.insert(format!("median_{name}_ms"), json!(d.median * 1000.0));
    obj.insert(format!("std_{name}_ms"), json!(d.std * 1000.0));
    for (p, v) in &d.percentiles {
        obj.insert(
            format!("p{}_{name}_ms", percentile_word(*p)),
            json!(v * 1000.0),
        );
    }
}

/// Builds the result object.
///
/// One insert per field of `vllm bench serve`'s result file, in its order:
/// a flat list is easier to check against that file than pieces would be.
pub fn build(spec: &ProbeSpec, result: &ProbeResult) -> Value {
    let m = &result.metrics;
    let mut obj = Map::new();
    obj.insert(
        "date".into(),
        json!(chrono::Local::now().format("%Y%m%d-%H%M%S").to_string()),
    );
    let backend = match spec.endpoint {
        Endpoint::Completions => "vllm",
        Endpoint::Chat => "openai-chat",
    };
    obj.insert("endpoint_type".into(), json!(backend));
    obj.insert("backend".into(), json!(backend));
    obj.insert("label".into(), Value::Null);
    obj.insert("model_id".into(), json!(result.model.id));
    obj.insert(
        "tokenizer_id".into(),
        json!(
            result
                .model
                .root
                .clone()
                .unwrap_or_else(|| result.model.id.clone())
        ),
    );
    obj.insert("num_prompts".into(), json!(spec.num_requests));
    obj.insert(
        "request_rate".into(),
        spec.request_rate.map_or(json!("inf"), |r| json!(r)),
    );
    obj.insert("burstiness".into(), json!(spec.burstiness));
    obj.insert("max_concurrency".into(), json!(spec.concurrency));
    obj.insert("duration".into(), json!(m.duration_s));
    obj.insert("completed".into(), json!(m.completed));
    obj.insert("failed".into(), json!(m.failed));
    obj.insert("total_input_tokens".into(), json!(m.total_input_tokens));
    obj.insert("total_output_tokens".into(), json!(m.total_output_tokens));
    obj.insert("request_throughput".into(), json!(m.request_throughput));
    obj.insert("request_goodput".into(), json!(m.request_goodput));
    obj.insert("output_throughput".into(), json!(m.output_throughput));
    obj.insert(
        "total_token_throughput".into(),
        json!(m.total_token_throughput),
    );
    let records = &result.records;
    obj.insert(
        "input_lens".into(),
        json!(
            records
                .iter()
                .map(|r| r.prompt_tokens.unwrap_or(0))
                .collect::<Vec<_>>()
        ),
    );
    obj.insert("output_lens".into(), json!(m.output_lens));
    let ok = |r: &&crate::client::RequestRecord| r.outcome.is_ok();
    obj.insert(
        "ttfts".into(),
        json!(
            records
                .iter()
                .map(|r| if ok(&r) {
                    r.ttft().map_or(0.0, |d| d.as_secs_f64())
                } else {
                    0.0
                })
                .collect::<Vec<_>>()
        ),
    );
    obj.insert(
        "itls".into(),
        json!(
            records
                .iter()
                .map(|r| r.itls().map(|d| d.as_secs_f64()).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        ),
    );
    obj.insert(
        "latencies".into(),
        json!(
            records
                .iter()
                .map(|r| if ok(&r) {
                    r.e2el().map_or(0.0, |d| d.as_secs_f64())
                } else {
                    0.0
                })
                .collect::<Vec<_>>()
        ),
    );
    obj.insert(
        "start_times".into(),
        json!(
            records
                .iter()
                .map(|r| r
                    .start
                    .saturating_duration_since(result.started)
                    .as_secs_f64())
                .collect::<Vec<_>>()
        ),
    );
    obj.insert(
        "errors".into(),
        json!(
            records
                .iter()
                .map(|r| r.error.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        ),
    );
    obj.insert(
        "max_output_tokens_per_s".into(),
        json!(m.max_output_tokens_per_s),
    );
    obj.insert(
        "max_concurrent_requests".into(),
        json!(m.max_concurrent_requests),
    );
    put_metric(&mut obj, "ttft", &m.ttft);
    put_metric(&mut obj, "tpot", &m.tpot);
    put_metric(&mut obj, "itl", &m.itl);
    put_metric(&mut obj, "e2el", &m.e2el);
    // Extras vLLM does not write.
    obj.insert(
        "outcomes".into(),
        json!(
            records
                .iter()
                .map(|r| r.outcome.as_str())
                .collect::<Vec<_>>()
        ),
    );
    obj.insert("server_version".into(), json!(result.server_version));
    obj.insert("prompt_lengths_calibrated".into(), json!(result.calibrated));
    obj.insert("prefill_tokens_per_s".into(), json!(m.prefill_tokens_per_s));
    obj.insert("decode_tokens_per_s".into(), json!(m.decode_tokens_per_s));
    if !m.turns.is_empty() {
        let turns: Vec<Value> = m
            .turns
            .iter()
            .map(|t| {
                let mut turn = Map::new();
                turn.insert("turn".into(), json!(t.turn));
                put_metric(&mut turn, "ttft", &t.ttft);
                put_metric(&mut turn, "itl", &t.itl);
                Value::Object(turn)
            })
            .collect();
        obj.insert("turns".into(), Value::Array(turns));
    }
    if let Some(used) = &result.prefix_cache {
        obj.insert("shared_prefix_len".into(), json!(spec.shared_prefix_len));
        obj.insert("prefix_cache_hits".into(), json!(used.hits));
        obj.insert("prefix_cache_queries".into(), json!(used.queries));
    }
    if let Some(ttfo) = &m.ttfo {
        put_metric(&mut obj, "ttfo", ttfo);
        obj.insert(
            "ttfos".into(),
            json!(
                records
                    .iter()
                    .map(|r| match (ok(&r), r.ttfo()) {
                        (true, Some(d)) => d.as_secs_f64(),
                        _ => 0.0,
                    })
                    .collect::<Vec<_>>()
            ),
        );
        obj.insert("reasoning_requests".into(), json!(m.reasoning_requests));
        obj.insert(
            "total_reasoning_tokens".into(),
            json!(m.total_reasoning_tokens),
        );
    }
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::{Value, json};

    use super::*;
    use crate::client::server_api::ModelInfo;
    use crate::client::{Outcome, PreparedRequest, RequestRecord};
    use crate::stats::bench::{BenchMetrics, TurnLatency};
    use crate::vocabulary::records::PrefixCacheUse;

    /// Mean `base`, median and p50 half of it, std a quarter, p99.9 twice.
    fn dist(base: f64) -> Distribution {
        Distribution {
            count: 2,
            mean: base,
            median: base / 2.0,
            std: base / 4.0,
            percentiles: vec![(50.0, base / 2.0), (99.9, base * 2.0)],
        }
    }

    /// A request started `start_ms` after `t0` whose choice chunks came
    /// at `chunks_ms` (from `t0`).
    fn record(t0: Instant, index: usize, start_ms: u64, chunks_ms: &[u64]) -> RequestRecord {
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let request = PreparedRequest {
            index,
            request_id: format!("sentinel-test-{index}"),
            prompt: String::new(),
            messages: None,
            max_tokens: 4,
            turn: None,
        };
        let mut r = RequestRecord::new(&request, at(start_ms), at(start_ms));
        r.chunk_times = chunks_ms.iter().map(|&ms| at(ms)).collect();
        r.end = r.chunk_times.last().copied().unwrap_or(r.start);
        r
    }

    /// Three requests: one that reasoned, one plain, one that failed.
    fn run() -> (ProbeSpec, ProbeResult) {
        let spec = ProbeSpec {
            endpoint: Endpoint::Chat,
            num_requests: 3,
            concurrency: Some(2),
            burstiness: 1.0,
            percentiles: vec![50.0, 99.9],
            shared_prefix_len: 16,
            ..ProbeSpec::default()
        };
        let t0 = Instant::now();
        let mut reasoned = record(t0, 0, 0, &[250, 500, 1000]);
        reasoned.first_answer = Some(t0 + Duration::from_millis(500));
        reasoned.reasoning_chunks = 1;
        reasoned.reasoning_tokens = Some(6);
        reasoned.prompt_tokens = Some(8);
        reasoned.completion_tokens = Some(3);
        let mut plain = record(t0, 1, 500, &[750, 1250]);
        plain.completion_tokens = Some(2);
        let mut failed = record(t0, 2, 1000, &[]);
        failed.outcome = Outcome::Http5xx;
        failed.error = Some("HTTP 500".into());
        let metrics = BenchMetrics {
            completed: 2,
            failed: 1,
            duration_s: 1.5,
            total_input_tokens: 8,
            total_output_tokens: 5,
            request_throughput: 1.25,
            request_goodput: Some(0.75),
            good_requests: Some(1),
            output_throughput: 3.5,
            total_token_throughput: 8.5,
            ttft: dist(0.25),
            ttfo: Some(dist(0.5)),
            reasoning_requests: 1,
            total_reasoning_tokens: 6,
            tpot: dist(1.0),
            itl: dist(2.0),
            e2el: dist(4.0),
            max_output_tokens_per_s: 3.0,
            max_concurrent_requests: 2,
            prefill_tokens_per_s: 32.0,
            decode_tokens_per_s: 2.5,
            output_lens: vec![3, 2, 0],
            turns: vec![TurnLatency {
                turn: 1,
                ttft: dist(8.0),
                itl: dist(16.0),
            }],
        };
        let result = ProbeResult {
            model: ModelInfo {
                id: "served".into(),
                root: Some("org/model".into()),
                max_model_len: None,
            },
            server_version: Some("0.11.0".into()),
            calibrated: false,
            records: vec![reasoned, plain, failed],
            started: t0,
            duration: Duration::from_millis(1500),
            metrics,
            prefix_cache: Some(PrefixCacheUse {
                hits: 32.0,
                queries: 48.0,
            }),
        };
        (spec, result)
    }

    /// The keys and values of today's file for [`run`], but `date`.
    fn expected() -> Value {
        serde_json::from_str(
            r#"{
            "endpoint_type": "openai-chat",
            "backend": "openai-chat",
            "label": null,
            "model_id": "served",
            "tokenizer_id": "org/model",
            "num_prompts": 3,
            "request_rate": "inf",
            "burstiness": 1.0,
            "max_concurrency": 2,
            "duration": 1.5,
            "completed": 2,
            "failed": 1,
            "total_input_tokens": 8,
            "total_output_tokens": 5,
            "request_throughput": 1.25,
            "request_goodput": 0.75,
            "output_throughput": 3.5,
            "total_token_throughput": 8.5,
            "input_lens": [8, 0, 0],
            "output_lens": [3, 2, 0],
            "ttfts": [0.25, 0.25, 0.0],
            "itls": [[0.25, 0.5], [0.5], []],
            "latencies": [1.0, 0.75, 0.0],
            "start_times": [0.0, 0.5, 1.0],
            "errors": ["", "", "HTTP 500"],
            "max_output_tokens_per_s": 3.0,
            "max_concurrent_requests": 2,
            "mean_ttft_ms": 250.0,
            "median_ttft_ms": 125.0,
            "std_ttft_ms": 62.5,
            "p50_ttft_ms": 125.0,
            "p99.9_ttft_ms": 500.0,
            "mean_tpot_ms": 1000.0,
            "median_tpot_ms": 500.0,
            "std_tpot_ms": 250.0,
            "p50_tpot_ms": 500.0,
            "p99.9_tpot_ms": 2000.0,
            "mean_itl_ms": 2000.0,
            "median_itl_ms": 1000.0,
            "std_itl_ms": 500.0,
            "p50_itl_ms": 1000.0,
            "p99.9_itl_ms": 4000.0,
            "mean_e2el_ms": 4000.0,
            "median_e2el_ms": 2000.0,
            "std_e2el_ms": 1000.0,
            "p50_e2el_ms": 2000.0,
            "p99.9_e2el_ms": 8000.0,
            "outcomes": ["ok", "ok", "http_5xx"],
            "server_version": "0.11.0",
            "prompt_lengths_calibrated": false,
            "prefill_tokens_per_s": 32.0,
            "decode_tokens_per_s": 2.5,
            "turns": [{
                "turn": 1,
                "mean_ttft_ms": 8000.0,
                "median_ttft_ms": 4000.0,
                "std_ttft_ms": 2000.0,
                "p50_ttft_ms": 4000.0,
                "p99.9_ttft_ms": 16000.0,
                "mean_itl_ms": 16000.0,
                "median_itl_ms": 8000.0,
                "std_itl_ms": 4000.0,
                "p50_itl_ms": 8000.0,
                "p99.9_itl_ms": 32000.0
            }],
            "shared_prefix_len": 16,
            "prefix_cache_hits": 32.0,
            "prefix_cache_queries": 48.0,
            "mean_ttfo_ms": 500.0,
            "median_ttfo_ms": 250.0,
            "std_ttfo_ms": 125.0,
            "p50_ttfo_ms": 250.0,
            "p99.9_ttfo_ms": 1000.0,
            "ttfos": [0.5, 0.0, 0.0],
            "reasoning_requests": 1,
            "total_reasoning_tokens": 6
        }"#,
        )
        .unwrap()
    }

    /// The file as a JSON value, and its `date` taken out.
    fn file(spec: &ProbeSpec, result: &ProbeResult) -> (Value, String) {
        let text = serde_json::to_vec(&build(spec, result)).unwrap();
        let mut value: Value = serde_json::from_slice(&text).unwrap();
        let date = value.as_object_mut().unwrap().remove("date").unwrap();
        (value, date.as_str().unwrap().to_owned())
    }

    #[test]
    fn the_file_has_every_key_and_value_of_a_run() {
        let (spec, result) = run();
        let (value, date) = file(&spec, &result);
        // Integers stay integers, floats floats: `Value` equality tells.
        assert_eq!(value, expected());
        let (day, time) = date.split_once('-').unwrap();
        assert!(
            day.len() == 8 && time.len() == 6,
            "date {date:?} is not %Y%m%d-%H%M%S"
        );
        assert!(day.chars().chain(time.chars()).all(|c| c.is_ascii_digit()));
    }

    #[test]
    fn optional_parts_are_left_out_and_a_rate_is_a_number() {
        let (mut spec, mut result) = run();
        spec.endpoint = Endpoint::Completions;
        spec.request_rate = Some(2.5);
        spec.concurrency = None;
        let m = &mut result.metrics;
        m.ttfo = None;
        m.reasoning_requests = 0;
        m.total_reasoning_tokens = 0;
        m.request_goodput = None;
        m.turns.clear();
        result.prefix_cache = None;
        result.server_version = None;
        result.model.root = None;
        result.calibrated = true;
        let (value, _) = file(&spec, &result);
        let mut want = expected();
        let obj = want.as_object_mut().unwrap();
        for key in [
            "turns",
            "shared_prefix_len",
            "prefix_cache_hits",
            "prefix_cache_queries",
            "mean_ttfo_ms",
            "median_ttfo_ms",
            "std_ttfo_ms",
            "p50_ttfo_ms",
            "p99.9_ttfo_ms",
            "ttfos",
            "reasoning_requests",
            "total_reasoning_tokens",
        ] {
            obj.remove(key).unwrap();
        }
        obj.insert("endpoint_type".into(), json!("vllm"));
        obj.insert("backend".into(), json!("vllm"));
        obj.insert("tokenizer_id".into(), json!("served"));
        obj.insert("request_rate".into(), json!(2.5));
        obj.insert("max_concurrency".into(), Value::Null);
        obj.insert("request_goodput".into(), Value::Null);
        obj.insert("server_version".into(), Value::Null);
        obj.insert("prompt_lengths_calibrated".into(), json!(true));
        assert_eq!(value, want);
    }
}
