//! Server load and the verdict, end to end against the simulator (whose
//! latencies grow 5% with each other running request): a new version
//! measured under far more load than its baseline is inconclusive while
//! the history cannot say how load matters, and is compared at the
//! baseline's load once it can.

use crate::common;
use crate::regression_e2e::{Probed, key, latest_verdict, metrics_page, sim_config};

use common::until;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use vllm_sentinel::config::Config;
use vllm_sentinel::sim::SimConfig;
use vllm_sentinel::verdict::{MetricResult, State, pair::PairVerdict};

/// Smaller windows than the defaults keep these tests short; the rule is
/// the same.
const DETECTOR: &str = r#"
[detector]
baseline_runs = 12
min_baseline_runs = 12
min_candidate_runs = 8
candidate_window = 8
warmup_runs = 1
"#;

/// Long streams beside the probe: `streams` of them at once (read on
/// every round, so the caller may change it), until `stop`.
fn background_load(base: String, most: usize, streams: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
    for i in 0..most {
        let (base, streams, stop) = (base.clone(), streams.clone(), stop.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                if i >= streams.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let r = http
                    .post(format!("{base}/v1/completions"))
                    .json(&serde_json::json!({
                        "model": "sim-model", "prompt": "busy", "max_tokens": 400,
                        "stream": true, "ignore_eos": true
                    }))
                    .send()
                    .await;
                if let Ok(r) = r {
                    let _ = r.bytes().await;
                }
            }
        });
    }
}

impl Probed {
    /// The simulator (latencies 5% longer for each other running
    /// request) and the daemon with this module's detector.
    async fn with_load(name: &str) -> Probed {
        let sim = SimConfig {
            load_factor: 0.05,
            ..sim_config()
        };
        Probed::start(name, sim, DETECTOR).await
    }

    /// Switches to a new version, not slower by itself, run beside
    /// `streams` long streams until it has enough runs for its verdict:
    /// that verdict and its TTFT p50 comparison.
    async fn new_version_beside(&self, streams: usize) -> (PairVerdict, MetricResult) {
        let stop = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(AtomicUsize::new(streams));
        background_load(self.sim.base_url(), streams, busy, stop.clone());
        self.sim
            .state
            .update(serde_json::json!({"version": "0.33.0"}))
            .unwrap();
        let need = Config::parse(&self.config, "t")
            .unwrap()
            .verdict_policy
            .runs_for_verdict();
        until(
            Duration::from_secs(60),
            "the new version's runs",
            async || {
                (self.store.count_ok_runs(&key(), "0.33.0").unwrap() >= need + 2).then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let verdict = latest_verdict(&self.handle).await.unwrap();
        let ttft = verdict.evaluation.metric("ttft_p50").unwrap().clone();
        (verdict, ttft)
    }

    /// No evaluation of the new version was ever a regression; stops.
    async fn never_a_regression(self) {
        let page = metrics_page(&self.handle).await;
        let regressions: Vec<&str> = page
            .lines()
            .filter(|l| {
                l.starts_with("sentinel_evaluations_total{") && l.contains("state=\"regression\"")
            })
            .collect();
        // On failure, which build's evaluation it was and why.
        let stored: Vec<String> = self
            .store
            .evaluations_after(0, 100_000)
            .unwrap()
            .into_iter()
            .filter(|(_, e)| e.state == "regression")
            .map(|(id, e)| format!("#{id} {} at {}: {}", e.build, e.at, e.detail))
            .collect();
        assert!(regressions.is_empty(), "{regressions:?}: {stored:#?}");
        self.handle.shutdown();
        self.handle.wait().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowdown_measured_under_far_more_load_is_inconclusive() {
    let probed = Probed::with_load("load").await;
    // The history is the baseline's dozen runs at one load: it cannot say
    // how load matters.
    let (verdict, ttft) = probed.new_version_beside(10).await;
    println!(
        "under load: ttft_p50 {:+.1}%, verdict {} ({})",
        ttft.relative_change * 100.0,
        verdict.state.as_str(),
        verdict.evaluation.reason
    );
    assert!(
        ttft.relative_change > 0.2,
        "the load did slow the runs: {ttft:?}"
    );
    assert_eq!(verdict.state, State::Inconclusive);
    assert!(verdict.evaluation.reason.contains("server load differs"));
    probed.never_a_regression().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busier_new_version_is_compared_at_the_baselines_load_once_the_history_shows_how_load_matters()
 {
    let probed = Probed::with_load("load-covariate").await;
    // The old version's runs go on under 0, 5 and 10 background streams
    // in turn, 3 s each: its history then shows what load does.
    let (streams, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    background_load(probed.sim.base_url(), 10, streams.clone(), stop.clone());
    let cycling = {
        let (streams, stop) = (streams.clone(), stop.clone());
        tokio::spawn(async move {
            for level in [0, 5, 10, 5].into_iter().cycle() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                streams.store(level, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        })
    };
    let history_runs = 12 + 1 + 40;
    until(
        Duration::from_secs(120),
        "the old version's history",
        async || {
            (probed.store.count_ok_runs(&key(), "0.32.0").unwrap() >= history_runs).then_some(())
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    cycling.await.unwrap();
    // Beside 7 streams every latency is about +35%.
    let (verdict, ttft) = probed.new_version_beside(7).await;
    println!(
        "under 7 streams: ttft_p50 {:+.1}% [{:+.1}%, {:+.1}%] at the baseline's load, verdict {} ({})",
        ttft.relative_change * 100.0,
        ttft.ci_low * 100.0,
        ttft.ci_high * 100.0,
        verdict.state.as_str(),
        verdict.evaluation.reason
    );
    assert_eq!(verdict.state, State::Ok, "{}", verdict.evaluation.reason);
    assert!(
        verdict
            .evaluation
            .reason
            .contains("compared at the baseline's server load"),
        "{}",
        verdict.evaluation.reason
    );
    // The runs were some 35% slower; at the baseline's load what is left
    // is the noise of the load's estimated effect (a few percent here, up
    // to +12% on a busy 2-core machine when these TTFTs were 20 ms).
    assert!(ttft.relative_change.abs() < 0.15, "{ttft:?}");
    probed.never_a_regression().await;
}
