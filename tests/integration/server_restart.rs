//! A server restarted on the same build (a crash, a drained node, a pod
//! rescheduled on the same image): the daemon reads the server's start
//! time from its `/metrics` (`process_start_time_seconds`), so each
//! start's first runs, slower while the server is cold, are a warm-up as
//! a new build's first runs are: in no baseline, candidate or history, and
//! no regression. The simulator restarts on `POST /admin/restart`, its
//! first requests after each start 3 times slower.

use crate::common;

use std::time::Duration;

use common::until;
use vllm_sentinel::sim::SimConfig;
use vllm_sentinel::store::starts::NoWarmup;
use vllm_sentinel::verdict::warmup::WarmupRule;

use crate::regression_e2e::{Probed, key, sim_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_servers_cold_runs_are_its_warm_up() {
    // The probe's runs are 4 requests: 8 cold requests are a start's
    // first 2 runs (fewer if a heartbeat took some).
    let sim = SimConfig {
        cold_requests: 8,
        cold_factor: 3.0,
        ..sim_config()
    };
    let detector = "[detector]\nbaseline_runs = 6\nmin_baseline_runs = 6\n";
    // The scratch directory bound too: it lives as long as the test.
    let Probed {
        sim,
        handle,
        store,
        dir: _dir,
        ..
    } = Probed::start("restart", sim, detector).await;

    let restart: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/admin/restart", sim.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let restarted = restart["process_start_time_seconds"].as_f64().unwrap();
    let all_runs = || {
        store
            .newest_ok_runs(&key(), "0.32.0", &NoWarmup, None, &[], 1000)
            .unwrap()
    };
    until(
        Duration::from_secs(60),
        "6 runs since the restart",
        async || {
            let since = all_runs()
                .iter()
                .filter(|r| r.server_started_s() == Some(restarted))
                .count();
            (since >= 6).then_some(())
        },
    )
    .await;
    handle.shutdown();
    handle.wait().await.unwrap();

    let runs = all_runs();
    let starts: Vec<Option<f64>> = runs.iter().map(|r| r.server_started_s()).collect();
    let first = starts[0].expect("the start time read from the simulator's /metrics");
    assert!(
        starts
            .iter()
            .all(|s| *s == Some(first) || *s == Some(restarted)),
        "{starts:?}"
    );
    // The warm-up: each start's first 2 completed runs.
    let warm_up: Vec<i64> = [first, restarted]
        .iter()
        .flat_map(|start| {
            runs.iter()
                .filter(move |r| r.server_started_s() == Some(*start))
                .take(2)
        })
        .map(|r| r.id.unwrap())
        .collect();
    let mut ttfts: Vec<f64> = runs.iter().map(|r| r.summary.ttft.p50).collect();
    ttfts.sort_by(f64::total_cmp);
    let median = ttfts[ttfts.len() / 2];
    let cold: Vec<i64> = runs
        .iter()
        .filter(|r| r.summary.ttft.p50 > 2.0 * median)
        .map(|r| r.id.unwrap())
        .collect();
    assert!(
        cold.iter().any(|id| warm_up[2..].contains(id)),
        "the restarted server was cold: {cold:?}, warm-up {warm_up:?}"
    );
    assert!(
        cold.iter().all(|id| warm_up.contains(id)),
        "every cold run is in a warm-up: {cold:?}, warm-up {warm_up:?}"
    );
    let judged: Vec<i64> = store
        .newest_ok_runs(&key(), "0.32.0", &WarmupRule(2), None, &[], 1000)
        .unwrap()
        .iter()
        .map(|r| r.id.unwrap())
        .collect();
    let expected: Vec<i64> = runs
        .iter()
        .map(|r| r.id.unwrap())
        .filter(|id| !warm_up.contains(id))
        .collect();
    assert_eq!(judged, expected, "every run past the two warm-ups");
    let baseline = store.baseline(&key(), "0.32.0").unwrap().unwrap();
    assert!(baseline.run_ids.iter().all(|id| !cold.contains(id)));
    let evaluations = store.evaluations_after(0, 1000).unwrap();
    assert!(evaluations.len() >= 6, "{}", evaluations.len());
    let slower: Vec<_> = evaluations
        .iter()
        .filter(|(_, e)| e.state == "regression" || e.state == "confirming")
        .collect();
    assert!(slower.is_empty(), "{slower:#?}");
}
