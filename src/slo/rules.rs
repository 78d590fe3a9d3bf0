//! The Prometheus rules of the objectives, as Sloth and Pyrra write them:
//! per objective, the error ratio recorded over every window its alerts
//! and its own window need, the burn rate over each, the SLI and the
//! budget left over its window, then one page alert and one ticket alert,
//! each the OR of its multiwindow conditions. Written as a plain rules
//! file or as a prometheus-operator `PrometheusRule`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::prometheus_duration;
use crate::config::SloConfig;
use crate::config::slos::{BurnAlert, Severity, Sli};

/// The counters the rules read.
pub const REQUESTS: &str = "sentinel_slo_requests_total";
pub const GOOD_REQUESTS: &str = "sentinel_slo_good_requests_total";
/// The recorded series, labelled `slo` (and `window` where it applies).
pub const ERROR_RATIO: &str = "sentinel_slo:error_ratio";
pub const BURN_RATE: &str = "sentinel_slo:burn_rate";
pub const OBJECTIVE_RATIO: &str = "sentinel_slo:objective_ratio";
pub const SLI_RATIO: &str = "sentinel_slo:sli_ratio";
pub const BUDGET_REMAINING: &str = "sentinel_slo:error_budget_remaining_ratio";
/// The alerts: one per severity per objective.
pub const PAGE_ALERT: &str = "SentinelErrorBudgetBurnPage";
pub const TICKET_ALERT: &str = "SentinelErrorBudgetBurnTicket";

/// One rules file.
#[derive(Debug, Serialize)]
pub struct RuleFile {
    pub groups: Vec<Group>,
}

/// One objective's rules.
#[derive(Debug, Serialize)]
pub struct Group {
    pub name: String,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Rule {
    Record(Record),
    Alert(Alert),
}

#[derive(Debug, Serialize)]
pub struct Record {
    pub record: String,
    pub expr: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct Alert {
    pub alert: String,
    pub expr: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The alert name of a severity.
pub fn alert_name(severity: Severity) -> &'static str {
    match severity {
        Severity::Page => PAGE_ALERT,
        Severity::Ticket => TICKET_ALERT,
    }
}

/// The `severity` label of a page and of a ticket, as the shipped rules
/// name them (Alertmanager routes already know these).
pub fn severity_label(severity: Severity) -> &'static str {
    match severity {
        Severity::Page => "critical",
        Severity::Ticket => "warning",
    }
}

/// Every window the objective's rules record, shortest first: each
/// alert's two and the objective's own.
pub fn windows(slo: &SloConfig) -> Vec<Duration> {
    let mut windows: Vec<Duration> = slo
        .alerts
        .iter()
        .flat_map(|a| [a.long_window, a.short_window])
        .chain([slo.window])
        .collect();
    windows.sort();
    windows.dedup();
    windows
}

/// A ratio or factor as PromQL reads it, without binary noise
/// (`1 - 0.995` is 0.0050000000000000044): rounded to 12 significant
/// digits, so that a tiny error budget (`1e-11`) stays itself.
pub fn number(v: f64) -> String {
    let rounded: f64 = format!("{v:.11e}").parse().unwrap_or(v);
    match format!("{rounded}").as_str() {
        "-0" => "0".to_owned(),
        text => text.to_owned(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The objective's group.
pub fn group(slo: &SloConfig) -> Group {
    let name = slo.name.as_str();
    let budget = number(slo.budget());
    let selector = format!("{{slo=\"{name}\"}}");
    let mut rules = Vec::new();
    for w in windows(slo) {
        let w = prometheus_duration(w);
        rules.push(Rule::Record(Record {
            record: ERROR_RATIO.to_owned(),
            expr: format!(
                "1 - sum(increase({GOOD_REQUESTS}{selector}[{w}])) / sum(increase({REQUESTS}{selector}[{w}]))"
            ),
            labels: labels(&[("slo", name), ("window", &w)]),
        }));
        rules.push(Rule::Record(Record {
            record: BURN_RATE.to_owned(),
            expr: format!("{ERROR_RATIO}{{slo=\"{name}\",window=\"{w}\"}} / {budget}"),
            labels: labels(&[("slo", name), ("window", &w)]),
        }));
    }
    let window = prometheus_duration(slo.window);
    let over_window = format!("{ERROR_RATIO}{{slo=\"{name}\",window=\"{window}\"}}");
    rules.push(Rule::Record(Record {
        record: OBJECTIVE_RATIO.to_owned(),
        expr: format!("vector({})", number(slo.objective)),
        labels: labels(&[("slo", name)]),
    }));
    rules.push(Rule::Record(Record {
        record: SLI_RATIO.to_owned(),
        expr: format!("1 - {over_window}"),
        labels: labels(&[("slo", name), ("window", &window)]),
    }));
    rules.push(Rule::Record(Record {
        record: BUDGET_REMAINING.to_owned(),
        expr: format!("1 - {over_window} / {budget}"),
        labels: labels(&[("slo", name), ("window", &window)]),
    }));
    for severity in [Severity::Page, Severity::Ticket] {
        let conditions: Vec<&BurnAlert> = slo
            .alerts
            .iter()
            .filter(|a| a.severity == severity)
            .collect();
        if !conditions.is_empty() {
            rules.push(Rule::Alert(alert(slo, severity, &conditions)));
        }
    }
    Group {
        name: format!("vllm-sentinel-slo-{name}"),
        rules,
    }
}

/// The burn rate over `window` without its window label, so that two
/// windows' rates can be compared (`and`) and ORed into one alert.
fn burn_over(name: &str, window: Duration) -> String {
    format!(
        "max without (window) ({BURN_RATE}{{slo=\"{name}\",window=\"{}\"}})",
        prometheus_duration(window)
    )
}

fn alert(slo: &SloConfig, severity: Severity, conditions: &[&BurnAlert]) -> Alert {
    let name = slo.name.as_str();
    let expr = conditions
        .iter()
        .map(|a| {
            let factor = number(a.factor);
            format!(
                "({} > {factor} and {} > {factor})",
                burn_over(name, a.long_window),
                burn_over(name, a.short_window)
            )
        })
        .collect::<Vec<_>>()
        .join(" or ");
    let what = match slo.sli {
        Sli::Liveness => "heartbeats finding the target generating".to_owned(),
        Sli::Success => "probe requests succeeding".to_owned(),
        Sli::Latency { .. } => format!("probe requests with {}", slo.sli.describe()),
    };
    let windows = conditions
        .iter()
        .map(|a| {
            format!(
                "{}x over {} and {}",
                number(a.factor),
                prometheus_duration(a.long_window),
                prometheus_duration(a.short_window)
            )
        })
        .collect::<Vec<_>>()
        .join(", or ");
    let (summary, urgency) = match severity {
        Severity::Page => ("burning its error budget fast", "page"),
        Severity::Ticket => ("burning its error budget", "ticket"),
    };
    Alert {
        alert: alert_name(severity).to_owned(),
        expr,
        labels: labels(&[
            ("severity", severity_label(severity)),
            ("slo", name),
            ("response", urgency),
        ]),
        annotations: labels(&[
            ("summary", &format!("Objective {name} is {summary}")),
            (
                "description",
                &format!(
                    "{}% of {what} over {} is the objective; its error budget burns faster than the window can sustain ({windows}).",
                    number(slo.objective * 100.0),
                    prometheus_duration(slo.window),
                ),
            ),
            (
                "runbook",
                "Open the sentinel status page's Objectives table (or GET /api/v1/slos) for the budget left and the burn rate per window, then the target dashboard: which target, scenario or replica fails or is slow (sentinel_requests_total by outcome, the latency per run and per replica).",
            ),
        ]),
    }
}

/// Every objective's rules as one rules file (YAML), with a header
/// saying where it came from.
pub fn rules_file(slos: &[SloConfig], origin: &str) -> String {
    let file = RuleFile {
        groups: slos.iter().map(group).collect(),
    };
    let body = yaml_serde::to_string(&file).unwrap_or_default();
    format!(
        "# Generated by `vllm-sentinel rules` from {origin}: the recording and\n\
# burn-rate alerting rules of its objectives. Load with rule_files.\n{body}"
    )
}

#[derive(Serialize)]
struct PrometheusRule<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    metadata: Metadata<'a>,
    spec: RuleFile,
}

#[derive(Serialize)]
struct Metadata<'a> {
    name: &'a str,
    labels: BTreeMap<String, String>,
}

/// The same rules as a prometheus-operator `PrometheusRule` named `name`.
pub fn prometheus_rule(slos: &[SloConfig], origin: &str, name: &str) -> String {
    let resource = PrometheusRule {
        api_version: "monitoring.coreos.com/v1",
        kind: "PrometheusRule",
        metadata: Metadata {
            name,
            labels: labels(&[("app.kubernetes.io/name", "vllm-sentinel")]),
        },
        spec: RuleFile {
            groups: slos.iter().map(group).collect(),
        },
    };
    let body = yaml_serde::to_string(&resource).unwrap_or_default();
    format!("# Generated by `vllm-sentinel rules --prometheus-rule` from {origin}.\n{body}")
}
