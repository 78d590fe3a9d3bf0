//! A target's build identity, checked on every run filed: a fingerprint
//! new on nearly every request, or a `/version` that disagrees with the
//! stream's fingerprints, is one named condition (logged once when it
//! starts and once when it ends, exported, on the status page), and
//! builds are named by the stable part of the identity meanwhile.

use crate::config::TargetConfig;
use crate::metrics::Metrics;
use crate::state::{IdentityCondition, TargetStates};
use crate::vocabulary::records::{RunRecord, version_of_fingerprint};

/// Runs in a row without the condition before it is said to be over.
pub const CLEAR_AFTER: u32 = 3;

/// What a run shows of its server's identity before it is filed. Its
/// fingerprint's version is compared with `/version` only where the
/// watcher files builds (the service alone is probed), and named a
/// condition only once `/version` kept saying another version for
/// [`crate::state::DISAGREEING_READINGS`] readings.
pub fn seen_in(
    record: &RunRecord,
    target: &TargetConfig,
    board: &TargetStates,
) -> Option<IdentityCondition> {
    if record.fingerprint_churn {
        return Some(IdentityCondition::FingerprintChurn);
    }
    if !record.replica.is_empty() || target.probe_mode().replicas() {
        return None;
    }
    let fingerprint_version = record
        .server
        .system_fingerprint
        .as_deref()
        .and_then(version_of_fingerprint)?;
    let (version, fingerprint_version) =
        board.version_disagreement(&record.target, &fingerprint_version)?;
    Some(IdentityCondition::VersionDisagrees {
        version,
        fingerprint_version,
    })
}

/// Notes what a run showed; a change of condition is logged and exported.
pub fn note(
    metrics: &Metrics,
    board: &TargetStates,
    target: &str,
    seen: Option<IdentityCondition>,
) {
    let Some((before, now)) = board.note_identity(target, seen, CLEAR_AFTER) else {
        return;
    };
    metrics
        .server
        .set_identity_unstable(target, now.as_ref().map(IdentityCondition::reason));
    match (&before, &now) {
        (_, Some(c)) => tracing::warn!(
            target,
            reason = c.reason(),
            "the server's identity is not stable: {}",
            c.sentence()
        ),
        (Some(b), None) => tracing::info!(
            target,
            reason = b.reason(),
            "the server's identity is stable again after {CLEAR_AFTER} runs"
        ),
        (None, None) => {}
    }
}
