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
    if let Some((from, to)) = &run.rollout {
        let Some((key, _)) = run.to_judge.first() else {
            return Ok(Vec::new());
        };
        if run.replica_run != run.by_replica {
            return Ok(Vec::new());
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
            return Ok(vec![canary]);
        }
    }
    run.to_judge
        .into_iter()
        .map(|(key, build)| pair::evaluate_pair(store, policy, &key, &build, now))
        .collect()
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
