use super::*;
use crate::client::Outcome;
use crate::vocabulary::records::{LatencySummary, RunSummary, ServerLoad};
use std::time::Duration;

/// A warm-up of the build's first `n` completed runs only.
struct FirstRuns(usize);

impl starts::Warmup for FirstRuns {
    fn left_out(&self, runs: &starts::BuildRuns<'_>) -> Result<Vec<i64>, StoreError> {
        runs.first(self.0)
    }
}

pub(super) fn run(target: &str, scenario: &str, minutes_ago: i64, ttft_p50: f64) -> RunRecord {
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
            ..ServerIdentity::default()
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
        replica: String::new(),
        answers: Vec::new(),
        fingerprint_churn: false,
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
                served_by: Some("10.0.0.1:8000".into()),
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
                served_by: None,
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
    want.build = Some("0.32.0".into());
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
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let _ = std::fs::remove_file(&path);
    {
        let store = Store::open(&path).unwrap();
        store.insert_run(&run("a", "s", 1, 0.5)).unwrap();
        assert_eq!(
            store.schema_version().unwrap(),
            schema::MIGRATIONS.len() as i64
        );
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

fn identity(version: &str, root: &str, fp: Option<&str>) -> ServerIdentity {
    ServerIdentity {
        version: Some(version.into()),
        model_root: Some(root.into()),
        system_fingerprint: fp.map(str::to_owned),
        max_model_len: None,
        ..ServerIdentity::default()
    }
}

#[test]
fn builds_get_readable_labels_and_changes_are_recorded() {
    let store = Store::in_memory().unwrap();
    let now = Utc::now();
    let seen = |id: &ServerIdentity| {
        store
            .observe_identity("t", "m", id, now, &fleet::FleetScope::default())
            .unwrap()
    };
    let first = seen(&identity("0.32.0", "/w1", None));
    assert_eq!(first.build, "0.32.0");
    assert_eq!(first.change.unwrap().from_build, None);
    // The watcher sees no fingerprint; the first run teaches it.
    assert_eq!(seen(&identity("0.32.0", "/w1", Some("fp1"))).change, None);
    let up = seen(&identity("0.33.0", "/w1", None));
    assert_eq!(up.build, "0.33.0");
    assert_eq!(up.change.unwrap().from_build.as_deref(), Some("0.32.0"));
    // Same version, other weights: a build of its own.
    let other = seen(&identity("0.33.0", "/w2", None));
    assert_eq!(other.build, "0.33.0+2");
    // Back to the first build with its fingerprint: the old label.
    let back = seen(&identity("0.32.0", "/w1", Some("fp1")));
    assert_eq!(back.build, "0.32.0");
    // Same version and weights but another fingerprint: new build.
    assert_eq!(
        seen(&identity("0.32.0", "/w1", Some("fp2"))).build,
        "0.32.0+2"
    );
    let history = store.version_changes("t", "m").unwrap();
    let path: Vec<&str> = history.iter().rev().map(|c| c.to_build.as_str()).collect();
    assert_eq!(path, ["0.32.0", "0.33.0", "0.33.0+2", "0.32.0", "0.32.0+2"]);
    assert_eq!(
        store.current_build("t", "m").unwrap().as_deref(),
        Some("0.32.0+2")
    );
    assert_eq!(store.models_of("t").unwrap(), ["m"]);
}

#[test]
fn images_of_one_version_and_fingerprint_are_builds_of_their_own() {
    let store = Store::in_memory().unwrap();
    let now = Utc::now();
    let seen = |digest: Option<&str>| {
        let mut id = identity("0.32.0", "/w", Some("vllm-0.32.0-abc"));
        id.image = digest.map(|_| "vllm/vllm-openai:v0.32.0".to_owned());
        id.image_digest = digest.map(str::to_owned);
        store
            .observe_identity("t", "m", &id, now, &fleet::FleetScope::default())
            .unwrap()
    };
    // Filed before its image was known, the build learns it.
    assert_eq!(seen(None).build, "0.32.0");
    assert_eq!(seen(Some("sha256:aa")).change, None);
    let other = seen(Some("sha256:bb"));
    assert_eq!(other.build, "0.32.0+2");
    assert_eq!(
        other.change.unwrap().from_build.as_deref(),
        Some("0.32.0"),
        "a new image is a change of build"
    );
    assert_eq!(seen(Some("sha256:aa")).build, "0.32.0");
    assert_eq!(seen(Some("sha256:bb")).build, "0.32.0+2");
    let conn = store.lock();
    let image: (Option<String>, Option<String>) = conn
        .query_row(
            "SELECT image, image_digest FROM builds WHERE label = '0.32.0'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        image,
        (
            Some("vllm/vllm-openai:v0.32.0".into()),
            Some("sha256:aa".into())
        )
    );
}

#[test]
fn new_builds_past_the_hourly_bound_are_filed_under_the_current_one() {
    let store = Store::in_memory().unwrap();
    let now = Utc::now();
    let scope = fleet::FleetScope {
        new_builds_per_hour: Some(2),
        ..fleet::FleetScope::default()
    };
    let seen = |fp: &str, at| {
        store
            .observe_identity("t", "m", &identity("0.32.0", "/w", Some(fp)), at, &scope)
            .unwrap()
    };
    assert_eq!(seen("fp1", now).build, "0.32.0");
    assert_eq!(seen("fp2", now).build, "0.32.0+2");
    let third = seen("fp3", now);
    assert!(third.limited && third.change.is_none(), "{third:?}");
    assert_eq!(third.build, "0.32.0+2", "filed under the current build");
    // A known build is found whatever the bound.
    assert!(!seen("fp1", now).limited);
    // An hour later there is room again.
    let later = seen("fp3", now + chrono::Duration::minutes(61));
    assert_eq!((later.build.as_str(), later.limited), ("0.32.0+3", false));
}

#[test]
fn a_new_label_is_one_index_read_however_many_builds_are_stored() {
    // 100,000 builds of one version, as a per-request fingerprint once
    // filed before builds were bounded: the next label is still right...
    let store = Store::in_memory().unwrap();
    store
        .lock()
        .execute_batch(
            "INSERT INTO builds VALUES ('t', 'm', '0.32.0', '0.32.0', '/w', 'fp1', 0, NULL, NULL);
             WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
             INSERT INTO builds (target, model, label, server_version, model_root,
                 system_fingerprint, first_seen)
             SELECT 't', 'm', '0.32.0+' || i, '0.32.0', '/w', 'fp' || i, 0 FROM n;",
        )
        .unwrap();
    let filed = store
        .observe_identity(
            "t",
            "m",
            &identity("0.32.0", "/w", Some("new")),
            Utc::now(),
            &fleet::FleetScope::default(),
        )
        .unwrap();
    assert_eq!(filed.build, "0.32.0+100001");
    // ...and found by one search of an index, not a scan of the table (a
    // plan, not a timing: the machine's load does not change it).
    let plan: Vec<String> = {
        let conn = store.lock();
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", builds::LABELS_OF_VERSION))
            .unwrap();
        stmt.query_map(params!["t", "m", "0.32.0", "0.32.0\u{10FFFF}"], |r| {
            r.get::<_, String>(3)
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    assert!(
        plan.iter()
            .all(|step| step.contains("USING") && step.contains("INDEX")),
        "{plan:?}"
    );
}

#[test]
fn baselines_form_after_warmup_pin_replace_unpin_and_survive_retention() {
    let store = Store::in_memory().unwrap();
    let key = baselines::PairKey {
        target: "a".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let mut ids = Vec::new();
    for i in 0..7 {
        let mut r = run("a", "s", 1000 - i, 0.1);
        if i == 3 {
            r.outcome = RunOutcome::Partial;
        }
        ids.push(store.insert_run(&r).unwrap());
    }
    let now = Utc::now();
    // 6 completed runs: warm-up 2 + 4 needed.
    assert!(
        store
            .form_baseline(&key, "0.32.0", &FirstRuns(2), 5, now)
            .unwrap()
            .is_none()
    );
    let b = store
        .form_baseline(&key, "0.32.0", &FirstRuns(2), 4, now)
        .unwrap()
        .unwrap();
    assert_eq!(b.run_ids, vec![ids[2], ids[4], ids[5], ids[6]]);
    assert_eq!(b.origin, "first-runs");
    assert!(b.pinned_at.is_none());
    // Formed once: later runs do not move it.
    store.insert_run(&run("a", "s", 10, 0.1)).unwrap();
    assert_eq!(
        store
            .form_baseline(&key, "0.32.0", &FirstRuns(2), 4, now)
            .unwrap()
            .unwrap()
            .run_ids,
        b.run_ids
    );

    let pinned = store.pin_baseline(&key, "0.32.0", None, now).unwrap();
    assert!(pinned.pinned_at.is_some());
    assert_eq!(store.pinned_baseline(&key).unwrap().unwrap().id, b.id);
    let replaced = store.pin_baseline(&key, "0.32.0", Some(3), now).unwrap();
    assert_eq!(replaced.origin, "recent-runs");
    assert_eq!(replaced.run_ids.len(), 3);
    assert!(replaced.run_ids.contains(&(ids[6] + 1)));
    assert!(matches!(
        store.pin_baseline(&key, "0.40.0", None, now),
        Err(StoreError::Refused(_))
    ));
    assert!(matches!(
        store.pin_baseline(&key, "0.40.0", Some(2), now),
        Err(StoreError::NotEnoughRuns {
            have: 0,
            need: 2,
            ..
        })
    ));
    // Retention keeps the runs a baseline stands on.
    let deleted = store.prune(Utc::now(), Duration::from_secs(3600)).unwrap();
    assert_eq!(
        deleted, 5,
        "7 runs past retention, 2 of them in the baseline"
    );
    assert_eq!(store.runs_by_id(&replaced.run_ids).unwrap().len(), 3);
    assert!(store.unpin_baseline(&key).unwrap());
    assert!(!store.unpin_baseline(&key).unwrap());
    assert!(store.pinned_baseline(&key).unwrap().is_none());
}

#[test]
fn the_candidate_window_skips_the_warmup_and_the_reference() {
    let store = Store::in_memory().unwrap();
    let key = baselines::PairKey {
        target: "a".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    let ids: Vec<i64> = (0..10)
        .map(|i| store.insert_run(&run("a", "s", 100 - i, 0.1)).unwrap())
        .collect();
    assert_eq!(store.count_ok_runs(&key, "0.32.0").unwrap(), 10);
    let since = |skip, since, exclude: &[i64], limit| -> Vec<i64> {
        store
            .newest_ok_runs(&key, "0.32.0", &FirstRuns(skip), since, exclude, limit)
            .unwrap()
            .iter()
            .map(|r| r.id.unwrap())
            .collect()
    };
    let window = |skip, exclude: &[i64], limit| since(skip, None, exclude, limit);
    assert_eq!(window(0, &[], 3), ids[7..].to_vec(), "newest, oldest first");
    // Since a time: the limit counts only the runs since (a build deployed
    // again is judged on up to a window of its runs since its return).
    let return_at = Utc::now() - chrono::Duration::minutes(95) - chrono::Duration::seconds(30);
    assert_eq!(since(0, Some(return_at), &[], 8), ids[5..].to_vec());
    assert_eq!(since(0, Some(return_at), &[], 3), ids[7..].to_vec());
    assert_eq!(since(7, Some(return_at), &[], 8), ids[7..].to_vec());
    assert_eq!(window(8, &[], 5), ids[8..].to_vec(), "warm-up left out");
    assert_eq!(
        window(2, &[ids[8], ids[9]], 3),
        ids[5..8].to_vec(),
        "reference left out"
    );
    assert_eq!(window(0, &[], usize::MAX).len(), 10);
}

#[test]
fn a_deleted_or_replaced_file_is_noticed() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let store = Store::open(&path).unwrap();
    assert_eq!(store.check_file(), Ok(()));
    std::fs::remove_file(&path).unwrap();
    let err = store.check_file().unwrap_err();
    assert!(err.ends_with("was deleted"), "{err}");
    std::fs::write(&path, b"other").unwrap();
    let err = store.check_file().unwrap_err();
    assert!(err.ends_with("was replaced by another file"), "{err}");
    assert_eq!(Store::in_memory().unwrap().check_file(), Ok(()));
}

/// A run of `build` (named by its fingerprint) at `seconds_ago`, through
/// the service or on a replica, with `completed` requests.
pub(crate) fn fleet_run(
    build: &str,
    seconds_ago: i64,
    replica: &str,
    completed: usize,
) -> RunRecord {
    let mut r = run("t", "s", 0, 0.1);
    r.started_at = Utc::now() - chrono::Duration::seconds(seconds_ago);
    r.server.version = Some(build.into());
    r.server.system_fingerprint = Some(format!("vllm-{build}-hash"));
    r.summary.completed = completed;
    r.replica = replica.into();
    r
}

#[test]
fn a_fleet_is_the_builds_of_its_last_rounds_and_a_rollout_ends_when_one_side_is_gone() {
    let store = Store::in_memory().unwrap();
    let scope = fleet::FleetScope::service(2);
    let file = |r: &RunRecord| store.insert_run_filed(r, &scope).unwrap().1;
    // One round served by two builds, 3 and 1 requests.
    let first = file(&fleet_run("0.32.0", 100, "", 3));
    assert_eq!(first.change.unwrap().from_build, None, "first seen");
    let second = file(&fleet_run("0.33.0", 100, "", 1));
    assert_eq!(second.change.unwrap().from_build.as_deref(), Some("0.32.0"));
    let shares: Vec<(String, f64)> = second
        .fleet
        .iter()
        .map(|b| (b.build.clone(), b.share))
        .collect();
    assert_eq!(
        shares,
        [("0.32.0".to_owned(), 0.75), ("0.33.0".to_owned(), 0.25)]
    );
    // The old build again: it serves, so no change.
    assert_eq!(file(&fleet_run("0.32.0", 90, "", 2)).change, None);
    assert!(store.open_rollout("t", "m").unwrap().is_some());
    // Two rounds of the new build alone: the old one is gone, the rollout
    // finished, once.
    assert_eq!(file(&fleet_run("0.33.0", 80, "", 4)).rollout_ended, None);
    let ended = file(&fleet_run("0.33.0", 70, "", 4)).rollout_ended.unwrap();
    assert_eq!(ended.outcome.as_deref(), Some("finished"));
    assert_eq!(file(&fleet_run("0.33.0", 60, "", 4)).rollout_ended, None);
    assert!(store.open_rollout("t", "m").unwrap().is_none());

    // By replica: each replica's latest run, one vote each; a replica no
    // longer listed does not count.
    file(&fleet_run("0.33.0", 50, "10.0.0.5:8000", 4));
    file(&fleet_run("0.34.0", 40, "10.0.0.6:8000", 4));
    file(&fleet_run("0.34.0", 30, "10.0.0.7:8000", 4));
    let replicas = fleet::FleetScope {
        window: 2,
        replicas: vec!["10.0.0.5:8000".into(), "10.0.0.6:8000".into()],
        new_builds_per_hour: None,
        rollout_timeout: None,
    };
    let fleet = store.fleet("t", "m", &replicas).unwrap();
    let counts: Vec<(&str, u64, bool)> = fleet
        .iter()
        .map(|b| (b.build.as_str(), b.count, b.by_replica))
        .collect();
    assert_eq!(counts, [("0.33.0", 1, true), ("0.34.0", 1, true)]);
}

#[test]
fn a_rollout_that_never_finishes_ends_as_stalled_after_the_timeout() {
    let store = Store::in_memory().unwrap();
    let scope = fleet::FleetScope {
        rollout_timeout: Some(Duration::from_secs(3600)),
        ..fleet::FleetScope::service(3)
    };
    let file = |r: &RunRecord| store.insert_run_filed(r, &scope).unwrap().1;
    // Two builds keep serving side by side: a canary kept for good.
    file(&fleet_run("0.32.0", 7200, "", 2));
    let started = file(&fleet_run("0.33.0", 7200, "", 2));
    assert!(started.change.is_some());
    for minutes_ago in [100, 61] {
        file(&fleet_run("0.32.0", minutes_ago * 60, "", 2));
        let mixed = file(&fleet_run("0.33.0", minutes_ago * 60, "", 2));
        assert_eq!(
            mixed.rollout_ended, None,
            "both still serve within the hour"
        );
    }
    // The first run past the hour ends it.
    let after = file(&fleet_run("0.32.0", 30, "", 2));
    let ended = after.rollout_ended.expect("ended after an hour open");
    assert_eq!(ended.outcome.as_deref(), Some("stalled"));
    assert!(store.open_rollout("t", "m").unwrap().is_none());
    // From then on each build is judged on its own: no new rollout.
    for build in ["0.33.0", "0.32.0"] {
        let next = file(&fleet_run(build, 10, "", 2));
        assert!(next.change.is_none() && next.rollout_ended.is_none());
    }
    // ...and each forms its own baseline from its runs, as after any
    // finished rollout.
    let key = baselines::PairKey {
        target: "t".into(),
        model: "m".into(),
        scenario: "s".into(),
    };
    for build in ["0.33.0", "0.32.0"] {
        for seconds_ago in [8, 6, 4] {
            file(&fleet_run(build, seconds_ago, "", 2));
        }
        let baseline = store
            .form_baseline(&key, build, &starts::NoWarmup, 4, Utc::now())
            .unwrap();
        assert!(baseline.is_some(), "{build} has a baseline");
    }
}
