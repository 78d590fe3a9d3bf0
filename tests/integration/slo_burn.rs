//! An objective's budget burnt for real: the simulator probed every
//! second, a real Prometheus (Debian's `prometheus`) scraping the daemon
//! and evaluating the rules `vllm-sentinel rules` generates, with the
//! workbook's windows shortened sixty times (a page at 14.4x over 60 s and
//! 5 s, or 6x over 6 min and 30 s). The simulator slowed past the
//! threshold pages; restored, the page ends; the status page's budget
//! figures (from the store) and Prometheus' (from the counters) agree.

use crate::common;

use std::time::{Duration, Instant};

use vllm_sentinel::sim::{SimConfig, SimHandle};

const OBJECTIVE: &str = "ttft-fast";

/// The daemon's configuration, probing on `schedule`.
fn config(dir: &std::path::Path, base_url: &str, schedule: &str) -> String {
    let alert = |severity: &str, factor: f64, long: &str, short: &str| {
        format!(
            "[[slos.alerts]]\nseverity = \"{severity}\"\nfactor = {factor}\nlong_window = \"{long}\"\nshort_window = \"{short}\"\n"
        )
    };
    format!(
        r#"
[store]
path = "{store}"
[telemetry]
nvml = false
[[targets]]
name = "sim"
base_url = "{base_url}"
schedule = "{schedule}"
[targets.heartbeat]
enabled = false
[[scenarios]]
name = "chat"
input_len = 16
output_len = 4
num_requests = 4
concurrency = 2
warmup = 0
[[slos]]
name = "{OBJECTIVE}"
sli = "ttft"
threshold = "100ms"
objective = 95
window = "10m"
{page}{ticket}"#,
        store = dir.join("store.db").display(),
        page = alert("page", 14.4, "1m", "5s"),
        ticket = alert("ticket", 3.0, "10m", "1m"),
    )
}

/// The alerts of `name` firing now.
async fn firing(http: &reqwest::Client, port: u16, name: &str) -> Vec<serde_json::Value> {
    let Ok(reply) = http
        .get(format!("http://127.0.0.1:{port}/api/v1/alerts"))
        .send()
        .await
    else {
        return Vec::new();
    };
    let body: serde_json::Value = reply.json().await.unwrap_or_default();
    body["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["state"] == "firing" && a["labels"]["alertname"] == name)
        .collect()
}

/// The value of `query` at `time` (seconds since the epoch), if any.
async fn query_at(http: &reqwest::Client, port: u16, query: &str, time: f64) -> Option<f64> {
    let url = reqwest::Url::parse_with_params(
        &format!("http://127.0.0.1:{port}/api/v1/query"),
        &[("query", query), ("time", &format!("{time:.3}"))],
    )
    .unwrap();
    let body: serde_json::Value = http.get(url).send().await.ok()?.json().await.ok()?;
    body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowed_simulator_pages_the_page_resolves_and_both_budgets_agree() {
    if !common::have(&["prometheus"]) {
        return;
    }
    let dir = common::temp_dir("slo-burn");
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 20.0,
            itl_ms: 2.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    // No run until Prometheus has scraped the objective's counters at 0:
    // it then sees every event the store keeps.
    let file = dir.join("sentinel.toml");
    let text = config(&dir, &sim.base_url(), "0 0 1 1 *");
    let handle = common::start_daemon(&text, Some(&file)).await;
    let parsed = vllm_sentinel::config::Config::from_text(&text, "test").unwrap();
    let rules = dir.join("slo-rules.yml");
    std::fs::write(
        &rules,
        vllm_sentinel::slo::rules::rules_file(&parsed.slos, "test"),
    )
    .unwrap();
    let (_prometheus, port) = common::prom::start_prometheus(
        &dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
scrape_configs:\n  - job_name: sentinel\n    static_configs:\n      - targets: [\"{}\"]\n",
            rules.display(),
            handle.addr
        ),
    );
    let http = reqwest::Client::new();
    let page = "SentinelErrorBudgetBurnPage";

    let counters = format!("sentinel_slo_requests_total{{slo=\"{OBJECTIVE}\"}}");
    common::until(
        Duration::from_secs(60),
        "Prometheus scraping the daemon",
        async || {
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1e3;
            query_at(&http, port, &counters, now).await
        },
    )
    .await;
    std::fs::write(&file, config(&dir, &sim.base_url(), "* * * * * *")).unwrap();
    handle.reload().await.unwrap();
    // Healthy until the page's long window is full: no page.
    common::until(
        Duration::from_secs(60),
        "Prometheus evaluating the rules",
        async || {
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1e3;
            query_at(&http, port, "sentinel_slo:sli_ratio", now)
                .await
                .filter(|v| !v.is_nan())
        },
    )
    .await;
    for _ in 0..35 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            firing(&http, port, page).await.is_empty(),
            "paged while healthy"
        );
    }

    // Every request now misses the 100 ms threshold.
    sim.state
        .update(serde_json::json!({"ttft_ms": 250.0}))
        .unwrap();
    let slowed = Instant::now();
    let alerts = common::until(Duration::from_secs(120), "the page", async || {
        let a = firing(&http, port, page).await;
        if a.is_empty() && std::env::var_os("SENTINEL_TEST_DEBUG").is_some() {
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1e3;
            let mut rates = Vec::new();
            for w in ["5s", "1m"] {
                let q = format!("sentinel_slo:burn_rate{{window=\"{w}\"}}");
                rates.push((w, query_at(&http, port, &q, now).await));
            }
            eprintln!(
                "{rates:?} {}",
                common::get_text(&handle, "/api/v1/slos").await
            );
        }
        (!a.is_empty()).then_some(a)
    })
    .await;
    let to_page = slowed.elapsed().as_secs_f64();
    assert_eq!(alerts[0]["labels"]["slo"], OBJECTIVE);
    assert_eq!(alerts[0]["labels"]["severity"], "critical");
    // The status page's own figures burn past the page's factor too
    // (within seconds: Prometheus extrapolates to its evaluation).
    common::until(
        Duration::from_secs(10),
        "the page burning on /api/v1/slos",
        async || {
            let api: serde_json::Value =
                serde_json::from_str(&common::get_text(&handle, "/api/v1/slos").await).unwrap();
            let alerts = api["slos"][0]["alerts"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            alerts
                .iter()
                .any(|a| a["burning"] == true && a["severity"] == "page")
                .then_some(())
        },
    )
    .await;

    // Restored: the short windows clear and the page ends.
    sim.state
        .update(serde_json::json!({"ttft_ms": 20.0}))
        .unwrap();
    let restored = Instant::now();
    common::until(
        Duration::from_secs(120),
        "the page to resolve",
        async || firing(&http, port, page).await.is_empty().then_some(()),
    )
    .await;
    let to_resolve = restored.elapsed().as_secs_f64();

    // The status page's figures from the store against Prometheus' from
    // the counters, over the objective's window, at the same moment:
    // while probes go on (Prometheus has the events up to its last scrape,
    // extrapolated), then once they have stopped (the same events).
    let (active, shown_active) = compare(&handle, &http, port, 3).await;
    std::fs::write(&file, config(&dir, &sim.base_url(), "0 0 1 1 *")).unwrap();
    handle.reload().await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (quiet, shown_quiet) = compare(&handle, &http, port, 1).await;
    let status_page = common::get_text(&handle, "/").await;
    println!(
        "page alert fired {to_page:.1} s after the slowdown, resolved {to_resolve:.1} s after the restore\n\
while probing:\n{}\nlargest difference in budget left: {:.2}% of the figure\n\
probes stopped:\n{}\ndifference in budget left: {:.3}% of the figure",
        shown_active.join("\n"),
        active * 100.0,
        shown_quiet.join("\n"),
        quiet * 100.0
    );
    assert!(
        status_page.contains("<h2>Objectives</h2>") && status_page.contains(OBJECTIVE),
        "{status_page}"
    );
    assert!(
        quiet <= 0.01 && active <= 0.05,
        "the page and Prometheus disagree on the budget left:\n{}\n{}",
        shown_active.join("\n"),
        shown_quiet.join("\n")
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}

/// Reads the budget left and the SLI from `/api/v1/slos`, then
/// Prometheus' recorded figures at the moment the page computed its own,
/// `times` times: the largest difference in budget left relative to the
/// page's figure, and what was seen.
async fn compare(
    handle: &vllm_sentinel::daemon::DaemonHandle,
    http: &reqwest::Client,
    port: u16,
    times: usize,
) -> (f64, Vec<String>) {
    let mut worst: f64 = 0.0;
    let mut shown = Vec::new();
    let selector = format!("{{slo=\"{OBJECTIVE}\"}}");
    for _ in 0..times {
        let api: serde_json::Value =
            serde_json::from_str(&common::get_text(handle, "/api/v1/slos").await).unwrap();
        let at = chrono::DateTime::parse_from_rfc3339(api["computed_at"].as_str().unwrap())
            .unwrap()
            .timestamp_millis() as f64
            / 1e3;
        let status = &api["slos"][0];
        let page_left = status["error_budget_remaining"].as_f64().unwrap();
        let page_sli = status["sli_ratio"].as_f64().unwrap();
        // Prometheus has scraped and evaluated past that moment.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let left = format!("sentinel_slo:error_budget_remaining_ratio{selector}");
        let prom_left = query_at(http, port, &left, at).await.unwrap();
        let sli = format!("sentinel_slo:sli_ratio{selector}");
        let prom_sli = query_at(http, port, &sli, at).await.unwrap();
        worst = worst.max((page_left - prom_left).abs() / page_left.abs().max(1.0));
        shown.push(format!(
            "  budget left: page {page_left:.4}, Prometheus {prom_left:.4}; SLI: page {page_sli:.5}, Prometheus {prom_sli:.5} ({} of {} good)",
            status["good"], status["total"]
        ));
    }
    (worst, shown)
}
