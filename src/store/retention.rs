//! Retention: what `[store] retention` deletes so the file stays bounded.
//! Runs (with their samples and answers), evaluations and objectives'
//! counts older than the retention go; so do the version changes and
//! ended rollouts older than it, except the rows whose answers the daemon
//! still reads (a target's current build, where each build was last named
//! and last deployed). A target whose build flaps on every run files one
//! version change per run: without this its history would grow forever.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, TransactionBehavior};
use std::time::Duration;

use super::{Store, StoreError, ts};

/// The version changes retention keeps whatever their age, one `SELECT`
/// of ids each, on parameter 1 (the cutoff). Each row answers a question
/// the daemon asks of any build, however long ago it was named:
const KEPT_CHANGES: [&str; 7] = [
    // The target's current build ([`super::builds::current`]; also the
    // newest model of a target, `models_of`).
    "SELECT MAX(id) FROM version_changes GROUP BY target, model",
    // Where each build was last named, as the build changed to and as the
    // one changed away from ([`super::builds::last_named`]).
    "SELECT MAX(id) FROM version_changes GROUP BY target, model, to_build",
    "SELECT MAX(id) FROM version_changes WHERE from_build IS NOT NULL
     GROUP BY target, model, from_build",
    // When each build was last changed to (the evaluations that count
    // towards its confirmation are those since) and last changed away
    // from. A bare column beside MAX is that of the row holding the
    // maximum (SQLite's rule), so these are ids.
    "SELECT id FROM (SELECT id, MAX(at) FROM version_changes GROUP BY target, model, to_build)",
    "SELECT id FROM (SELECT id, MAX(at) FROM version_changes WHERE from_build IS NOT NULL
     GROUP BY target, model, from_build)",
    // Each build's newest return ([`super::starts::returns_sql`]): where
    // its current or latest deployment after a rollback began. Its
    // witness, a later change back, is the newest change to the build,
    // kept above.
    "SELECT id FROM (SELECT v.id, MAX(v.at) FROM version_changes v
     WHERE v.from_build IS NOT NULL AND EXISTS (SELECT 1 FROM version_changes w
       WHERE w.target = v.target AND w.model = v.model AND w.to_build = v.from_build
         AND w.at >= v.at)
     GROUP BY v.target, v.model, v.from_build)",
    // The newest time each build was changed away from before the cutoff:
    // a return that began before it may have runs after it, whose first
    // are a warm-up. An older return's runs ended before this change,
    // before the cutoff, and went with it.
    "SELECT id FROM (SELECT id, MAX(at) FROM version_changes
     WHERE from_build IS NOT NULL AND at < ?1 GROUP BY target, model, from_build)",
];

impl Store {
    /// Deletes what started before `now - retention`: runs (and their
    /// samples), verdicts and objectives' counts; version changes and
    /// ended rollouts too, but for the rows still read ([`KEPT_CHANGES`],
    /// each target's newest rollout). Runs that form a baseline are kept.
    /// Returns how many runs were deleted.
    pub fn prune(&self, now: DateTime<Utc>, retention: Duration) -> Result<usize, StoreError> {
        let cutoff = ts(now) - retention.as_secs_f64();
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM evaluations WHERE at < ?1", [cutoff])?;
        tx.execute("DELETE FROM slo_counts WHERE at < ?1", [cutoff])?;
        let runs = tx.execute(
            "DELETE FROM runs WHERE started_at < ?1
               AND id NOT IN (SELECT run_id FROM baseline_runs)",
            [cutoff],
        )?;
        prune_history(&tx, cutoff)?;
        tx.commit()?;
        Ok(runs)
    }
}

/// Deletes the version changes and ended rollouts older than `cutoff`
/// (seconds since the epoch) that nothing reads any more.
fn prune_history(conn: &Connection, cutoff: f64) -> Result<(), StoreError> {
    let kept = KEPT_CHANGES.join(" UNION ");
    conn.execute(
        &format!("DELETE FROM version_changes WHERE at < ?1 AND id NOT IN ({kept})"),
        [cutoff],
    )?;
    // A rollout is read while open, and the newest as the target's latest.
    conn.execute(
        "DELETE FROM rollouts WHERE ended_at IS NOT NULL AND ended_at < ?1
           AND id NOT IN (SELECT MAX(id) FROM rollouts GROUP BY target, model)",
        [cutoff],
    )?;
    Ok(())
}

#[cfg(test)]
#[path = "retention_tests.rs"]
mod tests;
