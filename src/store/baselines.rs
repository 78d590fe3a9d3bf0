//! Baselines and verdicts in the store. A baseline is a fixed set of
//! completed runs of one (target, model, scenario, build); one per key
//! forms automatically from the build's first runs after its warm-up, and
//! a user may pin one per (target, model, scenario) as the reference for
//! every comparison, or rebuild it from the build's most recent runs.
//! Every evaluation is kept, so confirmations survive a restart.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::starts::{KeptSince, Warmup};
use super::{RUN_SELECT, Store, StoreError, from_ts, row_to_raw, ts};
use crate::vocabulary::records::RunRecord;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Baseline {
    pub id: i64,
    pub target: String,
    pub model: String,
    pub scenario: String,
    pub build: String,
    pub created_at: DateTime<Utc>,
    pub pinned_at: Option<DateTime<Utc>>,
    /// `first-runs` (formed automatically) or `recent-runs` (rebuilt on request).
    pub origin: String,
    pub run_ids: Vec<i64>,
}

pub use crate::vocabulary::pairs::PairKey;

/// One stored evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvaluation {
    pub key: PairKey,
    pub build: String,
    pub baseline_id: i64,
    pub at: DateTime<Utc>,
    pub flagged: bool,
    pub state: String,
    pub detail: String,
}

/// The baseline id a rollout's canary evaluations are stored under: they
/// compare the new build with the old one measured at the same time, not
/// with a stored baseline (whose ids count from 1).
pub const CANARY_BASELINE_ID: i64 = 0;

/// The stored evaluations one confirmation counts: those of `build`
/// against baseline `baseline_id` and, when `canary_against` names the
/// old build, the rollout's canary evaluations of `build` against it;
/// of either, only those since the target last changed to `build`.
/// An upgrade's comparison takes over from its rollout's canary when the
/// rollout ends; both ask whether `build` is slower than the old build,
/// so a regression the canary confirmed is held, not confirmed afresh
/// (`sentinel_regression_state` would drop to confirming for an
/// evaluation, resolving the alert that follows it).
#[derive(Debug, Clone, Copy)]
pub struct Comparison<'a> {
    pub build: &'a str,
    pub baseline_id: i64,
    pub canary_against: Option<&'a str>,
}

/// The `WHERE` clause of one [`Comparison`]'s evaluations, on parameters
/// 1-6: target, model, scenario, build, baseline id, canary against.
/// Only those since the target last changed to `build`: a build rolled
/// back and deployed again starts its confirmation afresh, not held by
/// the flags it raised before the rollback.
fn comparison_clause() -> String {
    format!(
        "target = ?1 AND model = ?2 AND scenario = ?3 AND build = ?4
         AND (baseline_id = ?5 OR (?6 IS NOT NULL AND baseline_id = {CANARY_BASELINE_ID}
              AND json_extract(detail, '$.reference_build') = ?6))
         AND at >= COALESCE((SELECT MAX(v.at) FROM version_changes v
              WHERE v.target = ?1 AND v.model = ?2 AND v.to_build = ?4), 0)"
    )
}

const BASELINE_SELECT: &str =
    "SELECT id, target, model, scenario, build, created_at, pinned_at, origin FROM baselines";

fn row_to_baseline(r: &rusqlite::Row<'_>) -> rusqlite::Result<Baseline> {
    Ok(Baseline {
        id: r.get(0)?,
        target: r.get(1)?,
        model: r.get(2)?,
        scenario: r.get(3)?,
        build: r.get(4)?,
        created_at: from_ts(r.get(5)?),
        pinned_at: r.get::<_, Option<f64>>(6)?.map(from_ts),
        origin: r.get(7)?,
        run_ids: Vec::new(),
    })
}

fn with_runs(conn: &Connection, mut b: Baseline) -> Result<Baseline, StoreError> {
    let mut stmt =
        conn.prepare("SELECT run_id FROM baseline_runs WHERE baseline_id = ?1 ORDER BY run_id")?;
    b.run_ids = stmt
        .query_map([b.id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(b)
}

fn query_baselines(
    conn: &Connection,
    where_sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<Baseline>, StoreError> {
    query_baselines_without_runs(conn, where_sql, args)?
        .into_iter()
        .map(|b| with_runs(conn, b))
        .collect()
}

/// The baselines `where_sql` selects, their `run_ids` not yet read.
fn query_baselines_without_runs(
    conn: &Connection,
    where_sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<Baseline>, StoreError> {
    let mut stmt = conn.prepare(&format!(
        "{BASELINE_SELECT} {where_sql} ORDER BY target, model, scenario, created_at"
    ))?;
    let found = stmt
        .query_map(args, row_to_baseline)?
        .collect::<Result<_, _>>()?;
    Ok(found)
}

/// Completed runs of one build, oldest first.
fn ok_run_ids(conn: &Connection, key: &PairKey, build: &str) -> Result<Vec<i64>, StoreError> {
    ok_run_ids_limited(conn, key, build, usize::MAX)
}

/// The first `limit` completed runs of one build, oldest first.
pub(super) fn ok_run_ids_limited(
    conn: &Connection,
    key: &PairKey,
    build: &str,
    limit: usize,
) -> Result<Vec<i64>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT id FROM runs WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND build = ?4
           AND outcome = 'ok' ORDER BY started_at, id LIMIT ?5",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    Ok(stmt
        .query_map(
            params![key.target, key.model, key.scenario, build, limit],
            |r| r.get(0),
        )?
        .collect::<Result<_, _>>()?)
}

pub(super) fn insert_baseline(
    conn: &Connection,
    key: &PairKey,
    build: &str,
    at: DateTime<Utc>,
    origin: &str,
    runs: &[i64],
) -> Result<i64, StoreError> {
    conn.execute(
        "INSERT INTO baselines (target, model, scenario, build, created_at, origin)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![key.target, key.model, key.scenario, build, ts(at), origin],
    )?;
    let id = conn.last_insert_rowid();
    let mut insert =
        conn.prepare("INSERT INTO baseline_runs (baseline_id, run_id) VALUES (?1, ?2)")?;
    for run in runs {
        insert.execute(params![id, run])?;
    }
    Ok(id)
}

impl Store {
    pub fn baselines(
        &self,
        target: Option<&str>,
        scenario: Option<&str>,
    ) -> Result<Vec<Baseline>, StoreError> {
        query_baselines(
            &self.lock(),
            "WHERE (?1 IS NULL OR target = ?1) AND (?2 IS NULL OR scenario = ?2)",
            &[&target, &scenario],
        )
    }

    pub fn baseline(&self, key: &PairKey, build: &str) -> Result<Option<Baseline>, StoreError> {
        Ok(query_baselines(
            &self.lock(),
            "WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND build = ?4",
            &[&key.target, &key.model, &key.scenario, &build],
        )?
        .pop())
    }

    /// The baseline of this key of the build, other than `build`, that
    /// the target's version changes named last: the build it ran before
    /// `build` (or after, when `build` is judged late). Reads one row per
    /// build with a baseline, not the target's whole history.
    pub fn newest_other_baseline(
        &self,
        key: &PairKey,
        build: &str,
    ) -> Result<Option<Baseline>, StoreError> {
        let conn = self.lock();
        let mut newest: Option<(super::builds::Named, Baseline)> = None;
        // The runs of the chosen one only: each baseline holds dozens.
        let others = query_baselines_without_runs(
            &conn,
            "WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND build != ?4",
            &[&key.target, &key.model, &key.scenario, &build],
        )?;
        for other in others {
            let named = super::builds::last_named(&conn, &key.target, &key.model, &other.build)?;
            if let Some(named) = named
                && newest.as_ref().is_none_or(|(n, _)| *n < named)
            {
                newest = Some((named, other));
            }
        }
        newest.map(|(_, b)| with_runs(&conn, b)).transpose()
    }

    pub fn pinned_baseline(&self, key: &PairKey) -> Result<Option<Baseline>, StoreError> {
        Ok(query_baselines(
            &self.lock(),
            "WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND pinned_at IS NOT NULL",
            &[&key.target, &key.model, &key.scenario],
        )?
        .pop())
    }

    /// Forms the build's baseline from its first `runs` completed runs
    /// that `warmup` leaves in, once it has them; returns it if it exists.
    pub fn form_baseline(
        &self,
        key: &PairKey,
        build: &str,
        warmup: &dyn Warmup,
        runs: usize,
        at: DateTime<Utc>,
    ) -> Result<Option<Baseline>, StoreError> {
        if let Some(b) = self.baseline(key, build)? {
            return Ok(Some(b));
        }
        {
            let mut conn = self.lock();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let skipped = super::starts::left_out(&tx, key, build, warmup)?;
            let ids: Vec<i64> = ok_run_ids(&tx, key, build)?
                .into_iter()
                .filter(|id| !skipped.contains(id))
                .take(runs)
                .collect();
            if ids.len() < runs {
                return Ok(None);
            }
            insert_baseline(&tx, key, build, at, "first-runs", &ids)?;
            tx.commit()?;
        }
        self.baseline(key, build)
    }

    /// Pins the build's baseline as the reference of its (target, model,
    /// scenario), replacing any earlier pin. With `recent`, the baseline is
    /// first rebuilt from the build's newest `recent` completed runs.
    pub fn pin_baseline(
        &self,
        key: &PairKey,
        build: &str,
        recent: Option<usize>,
        at: DateTime<Utc>,
    ) -> Result<Baseline, StoreError> {
        {
            let mut conn = self.lock();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let existing: Option<i64> = tx
                .query_row(
                    "SELECT id FROM baselines WHERE target = ?1 AND model = ?2 AND scenario = ?3
                     AND build = ?4",
                    params![key.target, key.model, key.scenario, build],
                    |r| r.get(0),
                )
                .optional()?;
            let id = match (existing, recent) {
                (Some(id), None) => id,
                (existing, recent) => {
                    let ids = ok_run_ids(&tx, key, build)?;
                    let what = format!(
                        "{}/{}/{} at version {build}",
                        key.target, key.model, key.scenario
                    );
                    let Some(want) = recent else {
                        return Err(StoreError::Refused(format!(
                            "{what} has no baseline yet; pin its newest N completed runs (recent N; it has {})",
                            ids.len()
                        )));
                    };
                    if want == 0 {
                        // It would replace a baseline with one that
                        // judges nothing and protects no run.
                        return Err(StoreError::Refused(
                            "a baseline of 0 recent runs would judge nothing; ask for at least 1"
                                .into(),
                        ));
                    }
                    if ids.len() < want {
                        return Err(StoreError::NotEnoughRuns {
                            what,
                            have: ids.len(),
                            need: want,
                        });
                    }
                    if let Some(old) = existing {
                        tx.execute("DELETE FROM baselines WHERE id = ?1", [old])?;
                    }
                    insert_baseline(&tx, key, build, at, "recent-runs", &ids[ids.len() - want..])?
                }
            };
            tx.execute(
                "UPDATE baselines SET pinned_at = NULL
                 WHERE target = ?1 AND model = ?2 AND scenario = ?3",
                params![key.target, key.model, key.scenario],
            )?;
            tx.execute(
                "UPDATE baselines SET pinned_at = ?2 WHERE id = ?1",
                params![id, ts(at)],
            )?;
            tx.commit()?;
        }
        self.baseline(key, build)?
            .ok_or_else(|| StoreError::NotFound("the baseline just pinned".into()))
    }

    /// Removes the pin; comparisons fall back to the automatic choice.
    pub fn unpin_baseline(&self, key: &PairKey) -> Result<bool, StoreError> {
        Ok(self.lock().execute(
            "UPDATE baselines SET pinned_at = NULL
             WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND pinned_at IS NOT NULL",
            params![key.target, key.model, key.scenario],
        )? > 0)
    }

    /// How many completed runs one build has.
    pub fn count_ok_runs(&self, key: &PairKey, build: &str) -> Result<usize, StoreError> {
        Ok(self.lock().query_row(
            "SELECT COUNT(*) FROM runs WHERE target = ?1 AND model = ?2 AND scenario = ?3
               AND build = ?4 AND outcome = 'ok'",
            params![key.target, key.model, key.scenario, build],
            |r| r.get::<_, i64>(0),
        )? as usize)
    }

    /// The newest `limit` completed runs of one build that started at or
    /// after `since` (any, without it), oldest first, leaving out those
    /// `warmup` leaves out and the runs in `exclude`. Reads only those
    /// rows, however long the build has run.
    pub fn newest_ok_runs(
        &self,
        key: &PairKey,
        build: &str,
        warmup: &dyn Warmup,
        since: Option<DateTime<Utc>>,
        exclude: &[i64],
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.lock();
        let mut skipped = super::starts::left_out(&conn, key, build, warmup)?;
        skipped.extend_from_slice(exclude);
        let mut stmt = conn.prepare(&format!(
            "{RUN_SELECT} FROM runs WHERE {}
             ORDER BY started_at DESC, id DESC LIMIT ?7",
            KeptSince::condition()
        ))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let kept = KeptSince::new(key, build, since, &skipped)?;
        let mut values = kept.params().to_vec();
        values.push(&limit);
        let rows = stmt.query_map(values.as_slice(), row_to_raw)?;
        let mut runs: Vec<RunRecord> = rows.map(|r| r?.into_record()).collect::<Result<_, _>>()?;
        runs.reverse();
        Ok(runs)
    }

    /// How many runs of one build were attempted, whatever their outcome.
    pub fn count_build_runs(&self, key: &PairKey, build: &str) -> Result<usize, StoreError> {
        Ok(self.lock().query_row(
            "SELECT COUNT(*) FROM runs WHERE target = ?1 AND model = ?2 AND scenario = ?3
               AND build = ?4",
            params![key.target, key.model, key.scenario, build],
            |r| r.get::<_, i64>(0),
        )? as usize)
    }

    /// The runs of a baseline, oldest first.
    pub fn runs_by_id(&self, ids: &[i64]) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "{RUN_SELECT} FROM runs WHERE id IN (SELECT value FROM json_each(?1))
             ORDER BY started_at, id"
        ))?;
        let rows = stmt.query_map([serde_json::to_string(ids)?], row_to_raw)?;
        rows.map(|r| r?.into_record()).collect()
    }

    pub fn baseline_by_id(&self, id: i64) -> Result<Option<Baseline>, StoreError> {
        Ok(query_baselines(&self.lock(), "WHERE id = ?1", &[&id])?.pop())
    }

    pub fn insert_evaluation(&self, e: &StoredEvaluation) -> Result<(), StoreError> {
        self.lock().execute(
            "INSERT INTO evaluations (target, model, scenario, build, baseline_id, at, flagged,
                state, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                e.key.target,
                e.key.model,
                e.key.scenario,
                e.build,
                e.baseline_id,
                ts(e.at),
                e.flagged,
                e.state,
                e.detail
            ],
        )?;
        Ok(())
    }

    /// Whether each of the last `n` evaluations one confirmation counts
    /// flagged, oldest first.
    pub fn recent_flags(
        &self,
        key: &PairKey,
        of: &Comparison<'_>,
        n: usize,
    ) -> Result<Vec<bool>, StoreError> {
        let mut flags: Vec<bool> = self.newest_of(key, of, "flagged", "", n)?;
        flags.reverse();
        Ok(flags)
    }

    /// Whether the newest evaluation one confirmation counts that was not
    /// inconclusive confirmed a regression.
    pub fn was_regression(&self, key: &PairKey, of: &Comparison<'_>) -> Result<bool, StoreError> {
        let states: Vec<String> =
            self.newest_of(key, of, "state", "AND state != 'inconclusive'", 1)?;
        Ok(states.first().map(String::as_str) == Some("regression"))
    }

    /// `column` of the newest `n` evaluations one confirmation counts
    /// (narrowed by the `AND ...` clause `and`), newest first.
    fn newest_of<T: rusqlite::types::FromSql>(
        &self,
        key: &PairKey,
        of: &Comparison<'_>,
        column: &str,
        and: &str,
        n: usize,
    ) -> Result<Vec<T>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            // Newest first by time (as they were made): read backwards
            // along `evaluations_by_time`, the walk ends at the build's
            // latest deployment however many evaluations came before it.
            "SELECT {column} FROM evaluations WHERE {} {and} ORDER BY at DESC, id DESC LIMIT ?7",
            comparison_clause()
        ))?;
        let rows = stmt.query_map(
            params![
                key.target,
                key.model,
                key.scenario,
                of.build,
                of.baseline_id,
                of.canary_against,
                n as i64
            ],
            |r| r.get(0),
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every stored evaluation in the order it was made, up to `limit`
    /// after evaluation `after_id`, with its id.
    pub fn evaluations_after(
        &self,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<(i64, StoredEvaluation)>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT target, model, scenario, build, baseline_id, at, flagged, state, detail, id
             FROM evaluations WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![after_id, limit as i64], |r| {
            Ok((r.get(9)?, stored_evaluation(r)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The newest evaluation of every (target, model, scenario).
    pub fn latest_evaluations(&self) -> Result<Vec<StoredEvaluation>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT target, model, scenario, build, baseline_id, at, flagged, state, detail
             FROM evaluations WHERE id IN (SELECT MAX(id) FROM evaluations
               GROUP BY target, model, scenario)
             ORDER BY target, model, scenario",
        )?;
        let rows = stmt.query_map([], stored_evaluation)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// An evaluation row read in the column order both queries select.
fn stored_evaluation(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredEvaluation> {
    Ok(StoredEvaluation {
        key: PairKey {
            target: r.get(0)?,
            model: r.get(1)?,
            scenario: r.get(2)?,
        },
        build: r.get(3)?,
        baseline_id: r.get(4)?,
        at: from_ts(r.get(5)?),
        flagged: r.get(6)?,
        state: r.get(7)?,
        detail: r.get(8)?,
    })
}
