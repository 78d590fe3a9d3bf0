//! `[[slos]]` and a target's gateway settings: defaults, and every
//! problem named on its field.

use std::time::Duration;

use super::*;
use crate::config::Config;
use crate::config::gateway::HeaderValueSource;

const BASE: &str = r#"
[[targets]]
name = "a"
base_url = "http://h:1"
scenarios = ["chat", "scaling"]
[[targets]]
name = "b"
base_url = "http://h:2"
scenarios = ["chat"]
[targets.heartbeat]
enabled = false
[[scenarios]]
name = "chat"
input_len = 8
output_len = 4
[[scenarios]]
name = "scaling"
preset = "concurrency-scaling"
scale = 0.01
"#;

fn parsed(extra: &str) -> Result<Config, Vec<String>> {
    Config::from_text(&format!("{BASE}{extra}"), "t")
        .map_err(|e| e.field_errors().iter().map(|e| e.to_string()).collect())
}

#[test]
fn an_objective_takes_the_workbook_alerts_and_covers_everything_by_default() {
    let c = parsed(
        "[[slos]]\nname = \"ok\"\nsli = \"success\"\nobjective = 99.5\nwindow = \"30d\"\n\
[[slos]]\nname = \"fast\"\ntargets = [\"a\"]\nscenarios = [\"scaling\"]\nsli = \"itl_p99\"\nthreshold = \"50ms\"\n\
objective = 99\nwindow = \"7d\"\nreplicas = \"service\"\n[[slos.alerts]]\nseverity = \"page\"\nfactor = 10\n\
long_window = \"10m\"\nshort_window = \"1m\"\n",
    )
    .unwrap();
    let ok = &c.slos[0];
    assert_eq!(ok.sli, Sli::Success);
    assert!((ok.objective - 0.995).abs() < 1e-12);
    assert!((ok.budget() - 0.005).abs() < 1e-12);
    assert_eq!(ok.window, Duration::from_secs(30 * 86400));
    assert_eq!(ok.alerts, workbook_alerts());
    assert_eq!(ok.replicas, ReplicaScope::All);
    assert!(ok.covers_target("b") && ok.covers_scenario("anything"));
    let fast = &c.slos[1];
    // The written name selects every concurrency level.
    assert_eq!(
        fast.scenarios,
        [
            "scaling-c2",
            "scaling-c4",
            "scaling-c8",
            "scaling-c16",
            "scaling-c32"
        ]
    );
    assert_eq!(
        fast.sli,
        Sli::Latency {
            metric: LatencyMetric::ItlP99,
            threshold: Duration::from_millis(50)
        }
    );
    assert_eq!(fast.sli.describe(), "itl_p99 <= 50ms");
    assert_eq!(fast.alerts.len(), 1);
    assert!(
        fast.covers_replica("", None, Some("10.0.0.1:80"))
            && !fast.covers_replica("r:1", None, None)
    );
}

#[test]
fn every_problem_of_an_objective_is_named_on_its_field() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[[slos]]\nname = \"x y\"\nsli = \"latency\"\nobjective = 100\n\
[[slos]]\nname = \"w\"\nsli = \"success\"\nobjective = 99\nwindow = \"30s\"\n",
            &[
                "slos[0].name: \"x y\" must be 1-64 characters of letters, digits, '-', '_' or '.'",
                "slos[0].sli: \"latency\" is not an SLI; one of ttft, tpot, itl_p99, e2el, success, liveness",
                "slos[0].objective: 100 must be above 0 and below 100 (percent)",
                "slos[0].window: is required, e.g. \"30d\"",
                "slos[1].window: 30s is too short: at least 1m",
            ],
        ),
        (
            "[[slos]]\nname = \"a\"\nsli = \"ttft\"\nobjective = 99\nwindow = \"100d\"\ntargets = [\"zz\"]\nscenarios = [\"nope\"]\n\
[[slos]]\nname = \"a\"\nsli = \"success\"\nthreshold = \"1s\"\nobjective = 99\nwindow = \"1h\"\n",
            &[
                "slos[0].threshold: is required for a ttft SLI, e.g. \"500ms\"",
                "slos[0].targets[0]: no target named \"zz\"; defined: a, b",
                "slos[0].scenarios[0]: no scenario named \"nope\"; defined: chat, scaling-c2, scaling-c4, scaling-c8, scaling-c16, scaling-c32",
                "slos[0].window: 100d is longer than store.retention (90d): the store would no longer hold the window's requests",
                "slos[1].threshold: only latency SLIs have a threshold, not \"success\"",
                "slos[1].name: \"a\" is used by more than one objective",
            ],
        ),
        (
            "[[slos]]\nname = \"live\"\nsli = \"liveness\"\ntargets = [\"b\"]\nscenarios = [\"chat\"]\nobjective = 99.9\nwindow = \"1d\"\n\
[[slos]]\nname = \"rep\"\nsli = \"success\"\nreplicas = \"replicas\"\nobjective = 99\nwindow = \"1d\"\n",
            &[
                "slos[0].scenarios: a liveness objective counts heartbeats, which belong to no scenario",
                "slos[0]: covers nothing: no target it covers has its heartbeat enabled",
                "slos[1].replicas: \"replicas\": no target it covers probes its replicas ([targets.replicas] probe)",
            ],
        ),
        (
            "[[slos]]\nname = \"x\"\nsli = \"e2el\"\nthreshold = \"2s\"\nobjective = 90\nwindow = \"1d\"\n\
[[slos.alerts]]\nseverity = \"page\"\nfactor = 14.4\nlong_window = \"1h\"\nshort_window = \"5m\"\n\
[[slos.alerts]]\nseverity = \"ticket\"\nfactor = 3\nlong_window = \"5m\"\nshort_window = \"1h\"\n\
[[slos.alerts]]\nseverity = \"email\"\nfactor = 0\nlong_window = \"1h\"\n",
            &[
                "slos[0].alerts[0].factor: 14.4 times a budget of 10.000% is every request failing or more: this alert could never fire",
                "slos[0].alerts[1].short_window: must be shorter than long_window: it is what lets the alert end soon after the burn",
                "slos[0].alerts[2].severity: \"email\" must be \"page\" or \"ticket\"",
                "slos[0].alerts[2].factor: must be above 0",
                "slos[0].alerts[2].short_window: is required, e.g. \"1h\"",
            ],
        ),
        (
            "[[slos]]\nname = \"x\"\nsli = \"success\"\nobjective = 99\nwindow = \"1d\"\n\
[[slos.alerts]]\nseverity = \"page\"\nfactor = 2\nlong_window = \"1h\"\nshort_window = \"5m\"\n\
[[slos.alerts]]\nseverity = \"ticket\"\nfactor = 3\nlong_window = \"6h\"\nshort_window = \"30m\"\n",
            &[
                "slos[0].alerts: a ticket's factor (3) must be below every page's (2): a ticket is for burns too slow to page",
            ],
        ),
    ];
    for (text, expected) in cases {
        let got = parsed(text).err().unwrap_or_default();
        let want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "for:\n{text}");
    }
}

const GATEWAY: &str =
    "[[targets]]\nname = \"gw\"\nbase_url = \"http://gw:1\"\napi_key_env = \"K\"\n";
const SCENARIO: &str = "[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n";

#[test]
fn a_gateway_target_carries_headers_and_reads_the_serving_endpoint() {
    let text = format!(
        "{GATEWAY}[[targets.headers]]\nname = \"X-Gateway-Priority\"\nvalue = \"low\"\n\
[[targets.headers]]\nname = \"x-tenant\"\nvalue_env = \"TENANT\"\n\
[targets.gateway]\nendpoint_header = \"X-Gateway-Destination-Endpoint\"\n{SCENARIO}"
    );
    let c = Config::from_text(&text, "t").unwrap();
    let t = &c.targets[0];
    assert_eq!(t.headers[0].name, "x-gateway-priority");
    assert!(matches!(t.headers[1].value, HeaderValueSource::Read(_)));
    let g = t.gateway.as_ref().unwrap();
    assert_eq!(
        g.endpoint_header.as_deref(),
        Some("x-gateway-destination-endpoint")
    );
    assert_eq!(g.shed_statuses, [429, 503]);
    assert_eq!(t.gateway_rules().shed_statuses, [429, 503]);
    // A written value is never shown, not even by Debug.
    assert!(!format!("{:?}", t.headers).contains("low"));
    // A replica is asked directly: no gateway rules there.
    assert!(t.at_replica("http://r:1").gateway.is_none());
}

#[test]
fn gateway_settings_name_their_problems_without_showing_values() {
    let text = format!(
        "{GATEWAY}[[targets.headers]]\nname = \"Authorization\"\nvalue = \"Bearer s3cret\"\n\
[[targets.headers]]\nname = \"host\"\nvalue_env = \"H\"\n\
[[targets.headers]]\nname = \"x-a\"\nvalue = \"v\"\nvalue_file = \"/f\"\n\
[[targets.headers]]\nname = \"x-b\"\nvalue = \"bad\\nline s3cret\"\n\
[[targets.headers]]\nname = \"x-b\"\n\
[targets.gateway]\nendpoint_header = \"no header\"\nshed_statuses = [429, 200, \"x\"]\n{SCENARIO}"
    );
    let got: Vec<String> = Config::from_text(&text, "t")
        .unwrap_err()
        .field_errors()
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        got,
        [
            "targets[0].headers[0].name: \"authorization\" carries the target's API key (api_key_env or api_key_file)",
            "targets[0].headers[1].name: \"host\" is set by the client itself",
            "targets[0].headers[2].value: set one of value, value_env or value_file",
            "targets[0].headers[3].value: contains characters not allowed in a header",
            "targets[0].headers[4].value: is required: value, value_env or value_file",
            "targets[0].gateway.endpoint_header: \"no header\" is not a header name",
            "targets[0].gateway.shed_statuses[2]: expected an integer, found a string",
            "targets[0].gateway.shed_statuses[1]: 200 is not an HTTP error status (400 to 599)",
        ]
    );
    assert!(got.iter().all(|e| !e.contains("s3cret")));
}

fn default_alerts_of(objective: &str, window: &str) -> Result<Vec<BurnAlert>, Vec<String>> {
    parsed(&format!(
        "[[slos]]\nname = \"s\"\nsli = \"success\"\nobjective = {objective}\nwindow = \"{window}\"\n"
    ))
    .map(|c| c.slos[0].alerts.clone())
}

/// (severity, factor, long window, short window) in seconds.
fn shape(alerts: &[BurnAlert]) -> Vec<(Severity, f64, u64, u64)> {
    alerts
        .iter()
        .map(|a| {
            let (long, short) = (a.long_window.as_secs(), a.short_window.as_secs());
            (a.severity, a.factor, long, short)
        })
        .collect()
}

#[test]
fn the_workbook_alerts_are_scaled_to_the_objectives_window() {
    use Severity::{Page, Ticket};
    let (m, h) = (60, 3600);
    for (window, expected) in [
        // 30 days: the workbook's own.
        (
            "30d",
            [
                (Page, 14.4, h, 5 * m),
                (Page, 6.0, 6 * h, 30 * m),
                (Ticket, 3.0, 24 * h, 2 * h),
                (Ticket, 1.0, 72 * h, 6 * h),
            ],
        ),
        // 7 days: each window 7/30 of the workbook's, so each condition
        // spends the workbook's share of the budget; the fastest page's
        // 70 s short window raised to 5 min.
        (
            "7d",
            [
                (Page, 14.4, 14 * m, 5 * m),
                (Page, 6.0, 84 * m, 7 * m),
                (Ticket, 3.0, 336 * m, 28 * m),
                (Ticket, 1.0, 1008 * m, 84 * m),
            ],
        ),
        // A day: every short window at 5 min, its long at least twice.
        (
            "1d",
            [
                (Page, 14.4, 10 * m, 5 * m),
                (Page, 6.0, 12 * m, 5 * m),
                (Ticket, 3.0, 48 * m, 5 * m),
                (Ticket, 1.0, 144 * m, 12 * m),
            ],
        ),
        // 90 days: three times the workbook's.
        (
            "90d",
            [
                (Page, 14.4, 3 * h, 15 * m),
                (Page, 6.0, 18 * h, 90 * m),
                (Ticket, 3.0, 72 * h, 6 * h),
                (Ticket, 1.0, 216 * h, 18 * h),
            ],
        ),
    ] {
        assert_eq!(
            shape(&default_alerts_of("99.5", window).unwrap()),
            expected,
            "{window}"
        );
    }
}

#[test]
fn a_default_condition_the_budget_could_never_burn_is_left_out_and_no_page_is_refused() {
    // A 10% budget cannot burn 14.4 times over (144% of requests): the
    // page at 6x stays, with both tickets.
    let factors: Vec<f64> = default_alerts_of("90", "30d")
        .unwrap()
        .iter()
        .map(|a| a.factor)
        .collect();
    assert_eq!(factors, [6.0, 3.0, 1.0]);
    // 20% cannot burn 6 times over either: no page left, said on the field.
    assert_eq!(
        default_alerts_of("80", "30d").unwrap_err(),
        [
            "slos[0].objective: 80% leaves a budget of 20.000%, which no page of the workbook's (14.4x, 6x) can burn that fast: write [[slos.alerts]] with factors below 5.00"
        ]
    );
}
