//! The simulator's own `/metrics`, named as vLLM names them (`vllm:`
//! prefix, `model_name` and `engine` labels), in either the current or the
//! pre-0.9 naming.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

pub struct SimMetrics {
    registry: Registry,
    pub running: IntGauge,
    pub waiting: IntGauge,
    pub kv_cache_usage: Gauge,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub preemptions: IntCounter,
    pub prefix_cache_queries: IntCounter,
    pub prefix_cache_hits: IntCounter,
    pub request_success: IntCounterVec,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

impl SimMetrics {
    /// One registration per family vLLM exports, in the order of its page:
    /// a list to compare with a real `/metrics`, not logic to split.
    pub fn new(model: &str, legacy_names: bool) -> Self {
        let registry = Registry::new();
        let labels = |opts: Opts| {
            opts.const_label("model_name", model)
                .const_label("engine", "0")
        };
        let hlabels = |opts: HistogramOpts| {
            opts.const_label("model_name", model)
                .const_label("engine", "0")
                .buckets(LATENCY_BUCKETS.to_vec())
        };
        let kv_name = if legacy_names {
            "vllm:gpu_cache_usage_perc"
        } else {
            "vllm:kv_cache_usage_perc"
        };
        let m = SimMetrics {
            running: IntGauge::with_opts(labels(Opts::new(
                "vllm:num_requests_running",
                "Requests in the running batch.",
            )))
            .expect("valid metric"),
            waiting: IntGauge::with_opts(labels(Opts::new(
                "vllm:num_requests_waiting",
                "Requests waiting to be scheduled.",
            )))
            .expect("valid metric"),
            kv_cache_usage: Gauge::with_opts(labels(Opts::new(
                kv_name,
                "KV-cache usage. 1 means 100 percent usage.",
            )))
            .expect("valid metric"),
            prompt_tokens: IntCounter::with_opts(labels(Opts::new(
                "vllm:prompt_tokens_total",
                "Prefill tokens processed.",
            )))
            .expect("valid metric"),
            generation_tokens: IntCounter::with_opts(labels(Opts::new(
                "vllm:generation_tokens_total",
                "Generation tokens processed.",
            )))
            .expect("valid metric"),
            preemptions: IntCounter::with_opts(labels(Opts::new(
                "vllm:num_preemptions_total",
                "Cumulative preemptions.",
            )))
            .expect("valid metric"),
            prefix_cache_queries: IntCounter::with_opts(labels(Opts::new(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in tokens.",
            )))
            .expect("valid metric"),
            prefix_cache_hits: IntCounter::with_opts(labels(Opts::new(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in tokens.",
            )))
            .expect("valid metric"),
            request_success: IntCounterVec::new(
                labels(Opts::new(
                    "vllm:request_success_total",
                    "Successfully processed requests.",
                )),
                &["finished_reason"],
            )
            .expect("valid metric"),
            ttft: Histogram::with_opts(hlabels(HistogramOpts::new(
                "vllm:time_to_first_token_seconds",
                "Time to first token in seconds.",
            )))
            .expect("valid metric"),
            itl: Histogram::with_opts(hlabels(HistogramOpts::new(
                "vllm:inter_token_latency_seconds",
                "Inter-token latency in seconds.",
            )))
            .expect("valid metric"),
            e2e: Histogram::with_opts(hlabels(HistogramOpts::new(
                "vllm:e2e_request_latency_seconds",
                "End-to-end request latency in seconds.",
            )))
            .expect("valid metric"),
            registry,
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.running.clone()),
            Box::new(m.waiting.clone()),
            Box::new(m.kv_cache_usage.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.generation_tokens.clone()),
            Box::new(m.preemptions.clone()),
            Box::new(m.prefix_cache_queries.clone()),
            Box::new(m.prefix_cache_hits.clone()),
            Box::new(m.request_success.clone()),
            Box::new(m.ttft.clone()),
            Box::new(m.itl.clone()),
            Box::new(m.e2e.clone()),
        ];
        for c in collectors {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}
