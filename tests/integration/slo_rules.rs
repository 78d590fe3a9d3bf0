//! `vllm-sentinel rules` on a configuration with three objectives, one of
//! latency and one of success at the workbook's windows (30 days), and one
//! of success over 7 days, whose windows are the workbook's scaled to it:
//! the rules file
//! passes `promtool check rules`, its generated unit tests pass `promtool
//! test rules` (a fast burn pages, a slow burn opens a ticket, a blip does
//! neither), the PrometheusRule carries the same groups, and
//! `check-config` names a bad objective's fields.

use crate::common;

use std::path::Path;
use std::process::Command;

const CONFIG: &str = r#"
[[targets]]
name = "prod"
base_url = "http://127.0.0.1:9"
[[scenarios]]
name = "chat"
input_len = 64
output_len = 16
[[slos]]
name = "chat-ttft"
scenarios = ["chat"]
sli = "ttft"
threshold = "500ms"
objective = 99.5
window = "30d"
[[slos]]
name = "prod-success"
targets = ["prod"]
sli = "success"
objective = 99.9
window = "30d"
[[slos]]
name = "prod-success-week"
targets = ["prod"]
sli = "success"
objective = 99
window = "7d"
"#;

fn sentinel(args: &[&str]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"));
    command.args(args);
    common::output_of(command)
}

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let mut command = Command::new("promtool");
    command.args(args).current_dir(dir);
    common::output_of(command)
}

#[test]
fn generated_rules_check_and_their_unit_tests_pass_in_promtool() {
    let dir = common::temp_dir("slo-rules");
    let config = dir.join("sentinel.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let (rules, tests) = (dir.join("slo-rules.yml"), dir.join("slo-rules.test.yml"));
    let (ok, out) = sentinel(&[
        "rules",
        "--config",
        config.to_str().unwrap(),
        "--output",
        rules.to_str().unwrap(),
        "--tests",
        tests.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let text = std::fs::read_to_string(&rules).unwrap();
    for expected in [
        "sentinel_slo:burn_rate",
        "SentinelErrorBudgetBurnPage",
        "SentinelErrorBudgetBurnTicket",
        "window: 5m",
        "window: 3d",
        "window: 30d",
        // The 7-day objective's: 1 h, 6 h, 1 d and 3 d scaled by 7/30.
        "window: 14m",
        "window: 1h24m",
        "window: 5h36m",
        "window: 16h48m",
        "window: 7d",
        "> 14.4",
        "/ 0.005",
        "/ 0.001",
    ] {
        assert!(text.contains(expected), "{expected} missing:\n{text}");
    }
    let test_text = std::fs::read_to_string(&tests).unwrap();
    assert!(test_text.contains("- slo-rules.yml"), "{test_text}");

    if !common::have(&["promtool"]) {
        return;
    }
    let (ok, checked) = promtool(&["check", "rules", "slo-rules.yml"], &dir);
    println!("promtool check rules:\n{checked}");
    // Per objective: an error ratio and a burn rate for each of its seven
    // windows (5m, 30m, 1h, 2h, 6h, 1d, 3d; over 7 days 5m, 7m, 14m, 28m,
    // 1h24m, 5h36m, 16h48m) and its own, the objective, the SLI, the
    // budget left, and two alerts.
    assert!(
        ok && checked.contains("SUCCESS: 63 rules found"),
        "{checked}"
    );
    let started = std::time::Instant::now();
    let (ok, tested) = promtool(&["test", "rules", "slo-rules.test.yml"], &dir);
    println!(
        "promtool test rules ({:.1} s):\n{tested}",
        started.elapsed().as_secs_f64()
    );
    assert!(ok && tested.contains("SUCCESS"), "{tested}");
    // Three tests per objective, each named for what it shows.
    for objective in ["chat-ttft", "prod-success", "prod-success-week"] {
        for what in [
            "(a fast burn) page",
            "(a slow burn) open a ticket",
            "(a blip) neither",
        ] {
            assert!(
                test_text.contains(&format!("{objective}: ")) && test_text.contains(what),
                "{objective} {what}:\n{test_text}"
            );
        }
    }

    // The same groups as a PrometheusRule.
    let resource = dir.join("prometheusrule.yaml");
    let (ok, out) = sentinel(&[
        "rules",
        "--config",
        config.to_str().unwrap(),
        "--prometheus-rule",
        "--output",
        resource.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let parsed: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(&resource).unwrap()).unwrap();
    assert_eq!(parsed["kind"], "PrometheusRule");
    assert_eq!(parsed["metadata"]["name"], "vllm-sentinel-slos");
    let spec = yaml_serde::to_string(&parsed["spec"]).unwrap();
    std::fs::write(dir.join("spec.yml"), spec).unwrap();
    let (ok, checked) = promtool(&["check", "rules", "spec.yml"], &dir);
    assert!(
        ok && checked.contains("SUCCESS: 63 rules found"),
        "{checked}"
    );
}

#[test]
fn rules_and_check_config_refuse_what_they_cannot_use() {
    let dir = common::temp_dir("slo-rules-errors");
    let config = dir.join("sentinel.toml");
    std::fs::write(&config, CONFIG.split("[[slos]]").next().unwrap()).unwrap();
    let (ok, out) = sentinel(&["rules", "--config", config.to_str().unwrap()]);
    assert!(!ok && out.contains("has no [[slos]]"), "{out}");

    std::fs::write(&config, CONFIG).unwrap();
    let (ok, out) = sentinel(&[
        "rules",
        "--config",
        config.to_str().unwrap(),
        "--tests",
        "t.yml",
    ]);
    assert!(!ok && out.contains("--tests needs --output"), "{out}");
    let (ok, out) = sentinel(&["rules", "--config", config.to_str().unwrap()]);
    assert!(
        ok && out.starts_with("# Generated by `vllm-sentinel rules`"),
        "{out}"
    );
    let (ok, out) = sentinel(&["check-config", "--config", config.to_str().unwrap()]);
    assert!(ok && out.contains("3 objectives"), "{out}");

    let bad = CONFIG
        .replace("objective = 99.9", "objective = 100")
        .replace("objective = 99\n", "objective = 80\n")
        .replace("threshold = \"500ms\"", "")
        .replace("window = \"30d\"\n[[slos]]", "window = \"91d\"\n[[slos]]");
    std::fs::write(&config, bad).unwrap();
    let (ok, out) = sentinel(&["check-config", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{out}");
    for line in [
        "slos[0].threshold: is required for a ttft SLI",
        "slos[0].window: 91d is longer than store.retention (90d)",
        "slos[1].objective: 100 must be above 0 and below 100 (percent)",
        "slos[2].objective: 80% leaves a budget of 20.000%, which no page of the workbook's (14.4x, 6x) can burn that fast: write [[slos.alerts]] with factors below 5.00",
    ] {
        assert!(out.contains(line), "{line} missing:\n{out}");
    }
}
