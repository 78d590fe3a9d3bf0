//! The server's load from vLLM's own `/metrics`: running and waiting
//! requests, KV cache usage, preemptions, prefix cache hit ratio. Both the
//! current names and the ones older vLLM releases used are accepted.

use super::exposition::{Exposition, ExpositionError};
use crate::records::ServerLoad;

const RUNNING: &[&str] = &["vllm:num_requests_running"];
const WAITING: &[&str] = &["vllm:num_requests_waiting"];
/// `gpu_cache_usage_perc` before 0.9; both are 0-1 despite the name.
const KV_CACHE: &[&str] = &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"];
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

/// Reads the load covariates out of a vLLM `/metrics` page.
pub fn parse_load(text: &str) -> Result<ServerLoad, ExpositionError> {
    let e = Exposition::parse_families(
        text,
        &[
            "vllm:num_requests_",
            "vllm:kv_cache",
            "vllm:gpu_cache",
            "vllm:num_preemptions",
            "vllm:prefix_cache_",
            "vllm:gpu_prefix_cache_",
        ],
    )?;
    let hits = e.sum(PREFIX_HITS);
    let queries = e.sum(PREFIX_QUERIES);
    Ok(ServerLoad {
        running: e.sum(RUNNING),
        waiting: e.sum(WAITING),
        kv_cache_usage: e.sum(KV_CACHE),
        preemptions_total: e.sum(PREEMPTIONS),
        prefix_cache_hit_ratio: match (hits, queries) {
            (Some(h), Some(q)) if q > 0.0 => Some(h / q),
            _ => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from vLLM 0.32 (CPU build) serving the tiny test model.
    const REAL: &str = include_str!("../../tests/fixtures/vllm-0.32-metrics.txt");

    #[test]
    fn reads_the_load_of_a_real_vllm_page() {
        let load = parse_load(REAL).unwrap();
        assert_eq!(load.running, Some(0.0));
        assert_eq!(load.waiting, Some(0.0));
        assert!(load.kv_cache_usage.is_some());
        assert_eq!(load.preemptions_total, Some(0.0));
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
        let load = parse_load(old).unwrap();
        assert_eq!(load.running, Some(5.0));
        assert_eq!(load.waiting, Some(7.0));
        assert_eq!(load.kv_cache_usage, Some(0.42));
        assert_eq!(load.preemptions_total, Some(11.0));
        assert_eq!(load.prefix_cache_hit_ratio, Some(0.25));
        assert_eq!(load.busy(), Some(12.0));
    }

    #[test]
    fn garbage_is_an_error_and_foreign_metrics_are_empty() {
        assert!(parse_load("<html>not metrics</html>").is_err());
        assert!(parse_load("").is_err());
        let other = parse_load("# TYPE up gauge\nup 1\n").unwrap();
        assert_eq!(other, ServerLoad::default());
    }
}
