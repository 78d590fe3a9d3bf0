//! Real `/metrics` pages captured from real GPU clusters and servers
//! (`../shared/fixtures/realworld/`, see its SOURCES.md), read in place:
//! every page parses, GPU readings come out per GPU in base units, and the
//! server pages yield their load. Skipped, saying so, when the folder is
//! absent (a fresh clone without the shared fixtures).

use std::path::PathBuf;

use vllm_sentinel::telemetry::exposition::Exposition;
use vllm_sentinel::telemetry::{dcgm, vllm};

fn page(name: &str) -> Option<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/realworld");
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return None;
    }
    Some(std::fs::read_to_string(dir.join(name)).unwrap())
}

#[test]
fn dcgm_pages_as_deployed_give_one_reading_per_gpu_in_base_units() {
    let cases = [
        // (page, GPUs, first GPU's framebuffer in bytes)
        (
            "dcgm_a100-mig_nvidia-docs.prom",
            1,
            (4845.0 + 35690.0) * 1048576.0,
        ),
        ("dcgm_h100x8_aicr-eks-dynamo-vllm-pod.prom", 8, f64::NAN),
        ("dcgm_l4_kops-aws.prom", 1, (0.0 + 22563.0) * 1048576.0),
    ];
    for (name, count, memory_total) in cases {
        let Some(text) = page(name) else { return };
        let gpus = dcgm::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let summary: Vec<String> = gpus
            .iter()
            .map(|g| {
                format!(
                    "gpu {} util {:?} power {:?} W",
                    g.gpu, g.utilization_ratio, g.power_watts
                )
            })
            .collect();
        eprintln!("{name}: {} GPUs: {summary:?}", gpus.len());
        assert_eq!(gpus.len(), count, "{name}");
        if !memory_total.is_nan() {
            assert_eq!(gpus[0].memory_total_bytes, Some(memory_total), "{name}");
        }
        for g in &gpus {
            if let Some(u) = g.utilization_ratio {
                assert!((0.0..=1.0).contains(&u), "{name}: utilization {u}");
            }
        }
    }
}

#[test]
fn server_pages_parse_and_the_vllm_v0_page_cut_mid_histogram_gives_its_load() {
    let Some(v0) = page("vllm_v0-engine_qwen2.5-coder-1.5b_aibrix-docs.prom") else {
        return;
    };
    let load = vllm::parse_load(&v0).unwrap();
    eprintln!("vLLM V0 page: {load:?}");
    assert_eq!((load.running, load.waiting), (Some(0.0), Some(0.0)));
    assert_eq!(
        load.kv_cache_usage,
        Some(0.0),
        "from the V0 name gpu_cache_usage_perc"
    );
    let Some(sglang) = page("sglang_v0.4-era_llama3.1-8b_production-metrics-doc.prom") else {
        return;
    };
    let e = Exposition::parse(&sglang).unwrap();
    assert_eq!(e.skipped_lines, 0);
    assert_eq!(e.sum(&["sglang:num_running_reqs"]), Some(162.0));
    assert_eq!(e.sum(&["sglang:num_queue_reqs"]), Some(2826.0));
    assert_eq!(e.sum(&["sglang:token_usage"]), Some(0.28));
}
