//! Two instances over one configuration, `[cluster] shard = "0/2"` and
//! `"1/2"`: every target is probed by exactly one of them, and
//! `check-config --shard` lists the same split.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use vllm_sentinel::sim::{SimConfig, SimHandle};

const TARGETS: usize = 8;

fn config(sim: &SimHandle, dir: &std::path::Path, shard: Option<&str>) -> String {
    let mut text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 4\nnum_requests = 1\nconcurrency = 1\nwarmup = 0\n",
        dir.join(format!("{}.db", shard.unwrap_or("all").replace('/', "-")))
            .display()
    );
    if let Some(shard) = shard {
        text.push_str(&format!("[cluster]\nshard = \"{shard}\"\n"));
    }
    for i in 0..TARGETS {
        text.push_str(&format!(
            "[[targets]]\nname = \"vllm-{i}\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n",
            sim.base_url()
        ));
    }
    text
}

async fn probed(handle: &vllm_sentinel::daemon::DaemonHandle) -> BTreeSet<String> {
    let page: serde_json::Value =
        serde_json::from_str(&common::get_text(handle, "/api/v1/runs?limit=200").await).unwrap();
    page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["target"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_probe_every_target_exactly_once() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("shards");
    let first = common::start_daemon(&config(&sim, &dir, Some("0/2")), None).await;
    let second = common::start_daemon(&config(&sim, &dir, Some("1/2")), None).await;
    let (a, b) = common::until(
        Duration::from_secs(30),
        "both shards to probe all theirs",
        async || {
            let (a, b) = (probed(&first).await, probed(&second).await);
            (a.len() + b.len() >= TARGETS).then_some((a, b))
        },
    )
    .await;
    // A few more seconds of runs: still nobody probes the other's targets.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (a2, b2) = (probed(&first).await, probed(&second).await);
    assert_eq!(
        (&a, &b),
        (&a2, &b2),
        "a shard started probing another's target"
    );
    println!("shard 0/2 probes {a:?}; shard 1/2 probes {b:?}");
    assert!(a.is_disjoint(&b), "probed twice: {:?}", a.intersection(&b));
    let all: BTreeSet<String> = (0..TARGETS).map(|i| format!("vllm-{i}")).collect();
    assert_eq!(a.union(&b).cloned().collect::<BTreeSet<_>>(), all);
    assert!(!a.is_empty() && !b.is_empty(), "one shard got every target");
    for handle in [first, second] {
        handle.shutdown();
        handle.wait().await.unwrap();
    }

    // check-config --shard shows the same split from the unsharded file.
    let file = dir.join("all.toml");
    std::fs::write(&file, config(&sim, &dir, None)).unwrap();
    for (shard, expected) in [("0/2", &a), ("1/2", &b)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
            .args(["check-config", "--shard", shard, "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let line = text.lines().find(|l| l.starts_with("shard ")).unwrap();
        let listed: BTreeSet<String> = line
            .split_once(": ")
            .unwrap()
            .1
            .split(" (")
            .next()
            .unwrap()
            .split(", ")
            .map(str::to_owned)
            .collect();
        assert_eq!(&listed, expected, "{line}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["check-config", "--shard", "2/2", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        error.contains("i counts from 0, so it must be below N (2)"),
        "{error}"
    );
}
