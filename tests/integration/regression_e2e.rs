//! The upgrade story end to end, with real delivery endpoints: the daemon
//! in-process against the simulator, a webhook receiver, a real SMTP
//! server (Debian's `python3-aiosmtpd`, writing a maildir) and a real
//! Alertmanager (Debian's `prometheus-alertmanager`, queried through its
//! v2 API). A stable version forms the baseline; the simulator's admin
//! endpoint then switches the version and adds 20% to TTFT, and the
//! regression must arrive everywhere within the runs the rule allows; a
//! restart in the middle of collecting the new version's runs loses
//! nothing; when the latency returns, the resolution arrives. Load is
//! `regression_load`'s.

use crate::common;

use common::{
    Killed, SmtpTls, free_port, start_smtp, start_webhook, temp_dir, until, until_every,
    wait_for_port,
};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vllm_sentinel::config::Config;
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::store::Store;
use vllm_sentinel::store::baselines::PairKey;
use vllm_sentinel::telemetry::exposition::Exposition;
use vllm_sentinel::verdict::pair::PairVerdict;

/// A real Alertmanager with one receiver that drops everything: the test
/// reads the alerts through the API.
async fn start_alertmanager(dir: &Path) -> (Killed, String) {
    let port = free_port();
    let config = dir.join("alertmanager.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: drop\n  group_wait: 1s\nreceivers:\n  - name: drop\n",
    )
    .unwrap();
    // Debian names the binary prometheus-alertmanager; upstream, alertmanager.
    let binary = ["prometheus-alertmanager", "alertmanager"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .expect("prometheus-alertmanager is not installed (.ci/run installs it)");
    let child = Command::new(binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus-alertmanager is not installed (.ci/run installs it)");
    let child = Killed(child);
    wait_for_port(port, "alertmanager").await;
    (child, format!("http://127.0.0.1:{port}"))
}

pub(crate) fn sim_config() -> SimConfig {
    SimConfig {
        // Long enough that a busy machine's scheduling delays (a few ms)
        // stay small beside it and beside the +20% step below.
        ttft_ms: 80.0,
        itl_ms: 2.0,
        // Per-request log-normal noise, as real servers show.
        jitter: 0.03,
        version: "0.32.0".into(),
        ..SimConfig::default()
    }
}

/// One target with one small scenario, probed every second.
pub(crate) fn probed_pair(sim: &SimHandle) -> String {
    format!(
        r#"
[scheduler]
schedule = "* * * * * *"
[[scenarios]]
name = "interactive"
input_len = 32
output_len = 8
concurrency = 2
num_requests = 4
warmup = 0
[[targets]]
name = "prod"
base_url = "{}"
scenarios = ["interactive"]
"#,
        sim.base_url()
    )
}

/// The simulator and a daemon probing it every second (its store in a
/// scratch directory, `detector` its `[detector]` section), once the
/// stable version's baseline has formed.
pub(crate) struct Probed {
    pub sim: SimHandle,
    pub handle: DaemonHandle,
    pub store: Store,
    pub config: String,
    /// The scratch directory, removed when this drops.
    pub dir: common::TempDir,
}

impl Probed {
    pub(crate) async fn start(name: &str, sim: SimConfig, detector: &str) -> Probed {
        let dir = temp_dir(name);
        let sim = SimHandle::start("127.0.0.1:0", sim).await.unwrap();
        let store_path = dir.join("store.db");
        let config = format!(
            "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n{detector}",
            store_path.display(),
        ) + &probed_pair(&sim);
        let handle = common::start_daemon(&config, None).await;
        let store = Store::open(&store_path).unwrap();
        until(Duration::from_secs(60), "the baseline", async || {
            store.baseline(&key(), "0.32.0").unwrap()
        })
        .await;
        Probed {
            sim,
            handle,
            store,
            config,
            dir,
        }
    }
}

pub(crate) fn key() -> PairKey {
    PairKey {
        target: "prod".into(),
        model: "sim-model".into(),
        scenario: "interactive".into(),
    }
}

/// Calls the daemon's API: GET, or POST with a JSON body; returns the
/// status and the JSON answer (`null` when the answer is not JSON).
async fn api(
    handle: &DaemonHandle,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let http = reqwest::Client::new();
    let url = format!("http://{}{path}", handle.addr);
    let mut request = match body {
        Some(b) => http.post(url).json(b),
        None => http.get(url),
    };
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap_or(serde_json::Value::Null),
    )
}

pub(crate) async fn metrics_page(handle: &DaemonHandle) -> String {
    common::get_text(handle, "/metrics").await
}

/// The newest verdict of the pair (the token is ignored where none is set).
pub(crate) async fn latest_verdict(handle: &DaemonHandle) -> Option<PairVerdict> {
    let (status, all) = api(handle, "/api/v1/verdicts", Some("e2e-admin-secret"), None).await;
    assert_eq!(status, 200);
    serde_json::from_value::<Vec<PairVerdict>>(all)
        .unwrap()
        .into_iter()
        .find(|v| v.scenario == "interactive")
}

fn mails(maildir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(maildir.join("new")) {
        for e in entries.flatten() {
            out.push(std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    out
}

async fn alertmanager_alerts(base: &str) -> Vec<serde_json::Value> {
    reqwest::get(format!(
        "{base}/api/v2/alerts?filter=alertname%3D%22SentinelRegression%22"
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_slows_ttft_is_reported_everywhere_then_resolved() {
    if !common::have(&["aiosmtpd", "alertmanager"]) {
        return;
    }
    let dir = temp_dir("upgrade");
    let maildir = dir.join("maildir");
    let (_smtp, smtp_port) = start_smtp(&maildir, SmtpTls::Plain).await;
    let (_am, am_url) = start_alertmanager(&dir).await;
    let (hook_url, hooks) = start_webhook().await;
    let sim = SimHandle::start("127.0.0.1:0", sim_config()).await.unwrap();
    let admin_file = dir.join("admin-token");
    std::fs::write(&admin_file, "e2e-admin-secret").unwrap();
    let store_path = dir.join("store.db");
    let config = format!(
        r#"
[exporter]
admin_token_file = "{admin}"
[store]
path = "{store}"
[telemetry]
scrape_interval = "500ms"
nvml = false
[detector]
upgrade_round_gap = "250ms"
[notify]
external_url = "http://sentinel.test:9464"
group_wait = "0s"
min_interval = "0s"
retry_initial = "100ms"
[notify.email]
smtp_host = "127.0.0.1"
smtp_port = {smtp_port}
security = "none"
from = "sentinel@example.com"
to = ["oncall@example.com"]
[[notify.webhooks]]
name = "chat"
url = "{hook_url}"
[notify.alertmanager]
url = "{am_url}"
resend_interval = "1s"
"#,
        admin = admin_file.display(),
        store = store_path.display(),
    ) + &probed_pair(&sim);

    // 1. The stable version: 2 warm-up runs, then 30 runs form the baseline.
    let handle = common::start_daemon(&config, None).await;
    let store = Store::open(&store_path).unwrap();
    let baseline = until(Duration::from_secs(90), "the baseline", async || {
        store.baseline(&key(), "0.32.0").unwrap()
    })
    .await;
    assert_eq!(baseline.run_ids.len(), 30);
    let verdict = latest_verdict(&handle).await.unwrap();
    assert_ne!(verdict.state, vllm_sentinel::verdict::State::Regression);

    // 2. The upgrade: new version, TTFT +20%.
    sim.state
        .update(serde_json::json!({"version": "0.33.0", "ttft_ms": 96.0}))
        .unwrap();
    let switched = Instant::now();
    // Restart while the new version's runs are being collected, before
    // any run that could be judged: the run in flight when the stop comes
    // is still filed, so the stop comes once the runs before the last
    // unjudged one are in (its first run after warm-up can be judged
    // alone, `upgrade_first_run_q`). Polled often: a run and its gap take
    // about half a second.
    let policy = Config::parse(&config, "t").unwrap().verdict_policy.clone();
    let first_judged = policy.runs_for_first_verdict();
    assert!(first_judged >= 3, "no run to restart after");
    let collected = until_every(
        Duration::from_secs(30),
        Duration::from_millis(20),
        "new-version runs",
        async || {
            let n = store.count_ok_runs(&key(), "0.33.0").unwrap();
            (n >= first_judged - 2).then_some(n)
        },
    )
    .await;
    handle.shutdown();
    handle.wait().await.unwrap();
    let after_stop = store.count_ok_runs(&key(), "0.33.0").unwrap();
    assert!(after_stop >= collected);
    assert!(
        after_stop < first_judged,
        "stopped after the first run that could be judged ({after_stop} runs of the new version)"
    );
    assert!(
        !hooks
            .lock()
            .unwrap()
            .iter()
            .any(|b| b["status"] == "firing"),
        "the regression was reported before the restart ({after_stop} runs of the new version)"
    );
    let handle = common::start_daemon(&config, None).await;
    // The restarted daemon resumes the upgrade rounds from the store.
    let mut resumed = None;
    for _ in 0..100 {
        resumed = Exposition::parse(&metrics_page(&handle).await)
            .unwrap()
            .scalars(&["sentinel_upgrade_runs_total"])
            .iter()
            .map(|s| s.value)
            .reduce(f64::max);
        if resumed.is_some_and(|n| n >= 1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        resumed.is_some_and(|n| n >= 1.0),
        "no upgrade round after the restart"
    );
    let kept = store.baseline(&key(), "0.32.0").unwrap().unwrap();
    assert_eq!(kept.id, baseline.id, "the baseline survives the restart");
    assert_eq!(kept.run_ids, baseline.run_ids);
    assert!(store.count_ok_runs(&key(), "0.33.0").unwrap() >= after_stop);

    // 3. The regression: metrics, webhook, email and Alertmanager.
    let need = policy.runs_for_verdict();
    // A slowdown far beyond the runs' noise needs no confirmation: its
    // first evaluation, the first run after warm-up, can be the regression.
    let earliest = first_judged;
    let regression_seen = loop {
        let page = metrics_page(&handle).await;
        if page.contains(
            "sentinel_regression_state{model=\"sim-model\",scenario=\"interactive\",target=\"prod\"} 2",
        ) {
            assert!(page.contains("sentinel_baseline_info{model=\"sim-model\",pinned_at=\"\",scenario=\"interactive\",target=\"prod\",version=\"0.32.0\"} 1"), "{page}");
            assert!(page.contains("sentinel_server_version_change_timestamp_seconds{target=\"prod\"}"));
            // The evidence of what the verdict finds slower, and only that.
            assert!(page.contains("sentinel_regression_relative_change{metric=\"ttft_p50\",model=\"sim-model\",scenario=\"interactive\",target=\"prod\"}"), "{page}");
            assert!(!page.contains("sentinel_regression_p_value{metric=\"tpot_p50\""), "{page}");
            break Instant::now();
        }
        assert!(
            switched.elapsed() < Duration::from_secs(60),
            "no regression state"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let verdict = latest_verdict(&handle).await.unwrap();
    assert_eq!(verdict.build, "0.33.0");
    assert_eq!(verdict.reference_build.as_deref(), Some("0.32.0"));
    let ttft = verdict.evaluation.metric("ttft_p50").unwrap();
    assert!(
        ttft.flagged && (0.12..0.30).contains(&ttft.relative_change),
        "{ttft:?}"
    );
    // Runs of the new version up to the first evaluation that confirmed
    // the regression, from the store's own record of both.
    let new_runs_at_verdict: usize = rusqlite::Connection::open(&store_path)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM runs WHERE build = '0.33.0' AND outcome = 'ok'
               AND started_at <= (SELECT MIN(at) FROM evaluations
                                  WHERE build = '0.33.0' AND state = 'regression')",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as usize;
    // Never before the rule allows; on a busy machine an evaluation or a
    // few may pass unflagged before the step stands out of the noise.
    assert!(
        (earliest..=2 * need).contains(&new_runs_at_verdict),
        "regression after {new_runs_at_verdict} runs of the new version; the rule allows {earliest} (beyond doubt) or {need}"
    );
    println!(
        "regression confirmed {:.1} s after the switch, after {new_runs_at_verdict} runs of the new version (rule: {earliest} beyond doubt, else {need}); ttft_p50 {:+.1}% [{:+.1}%, {:+.1}%], p = {:.1e}",
        (regression_seen - switched).as_secs_f64(),
        ttft.relative_change * 100.0,
        ttft.ci_low * 100.0,
        ttft.ci_high * 100.0,
        ttft.p_adjusted
    );

    let firing_hook = until(Duration::from_secs(10), "the webhook", async || {
        hooks
            .lock()
            .unwrap()
            .iter()
            .find(|b| b["status"] == "firing")
            .cloned()
    })
    .await;
    let text = firing_hook["text"].as_str().unwrap();
    assert!(
        text.contains("REGRESSION on prod: interactive slower"),
        "{text}"
    );
    assert!(
        text.contains("version 0.33.0 compared with 0.32.0"),
        "{text}"
    );
    assert!(text.contains("ttft_p50 +"), "{text}");
    assert!(
        text.contains("report: http://sentinel.test:9464/report?target=prod&from=0.32.0&to=0.33.0"),
        "{text}"
    );
    let mail = until(Duration::from_secs(10), "the email", async || {
        mails(&maildir)
            .into_iter()
            .find(|m| m.contains("REGRESSION"))
    })
    .await;
    assert!(mail.contains("To: oncall@example.com"), "{mail}");
    assert!(mail.contains("ttft_p50 +"), "{mail}");
    let mut alert = None;
    for _ in 0..50 {
        let alerts = alertmanager_alerts(&am_url).await;
        if let Some(a) = alerts.into_iter().next() {
            alert = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alert = alert.expect("no alert in Alertmanager");
    assert_eq!(alert["labels"]["target"], "prod");
    assert_eq!(alert["labels"]["scenario"], "interactive");
    assert_eq!(alert["status"]["state"], "active");
    assert_eq!(alert["annotations"]["baseline_version"], "0.32.0");
    println!(
        "delivered after the verdict: webhook, email and Alertmanager within {:.1} s",
        regression_seen.elapsed().as_secs_f64()
    );
    // Deduplicated: one firing message while the regression lasts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let firing = hooks
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b["status"] == "firing")
        .count();
    assert_eq!(firing, 1);

    // The report the messages link to.
    let report = common::get_text(&handle, "/report?target=prod&from=0.32.0&to=0.33.0").await;
    assert!(report.contains("<svg"), "{report}");
    assert!(report.contains("regression"), "{report}");
    let status = common::get_text(&handle, "/").await;
    assert!(
        status.contains("<td class=\"bad\">regression</td>")
            && status.contains("href=\"/report?target=prod&amp;from=0.32.0&amp;to=0.33.0\""),
        "{status}"
    );

    // 4. Back to normal: the resolution arrives on every channel.
    sim.state
        .update(serde_json::json!({"ttft_ms": 80.0}))
        .unwrap();
    // The candidate window must refill with normal runs first; on a busy
    // machine the runs come slower than one a second.
    let resolved = until(Duration::from_secs(150), "the resolution", async || {
        hooks
            .lock()
            .unwrap()
            .iter()
            .find(|b| b["status"] == "resolved")
            .cloned()
    })
    .await;
    assert!(
        resolved["text"]
            .as_str()
            .unwrap()
            .contains("RESOLVED on prod")
    );
    until(
        Duration::from_secs(10),
        "the resolution email",
        async || mails(&maildir).into_iter().find(|m| m.contains("RESOLVED")),
    )
    .await;
    let mut gone = false;
    for _ in 0..50 {
        if alertmanager_alerts(&am_url).await.is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone, "the alert is still active in Alertmanager");
    // The mail server stores a message before the daemon reads its reply,
    // so the daemon counts a delivery a moment after the mail is seen.
    let counted = [
        "sentinel_notifications_total{channel=\"email\",result=\"sent\"} 2",
        "sentinel_notifications_total{channel=\"webhook\",result=\"sent\"} 2",
    ];
    let mut page = metrics_page(&handle).await;
    for _ in 0..50 {
        if counted.iter().all(|line| page.contains(line)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        page = metrics_page(&handle).await;
    }
    let notification_lines: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("sentinel_notifications_total"))
        .collect();
    for line in counted {
        assert!(page.contains(line), "{notification_lines:#?}");
    }
    assert!(page.contains(
        "sentinel_regression_state{model=\"sim-model\",scenario=\"interactive\",target=\"prod\"} 0"
    ));

    // 5. Accepting the new speed: pin the new version's recent runs, over
    // the API and only with the admin token.
    let pin = serde_json::json!({
        "target": "prod", "model": "sim-model", "scenario": "interactive",
        "version": "0.33.0", "recent": 12
    });
    let (status, _) = api(&handle, "/api/v1/baselines/pin", None, Some(&pin)).await;
    assert_eq!(status, 401);
    let token = Some("e2e-admin-secret");
    let (_, pinned) = api(&handle, "/api/v1/baselines/pin", token, Some(&pin)).await;
    assert_eq!(pinned["build"], "0.33.0");
    assert_eq!(pinned["origin"], "recent-runs");
    assert_eq!(pinned["run_ids"].as_array().unwrap().len(), 12);
    assert!(pinned["pinned_at"].is_string());
    let (_, listed) = api(&handle, "/api/v1/baselines?target=prod", token, None).await;
    let listed = listed.as_array().unwrap();
    assert!(
        listed
            .iter()
            .any(|b| b["build"] == "0.33.0" && b["pinned_at"].is_string())
    );
    assert!(
        listed
            .iter()
            .any(|b| b["build"] == "0.32.0" && b["pinned_at"].is_null())
    );
    let path = format!("/api/v1/baselines/{}", baseline.id);
    let (_, shown) = api(&handle, &path, token, None).await;
    assert_eq!(shown["baseline"]["build"], "0.32.0");
    assert_eq!(shown["runs"].as_array().unwrap().len(), 30);
    assert!(shown["runs"][0]["summary"]["ttft"]["p50"].as_f64().unwrap() > 0.0);
    let (status, _) = api(&handle, "/api/v1/baselines/999999", token, None).await;
    assert_eq!(status, 404);
    let (_, unpinned) = api(&handle, "/api/v1/baselines/unpin", token, Some(&pin)).await;
    assert_eq!(unpinned["unpinned"], true);
    handle.shutdown();
    handle.wait().await.unwrap();
}
