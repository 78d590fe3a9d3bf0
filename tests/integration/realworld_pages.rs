//! Real `/metrics` pages captured from real GPU clusters and servers
//! (`../shared/fixtures/realworld/`, see its SOURCES.md), read in place:
//! every page parses, GPU readings come out per device (MIG instances
//! included) in base units, `dcgm_match` keeps the GPU of the vLLM pod, and
//! the server pages yield their load. Skipped, saying so, when the folder is
//! absent (a fresh clone without the shared fixtures); failed under
//! `CI=true`.

use crate::common;

use vllm_sentinel::metrics::GpuReading;
use vllm_sentinel::telemetry::{dcgm, load};
use vllm_sentinel::vocabulary::matchers::LabelMatchers;

fn page(name: &str) -> Option<String> {
    let dir = common::skip::realworld()?;
    Some(std::fs::read_to_string(dir.join(name)).unwrap())
}

const MIB: f64 = 1048576.0;

fn gpus(name: &str, select: Option<&str>) -> Option<Vec<GpuReading>> {
    let text = page(name)?;
    let select = select.map(|s| LabelMatchers::parse(s).unwrap());
    let gpus = dcgm::parse(&text, select.as_ref()).unwrap_or_else(|e| panic!("{name}: {e}"));
    for g in &gpus {
        eprintln!("{name}: {g:?}");
        for ratio in [
            g.utilization_ratio,
            g.graphics_engine_active_ratio,
            g.tensor_active_ratio,
            g.dram_active_ratio,
        ]
        .into_iter()
        .flatten()
        {
            assert!((0.0..=1.0).contains(&ratio), "{name}: ratio {ratio}");
        }
    }
    Some(gpus)
}

#[test]
fn a100_with_mig_gives_the_gpu_and_its_instance_with_profiling_ratios() {
    let Some(gpus) = gpus("dcgm_a100-mig_nvidia-docs.prom", None) else {
        return;
    };
    assert_eq!(gpus.len(), 2, "the GPU and its one MIG instance");
    let (whole, mig) = (&gpus[0], &gpus[1]);
    assert_eq!((whole.gpu.as_str(), whole.mig.as_str()), ("0", ""));
    assert_eq!(whole.uuid, "GPU-34319582-d595-d1c7-d1d2-179bcfa61660");
    assert_eq!(whole.memory_used_bytes, Some(4845.0 * MIB));
    assert_eq!(whole.memory_total_bytes, Some((4845.0 + 35690.0) * MIB));
    assert_eq!(whole.power_watts, Some(409.692));
    assert_eq!(whole.temperature_celsius, Some(61.0));
    assert_eq!(whole.sm_clock_hertz, Some(1215.0e6));
    assert_eq!(whole.graphics_engine_active_ratio, Some(0.99563));
    assert_eq!(whole.tensor_active_ratio, Some(0.92926));
    assert_eq!(whole.dram_active_ratio, Some(0.690789));
    assert_eq!(whole.last_xid, Some(0.0));
    assert_eq!((mig.gpu.as_str(), mig.mig.as_str()), ("0", "1g.5gb/13"));
    assert_eq!(mig.graphics_engine_active_ratio, Some(0.995687));
    assert_eq!(mig.last_xid, Some(0.0));
    assert_eq!(
        mig.memory_used_bytes, None,
        "not on the page for the instance"
    );
}

#[test]
fn l4_page_with_help_and_type_lines_gives_an_idle_gpu() {
    let Some(gpus) = gpus("dcgm_l4_kops-aws.prom", None) else {
        return;
    };
    assert_eq!(gpus.len(), 1);
    let g = &gpus[0];
    assert_eq!(g.utilization_ratio, Some(0.0));
    assert_eq!(g.memory_total_bytes, Some(22563.0 * MIB));
    assert_eq!(g.power_watts, Some(16.365));
    assert_eq!(g.temperature_celsius, Some(31.0));
    assert_eq!(g.sm_clock_hertz, Some(210.0e6));
    assert_eq!(
        (
            g.graphics_engine_active_ratio,
            g.tensor_active_ratio,
            g.dram_active_ratio
        ),
        (Some(0.0), Some(0.0), Some(0.0))
    );
}

#[test]
fn h100_node_gives_eight_gpus_and_dcgm_match_keeps_the_vllm_pods_one() {
    let name = "dcgm_h100x8_aicr-eks-dynamo-vllm-pod.prom";
    let Some(all) = gpus(name, None) else { return };
    assert_eq!(all.len(), 8);
    assert!(all.iter().all(|g| g.name == "NVIDIA H100 80GB HBM3"));
    assert_eq!(all[0].power_watts, Some(113.611));
    assert_eq!(all[0].temperature_celsius, Some(30.0));
    let ours = gpus(
        name,
        Some(r#"{pod=~"vllm-.*", namespace="dynamo-workload"}"#),
    )
    .unwrap();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].gpu, "0");
    assert_eq!(ours[0].uuid, "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005");
    // The GPUs no pod holds, by the absence of the label.
    let free = gpus(name, Some(r#"{pod=""}"#)).unwrap();
    assert_eq!(free.len(), 7);
    // A selector that matches nothing says so rather than showing no GPU.
    let text = page(name).unwrap();
    let none = LabelMatchers::parse(r#"{namespace="llm"}"#).unwrap();
    let e = dcgm::parse(&text, Some(&none)).unwrap_err().to_string();
    assert!(
        e.contains(r#"no GPU on the page matches dcgm_match {namespace="llm"} (8 devices"#),
        "{e}"
    );
}

#[test]
fn sglang_page_gives_its_load() {
    let Some(text) = page("sglang_v0.4-era_llama3.1-8b_production-metrics-doc.prom") else {
        return;
    };
    let load = load::parse_load(&text, Some("meta-llama/Llama-3.1-8B-Instruct")).unwrap();
    eprintln!("SGLang page: {load:?}");
    assert_eq!(load.running, Some(162.0));
    assert_eq!(load.waiting, Some(2826.0));
    assert_eq!(load.kv_cache_usage, Some(0.28));
    assert_eq!(load.prefix_cache_hit_ratio, Some(0.007507552643049313));
    assert_eq!(load.preemptions_total, None, "SGLang has no such counter");
}

#[test]
fn vllm_v0_page_cut_mid_histogram_gives_its_gauges() {
    let Some(text) = page("vllm_v0-engine_qwen2.5-coder-1.5b_aibrix-docs.prom") else {
        return;
    };
    let load = load::parse_load(&text, Some("Qwen/Qwen2.5-Coder-1.5B-Instruct")).unwrap();
    eprintln!("vLLM V0 page: {load:?}");
    assert_eq!((load.running, load.waiting), (Some(0.0), Some(0.0)));
    assert_eq!(load.kv_cache_usage, Some(0.0), "from gpu_cache_usage_perc");
    assert_eq!(load.preemptions_total, Some(0.0));
    assert_eq!(
        load.prefix_cache_hit_ratio, None,
        "gpu_prefix_cache_hit_rate is -1: no data"
    );
}

#[test]
fn a_dcgm_page_is_not_a_server_page_nor_the_reverse() {
    let (Some(dcgm_page), Some(sglang)) = (
        page("dcgm_l4_kops-aws.prom"),
        page("sglang_v0.4-era_llama3.1-8b_production-metrics-doc.prom"),
    ) else {
        return;
    };
    let e = load::parse_load(&dcgm_page, None).unwrap_err().to_string();
    assert!(e.contains("none of the families"), "{e}");
    let e = dcgm::parse(&sglang, None).unwrap_err().to_string();
    assert!(e.contains("none of the families"), "{e}");
}
