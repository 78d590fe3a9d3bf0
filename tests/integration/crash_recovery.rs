//! `kill -9` in the middle of a run, then a restart: the store opens
//! cleanly, passes SQLite's integrity check and keeps every run that had
//! completed, each with all its samples.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, Killed};

use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::store::{RunFilter, Store};

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_run_loses_no_completed_run() {
    // Requests take about a second: a kill lands inside a run.
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 20.0,
            itl_ms: 60.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let dir = common::temp_dir("crash");
    let store_path = dir.join("store.db");
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            "[exporter]\nlisten = \"127.0.0.1:0\"\n[store]\npath = \"{}\"\n[scheduler]\nschedule = \"* * * * * *\"\n[telemetry]\nnvml = false\n[[targets]]\nname = \"t\"\nbase_url = \"{}\"\n[[scenarios]]\nname = \"s\"\ninput_len = 16\noutput_len = 16\nconcurrency = 2\nnum_requests = 4\nwarmup = 0\n",
            store_path.display(),
            sim.base_url()
        ),
    )
    .unwrap();
    let spawn = || {
        let child = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Killed(child)
    };
    let mut daemon = spawn();
    // Wait for two completed runs and a third in flight.
    let started = Instant::now();
    let completed_before = loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no runs stored"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(store) = Store::open(&store_path) else {
            continue;
        };
        let n = store.count_runs().unwrap_or(0);
        let served = sim.state.stats().requests;
        if n >= 2 && served > 4 * n + 1 {
            break n;
        }
    };
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();

    let store = Store::open(&store_path).unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    let runs = store.runs(&RunFilter::default()).unwrap();
    assert!(
        runs.len() as u64 >= completed_before,
        "{} < {completed_before}",
        runs.len()
    );
    for r in &runs {
        let samples = store.samples(r.id.unwrap()).unwrap();
        assert_eq!(
            samples.len(),
            r.summary.completed + r.summary.failed,
            "run {:?}",
            r.id
        );
        assert_eq!(samples.len(), 4);
    }
    drop(store);

    // The restarted daemon goes on writing to the same file.
    let mut again = spawn();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no new run after restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        if Store::open(&store_path).unwrap().count_runs().unwrap() > runs.len() as u64 {
            break;
        }
    }
    again.0.kill().unwrap();
    again.0.wait().unwrap();
    sim.stop().await;
}
