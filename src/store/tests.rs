use super::*;
use crate::client::Outcome;
use crate::run::{LatencySummary, RunSummary, ServerLoad};

fn run(target: &str, scenario: &str, minutes_ago: i64, ttft_p50: f64) -> RunRecord {
    RunRecord {
        id: None,
        target: target.into(),
        scenario: scenario.into(),
        model: "m".into(),
        started_at: Utc::now() - chrono::Duration::minutes(minutes_ago),
        duration_s: 1.5,
        outcome: RunOutcome::Ok,
        error: None,
        server: ServerIdentity {
            version: Some("0.32.0".into()),
            model_root: Some("/models/m".into()),
            system_fingerprint: Some("vllm-0.32.0-abc".into()),
            max_model_len: Some(4096),
        },
        summary: RunSummary {
            completed: 2,
            ttft: LatencySummary {
                count: 2,
                p50: ttft_p50,
                ..Default::default()
            },
            ..Default::default()
        },
        load_before: Some(ServerLoad {
            running: Some(3.0),
            ..Default::default()
        }),
        load_after: None,
        build: None,
        samples: vec![
            SampleRow {
                index: 0,
                outcome: Outcome::Ok,
                ttft_s: Some(0.1),
                tpot_s: Some(0.01),
                e2el_s: Some(0.5),
                itls_s: vec![0.01, 0.02],
                prompt_tokens: 16,
                output_tokens: 3,
            },
            SampleRow {
                index: 1,
                outcome: Outcome::Timeout,
                ttft_s: None,
                tpot_s: None,
                e2el_s: None,
                itls_s: vec![],
                prompt_tokens: 0,
                output_tokens: 0,
            },
        ],
    }
}

#[test]
fn runs_round_trip_with_samples_and_covariates() {
    let store = Store::in_memory().unwrap();
    let id = store.insert_run(&run("a", "s", 1, 0.123)).unwrap();
    let back = store.run(id).unwrap().unwrap();
    let mut want = run("a", "s", 1, 0.123);
    want.id = Some(id);
    want.samples.clear();
    // Timestamps are kept to the microsecond.
    want.started_at = back.started_at;
    assert_eq!(back, want);
    let samples = store.samples(id).unwrap();
    assert_eq!(samples, run("a", "s", 1, 0.0).samples);
}

#[test]
fn filters_latest_and_retention() {
    let store = Store::in_memory().unwrap();
    for (t, s, ago, v) in [
        ("a", "x", 30, 1.0),
        ("a", "x", 20, 2.0),
        ("a", "y", 10, 3.0),
        ("b", "x", 5, 4.0),
        ("a", "x", 60 * 24 * 100, 9.0),
    ] {
        store.insert_run(&run(t, s, ago, v)).unwrap();
    }
    let ax = store
        .runs(&RunFilter {
            target: Some("a".into()),
            scenario: Some("x".into()),
            ..Default::default()
        })
        .unwrap();
    let p50s: Vec<f64> = ax.iter().map(|r| r.summary.ttft.p50).collect();
    assert_eq!(p50s, vec![2.0, 1.0, 9.0], "newest first");
    let latest: Vec<(String, String, f64)> = store
        .latest_runs()
        .unwrap()
        .into_iter()
        .map(|r| (r.target, r.scenario, r.summary.ttft.p50))
        .collect();
    assert_eq!(
        latest,
        vec![
            ("a".into(), "x".into(), 2.0),
            ("a".into(), "y".into(), 3.0),
            ("b".into(), "x".into(), 4.0)
        ]
    );
    let removed = store
        .prune(Utc::now(), Duration::from_secs(90 * 86400))
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(store.count_runs().unwrap(), 4);
}

#[test]
fn reopening_a_file_keeps_runs_and_refuses_a_newer_schema() {
    let dir = std::env::temp_dir().join(format!("sentinel-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let _ = std::fs::remove_file(&path);
    {
        let store = Store::open(&path).unwrap();
        store.insert_run(&run("a", "s", 1, 0.5)).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.count_runs().unwrap(), 1);
    store
        .lock()
        .pragma_update(None, "user_version", 999)
        .unwrap();
    drop(store);
    let err = Store::open(&path).unwrap_err().to_string();
    assert!(err.contains("schema version 999"), "{err}");
}
