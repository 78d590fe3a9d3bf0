//! The simulator's own `/metrics`, named as the server it passes for names
//! them: vLLM (`vllm:` prefix, `model_name` and `engine` labels, in the
//! current or the pre-0.9 naming) or SGLang (`sglang:` prefix, `model_name`).

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use super::{SimConfig, SimServerKind};

/// Which names the page uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricNames {
    Vllm,
    /// vLLM before 0.9: `gpu_cache_usage_perc`.
    VllmLegacy,
    Sglang,
}

pub fn names_of(config: &SimConfig) -> MetricNames {
    match (config.server_kind, config.legacy_metric_names) {
        (SimServerKind::Sglang, _) => MetricNames::Sglang,
        (SimServerKind::Vllm, true) => MetricNames::VllmLegacy,
        (SimServerKind::Vllm, false) => MetricNames::Vllm,
    }
}

impl MetricNames {
    /// The family's name on this server; `None` when it has no such family
    /// (the value is then counted but not shown).
    fn of(self, family: &str) -> Option<String> {
        let sglang = match family {
            "num_requests_running" => Some("num_running_reqs"),
            "num_requests_waiting" => Some("num_queue_reqs"),
            "kv_cache_usage_perc" => Some("token_usage"),
            "cache_hit_rate" => Some("cache_hit_rate"),
            "prompt_tokens_total" | "generation_tokens_total" => Some(family),
            "time_to_first_token_seconds" | "e2e_request_latency_seconds" => Some(family),
            "inter_token_latency_seconds" => Some("time_per_output_token_seconds"),
            _ => None,
        };
        match self {
            MetricNames::Sglang => sglang.map(|n| format!("sglang:{n}")),
            _ if family == "cache_hit_rate" => None,
            MetricNames::VllmLegacy if family == "kv_cache_usage_perc" => {
                Some("vllm:gpu_cache_usage_perc".to_owned())
            }
            _ => Some(format!("vllm:{family}")),
        }
    }
}

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
    /// SGLang's own ratio of the two above.
    cache_hit_rate: Gauge,
    pub request_success: IntCounterVec,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// The process collector's start time, on every server's page.
    pub process_start: Gauge,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

impl SimMetrics {
    /// One family per metric the server exports, in the order of its page:
    /// a list to compare with a real `/metrics`, not logic to split.
    pub fn new(model: &str, names: MetricNames) -> Self {
        let registry = Registry::new();
        // A family the server does not have is made under a placeholder
        // name and left out of the registry.
        let name = |family: &str| {
            names
                .of(family)
                .unwrap_or_else(|| format!("unshown_{family}"))
        };
        let labels = |family: &str, help: &str| {
            let opts = Opts::new(name(family), help).const_label("model_name", model);
            match names {
                MetricNames::Sglang => opts,
                _ => opts.const_label("engine", "0"),
            }
        };
        let histogram = |family: &str, help: &str| {
            let o = labels(family, help);
            Histogram::with_opts(
                HistogramOpts::new(o.name, o.help)
                    .const_labels(o.const_labels)
                    .buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid metric")
        };
        let gauge = |f: &str, h: &str| Gauge::with_opts(labels(f, h)).expect("valid metric");
        let int_gauge = |f: &str, h: &str| IntGauge::with_opts(labels(f, h)).expect("valid metric");
        let counter = |f: &str, h: &str| IntCounter::with_opts(labels(f, h)).expect("valid metric");
        let m = SimMetrics {
            running: int_gauge("num_requests_running", "Requests in the running batch."),
            waiting: int_gauge("num_requests_waiting", "Requests waiting to be scheduled."),
            kv_cache_usage: gauge(
                "kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ),
            prompt_tokens: counter("prompt_tokens_total", "Prefill tokens processed."),
            generation_tokens: counter("generation_tokens_total", "Generation tokens processed."),
            preemptions: counter("num_preemptions_total", "Cumulative preemptions."),
            prefix_cache_queries: counter(
                "prefix_cache_queries_total",
                "Prefix cache queries, in tokens.",
            ),
            prefix_cache_hits: counter("prefix_cache_hits_total", "Prefix cache hits, in tokens."),
            cache_hit_rate: gauge("cache_hit_rate", "The prefix cache hit rate."),
            request_success: IntCounterVec::new(
                labels("request_success_total", "Successfully processed requests."),
                &["finished_reason"],
            )
            .expect("valid metric"),
            ttft: histogram(
                "time_to_first_token_seconds",
                "Time to first token in seconds.",
            ),
            itl: histogram(
                "inter_token_latency_seconds",
                "Inter-token latency in seconds.",
            ),
            e2e: histogram(
                "e2e_request_latency_seconds",
                "End-to-end request latency in seconds.",
            ),
            process_start: Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            )
            .expect("valid metric"),
            registry,
        };
        m.registry
            .register(Box::new(m.process_start.clone()))
            .expect("metric names are unique");
        let families: [(&str, Box<dyn prometheus::core::Collector>); 13] = [
            ("num_requests_running", Box::new(m.running.clone())),
            ("num_requests_waiting", Box::new(m.waiting.clone())),
            ("kv_cache_usage_perc", Box::new(m.kv_cache_usage.clone())),
            ("prompt_tokens_total", Box::new(m.prompt_tokens.clone())),
            (
                "generation_tokens_total",
                Box::new(m.generation_tokens.clone()),
            ),
            ("num_preemptions_total", Box::new(m.preemptions.clone())),
            (
                "prefix_cache_queries_total",
                Box::new(m.prefix_cache_queries.clone()),
            ),
            (
                "prefix_cache_hits_total",
                Box::new(m.prefix_cache_hits.clone()),
            ),
            ("cache_hit_rate", Box::new(m.cache_hit_rate.clone())),
            ("request_success_total", Box::new(m.request_success.clone())),
            ("time_to_first_token_seconds", Box::new(m.ttft.clone())),
            ("inter_token_latency_seconds", Box::new(m.itl.clone())),
            ("e2e_request_latency_seconds", Box::new(m.e2e.clone())),
        ];
        for (family, collector) in families {
            if names.of(family).is_some() {
                m.registry
                    .register(collector)
                    .expect("metric names are unique");
            }
        }
        m
    }

    /// Sets SGLang's cache hit rate from the hits and queries so far.
    pub fn update_hit_rate(&self) {
        let queries = self.prefix_cache_queries.get();
        if queries > 0 {
            self.cache_hit_rate
                .set(self.prefix_cache_hits.get() as f64 / queries as f64);
        }
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}
