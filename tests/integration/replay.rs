//! Replay equals live: a daemon probes two simulated replicas through a
//! stable build, an upgrade that slows the first token rolled out one
//! replica at a time (a rollout and its canary, then the new build against
//! the old baseline) and a slowdown within the new build; its store is
//! exported and replayed with the same configuration, and every verdict
//! the daemon stored comes out of replay again, in order, with the same
//! state, reason and per-metric changes.

use crate::common;

use std::process::Command;
use std::time::Duration;

use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::store::Store;
use vllm_sentinel::store::baselines::PairKey;
use vllm_sentinel::verdict::pair::PairVerdict;

fn config(replicas: [&SimHandle; 2], store: &std::path::Path) -> String {
    format!(
        r#"
[store]
path = "{store}"
[scheduler]
schedule = "* * * * * *"
[telemetry]
scrape_interval = "500ms"
nvml = false
[detector]
baseline_runs = 8
warmup_runs = 1
candidate_window = 4
min_candidate_runs = 4
min_baseline_runs = 8
confirm_needed = 2
confirm_window = 3
canary_window = 3
min_canary_requests = 8
upgrade_round_gap = "100ms"
[[scenarios]]
name = "interactive"
input_len = 32
output_len = 8
concurrency = 2
num_requests = 4
warmup = 0
[[targets]]
name = "prod"
base_url = "{url}"
scenarios = ["interactive"]
[targets.heartbeat]
enabled = false
[targets.replicas]
static = ["{a}", "{b}"]
probe = "replicas"
"#,
        store = store.display(),
        url = replicas[0].base_url(),
        a = replicas[0].base_url(),
        b = replicas[1].base_url(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_daemons_runs_gives_the_verdicts_it_stored() {
    let dir = common::temp_dir("replay");
    let start_replica = async || {
        SimHandle::start(
            "127.0.0.1:0",
            SimConfig {
                ttft_ms: 20.0,
                itl_ms: 2.0,
                jitter: 0.03,
                version: "0.32.0".into(),
                ..SimConfig::default()
            },
        )
        .await
        .unwrap()
    };
    let replicas = [start_replica().await, start_replica().await];
    let store_path = dir.join("store.db");
    let config_path = dir.join("sentinel.toml");
    let text = config([&replicas[0], &replicas[1]], &store_path);
    let handle = common::start_daemon(&text, Some(&config_path)).await;
    let store = Store::open(&store_path).unwrap();
    let key = PairKey {
        target: "prod".into(),
        model: "sim-model".into(),
        scenario: "interactive".into(),
    };
    let count = |build: &str| store.count_ok_runs(&key, build).unwrap();
    let stored_reasons = || -> Vec<String> {
        store
            .evaluations_after(0, 10_000)
            .unwrap()
            .into_iter()
            .map(|(_, e)| {
                serde_json::from_str::<PairVerdict>(&e.detail)
                    .unwrap()
                    .reason
            })
            .collect()
    };
    common::until(
        Duration::from_secs(60),
        "the first build's baseline",
        async || store.baseline(&key, "0.32.0").unwrap().map(|_| ()),
    )
    .await;
    common::until(
        Duration::from_secs(30),
        "verdicts on the first build",
        async || (count("0.32.0") >= 13).then_some(()),
    )
    .await;
    // One replica at a time: the canary judges the first beside the other.
    let slower_first_token = serde_json::json!({"version": "0.33.0", "ttft_ms": 30.0});
    replicas[1]
        .state
        .update(slower_first_token.clone())
        .unwrap();
    common::until(Duration::from_secs(60), "a canary verdict", async || {
        stored_reasons()
            .iter()
            .any(|r| r.contains("rollout of 0.33.0 in progress"))
            .then_some(())
    })
    .await;
    replicas[0].state.update(slower_first_token).unwrap();
    common::until(
        Duration::from_secs(90),
        "the new build's runs",
        async || (count("0.33.0") >= 20).then_some(()),
    )
    .await;
    // A slowdown within the new build, after its own baseline formed.
    for replica in &replicas {
        replica
            .state
            .update(serde_json::json!({"itl_ms": 3.0}))
            .unwrap();
    }
    let slowed = count("0.33.0");
    common::until(
        Duration::from_secs(60),
        "runs of the slowed build",
        async || (count("0.33.0") >= slowed + 8).then_some(()),
    )
    .await;
    handle.shutdown();
    handle.wait().await.unwrap();

    let stored = common::replayed::stored(&store);
    let states: Vec<&str> = stored.iter().map(|v| v.state.as_str()).collect();
    eprintln!("stored evaluations: {} ({states:?})", stored.len());
    assert!(
        stored
            .iter()
            .any(|v| v.reason.contains("rollout of 0.33.0")),
        "no canary verdict stored"
    );
    assert!(
        stored.iter().any(|v| v.build == "0.33.0"
            && v.reference_build.as_deref() == Some("0.32.0")
            && !v.reason.contains("rollout")),
        "no upgrade verdict after the rollout"
    );

    let replayed = common::replayed::assert_replay_equals_stored(&store_path, &config_path, &dir);

    // The same from the store directly, as a table.
    let table = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["replay", "--format", "table", "--store"])
        .arg(&store_path)
        .arg("--config")
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(table.status.success());
    let table = String::from_utf8(table.stdout).unwrap();
    assert_eq!(table.lines().count(), replayed + 1, "{table}");
    for replica in replicas {
        replica.stop().await;
    }
}
