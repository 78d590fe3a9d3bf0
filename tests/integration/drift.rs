//! The output-drift canary in the daemon against the simulator: answers of
//! one build agree with themselves; a build whose numerics changed answers
//! differently, which is exported, notified by webhook ("... answers
//! differently: 8 of 8 prompts diverge before token 5") and stored; a
//! later build answering like the one before it does not drift.

use crate::common;

use std::time::Duration;

use vllm_sentinel::sim::{SimConfig, SimHandle};

fn gauge(page: &vllm_sentinel::telemetry::exposition::Exposition, name: &str) -> Option<f64> {
    common::value(page, name, &[("scenario", "canary")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_answers_differently_is_drift_and_is_notified() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 2.0,
            itl_ms: 1.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let (hook, received) = common::start_webhook().await;
    let dir = common::temp_dir("drift");
    let text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\nscrape_interval = \"500ms\"\n\
[detector]\nwarmup_runs = 0\n[notify]\ngroup_wait = \"0s\"\nmin_interval = \"0s\"\n[[notify.webhooks]]\nurl = \"{hook}\"\n\
[[targets]]\nname = \"a\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n\
[[scenarios]]\nname = \"canary\"\nkind = \"drift\"\ninput_len = 8\noutput_len = 12\n\
concurrency = 2\nwarmup = 0\n",
        dir.join("d.db").display(),
        sim.base_url()
    );
    let handle = common::start_daemon(&text, None).await;
    // Two runs of one build: the same answers.
    common::until(
        Duration::from_secs(30),
        "a second run of 0.32.0",
        async || {
            let page = common::metrics(&handle).await;
            gauge(&page, "sentinel_drift_self_diverged_prompts").filter(|v| *v == 0.0)
        },
    )
    .await;
    // Other numerics in a new build.
    sim.state
        .update(serde_json::json!({"version": "0.33.0", "answer_seed": 7}))
        .unwrap();
    common::until(Duration::from_secs(30), "the drift verdict", async || {
        let page = common::metrics(&handle).await;
        gauge(&page, "sentinel_drift").filter(|v| *v == 1.0)
    })
    .await;
    let page = common::metrics(&handle).await;
    assert_eq!(gauge(&page, "sentinel_drift_prompts"), Some(8.0));
    assert_eq!(
        gauge(&page, "sentinel_drift_diverged_early_prompts"),
        Some(8.0)
    );
    // Answers, not latency: the regression state says nothing of the canary.
    assert_eq!(gauge(&page, "sentinel_regression_state"), None);
    let hook = common::until(Duration::from_secs(15), "the webhook", async || {
        received.lock().unwrap().first().cloned()
    })
    .await;
    let text = hook["text"].as_str().unwrap();
    assert!(
        text.starts_with("[vllm-sentinel] DRIFT on a: canary answer differently"),
        "{text}"
    );
    assert!(
        text.contains("0.33.0 answers differently: 8 of 8 prompts diverge before token 5"),
        "{text}"
    );
    // The upgrade report shows it, prompt by prompt.
    let report = common::get_text(
        &handle,
        "/report?target=a&from=0.32.0&to=0.33.0&format=markdown",
    )
    .await;
    assert!(report.contains("## canary: output drift"), "{report}");
    assert!(
        report.contains("**0.33.0 answers differently: 8 of 8 prompts diverge before token 5"),
        "{report}"
    );
    assert!(report.contains("| 1 | token 0 |"), "{report}");
    // A later build that answers as 0.33.0 did: no drift, and resolved.
    sim.state
        .update(serde_json::json!({"version": "0.34.0"}))
        .unwrap();
    common::until(
        Duration::from_secs(30),
        "no drift from 0.33.0",
        async || {
            let page = common::metrics(&handle).await;
            gauge(&page, "sentinel_drift").filter(|v| *v == 0.0)
        },
    )
    .await;
    let resolved = common::until(Duration::from_secs(15), "the resolution", async || {
        let got = received.lock().unwrap();
        got.iter().find(|b| b["status"] == "resolved").cloned()
    })
    .await;
    assert!(
        resolved["text"]
            .as_str()
            .unwrap()
            .contains("0.34.0 answers as before"),
        "{resolved}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
    sim.stop().await;
}
