//! What is judged once a run is filed: each completed pair against its
//! reference, or, while a rollout is open, the new build against the old
//! one measured at the same time. The daemon and `replay` both decide
//! here, so a replayed history meets the same rule the daemon applied.

use chrono::{DateTime, Utc};

use super::canary::{self, RolloutProgress};
use super::pair::{self, PairVerdict};
use super::policy::VerdictPolicy;
use crate::store::baselines::PairKey;
use crate::store::fleet::FleetBuild;
use crate::store::{Store, StoreError};

/// One run, filed: the pairs it completed (with the build each record was
/// filed under) and where the target stood when the run ended.
#[derive(Debug, Clone, Default)]
pub struct FiledRun {
    /// `(pair, build)` of each record that completed and is judged by its
    /// latency (drift canaries are judged by their answers instead).
    pub to_judge: Vec<(PairKey, String)>,
    /// The run probed one replica directly.
    pub replica_run: bool,
    /// The target's replicas are probed one by one (not only through its
    /// service).
    pub by_replica: bool,
    /// The open rollout, `(from, to)`.
    pub rollout: Option<(String, String)>,
    /// The builds serving the target after the run.
    pub fleet: Vec<FleetBuild>,
}

/// Judges a filed run and stores the evaluations; returns the verdicts.
///
/// During a rollout the pair's verdict is the canary, from one source so
/// that its confirmation counts like with like: replica runs when replicas
/// are probed, else the service's rounds (a run served by both builds
/// gives one canary verdict, not one per build). Otherwise, and while the
/// two builds have served in none of the canary's rounds (one server
/// upgraded, a fleet switched at once: the rollout stays open until the
/// old build has been gone `canary_window` rounds), each record's build
/// is judged against its reference, so an upgrade's verdict need not
/// wait for those rounds.
pub fn judge(
    store: &Store,
    policy: &VerdictPolicy,
    run: FiledRun,
    now: DateTime<Utc>,
) -> Result<Vec<PairVerdict>, StoreError> {
    let mut judged = Vec::new();
    judge_from(store, policy, &run, now, &mut judged)?;
    Ok(judged)
}

/// The same, carrying on after `judged`: the verdicts an earlier try
/// decided before the store refused it (another process held it). Each
/// evaluation is stored as it is decided, so those pairs are not judged
/// again: their evaluations would count twice toward confirmation.
pub fn judge_from(
    store: &Store,
    policy: &VerdictPolicy,
    run: &FiledRun,
    now: DateTime<Utc>,
    judged: &mut Vec<PairVerdict>,
) -> Result<(), StoreError> {
    // A canary verdict is the run's only one: had an earlier try decided
    // it, there would be no try again.
    if judged.is_empty()
        && let Some((from, to)) = &run.rollout
    {
        let Some((key, _)) = run.to_judge.first() else {
            return Ok(());
        };
        if run.replica_run != run.by_replica {
            return Ok(());
        }
        let progress = RolloutProgress {
            from: from.clone(),
            to: to.clone(),
            share: share_of(&run.fleet, to),
            by_replica: run.by_replica,
            from_image: image_of(&run.fleet, from),
            to_image: image_of(&run.fleet, to),
        };
        if let Some(canary) = canary::evaluate_canary(store, policy, key, &progress, now)? {
            judged.push(canary);
            return Ok(());
        }
    }
    for (key, build) in run.to_judge.iter().skip(judged.len()) {
        judged.push(pair::evaluate_pair(store, policy, key, build, now)?);
    }
    Ok(())
}

/// A build's image as people quote it (`repo:tag@sha256:0123456789ab`),
/// when the fleet knows its digest.
fn image_of(fleet: &[FleetBuild], build: &str) -> Option<String> {
    let b = fleet.iter().find(|b| b.build == build)?;
    let digest = short_digest(b.image_digest.as_deref()?);
    Some(match b.image.as_deref() {
        Some(image) => format!("{image}@{digest}"),
        None => digest.to_owned(),
    })
}

/// A digest as people quote it: the algorithm and its first 12 digits,
/// enough to tell images apart in a sentence.
fn short_digest(digest: &str) -> &str {
    let end = digest.find(':').map_or(digest.len(), |i| i + 1 + 12);
    digest.get(..end).unwrap_or(digest)
}

/// How much of the fleet the new build serves, in words: "3 of 8
/// replicas" or "41% of requests".
fn share_of(fleet: &[FleetBuild], build: &str) -> String {
    match fleet.iter().find(|b| b.build == build) {
        Some(b) if b.by_replica => {
            let replicas: u64 = fleet.iter().map(|b| b.count).sum();
            format!("{} of {replicas} replicas", b.count)
        }
        Some(b) => format!("{:.0}% of requests", b.share * 100.0),
        None => "not seen in the last rounds".into(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::vocabulary::records::{RunOutcome, RunRecord};
    use chrono::TimeZone;

    /// Pair `target`/m/s, whose [`history`] is of build 0.32.0.
    pub(crate) fn pair_of(target: &str) -> PairKey {
        PairKey {
            target: target.into(),
            model: "m".into(),
            scenario: "s".into(),
        }
    }

    /// Enough completed runs of `target`'s pair to form its baseline and
    /// be judged.
    pub(crate) fn history(store: &Store, target: &str) {
        let start = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap();
        for i in 0..40 {
            let at = start + chrono::Duration::minutes(i);
            let mut r = RunRecord::failed(target, "s", "m", at, 1.0, RunOutcome::Ok, String::new());
            r.server.version = Some("0.32.0".into());
            r.summary.completed = 8;
            r.summary.ttft.count = 8;
            r.summary.ttft.p50 = 0.1 + 0.001 * (i % 5) as f64;
            store.insert_run(&r).unwrap();
        }
    }

    /// A try refused after its first pair's evaluation was stored carries
    /// on from the second: the first pair's evaluation is not stored twice.
    #[test]
    fn a_try_again_judges_only_the_pairs_not_judged_yet() {
        let store = Store::in_memory().unwrap();
        history(&store, "a");
        history(&store, "b");
        let policy = VerdictPolicy::default();
        let now = Utc.with_ymd_and_hms(2026, 12, 1, 13, 0, 0).unwrap();
        let run = FiledRun {
            to_judge: ["a", "b"]
                .iter()
                .map(|t| (pair_of(t), "0.32.0".to_owned()))
                .collect(),
            ..FiledRun::default()
        };
        // What the refused try had done: pair a judged and stored.
        let mut judged =
            vec![pair::evaluate_pair(&store, &policy, &pair_of("a"), "0.32.0", now).unwrap()];
        judge_from(&store, &policy, &run, now, &mut judged).unwrap();
        let targets: Vec<&str> = judged.iter().map(|v| v.target.as_str()).collect();
        assert_eq!(targets, ["a", "b"]);
        let stored: Vec<String> = store
            .evaluations_after(0, 100)
            .unwrap()
            .into_iter()
            .map(|(_, e)| e.key.target)
            .collect();
        assert_eq!(stored, ["a", "b"], "one evaluation of each pair");
        // A first try judges both.
        let all = judge(&store, &policy, run, now).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(store.evaluations_after(0, 100).unwrap().len(), 4);
    }
}
