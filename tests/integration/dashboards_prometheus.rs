//! The shipped dashboards against a real Prometheus (Debian's `prometheus`
//! package, installed by `.ci/run`) scraping the `demo` command: every
//! panel's and template variable's PromQL must be valid and return series.
//! The same scrape passes `promtool check metrics`, and SIGTERM stops the
//! demo cleanly with exit status 0. Prometheus loads the rules of the
//! demo's objectives (`demo --rules`), which the objectives' panels read.

use crate::common;

use common::{Killed, temp_dir};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `demo` on a free port, writing its objectives' rules to
/// `rules`, and returns it with its exporter address.
fn start_demo(store: &std::path::Path, rules: &std::path::Path) -> (Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        // The first replica rolls to the slower build after 20 s, the
        // second 20 s later: the rollout panels and annotations have data.
        .args(["demo", "--listen", "127.0.0.1:0", "--rollout-after", "20s"])
        .args(["--rollout-gap", "20s"])
        // Replica 2's engine wedges once the rollout is over: the
        // "Engine not generating" annotations have data.
        .args(["--wedge-after", "55s", "--wedge-for", "90s", "--store"])
        .arg(store)
        .arg("--rules")
        .arg(rules)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut addr = None;
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.trim().strip_prefix("metrics") {
            let url = rest.split_whitespace().next().unwrap();
            addr = Some(
                url.trim_start_matches("http://")
                    .trim_end_matches("/metrics")
                    .to_owned(),
            );
            break;
        }
    }
    // Keep reading so the demo never writes into a closed pipe.
    std::thread::spawn(move || for _ in lines {});
    (Killed(child), addr.expect("demo printed its metrics URL"))
}

/// Every PromQL expression in a dashboard: panel targets and
/// `label_values(<selector>, label)` template queries (as the selector).
fn expressions(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push((
                panel["title"].as_str().unwrap().to_owned(),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"]["query"].as_str() {
            let selector = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(s, _)| s.to_owned())
                .unwrap();
            out.push((format!("variable {}", var["name"]), selector));
        }
    }
    out
}

fn query_url(port: u16, query: &str) -> reqwest::Url {
    reqwest::Url::parse_with_params(
        &format!("http://127.0.0.1:{port}/api/v1/query"),
        &[("query", query)],
    )
    .unwrap()
}

/// Annotations must be valid PromQL; the rollouts' must mark the demo's
/// rollout (started, then ended) and the wedges' its wedged replica, each
/// at some time (`seen`: they mark moments, not the whole run); the
/// replica variable must list both of the demo's replicas.
async fn check_annotations(
    http: &reqwest::Client,
    prom_port: u16,
    file: &str,
    dashboard: &serde_json::Value,
    invalid: &mut Vec<String>,
    empty: &mut Vec<String>,
    seen: &mut std::collections::BTreeMap<String, bool>,
) {
    for a in dashboard["annotations"]["list"].as_array().unwrap() {
        let query = substitute(a["expr"].as_str().unwrap(), "demo");
        let body: Option<serde_json::Value> =
            match http.get(query_url(prom_port, &query)).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
        let name = a["name"].as_str().unwrap_or_default();
        match body {
            Some(body) if body["status"] != "success" => {
                invalid.push(format!("{file} / annotation: {query}: {}", body["error"]))
            }
            Some(body) if name.starts_with("Rollouts") || name == "Engine not generating" => {
                let marks = body["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty());
                *seen
                    .entry(format!("{file} / annotation {name}: {query}"))
                    .or_default() |= marks;
            }
            _ => {}
        }
    }
    let query = "sentinel_run_success{target=\"demo\",replica!=\"\"}";
    if let Ok(r) = http.get(query_url(prom_port, query)).send().await
        && let Ok(body) = r.json::<serde_json::Value>().await
        && body["data"]["result"]
            .as_array()
            .is_none_or(|r| r.len() < 2)
    {
        empty.push(format!("{file}: the replica variable: {query}"));
    }
}

/// What Grafana substitutes before sending a query.
fn substitute(expr: &str, target: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("=~\"$target\"", "=~\".*\"")
        .replace("\"$target\"", &format!("\"{target}\""))
        .replace("$model", ".*")
        .replace("$scenario", ".*")
        .replace("$replica", ".*")
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_query_returns_series_from_a_real_prometheus_scraping_demo() {
    if !common::have(&["prometheus", "promtool"]) {
        return;
    }
    let dir = temp_dir("prom");
    let rules = dir.join("slo-rules.yml");
    let (mut demo, demo_addr) = start_demo(&dir.join("demo.db"), &rules);
    assert!(rules.exists(), "demo --rules wrote no file");
    let http = reqwest::Client::new();

    let (_prometheus, prom_port) = common::prom::start_prometheus(
        &dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: sentinel\n    static_configs:\n      - targets: [\"{demo_addr}\"]\n",
            rules.display()
        ),
    );

    let dashboards: Vec<(String, serde_json::Value)> = ["overview.json", "target.json"]
        .iter()
        .map(|f| {
            let path = format!("{}/dashboards/{f}", env!("CARGO_MANIFEST_DIR"));
            (
                f.to_string(),
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap(),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut empty: Vec<String>;
    let mut seen = std::collections::BTreeMap::new();
    let mut checked_metrics = false;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if !checked_metrics {
            let page = http
                .get(format!("http://{demo_addr}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if page.contains("sentinel_run_success{") {
                let out = common::prom::check_metrics(&page);
                assert!(
                    out.status.success(),
                    "promtool check metrics: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                checked_metrics = true;
            }
        }
        empty = Vec::new();
        let mut invalid = Vec::new();
        for (file, dashboard) in &dashboards {
            for (title, expr) in expressions(dashboard) {
                let query = substitute(&expr, "demo");
                let response = http.get(query_url(prom_port, &query)).send().await;
                let Ok(response) = response else {
                    empty.push(format!("{file}: Prometheus not up yet"));
                    continue;
                };
                let body: serde_json::Value = response.json().await.unwrap();
                if body["status"] != "success" {
                    invalid.push(format!("{file} / {title}: {query}: {}", body["error"]));
                } else if body["data"]["result"]
                    .as_array()
                    .is_none_or(|r| r.is_empty())
                {
                    empty.push(format!("{file} / {title}: {query}"));
                }
            }
            check_annotations(
                &http,
                prom_port,
                file,
                dashboard,
                &mut invalid,
                &mut empty,
                &mut seen,
            )
            .await;
        }
        assert!(
            invalid.is_empty(),
            "invalid PromQL:\n{}",
            invalid.join("\n")
        );
        let unseen = seen.values().any(|s| !s);
        if (empty.is_empty() && !unseen && checked_metrics) || Instant::now() > deadline {
            break;
        }
    }
    assert!(checked_metrics, "the demo produced no run");
    assert!(
        empty.is_empty(),
        "queries without series after 240 s:\n{}",
        empty.join("\n")
    );
    let unseen: Vec<&String> = seen.iter().filter(|(_, s)| !**s).map(|(q, _)| q).collect();
    assert!(
        unseen.is_empty(),
        "annotations that marked nothing in 240 s:\n{unseen:?}"
    );

    // SIGTERM: the demo drains and exits 0.
    let pid = demo.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    let status = loop {
        if let Some(s) = demo.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "demo did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "demo exit status after SIGTERM: {status}");
}
