//! Replay's tests of a server restarted on the same build: its first runs
//! after the restart are a warm-up, as a new build's first runs are.

use super::tests::{replay_all, run, slower};
use super::*;
use crate::store::starts::NoWarmup;
use crate::verdict::State;

/// Build 0.32.0 for 40 runs, then 0.33.0 as fast, its server restarted
/// (the same image: a crash, a node drained) right after its warm-up, at
/// its 3rd run: the runs its upgrade verdict would judge first. Each start's
/// first `cold` runs are 3 times slower, as a freshly started server's
/// first runs are; `read` says whether the daemon read the server's
/// start time (`process_start_time_seconds`). Returns 0.33.0's verdicts
/// from its restart on.
fn restarted_after_the_new_builds_warm_up(read: bool, cold: usize) -> Vec<(i64, State, String)> {
    let runs = (0..80).map(|i| {
        let (build, started, since_start) = match i {
            _ if i < 40 => ("0.32.0", 1.0e9, i),
            _ if i < 42 => ("0.33.0", 1.1e9, i - 40),
            _ => ("0.33.0", 1.2e9, i - 42),
        };
        let slower = if since_start < cold { 3.0 } else { 1.0 };
        let mut r = run(i, 0.020 * slower);
        r.server.version = Some(build.into());
        for load in [&mut r.load_before, &mut r.load_after]
            .into_iter()
            .flatten()
        {
            load.server_started_s = read.then_some(started);
        }
        r
    });
    replay_all(VerdictPolicy::default(), runs)
        .into_iter()
        .filter(|r| r.verdict.build == "0.33.0" && r.after_run >= Some(43))
        .map(|r| (r.after_run.unwrap_or(0), r.verdict.state, r.verdict.reason))
        .collect()
}

#[test]
fn a_restart_of_the_new_build_is_not_its_regression() {
    let read = restarted_after_the_new_builds_warm_up(true, 2);
    assert!(read.len() >= 30, "{read:#?}");
    assert_eq!(slower(&read), [], "the restart's cold runs are its warm-up");
    // Not read, the same cold runs are the upgrade's first runs after its
    // warm-up slowing down: what the start time keeps out.
    let unread = restarted_after_the_new_builds_warm_up(false, 2);
    let slowed = slower(&unread);
    assert!(!slowed.is_empty(), "{unread:#?}");
}

/// The `restarts` recording: a real vLLM server (CPU build) restarted 8
/// times with the same configuration, the probe daemon running throughout
/// (`benches/traces/record/restarts.sh`).
fn recorded_restarts() -> Vec<RunRecord> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/traces/restarts/restarts.jsonl.gz");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    std::io::BufRead::lines(reader)
        .map(|line| {
            serde_json::from_str::<RunLine>(&line.unwrap())
                .unwrap()
                .into_record()
        })
        .collect()
}

#[test]
fn a_real_servers_restarts_are_read_and_each_starts_a_warm_up() {
    let runs = recorded_restarts();
    let completed = runs.iter().filter(|r| r.success()).count();
    let mut starts: Vec<f64> = runs
        .iter()
        .filter(|r| r.success())
        .map(|r| r.server_started_s().expect("every completed run read it"))
        .collect();
    starts.dedup();
    assert_eq!(starts.len(), 9, "{starts:?}");
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
    assert!(runs.len() > completed, "runs failed while it was down");
    // Replayed, each start's first 2 completed runs are left out of every
    // comparison, as the build's first 2 are; the slower starts stay
    // unflagged.
    let policy = VerdictPolicy::default();
    let mut replayer = Replayer::new(policy.clone(), HashSet::new()).unwrap();
    let mut verdicts = Vec::new();
    for r in runs.into_iter() {
        verdicts.extend(replayer.push(r).unwrap());
    }
    verdicts.extend(replayer.flush().unwrap());
    assert!(
        verdicts
            .iter()
            .all(|v| matches!(v.verdict.state, State::Ok | State::Inconclusive)),
        "{verdicts:#?}"
    );
    let key = PairKey {
        target: "real-vllm".into(),
        model: "tiny".into(),
        scenario: "probe".into(),
    };
    let past_warm_up = replayer
        .store
        .newest_ok_runs(&key, "0.32.0", &policy.warmup(), None, &[], usize::MAX)
        .unwrap();
    assert_eq!(past_warm_up.len(), completed - 2 * starts.len());
    let baseline = replayer.store.baseline(&key, "0.32.0").unwrap().unwrap();
    let firsts: Vec<i64> = starts
        .iter()
        .flat_map(|s| {
            replayer
                .store
                .newest_ok_runs(&key, "0.32.0", &NoWarmup, None, &[], usize::MAX)
                .unwrap()
                .into_iter()
                .filter(move |r| r.server_started_s() == Some(*s))
                .take(2)
        })
        .filter_map(|r| r.id)
        .collect();
    assert_eq!(firsts.len(), 18);
    assert!(baseline.run_ids.iter().all(|id| !firsts.contains(id)));
}
