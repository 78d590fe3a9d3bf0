//! Replay equals live: a daemon's stored evaluations beside those that
//! `vllm-sentinel replay` gives from its exported runs.

use std::path::Path;
use std::process::Command;

use vllm_sentinel::store::Store;
use vllm_sentinel::verdict::pair::PairVerdict;

/// Every evaluation the daemon stored, oldest first.
pub fn stored(store: &Store) -> Vec<PairVerdict> {
    store
        .evaluations_after(0, 10_000)
        .unwrap()
        .into_iter()
        .map(|(_, e)| serde_json::from_str(&e.detail).unwrap())
        .collect()
}

/// What must agree: the build judged, its reference, the state, the reason
/// and each metric's change and interval.
fn essence(v: &PairVerdict) -> serde_json::Value {
    serde_json::json!({
        "build": v.build,
        "reference_build": v.reference_build,
        "state": v.state.as_str(),
        "reason": v.reason,
        "changes": v.evaluation.metrics.iter().map(|m| {
            serde_json::json!([m.metric, m.relative_change, m.ci_low, m.ci_high, m.flagged && m.alerting])
        }).collect::<Vec<_>>(),
    })
}

/// The same, of one line of `replay`'s output.
fn replayed_essence(l: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "build": l["build"],
        "reference_build": l["reference_build"],
        "state": l["state"],
        "reason": l["reason"],
        "changes": l["changes"].as_array().unwrap().iter().map(|c| {
            serde_json::json!([c["metric"], c["change"], c["ci_low"], c["ci_high"], c["flagged"]])
        }).collect::<Vec<_>>(),
    })
}

/// Exports the store's runs into `dir` (every run, one a line), replays
/// them with the daemon's configuration file and asserts that every
/// evaluation the daemon stored comes out again, in order, the same.
/// Returns how many lines replay printed.
pub fn assert_replay_equals_stored(store_path: &Path, config_path: &Path, dir: &Path) -> usize {
    let store = Store::open(store_path).unwrap();
    let exported = dir.join("runs.jsonl");
    let binary = env!("CARGO_BIN_EXE_vllm-sentinel");
    let (ok, output) = super::output_of({
        let mut c = Command::new(binary);
        c.args(["export", "--store"])
            .arg(store_path)
            .arg("--out")
            .arg(&exported);
        c
    });
    assert!(ok, "export failed: {output}");
    let lines = std::fs::read_to_string(&exported).unwrap();
    assert_eq!(lines.lines().count() as u64, store.count_runs().unwrap());

    let replay = Command::new(binary)
        .args(["replay", "--runs"])
        .arg(&exported)
        .arg("--config")
        .arg(config_path)
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let replayed: Vec<serde_json::Value> = String::from_utf8(replay.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The daemon stores an evaluation once the build has a reference.
    let with_reference: Vec<serde_json::Value> = replayed
        .iter()
        .filter(|l| !l["reference_build"].is_null())
        .map(replayed_essence)
        .collect();
    let live: Vec<serde_json::Value> = stored(&store).iter().map(essence).collect();
    eprintln!(
        "replayed {} evaluations, {} with a reference; the daemon stored {}",
        replayed.len(),
        with_reference.len(),
        live.len()
    );
    for (i, (l, r)) in live.iter().zip(&with_reference).enumerate() {
        assert_eq!(l, r, "evaluation {i} differs");
    }
    assert_eq!(live.len(), with_reference.len());
    replayed.len()
}
