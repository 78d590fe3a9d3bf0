//! The daemon under a low file-descriptor limit with its exporter flooded
//! by idle connections: the exporter takes at most a quarter of the
//! descriptors, drops clients that never finish a request header, still
//! answers `/metrics`, and the healthy target's probes go on (never failed
//! as `connect` for want of descriptors).

use crate::common;

use std::time::{Duration, Instant};

use vllm_sentinel::sim::{SimConfig, SimHandle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_starve_the_exporter_or_the_probes() {
    use nix::sys::resource::{Resource, setrlimit};
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("descriptors");
    let port = common::free_port();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[exporter]\nlisten = \"127.0.0.1:{port}\"\nheader_timeout = \"1s\"\n[store]\npath = \"{}\"\n\
[telemetry]\nnvml = false\n[[targets]]\nname = \"healthy\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 16\noutput_len = 8\nnum_requests = 2\nconcurrency = 2\nwarmup = 0\n",
            dir.join("store.db").display(),
            sim.base_url()
        ),
    )
    .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"));
    command
        .args(["serve", "--config", config.to_str().unwrap()])
        .stdout(std::fs::File::create(dir.join("log")).unwrap())
        .stderr(std::process::Stdio::null());
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            setrlimit(Resource::RLIMIT_NOFILE, 64, 64)?;
            Ok(())
        });
    }
    let _daemon = common::Killed(command.spawn().unwrap());
    common::wait_for_port(port, "the daemon").await;

    // Three times the descriptors the daemon has, all idle.
    let mut idle = Vec::new();
    for _ in 0..192 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
    }
    let flooded = Instant::now();
    let http = reqwest::Client::new();
    // Every slot is held by a silent connection: the scrape's arrival
    // closes the oldest of them instead of waiting for a header timeout.
    let answered = tokio::time::timeout(
        Duration::from_secs(60),
        http.get(format!("http://127.0.0.1:{port}/metrics")).send(),
    )
    .await
    .ok()
    .and_then(Result::ok);
    let answered = match answered {
        Some(r) => Some((r.text().await.unwrap(), flooded.elapsed())),
        None => None,
    };
    let (page, after) = answered.expect("/metrics answers despite the idle connections");
    println!("/metrics answered {after:?} after 192 idle connections (descriptor limit 64)");
    // Let the probes run under the flood for a few seconds.
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(idle);
    let runs: serde_json::Value = http
        .get(format!(
            "http://127.0.0.1:{port}/api/v1/runs?target=healthy&limit=50"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let outcomes: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert!(
        outcomes.iter().filter(|o| **o == "ok").count() >= 3,
        "{outcomes:?}"
    );
    assert!(!outcomes.contains(&"connect"), "{outcomes:?}");
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert!(
        log.contains("descriptor_limit=Some(64)") && log.contains("max_connections=16"),
        "the limits are logged: {log}"
    );
    assert!(page.contains("sentinel_exporter_accept_errors_total"));
}
