//! `baseline` and `report` as a user runs them, on a store holding two
//! versions of one target: listing, showing, pinning (and replacing from
//! recent runs), unpinning, the Markdown and HTML report, and one-line
//! errors for what does not exist.

use std::process::Command;

use crate::common;

use chrono::{Duration, Utc};
use vllm_sentinel::client::Outcome;
use vllm_sentinel::store::Store;
use vllm_sentinel::store::baselines::PairKey;
use vllm_sentinel::verdict::warmup::WarmupRule;
use vllm_sentinel::vocabulary::records::{
    LatencySummary, RunOutcome, RunRecord, RunSummary, SampleRow, ServerIdentity, ServerLoad,
};

pub(crate) fn run(version: &str, i: i64, ttft: f64) -> RunRecord {
    let jitter = 1.0 + ((i * 37) % 11) as f64 / 200.0;
    let ttft = ttft * jitter;
    let lat = |v: f64| LatencySummary {
        count: 2,
        mean: v,
        p50: v,
        p90: v * 1.05,
        p95: v * 1.07,
        p99: v * 1.1,
        ..Default::default()
    };
    RunRecord {
        id: None,
        target: "prod".into(),
        scenario: "chat".into(),
        model: "m".into(),
        started_at: Utc::now() - Duration::minutes(200 - i),
        duration_s: 1.0,
        outcome: RunOutcome::Ok,
        error: None,
        server: ServerIdentity {
            version: Some(version.into()),
            model_root: Some("/w".into()),
            system_fingerprint: None,
            max_model_len: Some(4096),
            ..ServerIdentity::default()
        },
        summary: RunSummary {
            completed: 2,
            output_throughput: 100.0,
            request_throughput: 2.0,
            ttft: lat(ttft),
            tpot: lat(0.01),
            itl: lat(0.01),
            e2el: lat(ttft + 0.1),
            ..Default::default()
        },
        load_before: Some(ServerLoad {
            running: Some(1.0),
            waiting: Some(0.0),
            ..Default::default()
        }),
        load_after: None,
        build: None,
        replica: String::new(),
        answers: Vec::new(),
        fingerprint_churn: false,
        samples: (0..2)
            .map(|index| SampleRow {
                index,
                outcome: Outcome::Ok,
                ttft_s: Some(ttft),
                tpot_s: Some(0.01),
                e2el_s: Some(ttft + 0.1),
                itls_s: vec![0.01; 10],
                prompt_tokens: 32,
                output_tokens: 11,
                served_by: None,
            })
            .collect(),
    }
}

/// `sentinel` with arguments written as one line (no argument has a space).
fn sentinel_words(line: &str) -> (i32, String, String) {
    sentinel(&line.split_whitespace().collect::<Vec<_>>())
}

pub(crate) fn sentinel(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn baselines_and_reports_from_the_command_line() {
    let dir = common::temp_dir("cli-baseline");
    let path = dir.join("store.db");
    {
        let store = Store::open(&path).unwrap();
        for i in 0..34 {
            store.insert_run(&run("0.32.0", i, 0.100)).unwrap();
        }
        for i in 34..50 {
            store.insert_run(&run("0.33.0", i, 0.125)).unwrap();
        }
        let key = PairKey {
            target: "prod".into(),
            model: "m".into(),
            scenario: "chat".into(),
        };
        assert!(
            store
                .form_baseline(&key, "0.32.0", &WarmupRule(2), 30, Utc::now())
                .unwrap()
                .is_some()
        );
    }
    let s = path.to_str().unwrap();

    let (code, out, _) = sentinel_words(&format!("baseline --store {s} list"));
    assert_eq!(code, 0);
    assert!(
        out.contains("prod")
            && out.contains("0.32.0")
            && out.contains("30 runs")
            && out.contains("automatic"),
        "{out}"
    );

    let (code, out, _) = sentinel_words(&format!(
        "baseline --store {s} show --target prod --scenario chat"
    ));
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| l.contains("ms")).count(),
        30,
        "{out}"
    );

    let (code, out, err) = sentinel_words(&format!(
        "baseline --store {s} pin --target prod --scenario chat --version 0.33.0 --recent 10"
    ));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("pinned:")
            && out.contains("0.33.0")
            && out.contains("10 runs")
            && out.contains("recent-runs"),
        "{out}"
    );
    let (_, out, _) = sentinel_words(&format!("baseline --store {s} list"));
    assert!(
        out.lines()
            .any(|l| l.contains("0.33.0") && l.contains("pinned")),
        "{out}"
    );
    let (code, out, _) = sentinel_words(&format!(
        "baseline --store {s} unpin --target prod --scenario chat"
    ));
    assert_eq!(code, 0);
    assert!(out.starts_with("unpinned prod/m/chat"), "{out}");

    let (code, _, err) = sentinel_words(&format!(
        "baseline --store {s} pin --target prod --scenario chat --version 0.40.0"
    ));
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "error: prod/m/chat at version 0.40.0 has no baseline yet; pin its newest N completed runs (recent N; it has 0)"
    );
    // A baseline of no runs would replace the real one and judge nothing.
    let (code, _, err) = sentinel_words(&format!(
        "baseline --store {s} pin --target prod --scenario chat --version 0.33.0 --recent 0"
    ));
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "error: a baseline of 0 recent runs would judge nothing; ask for at least 1"
    );
    let (code, out, _) = sentinel_words(&format!(
        "baseline --store {s} show --target prod --scenario chat --version 0.33.0"
    ));
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| l.contains("ms")).count(),
        10,
        "the pinned baseline is kept: {out}"
    );

    let md = dir.join("r.md");
    let html = dir.join("r.html");
    let (code, _, err) = sentinel(&[
        "report",
        "--store",
        s,
        "--target",
        "prod",
        "--from",
        "0.32.0",
        "--to",
        "0.33.0",
        "--markdown",
        md.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let md = std::fs::read_to_string(md).unwrap();
    assert!(
        md.starts_with("# prod: version 0.33.0 compared with 0.32.0"),
        "{md}"
    );
    assert!(md.contains("Verdict: **regression**"), "{md}");
    assert!(
        md.contains("Overall: **regression** (1 of 1 scenario(s) slower)"),
        "{md}"
    );
    assert!(md.contains("| runs | 30 | 14 |"), "{md}");
    assert!(md.contains("| TTFT | "), "{md}");
    let ttft = md.lines().find(|l| l.starts_with("| ttft_p50 |")).unwrap();
    assert!(ttft.contains("slower"), "{ttft}");
    let html = std::fs::read_to_string(html).unwrap();
    assert!(html.contains("<svg") && html.contains("</svg>") && html.contains("TTFT p50"));

    let (code, out, err) = sentinel_words(&format!(
        "report --store {s} --target prod --from 0.31.0 --to 0.33.0"
    ));
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim(),
        "error: target \"prod\" has no completed runs at version \"0.31.0\"; versions with runs: 0.32.0, 0.33.0"
    );
    assert_eq!(err.lines().count(), 1);

    let (code, _, err) =
        sentinel_words("report --store /nonexistent/x.db --target prod --from a --to b");
    assert_eq!(code, 1);
    assert_eq!(err.trim(), "error: store /nonexistent/x.db does not exist");
}

/// A version with only warm-up runs is said to be one, and server text in a
/// Markdown report is escaped (a version is whatever the server says).
#[test]
fn reports_name_warmup_only_versions_and_escape_server_text() {
    let dir = common::temp_dir("cli-report");
    let path = dir.join("store.db");
    let hostile = "0.33.0<img src=x onerror=alert(1)>|x";
    {
        let store = Store::open(&path).unwrap();
        for i in 0..34 {
            store.insert_run(&run("0.32.0", i, 0.100)).unwrap();
        }
        for i in 34..50 {
            store.insert_run(&run(hostile, i, 0.100)).unwrap();
        }
        store.insert_run(&run("0.34.0", 51, 0.100)).unwrap();
        // Two starts of the server, two runs each: more runs than the
        // version's warm-up, every one a start's.
        for i in 52..56 {
            let mut r = run("0.35.0", i, 0.100);
            if let Some(load) = r.load_before.as_mut() {
                load.server_started_s = Some(if i < 54 { 1.7e9 } else { 1.7e9 + 600.0 });
            }
            store.insert_run(&r).unwrap();
        }
    }
    let s = path.to_str().unwrap();
    let (code, out, err) = sentinel_words(&format!(
        "report --store {s} --target prod --from 0.32.0 --to 0.34.0"
    ));
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("has 1 completed run(s) at version \"0.34.0\", all of them warm-up")
            && err.contains("[detector] warmup_runs"),
        "{err}"
    );
    let (code, out, err) = sentinel_words(&format!(
        "report --store {s} --target prod --from 0.32.0 --to 0.35.0"
    ));
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("has 4 completed run(s) at version \"0.35.0\", all of them warm-up"),
        "{err}"
    );
    let md = dir.join("r.md");
    let (code, _, err) = sentinel(&[
        "report",
        "--store",
        s,
        "--target",
        "prod",
        "--from",
        "0.32.0",
        "--to",
        hostile,
        "--markdown",
        md.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let md = std::fs::read_to_string(md).unwrap();
    assert!(!md.contains("<img"), "{md}");
    assert!(
        md.contains("0.33.0&lt;img src=x onerror=alert(1)&gt;\\|x"),
        "{md}"
    );
}

/// A version deployed again after a rollback, seen by the identity watcher
/// before any probe ran on it: the report says it has no runs since its
/// return, and how many from before it does not judge, instead of saying
/// it has none (while listing it among the versions with runs).
#[test]
fn a_report_on_a_version_back_before_its_first_run_says_so() {
    let dir = common::temp_dir("cli-report-return");
    // The rollback is the 0.32.0 run 156 minutes before now; read the
    // clock either side, in case a minute turns in between.
    let rolled_back_at = || (Utc::now() - Duration::minutes(156)).format("%Y-%m-%d %H:%M");
    let early = rolled_back_at().to_string();
    let path = dir.join("store.db");
    {
        let store = Store::open(&path).unwrap();
        for i in 0..34 {
            store.insert_run(&run("0.32.0", i, 0.100)).unwrap();
        }
        for i in 34..44 {
            store.insert_run(&run("0.33.0", i, 0.130)).unwrap();
        }
        for i in 44..50 {
            store.insert_run(&run("0.32.0", i, 0.100)).unwrap();
        }
        let identity = run("0.33.0", 50, 0.1).server;
        let back = Utc::now() - Duration::minutes(150);
        let observed = store
            .observe_identity("prod", "m", &identity, back, &Default::default())
            .unwrap();
        assert_eq!(observed.build, "0.33.0");
    }
    let s = path.to_str().unwrap();
    let (code, out, err) = sentinel_words(&format!(
        "report --store {s} --target prod --from 0.32.0 --to 0.33.0"
    ));
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    let said = |at: &str| {
        format!(
            "error: target \"prod\" has no completed runs at version \"0.33.0\" since it was rolled back at {at} UTC and deployed again; its 10 run(s) from before the rollback are not judged; wait for more runs"
        )
    };
    let late = rolled_back_at().to_string();
    assert!(
        err.trim() == said(&early) || err.trim() == said(&late),
        "{err}"
    );
}
