//! What the notifier says, and when: an alert no verdict will end is
//! ended (a reload that stops probing its target, or another model
//! serving the target alone, posts its end to Alertmanager: it was re-sent
//! as firing for ever), a message waiting for its window goes out when the
//! daemon stops, one held by its window is not resent meanwhile, and
//! resends are tried once while Alertmanager is away.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use tokio::net::TcpListener;

use crate::notify_failures::regression;

/// Every alert Alertmanager was sent, in order, with when it came.
type Posted = Arc<Mutex<Vec<(chrono::DateTime<chrono::Utc>, serde_json::Value)>>>;

async fn alertmanager() -> (String, Posted) {
    let posted = Posted::default();
    let app = axum::Router::new()
        .route(
            "/api/v2/alerts",
            axum::routing::post(
                |State(posted): State<Posted>, body: axum::Json<Vec<serde_json::Value>>| async move {
                    let now = chrono::Utc::now();
                    posted.lock().unwrap().extend(body.0.into_iter().map(|a| (now, a)));
                    "ok"
                },
            ),
        )
        .with_state(posted.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, posted)
}

/// A configuration probing `targets` (yearly), telling `am`.
fn config(store: &std::path::Path, am: &str, targets: &[&str]) -> String {
    let mut text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[notify]\ngroup_wait = \"0s\"\nmin_interval = \"0s\"\n\
[notify.alertmanager]\nurl = \"{am}\"\nresend_interval = \"500ms\"\n\
[[scenarios]]\nname = \"chat\"\ninput_len = 8\noutput_len = 4\nschedule = \"0 0 1 1 *\"\n",
        store.display()
    );
    for t in targets {
        text.push_str(&format!(
            "[[targets]]\nname = \"{t}\"\nbase_url = \"http://127.0.0.1:{}\"\n[targets.heartbeat]\nenabled = false\n",
            common::free_port()
        ));
    }
    text
}

/// Whether an alert of `target` under `model` was posted as ended (its
/// `endsAt` no later than when it came).
fn ended(posted: &Posted, target: &str, model: &str) -> bool {
    posted.lock().unwrap().iter().any(|(came, a)| {
        let ends = chrono::DateTime::parse_from_rfc3339(a["endsAt"].as_str().unwrap()).unwrap();
        a["labels"]["target"] == target && a["labels"]["model"] == model && ends <= *came
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_of_pairs_no_longer_probed_or_served_end() {
    let (am, posted) = alertmanager().await;
    let dir = common::temp_dir("notify-ends");
    let file = dir.join("sentinel.toml");
    let store = dir.join("store.db");
    let handle = common::start_daemon(&config(&store, &am, &["prod", "stage"]), Some(&file)).await;
    let mut staged = regression();
    staged.target = "stage".into();
    handle.notifier().verdict(&regression());
    handle.notifier().verdict(&staged);
    common::until(Duration::from_secs(10), "both alerts firing", async || {
        let p = posted.lock().unwrap();
        let firing = |t: &str| p.iter().any(|(_, a)| a["labels"]["target"] == t);
        (firing("prod") && firing("stage")).then_some(())
    })
    .await;

    // stage's model changes: its third verdict with none of the old
    // model's between, whatever it says, ends the old model's alert.
    let mut new_model = staged.clone();
    new_model.model = "m2".into();
    new_model.state = vllm_sentinel::verdict::State::Inconclusive;
    for _ in 0..3 {
        handle.notifier().verdict(&new_model);
    }
    common::until(
        Duration::from_secs(10),
        "stage's m alert ended",
        async || ended(&posted, "stage", "m").then_some(()),
    )
    .await;

    // prod is no longer probed.
    std::fs::write(&file, config(&store, &am, &["stage"])).unwrap();
    handle.reload().await.unwrap();
    common::until(Duration::from_secs(10), "prod's alert ended", async || {
        ended(&posted, "prod", "m").then_some(())
    })
    .await;
    // Neither is re-sent as firing after its end.
    let count = posted.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after: Vec<serde_json::Value> = posted.lock().unwrap()[count..]
        .iter()
        .map(|(_, a)| a.clone())
        .collect();
    assert!(
        after.iter().all(|a| a["labels"]["target"] != "prod"
            && !(a["labels"]["target"] == "stage" && a["labels"]["model"] == "m")),
        "{after:?}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}

/// A regression still waiting for its group window when the daemon stops
/// is sent before it exits (it was lost: restored after the restart as
/// already announced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_for_its_window_is_sent_when_the_daemon_stops() {
    let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(
                |State(bodies): State<Arc<Mutex<Vec<serde_json::Value>>>>,
                 body: axum::Json<serde_json::Value>| async move {
                    bodies.lock().unwrap().push(body.0);
                    "ok"
                },
            ),
        )
        .with_state(bodies.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = common::temp_dir("notify-finish");
    let text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[notify]\ngroup_wait = \"1h\"\n[[notify.webhooks]]\nname = \"chat\"\nurl = \"{hook}\"\n\
[[scenarios]]\nname = \"chat\"\ninput_len = 8\noutput_len = 4\nschedule = \"0 0 1 1 *\"\n\
[[targets]]\nname = \"prod\"\nbase_url = \"http://127.0.0.1:{}\"\n[targets.heartbeat]\nenabled = false\n",
        dir.join("store.db").display(),
        common::free_port()
    );
    let handle = common::start_daemon(&text, None).await;
    handle.notifier().verdict(&regression());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        bodies.lock().unwrap().is_empty(),
        "held by the group window"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
    let sent = bodies.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["status"], "firing", "{sent:?}");
}

/// A regression still held by its group window is not posted by
/// Alertmanager's resend either: flapping back within the window, it was
/// never announced, so it must never fire there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regression_held_by_its_window_is_not_resent_to_alertmanager() {
    let (am, posted) = alertmanager().await;
    let dir = common::temp_dir("notify-held");
    let text = config(&dir.join("store.db"), &am, &["prod"])
        .replace("group_wait = \"0s\"", "group_wait = \"1h\"");
    let handle = common::start_daemon(&text, None).await;
    handle.notifier().verdict(&regression());
    // Three resends' time.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let mut ok = regression();
    ok.state = vllm_sentinel::verdict::State::Ok;
    handle.notifier().verdict(&ok);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        posted.lock().unwrap().is_empty(),
        "{:?}",
        posted.lock().unwrap()
    );
    handle.shutdown();
    handle.wait().await.unwrap();
    assert!(
        posted.lock().unwrap().is_empty(),
        "nothing to say at the stop either"
    );
}

/// While Alertmanager is away, resends are tried once each: the next one
/// is the retry, with a fresh `endsAt` (retried, a resend's payload could
/// land minutes late and end alerts, or pile up behind others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resends_are_tried_once_while_alertmanager_is_away() {
    let posts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/api/v2/alerts",
            axum::routing::post(
                |State(posts): State<Arc<std::sync::atomic::AtomicUsize>>| async move {
                    posts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                },
            ),
        )
        .with_state(posts.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let am = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = common::temp_dir("notify-away");
    let text = config(&dir.join("store.db"), &am, &["prod"]).replace(
        "[notify]\n",
        "[notify]\nmax_attempts = 10\nretry_initial = \"1s\"\ntimeout = \"1s\"\n",
    );
    let handle = common::start_daemon(&text, None).await;
    handle.notifier().verdict(&regression());
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let page = common::get_text(&handle, "/metrics").await;
    let count = |result: &str| -> f64 {
        let prefix = format!(
            "sentinel_notifications_total{{channel=\"alertmanager\",result=\"{result}\"}} "
        );
        page.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0.0)
    };
    // The announcement is retried (at 1 s and 3 s: its tries fail at 0,
    // 1 and 3 s); each resend, every 500 ms, is tried once and fails.
    let posted = posts.load(std::sync::atomic::Ordering::SeqCst);
    assert!(count("retried") <= 3.0, "{page}");
    assert!(count("failed") >= 3.0, "{posted} posts: {page}");
    handle.shutdown();
    handle.wait().await.unwrap();
}
