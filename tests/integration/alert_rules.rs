//! The shipped Prometheus alert rules: `promtool check rules` and the
//! `promtool test rules` unit tests (one or more per rule) pass, every
//! rule has `for:`, a severity, summary, description and runbook, and every
//! series a rule reads is one the daemon exports.

use crate::common;

use std::process::Command;

const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/alerts/sentinel-rules.yml");
const TESTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/alerts/sentinel-rules.test.yml"
);

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/alerts"))
        .output()
        .expect("`promtool` is not installed: apt-get install prometheus (.ci/run does this)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn rules_are_valid_and_their_unit_tests_pass() {
    if !common::have(&["promtool"]) {
        return;
    }
    let checked = promtool(&["check", "rules", RULES]);
    assert!(checked.contains("SUCCESS: 9 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", TESTS]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_rule_is_complete_and_tested() {
    let rules = std::fs::read_to_string(RULES).unwrap();
    let tests = std::fs::read_to_string(TESTS).unwrap();
    let blocks: Vec<&str> = rules.split("- alert: ").skip(1).collect();
    assert_eq!(blocks.len(), 9);
    for block in blocks {
        let name = block.lines().next().unwrap().trim();
        for field in ["for:", "severity:", "summary:", "description:", "runbook:"] {
            assert!(block.contains(field), "{name} lacks {field}");
        }
        assert!(
            tests.contains(&format!("alertname: {name}")),
            "{name} has no promtool unit test"
        );
    }
}

#[test]
fn rules_read_only_series_the_daemon_exports() {
    let rules = std::fs::read_to_string(RULES).unwrap();
    let metrics_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics");
    let mut source = String::new();
    for entry in std::fs::read_dir(metrics_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            source.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    let mut names: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("sentinel_"))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 9, "{names:?}");
    for name in names {
        assert!(
            source.contains(&format!("\"{name}\"")),
            "{name} is not a metric the daemon exports"
        );
    }
}
