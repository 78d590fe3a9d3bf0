//! Delivery failures: a webhook that answers 500 at first is retried until
//! it takes the message; a dead webhook, a dead SMTP server and a dead
//! Alertmanager are retried, then counted as failed, and the daemon goes on
//! serving. A secret webhook URL appears neither in the error that is
//! logged nor on `/metrics`.

use crate::common;

use common::{free_port, temp_dir};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use tokio::net::TcpListener;
use vllm_sentinel::verdict::pair::PairVerdict;
use vllm_sentinel::verdict::{Evaluation, MetricResult, State as Verdict};

pub(crate) fn regression() -> PairVerdict {
    PairVerdict {
        drift: false,
        target: "prod".into(),
        model: "m".into(),
        scenario: "chat".into(),
        build: "0.33.0".into(),
        reference_build: Some("0.32.0".into()),
        baseline_id: Some(1),
        baseline_pinned_at: None,
        candidate_runs: 12,
        baseline_runs: 30,
        state: Verdict::Regression,
        reason: "slower in 3 of the last 4 evaluations: ttft_p50 +25.0%".into(),
        evaluation: Evaluation {
            state: Verdict::Ok,
            reason: "slower: ttft_p50".into(),
            metrics: vec![MetricResult {
                metric: "ttft_p50".into(),
                baseline_median: 0.1,
                candidate_median: 0.125,
                relative_change: 0.25,
                ci_low: 0.2,
                ci_high: 0.3,
                p_value: 1e-6,
                p_adjusted: 1e-5,
                flagged: true,
                improvement: false,
                alerting: true,
                runs: 12,
                at_load: None,
            }],
            decisive: None,
        },
        at: Utc::now(),
    }
}

fn counter(page: &str, channel: &str, result: &str) -> u64 {
    let prefix =
        format!("sentinel_notifications_total{{channel=\"{channel}\",result=\"{result}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn failed_deliveries_are_retried_counted_and_never_stop_the_daemon() {
    // Answers 500 twice, then 200.
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(|State(calls): State<Arc<AtomicUsize>>| async move {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }),
        )
        .with_state(calls.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let flaky = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = temp_dir("notify");
    let secret_url = dir.join("secret-url");
    std::fs::write(
        &secret_url,
        format!("http://127.0.0.1:{}/services/T000/SECRET", free_port()),
    )
    .unwrap();
    let config = format!(
        r#"
[store]
path = "{store}"
[telemetry]
nvml = false
[notify]
group_wait = "0s"
min_interval = "0s"
max_attempts = 3
retry_initial = "50ms"
timeout = "1s"
[notify.email]
smtp_host = "127.0.0.1"
smtp_port = {smtp}
security = "none"
from = "s@example.com"
to = ["o@example.com"]
[[notify.webhooks]]
name = "flaky"
url = "{flaky}"
[[notify.webhooks]]
name = "secret"
url_file = "{secret_url}"
[notify.alertmanager]
url = "http://127.0.0.1:{am}"
resend_interval = "1h"
[[scenarios]]
name = "chat"
input_len = 8
output_len = 4
schedule = "0 0 1 1 *"
[[targets]]
name = "prod"
base_url = "http://127.0.0.1:{target}"
"#,
        store = dir.join("store.db").display(),
        secret_url = secret_url.display(),
        smtp = free_port(),
        am = free_port(),
        target = free_port(),
    );
    let handle = common::start_daemon(&config, None).await;
    handle.notifier().verdict(&regression());

    let mut page = String::new();
    for _ in 0..100 {
        page = common::get_text(&handle, "/metrics").await;
        let done = counter(&page, "email", "failed") == 1
            && counter(&page, "alertmanager", "failed") == 1
            && counter(&page, "webhook", "failed") == 1
            && counter(&page, "webhook", "sent") == 1;
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The flaky webhook: two failures retried, then delivered.
    assert_eq!(counter(&page, "webhook", "sent"), 1, "{page}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The dead ones: every attempt but the last is a retry, then one failure.
    assert_eq!(counter(&page, "webhook", "failed"), 1, "{page}");
    assert_eq!(counter(&page, "webhook", "retried"), 2 + 2, "{page}");
    assert_eq!(counter(&page, "email", "retried"), 2, "{page}");
    assert_eq!(counter(&page, "email", "failed"), 1, "{page}");
    assert_eq!(counter(&page, "alertmanager", "retried"), 2, "{page}");
    assert_eq!(counter(&page, "alertmanager", "failed"), 1, "{page}");
    assert!(!page.contains("SECRET"));
    // Still serving, and shuts down cleanly.
    let health = reqwest::get(format!("http://{}/healthz", handle.addr))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    handle.shutdown();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn a_failed_webhook_error_does_not_carry_its_url() {
    use vllm_sentinel::config::detector_notify::{WebhookConfig, WebhookUrl};
    use vllm_sentinel::secret::SecretSource;
    let dir = temp_dir("notify-webhook-error");
    let secret_url = dir.join("secret-url");
    std::fs::write(
        &secret_url,
        format!("http://127.0.0.1:{}/services/T000/SECRET", free_port()),
    )
    .unwrap();
    let hook = WebhookConfig {
        name: "slack".into(),
        url: WebhookUrl::Secret(SecretSource::File(secret_url)),
        bearer_token: None,
    };
    let err = vllm_sentinel::notify::channels::webhook(
        &reqwest::Client::new(),
        &hook,
        &serde_json::json!({"text": "x"}),
        Duration::from_secs(1),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("HTTP: error sending request"), "{err}");
    assert!(
        !err.contains("SECRET") && !err.contains("127.0.0.1"),
        "{err}"
    );
}

#[tokio::test]
async fn a_webhook_that_redirects_fails_and_its_url_goes_nowhere_else() {
    use vllm_sentinel::config::detector_notify::{WebhookConfig, WebhookUrl};
    use vllm_sentinel::secret::SecretSource;
    // Where the redirect points: it counts the connections it is offered.
    let elsewhere = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = format!("http://{}/collect", elsewhere.local_addr().unwrap());
    let offered = Arc::new(AtomicUsize::new(0));
    let count = offered.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = elsewhere.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    let app = axum::Router::new().fallback(move || {
        let to = to.clone();
        async move { (StatusCode::TEMPORARY_REDIRECT, [("location", to)]) }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!(
        "http://{}/services/T000/SECRET?token=QSECRET",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = temp_dir("notify-webhook-redirect");
    let secret_url = dir.join("secret-url");
    std::fs::write(&secret_url, hook_url).unwrap();
    let hook = WebhookConfig {
        name: "slack".into(),
        url: WebhookUrl::Secret(SecretSource::File(secret_url)),
        bearer_token: None,
    };
    // The daemon's own client.
    let http = vllm_sentinel::client::http::client_builder()
        .build()
        .unwrap();
    let err = vllm_sentinel::notify::channels::webhook(
        &http,
        &hook,
        &serde_json::json!({"text": "x"}),
        Duration::from_secs(2),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("307"), "{err}");
    assert!(!err.contains("SECRET"), "{err}");
    // Neither the URL (as a Referer) nor the message went on.
    assert_eq!(offered.load(Ordering::SeqCst), 0);
}
