//! The exporter's HTTP surface under abuse, against the whole daemon
//! in-process: five times more silent connections than it has slots do
//! not keep `/metrics` from a real client; a body that never arrives gets
//! a 408; an oversized body a 413; odd queries a 400 with the reason,
//! never a 500; API requests past `max_requests` wait while `/metrics`
//! does not; and `POST /-/reload` is shut unless a token or
//! `enable_lifecycle` opens it.

use crate::common;

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use vllm_sentinel::sim::{SimConfig, SimHandle};

const ADMIN: &str = "surface-admin-token";

fn config(sim: &SimHandle, dir: &std::path::Path, exporter: &str) -> String {
    format!(
        "[exporter]\n{exporter}\n[store]\npath = \"{}\"\n[scheduler]\nschedule = \"0 0 0 1 1 *\"\n\
[telemetry]\nnvml = false\n[[targets]]\nname = \"a\"\nbase_url = \"{}\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 4\nnum_requests = 1\nconcurrency = 1\nwarmup = 0\n",
        dir.join("store.db").display(),
        sim.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_crowds_slow_bodies_and_odd_queries_cost_the_exporter_nothing() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("http-surface");
    let admin_file = dir.join("admin-token");
    std::fs::write(&admin_file, ADMIN).unwrap();
    let text = config(
        &sim,
        &dir,
        &format!(
            "max_connections = 100\nheader_timeout = \"30s\"\nrequest_timeout = \"1s\"\n\
admin_token_file = \"{}\"",
            admin_file.display()
        ),
    );
    let handle = common::start_daemon(&text, None).await;
    let base = format!("http://{}", handle.addr);

    // 500 connections, half silent, half stopped inside a request header.
    let mut crowd = Vec::new();
    for i in 0..500 {
        let mut stream = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
        if i % 2 == 1 {
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHo")
                .await
                .unwrap();
        }
        crowd.push(stream);
    }
    let asked = Instant::now();
    let page = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("/metrics answers beside 500 idle connections")
        .text()
        .await
        .unwrap();
    let took = asked.elapsed();
    println!("/metrics answered in {took:?} beside 500 idle connections (100 slots)");
    assert!(page.contains("sentinel_"), "{page}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    drop(crowd);

    // A body announced and never sent: the request timeout answers.
    let mut slow = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
    let head = format!(
        "POST /api/v1/baselines/pin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n\
Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"target\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = vec![0u8; 256];
        let n = tokio::io::AsyncReadExt::read(&mut slow, &mut buf)
            .await
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .expect("a stalled body is answered within the request timeout");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    let http = reqwest::Client::new();
    let status = async |request: reqwest::RequestBuilder| {
        let r = request.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    // A body past the limit: refused before it is read whole. Sent by hand,
    // since the server may answer and close while the body is still going.
    let big = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
    let (mut reader, mut writer) = big.into_split();
    let head = format!(
        "POST /api/v1/baselines/pin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n\
Content-Length: {}\r\n\r\n",
        1 << 20
    );
    tokio::spawn(async move {
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&vec![b' '; 1 << 20]).await;
    });
    let mut answer = vec![0u8; 64];
    let n = tokio::io::AsyncReadExt::read(&mut reader, &mut answer)
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // Odd queries: a 400 that says why, or a plain answer; never a 500.
    let odd = [
        (
            "/api/v1/runs?limit=100000",
            400,
            "limit: 100000 is outside 1..=200",
        ),
        ("/api/v1/runs?limit=0", 400, "limit: 0 is outside"),
        ("/api/v1/runs?limit=-1", 400, "limit"),
        ("/api/v1/runs?limit=99999999999999999999999", 400, "limit"),
        ("/api/v1/runs?limit=1&limit=2", 400, "limit"),
        ("/api/v1/runs?cursor=%FF%FE", 400, "cursor"),
        ("/api/v1/runs?target=%00%0A%1B", 200, "\"runs\":[]"),
        ("/api/v1/runs?&&==&", 200, "\"runs\""),
        ("/api/v1/baselines/not-a-number", 400, "parse"),
        ("/report?target=a&format=pdf", 400, "format: \"pdf\""),
        ("/report", 400, "target"),
    ];
    for (path, want, says) in odd {
        let (code, body) = status(http.get(format!("{base}{path}"))).await;
        println!("{path}: {code} {}", body.trim());
        assert_eq!(code, want, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    let long = format!("{base}/api/v1/runs?target={}", "x".repeat(60_000));
    let (code, _) = status(http.get(long)).await;
    assert!(code < 500, "a 60 kB query: {code}");

    // The token opens the reload; without it, 401.
    let reload = format!("{base}/-/reload");
    assert_eq!(status(http.post(&reload)).await.0, 401);
    assert_eq!(status(http.post(&reload).bearer_auth(ADMIN)).await.0, 200);
    handle.shutdown();
    handle.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_over_http_is_shut_unless_opened() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("http-lifecycle");
    let http = reqwest::Client::new();
    for (exporter, want) in [("", 403), ("enable_lifecycle = true", 200)] {
        let text = config(&sim, &dir, exporter);
        let handle = common::start_daemon(&text, Some(&dir.join("sentinel.toml"))).await;
        let r = http
            .post(format!("http://{}/-/reload", handle.addr))
            .send()
            .await
            .unwrap();
        let code = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(code, want, "{exporter:?}: {body}");
        if want == 403 {
            assert!(body.contains("enable_lifecycle = true"), "{body}");
        }
        handle.shutdown();
        handle.wait().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_requests_past_the_bound_wait_while_metrics_does_not() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("http-requests");
    let exporter = "max_requests = 1\nrequest_timeout = \"2s\"\nenable_lifecycle = true";
    let handle = common::start_daemon(&config(&sim, &dir, exporter), None).await;
    // The one API slot, held by a request whose body never comes.
    let mut slow = tokio::net::TcpStream::connect(handle.addr).await.unwrap();
    slow.write_all(
        b"POST /api/v1/baselines/pin HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = format!("http://{}", handle.addr);
    let http = reqwest::Client::new();
    let started = Instant::now();
    let waiting = tokio::spawn({
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .get(format!("{base}/api/v1/runs"))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), Instant::now())
        }
    });
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    let metrics_at = Instant::now();
    assert_eq!(metrics.status().as_u16(), 200);
    let mut answer = vec![0u8; 64];
    let n = tokio::io::AsyncReadExt::read(&mut slow, &mut answer)
        .await
        .unwrap();
    let freed_at = Instant::now();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 408"));
    let (status, runs_at) = waiting.await.unwrap();
    assert_eq!(status, 200);
    println!(
        "/metrics after {:?}; the held slot freed after {:?}; the waiting API request after {:?}",
        metrics_at - started,
        freed_at - started,
        runs_at - started
    );
    assert!(metrics_at < freed_at, "/metrics waited for the API slot");
    // The slot is held until the slow request's 2 s timeout, which began
    // 200 ms before `started`. The client may see the waiting request's
    // answer before it reads the 408, so the bound is the timeout itself.
    assert!(
        runs_at - started >= Duration::from_millis(1700),
        "the second API request did not wait"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
