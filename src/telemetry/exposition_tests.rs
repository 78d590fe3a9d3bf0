use proptest::prelude::*;

use super::*;

/// The sum of a family's finite values; `None` when it is absent.
fn total_of(e: &Exposition, name: &str) -> Option<f64> {
    total(&e.scalars(&[name]))
}

#[test]
fn what_prometheus_accepts_is_read() {
    let page = "\
# HELP lonely_family has no samples
# TYPE lonely_family gauge

DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\"} 37
DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-2\",pod=\"vllm-0\",namespace=\"llm\"} 91 1700000000000
vllm:num_requests_running{model_name=\"a, \\\"quoted\\\" = b\\\\c\",engine=\"0\",} 3
vllm:num_requests_running{model_name=\"x\",engine=\"1\"} NaN
sglang:token_usage +Inf
requests_total{code=\"200\"} 1.5e3 # {trace_id=\"abc\"} 1 1700000000.0
requests_created{code=\"200\"} 1700000000
this is not a sample
# EOF
";
    let e = Exposition::parse(page).unwrap();
    assert_eq!(e.skipped_lines, 1);
    let gpus = e.scalars(&["DCGM_FI_DEV_GPU_UTIL"]);
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[1].label("pod"), Some("vllm-0"));
    assert_eq!(gpus[0].label("pod"), None);
    let running = e.scalars(&["vllm:num_requests_running"]);
    assert_eq!(running[0].label("model_name"), Some("a, \"quoted\" = b\\c"));
    assert!(running[1].value.is_nan());
    assert_eq!(total_of(&e, "vllm:num_requests_running"), Some(3.0));
    assert_eq!(total_of(&e, "sglang:token_usage"), Some(0.0));
    assert_eq!(total_of(&e, "requests_total"), Some(1500.0));
    // A counter asked for with `_total` is found without it too.
    assert_eq!(total_of(&e, "requests_created_total"), Some(1.7e9));
    assert!(e.scalars(&["lonely_family"]).is_empty());
}

#[test]
fn a_page_without_one_sample_is_refused() {
    assert!(Exposition::parse("").is_err());
    assert!(Exposition::parse("<html>not metrics</html>\n").is_err());
    assert!(Exposition::parse("# HELP only comments\n").is_err());
}

/// One valid sample line of `family` with label values drawn from `values`.
fn sample_line(family: &str, labels: &[(String, String)], value: f64) -> String {
    let rendered: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let escaped = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{escaped}\"")
        })
        .collect();
    format!("{family}{{{}}} {value}", rendered.join(","))
}

proptest! {
    /// Valid lines in any order, with any label sets per family, parse to
    /// exactly their samples; a garbage line inserted anywhere costs only
    /// itself.
    #[test]
    fn valid_lines_in_any_order_parse_and_garbage_costs_one_line(
        lines in prop::collection::vec(
            (
                prop::sample::select(vec!["vllm:a", "DCGM_FI_X", "sglang:b_total", "plain"]),
                prop::collection::vec(
                    (prop::sample::select(vec!["gpu", "pod", "model_name", "le"]), "[ -~\\n]{0,12}"),
                    0..4,
                ),
                -1e6f64..1e6,
            ),
            1..30,
        ),
        garbage in "[^\\n#]{1,40}",
        at in 0usize..30,
    ) {
        let mut text: Vec<String> = lines
            .iter()
            .map(|(family, labels, value)| {
                let mut unique: Vec<(String, String)> = Vec::new();
                for (k, v) in labels {
                    if !unique.iter().any(|(u, _)| u == k) {
                        unique.push((k.to_string(), v.clone()));
                    }
                }
                sample_line(family, &unique, *value)
            })
            .collect();
        let clean = Exposition::parse(&text.join("\n")).unwrap();
        prop_assert_eq!(clean.skipped_lines, 0);
        let count = |e: &Exposition| -> usize {
            ["vllm:a", "DCGM_FI_X", "sglang:b_total", "plain"]
                .iter()
                .map(|f| e.samples.get(*f).map_or(0, Vec::len))
                .sum()
        };
        prop_assert_eq!(count(&clean), lines.len());
        // Garbage that happens to be a valid sample is not garbage.
        if parse_sample(garbage.trim()).is_none() && !garbage.trim().is_empty() {
            text.insert(at.min(text.len()), garbage.clone());
            let dirty = Exposition::parse(&text.join("\n")).unwrap();
            prop_assert_eq!(dirty.skipped_lines, 1);
            prop_assert_eq!(count(&dirty), lines.len());
        }
    }
}
