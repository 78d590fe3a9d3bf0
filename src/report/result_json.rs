//! `--result-json`: one JSON object with the keys of
//! `vllm bench serve --save-result`, in its order, so tools that read
//! vLLM's result files read ours unchanged, plus a few `sentinel_`-free
//! extras at the end.

use std::fmt::Display;

use chrono::{DateTime, TimeZone};
use serde::{Serialize, Serializer};

use super::console::percentile_word;
use crate::client::{Endpoint, RequestRecord};
use crate::probe::{ProbeResult, ProbeSpec};
use crate::stats::Distribution;

/// The result object: one field per key of `vllm bench serve`'s result
/// file, in its order (a flat list is easier to check against that file
/// than pieces would be), then ours.
#[derive(Debug, Serialize)]
pub struct ResultFile<'a> {
    /// Local time, `%Y%m%d-%H%M%S`, as vLLM writes it.
    date: String,
    endpoint_type: &'static str,
    backend: &'static str,
    /// vLLM's `--label`; we have none.
    label: Option<&'a str>,
    model_id: &'a str,
    tokenizer_id: &'a str,
    num_prompts: usize,
    /// The rate, or `"inf"` for all at once, as vLLM writes it.
    #[serde(serialize_with = "rate_or_inf")]
    request_rate: Option<f64>,
    burstiness: f64,
    max_concurrency: Option<usize>,
    duration: f64,
    completed: usize,
    failed: usize,
    total_input_tokens: u64,
    total_output_tokens: u64,
    request_throughput: f64,
    request_goodput: Option<f64>,
    output_throughput: f64,
    total_token_throughput: f64,
    input_lens: Vec<u32>,
    output_lens: &'a [u32],
    ttfts: Vec<f64>,
    itls: Vec<Vec<f64>>,
    latencies: Vec<f64>,
    start_times: Vec<f64>,
    errors: Vec<&'a str>,
    max_output_tokens_per_s: f64,
    max_concurrent_requests: usize,
    #[serde(flatten)]
    ttft: MetricKeys,
    #[serde(flatten)]
    tpot: MetricKeys,
    #[serde(flatten)]
    itl: MetricKeys,
    #[serde(flatten)]
    e2el: MetricKeys,
    // Extras vLLM does not write.
    outcomes: Vec<&'static str>,
    server_version: Option<&'a str>,
    prompt_lengths_calibrated: bool,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    /// A multi-turn run's latencies by turn.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    turns: Vec<TurnKeys>,
    #[serde(flatten)]
    prefix_cache: Option<PrefixCacheKeys>,
    #[serde(flatten)]
    reasoning: Option<ReasoningKeys>,
}

/// One entry of `turns`.
#[derive(Debug, Serialize)]
struct TurnKeys {
    turn: u32,
    #[serde(flatten)]
    ttft: MetricKeys,
    #[serde(flatten)]
    itl: MetricKeys,
}

/// The server's prefix cache, when the run shared a prefix and the server
/// counts it.
#[derive(Debug, Serialize)]
struct PrefixCacheKeys {
    shared_prefix_len: u32,
    prefix_cache_hits: f64,
    prefix_cache_queries: f64,
}

/// Time to the first answer token, when some request reasoned.
#[derive(Debug, Serialize)]
struct ReasoningKeys {
    #[serde(flatten)]
    ttfo: MetricKeys,
    ttfos: Vec<f64>,
    reasoning_requests: usize,
    total_reasoning_tokens: u64,
}

/// One latency's keys, in milliseconds: `mean_<name>_ms`,
/// `median_<name>_ms`, `std_<name>_ms`, then `p<P>_<name>_ms` per
/// percentile in the order asked for (a percentile asked for twice once).
#[derive(Debug)]
struct MetricKeys(Vec<(String, f64)>);

impl MetricKeys {
    fn of(name: &str, d: &Distribution) -> MetricKeys {
        let mut keys = vec![
            (format!("mean_{name}_ms"), d.mean * 1000.0),
            (format!("median_{name}_ms"), d.median * 1000.0),
            (format!("std_{name}_ms"), d.std * 1000.0),
        ];
        for (p, v) in &d.percentiles {
            let key = format!("p{}_{name}_ms", percentile_word(*p));
            if !keys.iter().any(|(k, _)| *k == key) {
                keys.push((key, v * 1000.0));
            }
        }
        MetricKeys(keys)
    }
}

impl Serialize for MetricKeys {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

fn rate_or_inf<S: Serializer>(rate: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
    match rate {
        Some(r) => serializer.serialize_f64(*r),
        None => serializer.serialize_str("inf"),
    }
}

/// Builds the result object of a run finished at `now`, whose time zone
/// is the one `date` is written in (vLLM writes local time).
pub fn build<'a, Tz>(
    spec: &ProbeSpec,
    result: &'a ProbeResult,
    now: &DateTime<Tz>,
) -> ResultFile<'a>
where
    Tz: TimeZone,
    Tz::Offset: Display,
{
    let m = &result.metrics;
    let records = &result.records;
    let backend = match spec.endpoint {
        Endpoint::Completions => "vllm",
        Endpoint::Chat => "openai-chat",
    };
    // A failed request counts 0 s, as in vLLM's lists.
    let secs_if_ok = |r: &RequestRecord, d: Option<std::time::Duration>| {
        if r.outcome.is_ok() {
            d.map_or(0.0, |d| d.as_secs_f64())
        } else {
            0.0
        }
    };
    ResultFile {
        date: now.format("%Y%m%d-%H%M%S").to_string(),
        endpoint_type: backend,
        backend,
        label: None,
        model_id: &result.model.id,
        tokenizer_id: result.model.root.as_deref().unwrap_or(&result.model.id),
        num_prompts: spec.num_requests,
        request_rate: spec.request_rate,
        burstiness: spec.burstiness,
        max_concurrency: spec.concurrency,
        duration: m.duration_s,
        completed: m.completed,
        failed: m.failed,
        total_input_tokens: m.total_input_tokens,
        total_output_tokens: m.total_output_tokens,
        request_throughput: m.request_throughput,
        request_goodput: m.request_goodput,
        output_throughput: m.output_throughput,
        total_token_throughput: m.total_token_throughput,
        input_lens: records
            .iter()
            .map(|r| r.prompt_tokens.unwrap_or(0))
            .collect(),
        output_lens: &m.output_lens,
        ttfts: records.iter().map(|r| secs_if_ok(r, r.ttft())).collect(),
        itls: records
            .iter()
            .map(|r| r.itls().map(|d| d.as_secs_f64()).collect())
            .collect(),
        latencies: records.iter().map(|r| secs_if_ok(r, r.e2el())).collect(),
        start_times: records
            .iter()
            .map(|r| {
                r.start
                    .saturating_duration_since(result.started)
                    .as_secs_f64()
            })
            .collect(),
        errors: records
            .iter()
            .map(|r| r.error.as_deref().unwrap_or(""))
            .collect(),
        max_output_tokens_per_s: m.max_output_tokens_per_s,
        max_concurrent_requests: m.max_concurrent_requests,
        ttft: MetricKeys::of("ttft", &m.ttft),
        tpot: MetricKeys::of("tpot", &m.tpot),
        itl: MetricKeys::of("itl", &m.itl),
        e2el: MetricKeys::of("e2el", &m.e2el),
        outcomes: records.iter().map(|r| r.outcome.as_str()).collect(),
        server_version: result.server_version.as_deref(),
        prompt_lengths_calibrated: result.calibrated,
        prefill_tokens_per_s: m.prefill_tokens_per_s,
        decode_tokens_per_s: m.decode_tokens_per_s,
        turns: m
            .turns
            .iter()
            .map(|t| TurnKeys {
                turn: t.turn,
                ttft: MetricKeys::of("ttft", &t.ttft),
                itl: MetricKeys::of("itl", &t.itl),
            })
            .collect(),
        prefix_cache: result.prefix_cache.map(|used| PrefixCacheKeys {
            shared_prefix_len: spec.shared_prefix_len,
            prefix_cache_hits: used.hits,
            prefix_cache_queries: used.queries,
        }),
        reasoning: m.ttfo.as_ref().map(|ttfo| ReasoningKeys {
            ttfo: MetricKeys::of("ttfo", ttfo),
            ttfos: records
                .iter()
                .map(|r| match r.ttfo() {
                    Some(d) if r.outcome.is_ok() => d.as_secs_f64(),
                    _ => 0.0,
                })
                .collect(),
            reasoning_requests: m.reasoning_requests,
            total_reasoning_tokens: m.total_reasoning_tokens,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::{Value, json};

    use chrono::TimeZone as _;

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

    /// The keys and values of the file for [`run`], but `date`.
    const EXPECTED: &str = r#"{
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
        }"#;

    fn expected() -> Value {
        serde_json::from_str(EXPECTED).unwrap()
    }

    /// The file as written, for a run that ended 2026-01-02 03:04:05 UTC
    /// where clocks are two hours ahead.
    fn text(spec: &ProbeSpec, result: &ProbeResult) -> String {
        let now = chrono::FixedOffset::east_opt(2 * 3600)
            .unwrap()
            .with_ymd_and_hms(2026, 1, 2, 5, 4, 5)
            .unwrap();
        serde_json::to_string(&build(spec, result, &now)).unwrap()
    }

    /// The file as a JSON value, and its `date` taken out.
    fn file(spec: &ProbeSpec, result: &ProbeResult) -> (Value, String) {
        let mut value: Value = serde_json::from_str(&text(spec, result)).unwrap();
        let date = value.as_object_mut().unwrap().remove("date").unwrap();
        (value, date.as_str().unwrap().to_owned())
    }

    #[test]
    fn the_file_has_every_key_and_value_of_a_run() {
        let (spec, result) = run();
        let (value, date) = file(&spec, &result);
        // Integers stay integers, floats floats: `Value` equality tells.
        assert_eq!(value, expected());
        // The time where the run ran, as vLLM writes it.
        assert_eq!(date, "20260102-050405");
    }

    /// Byte for byte: the keys in vLLM's order, ours after them, at
    /// every level, as [`EXPECTED`] lists them.
    #[test]
    fn the_keys_come_in_vllms_order() {
        let (spec, result) = run();
        // `EXPECTED` without the blanks between its tokens.
        let mut compact = String::new();
        let mut in_string = false;
        for c in EXPECTED.chars() {
            in_string ^= c == '"';
            if in_string || !c.is_whitespace() {
                compact.push(c);
            }
        }
        assert_eq!(
            text(&spec, &result),
            format!(r#"{{"date":"20260102-050405",{}"#, &compact[1..])
        );
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

    #[test]
    fn a_percentile_asked_for_twice_is_written_once() {
        let mut d = dist(0.25);
        d.percentiles.push((50.0, 0.125));
        let keys = MetricKeys::of("ttft", &d);
        let names: Vec<&str> = keys.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "mean_ttft_ms",
                "median_ttft_ms",
                "std_ttft_ms",
                "p50_ttft_ms",
                "p99.9_ttft_ms"
            ]
        );
    }
}
