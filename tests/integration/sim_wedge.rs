//! The simulator's wedge, as `demo`, the liveness tests and a user trying
//! the alert rely on: `/health`, `/version` and `/v1/models` keep
//! answering while a generation request gets no token until the wedge
//! ends; set over `POST /admin/config` or by `sim --wedge-at/--wedge-for`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Killed, until};
use vllm_sentinel::sim::{SimConfig, SimHandle};

/// Whether a one-token streaming completion at `base` gets its first byte
/// of a token within `within`.
async fn generates(base: &str, within: Duration) -> bool {
    let http = reqwest::Client::new();
    let body = serde_json::json!({
        "model": "sim-model", "prompt": "Say hi.", "max_tokens": 1, "stream": true
    });
    let request = async {
        let mut response = http
            .post(format!("{base}/v1/completions"))
            .json(&body)
            .send()
            .await
            .ok()?;
        while let Some(chunk) = response.chunk().await.ok()? {
            if String::from_utf8_lossy(&chunk).contains("\"text\"") {
                return Some(());
            }
        }
        None
    };
    tokio::time::timeout(within, request)
        .await
        .ok()
        .flatten()
        .is_some()
}

/// Status codes of the endpoints a liveness check reads.
async fn answers(base: &str) -> Vec<u16> {
    let mut codes = Vec::new();
    for path in ["/health", "/version", "/v1/models"] {
        let code = reqwest::get(format!("{base}{path}"))
            .await
            .map_or(0, |r| r.status().as_u16());
        codes.push(code);
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedge_set_over_the_admin_endpoint_stops_tokens_not_answers() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let base = sim.base_url();
    assert!(generates(&base, Duration::from_secs(5)).await);
    let http = reqwest::Client::new();
    let set = |wedged: bool| {
        http.post(format!("{base}/admin/config"))
            .json(&serde_json::json!({ "wedged": wedged }))
            .send()
    };
    assert!(set(true).await.unwrap().status().is_success());
    assert_eq!(answers(&base).await, [200, 200, 200]);
    assert!(!generates(&base, Duration::from_secs(2)).await);
    // A request accepted during the wedge gets its token once it ends.
    let waiting = tokio::spawn({
        let base = base.clone();
        async move { generates(&base, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(set(false).await.unwrap().status().is_success());
    assert!(waiting.await.unwrap(), "the waiting request got its token");
    assert!(generates(&base, Duration::from_secs(5)).await);
    sim.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_wedges_at_a_time_for_a_while() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args([
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--wedge-at",
            "2s",
            "--wedge-for",
            "3s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let first = lines.recv().await.unwrap();
    let base = first
        .rsplit(' ')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert!(base.starts_with("http://127.0.0.1:"), "{first}");
    assert!(
        generates(&base, Duration::from_secs(1)).await,
        "before the wedge"
    );
    until(Duration::from_secs(10), "the wedge", async || {
        lines
            .try_recv()
            .ok()
            .filter(|l| l.contains("engine wedged"))
            .map(|_| ())
    })
    .await;
    let wedged_at = started.elapsed().as_secs_f64();
    assert_eq!(answers(&base).await, [200, 200, 200]);
    assert!(
        !generates(&base, Duration::from_secs(1)).await,
        "during the wedge"
    );
    until(Duration::from_secs(10), "the wedge's end", async || {
        lines
            .try_recv()
            .ok()
            .filter(|l| l.contains("wedge over"))
            .map(|_| ())
    })
    .await;
    let ended_at = started.elapsed().as_secs_f64();
    assert!(
        generates(&base, Duration::from_secs(5)).await,
        "after the wedge"
    );
    eprintln!(
        "sim --wedge-at 2s --wedge-for 3s: wedged at {wedged_at:.1} s, over at {ended_at:.1} s"
    );
    assert!((1.5..5.0).contains(&wedged_at), "{wedged_at}");
    assert!(ended_at - wedged_at >= 2.5, "{wedged_at} -> {ended_at}");
    drop(child);
}
