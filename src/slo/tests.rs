use std::time::Duration;

use chrono::Utc;

use super::*;
use crate::config::Config;
use crate::config::slos::ReplicaScope;

fn sample(outcome: Outcome, ttft_ms: f64, itls_ms: &[f64]) -> SampleRow {
    SampleRow {
        index: 0,
        outcome,
        ttft_s: outcome.is_ok().then_some(ttft_ms / 1e3),
        tpot_s: (!itls_ms.is_empty())
            .then(|| itls_ms.iter().sum::<f64>() / itls_ms.len() as f64 / 1e3),
        e2el_s: outcome
            .is_ok()
            .then(|| (ttft_ms + itls_ms.iter().sum::<f64>()) / 1e3),
        itls_s: itls_ms.iter().map(|v| v / 1e3).collect(),
        prompt_tokens: 8,
        output_tokens: itls_ms.len() as u32 + 1,
        served_by: None,
    }
}

fn objectives(extra: &str) -> Config {
    let text = format!(
        r#"
[[targets]]
name = "a"
base_url = "http://127.0.0.1:1"
[targets.replicas]
static = ["http://127.0.0.1:2"]
[[targets]]
name = "b"
base_url = "http://127.0.0.1:3"
[[scenarios]]
name = "chat"
input_len = 8
output_len = 4
[[scenarios]]
name = "batch"
input_len = 8
output_len = 4
{extra}
"#
    );
    Config::parse(&text, "t")
        .unwrap_or_else(|e| panic!("{e}"))
        .load_files()
        .unwrap()
}

#[test]
fn a_latency_sli_holds_each_request_to_the_exact_threshold() {
    let ttft = Sli::Latency {
        metric: LatencyMetric::Ttft,
        threshold: Duration::from_millis(500),
    };
    assert_eq!(
        judge(&ttft, &sample(Outcome::Ok, 500.0, &[10.0])),
        Some(true)
    );
    assert_eq!(
        judge(&ttft, &sample(Outcome::Ok, 500.1, &[10.0])),
        Some(false)
    );
    assert_eq!(
        judge(&ttft, &sample(Outcome::Http5xx, 0.0, &[])),
        Some(false)
    );
    assert_eq!(judge(&ttft, &sample(Outcome::Shed, 0.0, &[])), Some(false));
    assert_eq!(judge(&ttft, &sample(Outcome::Local, 0.0, &[])), None);
    assert_eq!(
        judge(&Sli::Success, &sample(Outcome::Ok, 9e9, &[])),
        Some(true)
    );
    // The 99th percentile of the request's own gaps (linear): ten gaps of
    // 10 ms and one of 50 ms put it at 10 + 0.9 x 40 = 46 ms.
    let mut gaps = vec![10.0; 10];
    gaps.push(50.0);
    let itl = |ms| Sli::Latency {
        metric: LatencyMetric::ItlP99,
        threshold: Duration::from_micros(ms),
    };
    assert_eq!(
        judge(&itl(46_100), &sample(Outcome::Ok, 1.0, &gaps)),
        Some(true)
    );
    assert_eq!(
        judge(&itl(45_900), &sample(Outcome::Ok, 1.0, &gaps)),
        Some(false)
    );
    // A one-token answer has no gap and no TPOT to miss.
    assert_eq!(judge(&itl(1), &sample(Outcome::Ok, 1.0, &[])), Some(true));
    let tpot = Sli::Latency {
        metric: LatencyMetric::Tpot,
        threshold: Duration::from_millis(1),
    };
    assert_eq!(judge(&tpot, &sample(Outcome::Ok, 1.0, &[])), Some(true));
}

#[test]
fn a_run_counts_toward_the_objectives_that_cover_it() {
    let c = objectives(
        r#"
[[slos]]
name = "chat-ttft"
targets = ["a"]
scenarios = ["chat"]
sli = "ttft"
threshold = "100ms"
objective = 99
window = "1h"
[[slos]]
name = "all-success"
sli = "success"
replicas = "service"
objective = 99.5
window = "1h"
[[slos]]
name = "replica-2"
sli = "success"
replicas = ["127.0.0.1:2", "10.0.0.9:80"]
objective = 99.5
window = "1h"
"#,
    );
    let [ttft, success, named] = &c.slos[..] else {
        panic!("{:?}", c.slos)
    };
    let mut run = RunRecord::failed(
        "a",
        "chat",
        "m",
        Utc::now(),
        1.0,
        RunOutcome::Partial,
        String::new(),
    );
    run.samples = vec![
        sample(Outcome::Ok, 50.0, &[5.0]),
        sample(Outcome::Ok, 150.0, &[5.0]),
        sample(Outcome::Http5xx, 0.0, &[]),
        sample(Outcome::Local, 0.0, &[]),
    ];
    run.samples[1].served_by = Some("10.0.0.9:80".into());
    assert_eq!(tally_run(ttft, &run, None), Tally { good: 1, total: 3 });
    assert_eq!(tally_run(success, &run, None), Tally { good: 2, total: 3 });
    // Through the gateway, only the request it named as served by a
    // listed replica.
    assert_eq!(tally_run(named, &run, None), Tally { good: 1, total: 1 });
    let mut other = run.clone();
    other.scenario = "batch".into();
    assert_eq!(tally_run(ttft, &other, None), Tally::default());
    other.target = "b".into();
    assert_eq!(tally_run(ttft, &other, None), Tally::default());
    assert_eq!(
        tally_run(success, &other, None),
        Tally { good: 2, total: 3 }
    );
    // Sent to a replica: outside "service", inside the replica's name.
    let mut at_replica = run.clone();
    at_replica.replica = "127.0.0.1:2".into();
    assert_eq!(tally_run(success, &at_replica, None), Tally::default());
    assert_eq!(
        tally_run(named, &at_replica, None),
        Tally { good: 2, total: 3 }
    );
    // A pod, named by its pod's name: a listed address is its address.
    let mut at_pod = run.clone();
    at_pod.replica = "vllm-6f7c9-a2x4q".into();
    assert_eq!(tally_run(named, &at_pod, None), Tally::default());
    assert_eq!(
        tally_run(named, &at_pod, Some("10.0.0.9:80")),
        Tally { good: 2, total: 3 }
    );

    // A target that could not be reached burns one request; a run cut at
    // shutdown, or our own configuration, burns nothing.
    let down = RunRecord::failed(
        "a",
        "chat",
        "m",
        Utc::now(),
        1.0,
        RunOutcome::Failed(Outcome::Connect),
        "refused".into(),
    );
    assert_eq!(tally_run(ttft, &down, None), Tally { good: 0, total: 1 });
    for ours in [
        RunOutcome::Aborted,
        RunOutcome::Config,
        RunOutcome::Failed(Outcome::Local),
    ] {
        let r = RunRecord::failed("a", "chat", "m", Utc::now(), 1.0, ours, String::new());
        assert_eq!(tally_run(ttft, &r, None), Tally::default(), "{ours:?}");
    }
    assert_eq!(
        named.replicas,
        ReplicaScope::Named(vec!["127.0.0.1:2".into(), "10.0.0.9:80".into()])
    );
}

#[test]
fn heartbeats_count_only_toward_liveness_objectives() {
    let c = objectives(
        r#"
[[slos]]
name = "alive"
targets = ["b"]
sli = "liveness"
objective = 99.9
window = "30d"
[[slos]]
name = "ok"
sli = "success"
objective = 99
window = "1h"
"#,
    );
    let (alive, ok) = (&c.slos[0], &c.slos[1]);
    assert_eq!(
        tally_heartbeat(alive, "b", ("", None), true),
        Tally { good: 1, total: 1 }
    );
    assert_eq!(
        tally_heartbeat(alive, "b", ("", None), false),
        Tally { good: 0, total: 1 }
    );
    assert_eq!(
        tally_heartbeat(alive, "a", ("", None), false),
        Tally::default()
    );
    assert_eq!(
        tally_heartbeat(ok, "b", ("", None), false),
        Tally::default()
    );
    let run = RunRecord::failed(
        "b",
        "chat",
        "m",
        Utc::now(),
        1.0,
        RunOutcome::Failed(Outcome::Connect),
        String::new(),
    );
    assert_eq!(tally_run(alive, &run, None), Tally::default());
}

#[test]
fn budget_and_burn_rate_follow_the_workbook() {
    let t = Tally {
        good: 990,
        total: 1000,
    };
    let budget = 1.0 - 0.995;
    assert_eq!(t.sli(), Some(0.99));
    assert!((t.burn_rate(budget).unwrap() - 2.0).abs() < 1e-9);
    assert!((t.budget_remaining(budget).unwrap() + 1.0).abs() < 1e-9);
    let none = Tally::default();
    assert_eq!((none.sli(), none.burn_rate(budget)), (None, None));
}

#[test]
fn durations_are_written_as_prometheus_reads_them() {
    let d = |s: u64| prometheus_duration(Duration::from_secs(s));
    assert_eq!(d(30 * 86_400), "30d");
    assert_eq!(d(3600), "1h");
    assert_eq!(d(300), "5m");
    assert_eq!(d(90), "1m30s");
    assert_eq!(prometheus_duration(Duration::from_millis(1500)), "1s500ms");
    assert_eq!(d(0), "0s");
    assert_eq!(rules::number(1.0 - 0.995), "0.005");
    assert_eq!(rules::number(14.4), "14.4");
    assert_eq!(rules::number(6.0), "6");
    // A tiny error budget stays itself, not 0 (a division by zero).
    assert_eq!(rules::number(1e-11), "0.00000000001");
    let tiny: f64 = rules::number(1.0 - 0.9999999999999).parse().unwrap();
    assert!((tiny / 1e-13 - 1.0).abs() < 1e-3, "{tiny}");
}
