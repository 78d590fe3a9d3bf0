//! The server's load from its own `/metrics`: running and waiting
//! requests, KV cache usage, preemptions, prefix cache hit ratio. vLLM's
//! names of every era (V0, 0.8-0.10 with an `engine` label, today's) and
//! SGLang's are read; several engines add up, and on a server with several
//! models only the probed model's series count.

use super::exposition::{Exposition, PageError, Scalar, total};
use crate::vocabulary::records::ServerLoad;

const RUNNING: &[&str] = &["vllm:num_requests_running", "sglang:num_running_reqs"];
const WAITING: &[&str] = &["vllm:num_requests_waiting", "sglang:num_queue_reqs"];
/// Today's vLLM also splits the waiting requests by reason; used only
/// when the total is absent.
const WAITING_BY_REASON: &[&str] = &["vllm:num_requests_waiting_by_reason"];
/// `gpu_cache_usage_perc` before 0.9; both are 0-1 despite the name.
const KV_CACHE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];
const PREEMPTIONS: &[&str] = &["vllm:num_preemptions_total", "vllm:num_preemptions"];
const PREFIX_HITS: &[&str] = &[
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits",
];
const PREFIX_QUERIES: &[&str] = &[
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries",
];
/// Ratios the server computes itself (V0 vLLM: -1 until it has data).
const PREFIX_HIT_RATE: &[&str] = &["vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"];

/// The server process's start, from the Prometheus client's process
/// collector (on vLLM's API server's page): a restart changes it.
const PROCESS_START: &[&str] = &["process_start_time_seconds"];

/// What an operator is told a page lacks.
const EXPECTED: &str = "vllm:num_requests_running, vllm:kv_cache_usage_perc, \
sglang:num_running_reqs, sglang:token_usage, ...";

/// The families read, by name prefix: nothing else on the page is kept.
const PREFIXES: &[&str] = &[
    "vllm:num_requests_",
    "vllm:kv_cache",
    "vllm:gpu_cache",
    "vllm:num_preemptions",
    "vllm:prefix_cache_",
    "vllm:gpu_prefix_cache_",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "process_start_time_seconds",
];

/// The series of `names` that count for the probed model: those labelled
/// with it when the page has any, else all (a LoRA adapter's load is its
/// base model's).
struct ModelView<'a> {
    page: &'a Exposition,
    model: Option<&'a str>,
}

impl ModelView<'_> {
    fn series(&self, names: &[&str]) -> Vec<Scalar> {
        let all = self.page.scalars(names);
        let Some(model) = self.model else {
            return all;
        };
        let own: Vec<Scalar> = all
            .iter()
            .filter(|s| s.label("model_name") == Some(model))
            .cloned()
            .collect();
        if own.is_empty() { all } else { own }
    }

    /// Counts add up over engines.
    fn sum(&self, names: &[&str]) -> Option<f64> {
        total(&self.series(names))
    }

    /// The latest of several values (processes), for a time.
    fn latest(&self, names: &[&str]) -> Option<f64> {
        self.series(names)
            .iter()
            .map(|s| s.value)
            .filter(|v| v.is_finite() && *v > 0.0)
            .reduce(f64::max)
    }

    /// Ratios are averaged over engines, each engine having its own cache.
    fn mean(&self, names: &[&str]) -> Option<f64> {
        let values: Vec<f64> = self
            .series(names)
            .iter()
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }
}

/// Reads the load covariates out of a vLLM or SGLang `/metrics` page,
/// counting only `model`'s series when the page labels several models. A
/// page with none of the families read is an error: it is not the page of
/// a server we know.
pub fn parse_load(text: &str, model: Option<&str>) -> Result<ServerLoad, PageError> {
    let page = Exposition::parse_families(text, PREFIXES)?;
    let view = ModelView { page: &page, model };
    let running = view.sum(RUNNING);
    let waiting = view.sum(WAITING).or_else(|| view.sum(WAITING_BY_REASON));
    let kv_cache_usage = view.mean(KV_CACHE);
    if running.is_none() && waiting.is_none() && kv_cache_usage.is_none() {
        return Err(PageError::NoFamilies { expected: EXPECTED });
    }
    let (prefix_cache_hits, prefix_cache_queries) =
        (view.sum(PREFIX_HITS), view.sum(PREFIX_QUERIES));
    let counted = match (prefix_cache_hits, prefix_cache_queries) {
        (Some(h), Some(q)) if q > 0.0 => Some(h / q),
        _ => None,
    };
    let reported = view
        .mean(PREFIX_HIT_RATE)
        .filter(|r| (0.0..=1.0).contains(r));
    Ok(ServerLoad {
        running,
        waiting,
        kv_cache_usage,
        preemptions_total: view.sum(PREEMPTIONS),
        prefix_cache_hit_ratio: counted.or(reported),
        prefix_cache_hits,
        prefix_cache_queries,
        server_started_s: view.latest(PROCESS_START),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from vLLM 0.32 (CPU build) serving the tiny test model.
    const REAL: &str = include_str!("../../tests/fixtures/vllm-0.32-metrics.txt");

    #[test]
    fn reads_the_load_of_a_real_vllm_page() {
        let load = parse_load(REAL, None).unwrap();
        assert_eq!(load.running, Some(0.0));
        assert_eq!(load.waiting, Some(0.0));
        assert!(load.kv_cache_usage.is_some());
        assert_eq!(load.preemptions_total, Some(0.0));
        assert_eq!(load.server_started_s, Some(1.79532551697e9));
    }

    #[test]
    fn accepts_the_names_of_older_releases_and_sums_engines() {
        let old = "# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3\n\
vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 2\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"m\"} 7\n\
# TYPE vllm:gpu_cache_usage_perc gauge\n\
vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.42\n\
# TYPE vllm:num_preemptions_total counter\n\
vllm:num_preemptions_total{model_name=\"m\"} 11\n\
# TYPE vllm:gpu_prefix_cache_queries_total counter\n\
vllm:gpu_prefix_cache_queries_total{model_name=\"m\"} 200\n\
# TYPE vllm:gpu_prefix_cache_hits_total counter\n\
this line is not valid and belongs to no family we read\n\
vllm:gpu_prefix_cache_hits_total{model_name=\"m\"} 50\n";
        let load = parse_load(old, Some("m")).unwrap();
        assert_eq!(load.running, Some(5.0));
        assert_eq!(load.waiting, Some(7.0));
        assert_eq!(load.kv_cache_usage, Some(0.42));
        assert_eq!(load.preemptions_total, Some(11.0));
        assert_eq!(load.server_started_s, None, "no process collector");
        assert_eq!(load.prefix_cache_hit_ratio, Some(0.25));
        assert_eq!(load.busy(), Some(12.0));
    }

    #[test]
    fn garbage_and_pages_of_other_exporters_are_errors() {
        assert!(parse_load("<html>not metrics</html>", None).is_err());
        assert!(parse_load("", None).is_err());
        let other = parse_load("# TYPE up gauge\nup 1\n", None).unwrap_err();
        assert!(
            other.to_string().contains("none of the families"),
            "{other}"
        );
    }

    #[test]
    fn engines_add_up_and_only_the_probed_model_counts() {
        let page = "vllm:num_requests_running{model_name=\"a\",engine=\"0\"} 3\n\
vllm:num_requests_running{model_name=\"a\",engine=\"1\"} 2\n\
vllm:num_requests_running{model_name=\"b\",engine=\"0\"} 40\n\
vllm:num_requests_waiting_by_reason{model_name=\"a\",engine=\"0\",reason=\"capacity\"} 4\n\
vllm:num_requests_waiting_by_reason{model_name=\"a\",engine=\"0\",reason=\"deferred\"} 1\n\
vllm:kv_cache_usage_perc{model_name=\"a\",engine=\"0\"} 0.2\n\
vllm:kv_cache_usage_perc{model_name=\"a\",engine=\"1\"} 0.4\n\
vllm:kv_cache_usage_perc{model_name=\"b\",engine=\"0\"} 0.9\n";
        let a = parse_load(page, Some("a")).unwrap();
        assert_eq!(a.running, Some(5.0));
        assert_eq!(a.waiting, Some(5.0), "from the waiting requests by reason");
        assert!((a.kv_cache_usage.unwrap() - 0.3).abs() < 1e-12, "{a:?}");
        // A model the page does not label (a LoRA adapter): the whole server.
        let adapter = parse_load(page, Some("adapter")).unwrap();
        assert_eq!(adapter.running, Some(45.0));
    }
}
