//! The series budget: after real runs against the simulator, the series
//! one (target, scenario) pair costs on `/metrics` at each histogram
//! resolution, and the two series each objective costs: at most 60 at the
//! default for a pair with two objectives covering it, and a few more once
//! its verdict is judged against a baseline.

use crate::common;

use std::time::Duration;

use vllm_sentinel::sim::{SimConfig, SimHandle};

/// Series on the page that belong to the pair (carry its scenario label).
fn pair_series(page: &str) -> usize {
    page.lines()
        .filter(|l| !l.starts_with('#') && l.contains("scenario=\"s\""))
        .count()
}

/// The pair's evaluation counters: one series per verdict state it has
/// been in.
fn evaluation_states(page: &str) -> usize {
    page.lines()
        .filter(|l| l.starts_with("sentinel_evaluations_total{") && l.contains("scenario=\"s\""))
        .count()
}

/// Series on the page that belong to an objective (carry an `slo` label).
fn objective_series(page: &str) -> usize {
    page.lines()
        .filter(|l| !l.starts_with('#') && l.contains("slo=\""))
        .count()
}

/// Two objectives covering the pair: one of latency, one of success.
const OBJECTIVES: &str = "[[slos]]\nname = \"s-ttft\"\nsli = \"ttft\"\nthreshold = \"500ms\"\n\
objective = 99\nwindow = \"1d\"\n[[slos]]\nname = \"s-success\"\nsli = \"success\"\nobjective = 99.5\nwindow = \"30d\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pair_costs_at_most_sixty_series_by_default() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("series-budget");
    let mut counts = Vec::new();
    let mut judged = None;
    for setting in [
        "",
        "histograms = \"off\"",
        "histograms = \"coarse\"",
        "histograms = \"fine\"",
    ] {
        let text = format!(
            "[exporter]\n{setting}\n[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[[targets]]\nname = \"a\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 4\nnum_requests = 4\nconcurrency = 2\n\
warmup = 0\nslo = {{ ttft = \"500ms\" }}\n{OBJECTIVES}",
            dir.join(format!("{}.db", counts.len())).display(),
            sim.base_url()
        );
        let handle = common::start_daemon(&text, None).await;
        // Two runs: the counters and histograms have moved, the verdict
        // gauges are set.
        let page = common::until(Duration::from_secs(30), "two runs", async || {
            let page = common::get_text(&handle, "/metrics").await;
            page.lines()
                .any(|l| {
                    l.starts_with("sentinel_runs_total{")
                        && l.contains("outcome=\"ok\"")
                        && l.ends_with(" 2")
                })
                .then_some(page)
        })
        .await;
        let n = pair_series(&page);
        let objectives = objective_series(&page);
        if setting.is_empty() {
            judged = Some((n - evaluation_states(&page), once_judged(&handle).await));
        }
        let ttft = page.contains("sentinel_ttft_seconds_bucket{");
        let itl = page.contains("sentinel_itl_seconds_bucket{");
        println!(
            "{:<24} {n} series per pair, {objectives} for its two objectives (TTFT histogram {ttft}, ITL histogram {itl})",
            if setting.is_empty() {
                "default"
            } else {
                setting
            }
        );
        assert_eq!(objectives, 4, "two series per objective");
        counts.push((n + objectives, ttft, itl));
        handle.shutdown();
        handle.wait().await.unwrap();
    }
    let [default, off, coarse, fine] = counts[..] else {
        unreachable!()
    };
    assert_eq!(default, coarse, "coarse is the default");
    assert!(
        coarse.0 <= 60,
        "{} series at the default with two objectives",
        coarse.0
    );
    assert_eq!(
        (off.1, coarse.1, fine.1),
        (false, true, true),
        "TTFT histogram"
    );
    assert_eq!(
        (off.2, coarse.2, fine.2),
        (false, false, true),
        "ITL histogram"
    );
    assert!(off.0 < coarse.0 && coarse.0 < fine.0);
    // Once judged: the baseline's series and one per evaluation state
    // met (ok, inconclusive, confirming, regression: four at most), and
    // no verdict evidence while nothing is slower.
    let (before, (after, states)) = judged.unwrap();
    println!(
        "default, once judged: {} series with its two objectives ({states} evaluation states)",
        after + states + 4
    );
    assert_eq!(after, before + 1, "only sentinel_baseline_info more");
    assert!(states <= 4);
}

/// Waits for the pair's first evaluations against its baseline (the
/// default detector: 2 warm-up runs, 30 for the baseline, then 4
/// candidate runs) and returns the pair's series then, but for its
/// evaluation counters, and how many those are; the verdict's
/// evidence (`sentinel_regression_relative_change`, `..._p_value`) is
/// shown only for metrics it finds slower, and the simulator's runs are
/// none.
async fn once_judged(handle: &vllm_sentinel::daemon::DaemonHandle) -> (usize, usize) {
    let page = common::until(Duration::from_secs(90), "an ok verdict", async || {
        let page = common::get_text(handle, "/metrics").await;
        page.lines()
            .any(|l| {
                l.starts_with("sentinel_evaluations_total{")
                    && l.contains("state=\"ok\"")
                    && !l.ends_with(" 0")
            })
            .then_some(page)
    })
    .await;
    let evidence: Vec<&str> = page
        .lines()
        .filter(|l| {
            l.starts_with("sentinel_regression_relative_change{")
                || l.starts_with("sentinel_regression_p_value{")
        })
        .collect();
    assert!(page.contains("sentinel_baseline_info{"), "{page}");
    assert_eq!(
        evidence,
        Vec::<&str>::new(),
        "evidence while nothing is slower"
    );
    let states = evaluation_states(&page);
    (pair_series(&page) - states, states)
}
