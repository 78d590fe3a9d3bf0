//! A real vLLM whose engine core is stopped (SIGSTOP) while its API server
//! keeps answering `/health`: the daemon, on a 5-minute schedule, must say
//! "not generating" from its heartbeats, and a real Prometheus with the
//! shipped rules (15 s scrape and evaluation) must fire
//! `SentinelEngineNotGenerating` within two minutes; SIGCONT recovers both.
//! Ignored by default; it runs with `-- --ignored` when
//! `SENTINEL_REAL_VLLM_SERVE` names the script that starts the server
//! (`../shared/real-vllm/serve.sh`), on port `SENTINEL_REAL_VLLM_WEDGE_PORT`
//! (default 8103).

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::temp_dir;

/// The engine core process of the server started as process group `pgid`.
fn engine_core(pgid: i32) -> i32 {
    let out = Command::new("ps")
        .args(["-o", "pid=,cmd=", "-g", &pgid.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.to_lowercase().contains("enginecore"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("an EngineCore process in the server's group")
}

fn signal(pid: i32, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real vLLM install: SENTINEL_REAL_VLLM_SERVE=../shared/real-vllm/serve.sh cargo test --release --test integration real_vllm_liveness:: -- --ignored"]
async fn a_stopped_engine_core_is_not_generating_and_alerted_within_two_minutes() {
    let script = common::real_vllm::script();
    let port = common::real_vllm::port("SENTINEL_REAL_VLLM_WEDGE_PORT", 8103);
    let dir = temp_dir("real-vllm-wedge");
    let pgid = common::real_vllm::serve(&script, port, "");
    let core = engine_core(pgid);
    // Whatever happens, the engine is resumed and the server stopped.
    let _server = Stopped { pgid, core };
    let text = common::wedge::daemon_config(
        &dir.join("store.db"),
        "0 */5 * * * *",
        (32, 16),
        ("real", &format!("http://127.0.0.1:{port}")),
        "endpoint = \"chat\"",
    );
    let handle = common::start_daemon(&text, None).await;
    let (_prometheus, prom_port) = common::wedge::prometheus_for(&dir, &handle);
    // What the heartbeat costs the server: a minute of heartbeats alone,
    // read from vLLM's own counters.
    let counters = || async {
        let page = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let page = vllm_sentinel::telemetry::exposition::Exposition::parse(&page).unwrap();
        let sum = |name: &str| -> f64 { page.scalars(&[name]).iter().map(|s| s.value).sum() };
        (
            sum("vllm:request_success_total"),
            sum("vllm:prompt_tokens_total"),
            sum("vllm:generation_tokens_total"),
        )
    };
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before = counters().await;
    let runs_before = common::metrics(&handle)
        .await
        .scalars(&["sentinel_runs_total"])
        .iter()
        .map(|s| s.value)
        .sum::<f64>();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = counters().await;
    let runs_after = common::metrics(&handle)
        .await
        .scalars(&["sentinel_runs_total"])
        .iter()
        .map(|s| s.value)
        .sum::<f64>();
    eprintln!(
        "heartbeat cost over 60 s at the defaults: {} requests, {} prompt tokens, {} output tokens ({} runs meanwhile)",
        after.0 - before.0,
        after.1 - before.1,
        after.2 - before.2,
        runs_after - runs_before
    );
    let health = format!("http://127.0.0.1:{port}/health");
    let figures = common::wedge::time_a_wedge(
        &handle,
        prom_port,
        ("real", ""),
        || signal(core, "-STOP"),
        || signal(core, "-CONT"),
    )
    .await;
    // SIGSTOP left the API server answering all along.
    let status = reqwest::get(&health).await.unwrap().status();
    eprintln!(
        "real vLLM, EngineCore stopped under a 5-minute schedule: {figures:?}; /health {status}"
    );
    assert!(figures.to_alert <= 120.0, "{figures:?}");
    // Within one heartbeat interval (15 s) of SIGCONT.
    assert!(figures.to_recovery <= 16.0, "{figures:?}");
    handle.shutdown();
    handle.wait().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real server of a test: its engine resumed and its process group
/// stopped when the test ends, pass or fail.
struct Stopped {
    pgid: i32,
    core: i32,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.core.to_string()])
            .status();
        common::real_vllm::stop(self.pgid);
    }
}
