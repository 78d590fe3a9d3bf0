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
