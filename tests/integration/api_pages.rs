//! The exporter's own answers stay bounded: `/api/v1/runs` pages hold at
//! most 200 runs and a cursor leads through the rest; fifty clients asking
//! for huge pages at once cost little memory, and `/metrics` answers all
//! the while. Alone in its binary, so the process's memory is the daemon's.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::net::TcpListener;
use vllm_sentinel::config::Config;
use vllm_sentinel::daemon;
use vllm_sentinel::store::Store;
use vllm_sentinel::vocabulary::records::{RunOutcome, RunRecord};

/// Growth of resident memory the fifty big requests may cause, KiB.
const RSS_GROWTH_KIB: u64 = 150 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_pages_are_bounded_and_cursors_lead_through_every_run() {
    let dir = common::temp_dir("api-pages");
    let path = dir.join("store.db");
    {
        let store = Store::open(&path).unwrap();
        let now = Utc::now();
        for i in 0..450 {
            let mut run = RunRecord::failed(
                "t",
                "s",
                "m",
                now - chrono::Duration::seconds(i),
                1.0,
                RunOutcome::Failed(vllm_sentinel::client::Outcome::Connect),
                format!("run {i}: cannot reach the server"),
            );
            run.duration_s = 1.0 + i as f64;
            store.insert_run(&run).unwrap();
        }
    }
    let config = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n[[targets]]\nname = \"t\"\nbase_url = \"http://127.0.0.1:9\"\nschedule = \"0 0 1 1 *\"\nserver_metrics = false\n[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\n",
        path.display()
    );
    let config = Config::from_text(&config, "test").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let handle = daemon::start(
        config,
        None,
        listener,
        tokio_util::sync::CancellationToken::new(),
        // Real servers and real Prometheus: real time.
        vllm_sentinel::clock::Clock::System,
    )
    .await
    .unwrap();
    let base = format!("http://{}", handle.addr);
    let http = reqwest::Client::new();

    // Every run once, newest first, in pages of at most 200.
    let mut seen = BTreeSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let mut url = format!("{base}/api/v1/runs?limit=200");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        let runs = page["runs"].as_array().unwrap();
        pages.push(runs.len());
        for r in runs {
            assert!(seen.insert(r["id"].as_i64().unwrap()), "a run listed twice");
        }
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 450, "pages {pages:?}");
    assert!(pages.iter().all(|&n| n <= 200), "pages {pages:?}");
    let bad = http
        .get(format!("{base}/api/v1/runs?cursor=nonsense"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);

    // Fifty clients asking for the largest page at once, with /metrics
    // asked every 50 ms meanwhile.
    let pid = std::process::id();
    let before = common::hostile::rss_kib(pid).unwrap();
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..50 {
        let (http, base) = (http.clone(), base.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..4 {
                let body = http
                    .get(format!("{base}/api/v1/runs?limit=200"))
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                assert!(!body.is_empty());
            }
        }));
    }
    let mut slowest = Duration::ZERO;
    let mut scrapes = 0;
    while clients.iter().any(|c| !c.is_finished()) {
        let asked = Instant::now();
        let page = tokio::time::timeout(
            Duration::from_secs(5),
            http.get(format!("{base}/metrics")).send(),
        )
        .await
        .expect("/metrics answers while the API is busy")
        .unwrap()
        .text()
        .await
        .unwrap();
        assert!(page.contains("sentinel_build_info") || page.contains("sentinel_"));
        slowest = slowest.max(asked.elapsed());
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    let after = common::hostile::rss_kib(pid).unwrap();
    println!(
        "200 pages of 200 runs to 50 clients in {:?}: resident {before} -> {after} KiB; {scrapes} scrapes meanwhile, slowest {slowest:?}",
        started.elapsed()
    );
    assert!(
        after.saturating_sub(before) < RSS_GROWTH_KIB,
        "resident memory grew from {before} to {after} KiB"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
