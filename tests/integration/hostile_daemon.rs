//! The whole daemon in-process with two targets: a healthy simulator and a
//! hostile server that serves each bad case in turn. Every case ends in a
//! bounded outcome with a clean, key-free message, while the healthy
//! target keeps its schedule; the exporter's own rules (token first,
//! case-insensitive scheme, Retry-After, series of replaced models, a
//! deleted store file) hold.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::hostile::{HostileServer, Mode, run_outcome};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};

const KEY: &str = "sk-hostile-secret-0123456789";
const ADMIN: &str = "admin-secret-token";

/// The newest run of `target` that started after `after`, once there is one.
async fn run_after(
    handle: &DaemonHandle,
    target: &str,
    after: DateTime<Utc>,
    what: &str,
) -> serde_json::Value {
    for _ in 0..200 {
        let page: serde_json::Value = serde_json::from_str(
            &common::get_text(handle, &format!("/api/v1/runs?target={target}&limit=5")).await,
        )
        .unwrap();
        if let Some(run) = page["runs"].as_array().unwrap().iter().find(|r| {
            r["started_at"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t.to_utc() > after)
        }) {
            return run.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {target} run after {after} ({what})");
}

fn no_control(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_target_gets_bounded_outcomes_while_the_healthy_one_keeps_its_schedule() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let hostile = HostileServer::start(Mode::Normal).await;
    let dir = common::temp_dir("hostile-daemon");
    let store = dir.join("store.db");
    let (key_file, admin_file) = (dir.join("api-key"), dir.join("admin-token"));
    std::fs::write(&key_file, KEY).unwrap();
    std::fs::write(&admin_file, ADMIN).unwrap();
    let config = format!(
        r#"
[exporter]
admin_token_file = "{}"
stale_series_after = "2s"
[store]
path = "{}"
[scheduler]
backoff_initial = "1s"
backoff_max = "1s"
[telemetry]
scrape_interval = "1s"
nvml = false
[[targets]]
name = "healthy"
base_url = "{}"
schedule = "* * * * * *"
[[targets]]
name = "hostile"
base_url = "{}"
api_key_file = "{}"
schedule = "* * * * * *"
server_metrics = false
[targets.timeouts]
first_token = "20s"
request = "30s"
[[scenarios]]
name = "s"
input_len = 16
output_len = 8
num_requests = 2
concurrency = 1
warmup = 0
"#,
        admin_file.display(),
        store.display(),
        sim.base_url(),
        hostile.url,
        key_file.display()
    );
    let handle = common::start_daemon(&config, None).await;

    type Check = fn(&serde_json::Value) -> bool;
    let cases: Vec<(&str, Mode, &str, Check)> = vec![
        (
            "tokenize answers 1",
            Mode::TokenizeCount("1".into()),
            "config",
            |r| {
                r["error"]
                    .as_str()
                    .unwrap()
                    .contains("token counts that make no sense")
            },
        ),
        (
            "tokenize answers -5",
            Mode::TokenizeCount("-5".into()),
            "config",
            |r| {
                r["error"]
                    .as_str()
                    .unwrap()
                    .contains("is not a token count")
            },
        ),
        (
            "a stream that never stops",
            Mode::Runaway,
            "stream_error",
            |r| {
                r["error"]
                    .as_str()
                    .unwrap()
                    .contains("more output than requested")
            },
        ),
        ("a 401 echoing the key", Mode::EchoKey401, "http_4xx", |r| {
            let e = r["error"].as_str().unwrap();
            e.contains("[redacted]") && !e.contains(KEY) && no_control(e)
        }),
        ("every request fails", Mode::AllFail, "http_5xx", |r| {
            r["summary"]["completed"] == 0
        }),
        (
            "control characters in /version",
            Mode::HostileText,
            "ok",
            |r| {
                let version = r["server"]["version"].as_str().unwrap_or("");
                let model = r["model"].as_str().unwrap_or("");
                let fingerprint = r["server"]["system_fingerprint"].as_str().unwrap_or("");
                version.contains("FORGED")
                    && no_control(version)
                    && no_control(model)
                    && no_control(fingerprint)
            },
        ),
    ];
    for (what, mode, expected, check) in cases {
        hostile.set(mode);
        let switched = Utc::now();
        let run = run_after(&handle, "hostile", switched, what).await;
        assert_eq!(run_outcome(&run), expected, "{what}: {run}");
        assert!(check(&run), "{what}: {run}");
        let healthy = run_after(&handle, "healthy", switched, what).await;
        assert_eq!(
            healthy["outcome"], "ok",
            "healthy target during {what}: {healthy}"
        );
        println!("{what}: outcome {}, error {}", run["outcome"], run["error"]);
    }

    // Nothing the hostile server said reached the pages raw, nor the key.
    let status = common::get_text(&handle, "/").await;
    let runs = common::get_text(&handle, "/api/v1/runs?target=hostile&limit=200").await;
    for (name, text) in [("status page", &status), ("runs API", &runs)] {
        assert!(!text.contains(KEY), "{name} shows the key");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\0'),
            "{name} has control characters"
        );
    }
    assert!(
        !status.contains("<script>"),
        "the status page escapes markup"
    );
    assert!(
        hostile
            .state
            .auth_seen
            .lock()
            .unwrap()
            .iter()
            .all(|a| a == &format!("Bearer {KEY}"))
    );

    // A 429 with Retry-After: the target is left alone that long.
    hostile.set(Mode::RateLimited(7));
    let switched = Utc::now();
    let run = run_after(&handle, "hostile", switched, "429").await;
    assert_eq!(run_outcome(&run), "http_4xx", "{run}");
    let mut backoff = 0.0;
    for _ in 0..50 {
        let page = common::get_text(&handle, "/metrics").await;
        backoff = page
            .lines()
            .find(|l| l.starts_with("sentinel_target_backoff_seconds{target=\"hostile\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        if backoff > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(backoff, 7.0, "Retry-After honoured");
    let asked = hostile.state.auth_seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        hostile.state.auth_seen.lock().unwrap().len(),
        asked,
        "no request within the Retry-After pause"
    );

    // A model replaced by another loses its series after the grace period.
    hostile.set(Mode::Model("first-model".into()));
    let switched = Utc::now();
    let mut run = run_after(&handle, "hostile", switched, "first model").await;
    while run["model"] != "first-model" {
        run = run_after(&handle, "hostile", Utc::now(), "first model").await;
    }
    assert!(
        common::get_text(&handle, "/metrics")
            .await
            .contains("model=\"first-model\"")
    );
    hostile.set(Mode::Model("second-model".into()));
    let mut gone = false;
    for _ in 0..100 {
        let page = common::get_text(&handle, "/metrics").await;
        if page.contains("model=\"second-model\"") && !page.contains("model=\"first-model\"") {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the replaced model's series are still on /metrics");

    // Writes: the token before the body, and any case of the scheme.
    let http = reqwest::Client::new();
    let pin = format!("http://{}/api/v1/baselines/pin", handle.addr);
    let r = http.post(&pin).body("not json").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401, "the token is checked first");
    let r = http
        .post(&pin)
        .header("authorization", format!("bearer {ADMIN}"))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        400,
        "lowercase bearer accepted, then the body judged"
    );
    // Reads are open, as /metrics is.
    let r = http
        .get(format!("http://{}/api/v1/verdicts", handle.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // The store's file deleted under the daemon: said loudly.
    std::fs::remove_file(&store).unwrap();
    let mut said = false;
    for _ in 0..100 {
        let page = common::get_text(&handle, "/metrics").await;
        if page.lines().any(|l| l == "sentinel_store_file_missing 1") {
            said = page
                .lines()
                .any(|l| l.starts_with("sentinel_store_errors_total") && !l.ends_with(" 0"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = common::get_text(&handle, "/metrics").await;
    let lines: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("sentinel_store"))
        .collect();
    assert!(
        said,
        "a deleted store file is exported and counted: {lines:?}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
