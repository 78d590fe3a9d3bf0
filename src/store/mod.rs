//! The embedded store: SQLite (WAL) holding runs with their summary,
//! per-request samples, server identity and load covariates. Schema
//! migrations are numbered and applied at open; the `retention` module
//! deletes old runs and history so the file stays bounded.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::vocabulary::Outcome;
use crate::vocabulary::records::{RunOutcome, RunRecord, SampleRow, ServerIdentity};

pub mod answers;
pub mod async_store;
pub mod baselines;
pub mod builds;
pub mod fleet;
mod opening;
mod retention;
mod schema;
pub mod slo;
pub mod starts;
pub mod writer_lock;

pub use async_store::AsyncStore;

/// What went wrong in the store. Causes are part of the messages, not
/// chained, so each is printed once wherever the error is shown.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {}", cause_without_path(cause, path))]
    Open {
        path: String,
        cause: rusqlite::Error,
    },
    #[error("store: {0}")]
    Sql(rusqlite::Error),
    #[error(
        "store {store} is in use by another vllm-sentinel daemon{}: stop it, or give this one its own store.path",
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    InUse { store: String, holder: Option<u32> },
    #[error("store {store}: cannot copy it to read it at this build's schema: {cause}")]
    Copy { store: String, cause: String },
    #[error("cannot make a scratch store under TMPDIR: {0}")]
    Scratch(String),
    #[error("store lock {path}: {cause}")]
    Lock { path: String, cause: String },
    /// A stored value this build cannot read, named by its run (and the
    /// column), so the row can be found and the store's writer told.
    #[error("store: {what} {problem}: written by a newer vllm-sentinel, or damaged")]
    Unreadable { what: String, problem: String },
    #[error("store: a stored JSON column is unreadable: {0}")]
    Json(serde_json::Error),
    #[error("{what} has {have} completed run(s); {need} are needed")]
    NotEnoughRuns {
        what: String,
        have: usize,
        need: usize,
    },
    #[error("not found: {0}")]
    NotFound(String),
    /// A request that cannot be carried out as asked (the reason says).
    #[error("{0}")]
    Refused(String),
    #[error("store task failed: {0}")]
    Task(String),
    /// A call after the daemon's last checkpoint (a request that outlived
    /// the drain): refused, so nothing is written after it.
    #[error("store: closed, the daemon is stopping")]
    Closed,
    #[error(
        "store {path} has schema version {found}, newer than this build knows ({known}); upgrade vllm-sentinel"
    )]
    TooNew {
        path: String,
        found: i64,
        known: i64,
    },
}

/// SQLite names the file at the end of some causes ("unable to open
/// database file: PATH"); the message names it once, first.
fn cause_without_path(cause: &rusqlite::Error, path: &str) -> String {
    let text = cause.to_string();
    match text.strip_suffix(path).and_then(|t| t.strip_suffix(": ")) {
        Some(short) => short.to_owned(),
        None => text,
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sql(e)
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Json(e)
    }
}

impl StoreError {
    /// Refused because another connection held the store longer than the
    /// busy timeout: worth trying again.
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            StoreError::Sql(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        )
    }

    /// A failure of the store itself, as opposed to an answer about what
    /// it holds (nothing found, too few runs) or a call refused because
    /// the daemon is stopping.
    pub fn is_failure(&self) -> bool {
        !matches!(
            self,
            StoreError::NotFound(_)
                | StoreError::NotEnoughRuns { .. }
                | StoreError::Refused(_)
                | StoreError::Closed
        )
    }
}

/// `SELECT` of the columns `row_to_raw` reads, in its order.
const RUN_SELECT: &str = "SELECT id, target, scenario, model, started_at, duration_s, outcome, error, \
    server_version, model_root, system_fingerprint, max_model_len, summary, load_before, load_after, build, replica, \
    image, image_digest";

/// Which runs to list.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub target: Option<String>,
    pub scenario: Option<String>,
    pub server_version: Option<String>,
    /// Only runs that started at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Only runs listed after this one (its start and id), newest first:
    /// the cursor of the next page.
    pub before: Option<(DateTime<Utc>, i64)>,
    pub limit: usize,
}

/// A handle shared by the daemon's tasks; every call is short.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    /// The file opened and its (device, inode), to notice it deleted or
    /// replaced under a running daemon; `None` in memory.
    file: Option<(std::path::PathBuf, (u64, u64))>,
    /// Set by [`Store::stop_waiting_for_others`].
    no_waiting: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

fn ts(t: DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

fn from_ts(s: f64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros((s * 1e6).round() as i64).unwrap_or_default()
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent
        // (transactions roll back), so a poisoned lock is still usable.
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if self.no_waiting.load(std::sync::atomic::Ordering::Acquire) {
            // One call into SQLite, no I/O.
            let _ = conn.busy_timeout(std::time::Duration::ZERO);
        }
        conn
    }

    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .lock()
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// Stores a run and its samples in one transaction; returns its id.
    /// A run whose server answered is filed under the build it identified
    /// (which may record a version change); one that never reached the
    /// server under the target's current build.
    pub fn insert_run(&self, run: &RunRecord) -> Result<i64, StoreError> {
        Ok(self.insert_run_filed(run, &fleet::FleetScope::default())?.0)
    }

    /// [`Store::insert_run`], also returning the build the run was filed
    /// under, the change it caused, the fleet after it (within `scope`)
    /// and the rollout it ended.
    pub fn insert_run_filed(
        &self,
        run: &RunRecord,
        scope: &fleet::FleetScope,
    ) -> Result<(i64, builds::Observed), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut observed = if run.summary.completed > 0 {
            builds::observe(
                &tx,
                &run.target,
                &run.model,
                &run.server,
                run.started_at,
                scope,
            )?
        } else {
            builds::Observed {
                build: builds::current(&tx, &run.target, &run.model)?
                    .unwrap_or_else(|| "unknown".to_owned()),
                ..builds::Observed::default()
            }
        };
        let build = &observed.build;
        tx.execute(
            "INSERT INTO runs (target, scenario, model, started_at, duration_s, outcome, error,
                server_version, model_root, system_fingerprint, max_model_len, summary,
                load_before, load_after, build, replica, image, image_digest, server_started)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                ?17, ?18, ?19)",
            params![
                run.target,
                run.scenario,
                run.model,
                ts(run.started_at),
                run.duration_s,
                run.outcome.as_str(),
                run.error,
                run.server.version,
                run.server.model_root,
                run.server.system_fingerprint,
                run.server.max_model_len.map(|v| v as i64),
                serde_json::to_string(&run.summary)?,
                run.load_before
                    .map(|l| serde_json::to_string(&l))
                    .transpose()?,
                run.load_after
                    .map(|l| serde_json::to_string(&l))
                    .transpose()?,
                build,
                run.replica,
                run.server.image,
                run.server.image_digest,
                run.server_started_s(),
            ],
        )?;
        let id = tx.last_insert_rowid();
        insert_samples(&tx, id, &run.samples)?;
        answers::insert(&tx, id, &run.answers)?;
        if run.summary.completed > 0 {
            observed.fleet = fleet::serving(&tx, &run.target, &run.model, scope)?;
            observed.rollout_ended = fleet::settle(
                &tx,
                &run.target,
                &run.model,
                &observed.fleet,
                run.started_at,
                scope.window,
                scope.rollout_timeout,
            )?;
        }
        tx.commit()?;
        Ok((id, observed))
    }

    /// Runs matching the filter, newest first (without samples).
    pub fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "{RUN_SELECT}
             FROM runs
             WHERE (?1 IS NULL OR target = ?1) AND (?2 IS NULL OR scenario = ?2)
               AND (?3 IS NULL OR server_version = ?3) AND (?4 IS NULL OR started_at >= ?4)
               AND (?6 IS NULL OR started_at < ?6 OR (started_at = ?6 AND id < ?7))
             ORDER BY started_at DESC, id DESC LIMIT ?5"
        ))?;
        let limit = if filter.limit == 0 {
            -1
        } else {
            filter.limit as i64
        };
        let rows = stmt.query_map(
            params![
                filter.target,
                filter.scenario,
                filter.server_version,
                filter.since.map(ts),
                limit,
                filter.before.map(|(at, _)| ts(at)),
                filter.before.map(|(_, id)| id),
            ],
            row_to_raw,
        )?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?.into_record()?);
        }
        Ok(out)
    }

    /// Up to `limit` runs filed after run `after_id`, in the order they
    /// were filed, each with its requests: what `export` and `replay
    /// --store` page through.
    pub fn runs_filed_after(
        &self,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs = {
            let conn = self.lock();
            let mut stmt = conn.prepare(&format!(
                "{RUN_SELECT} FROM runs WHERE id > ?1 ORDER BY id LIMIT ?2"
            ))?;
            let rows = stmt.query_map(params![after_id, limit as i64], row_to_raw)?;
            rows.map(|row| row?.into_record())
                .collect::<Result<Vec<_>, _>>()?
        };
        for run in &mut runs {
            if let Some(id) = run.id {
                run.samples = self.samples(id)?;
            }
        }
        Ok(runs)
    }

    /// The newest run of every (target, scenario) pair.
    pub fn latest_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "{RUN_SELECT}
             FROM runs r
             WHERE id = (SELECT id FROM runs x WHERE x.target = r.target AND x.scenario = r.scenario
                         ORDER BY started_at DESC, id DESC LIMIT 1)
             ORDER BY target, scenario"
        ))?;
        let rows = stmt.query_map([], row_to_raw)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?.into_record()?);
        }
        Ok(out)
    }

    pub fn samples(&self, run_id: i64) -> Result<Vec<SampleRow>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SAMPLE_COLUMNS} FROM samples s WHERE run_id = ?1 ORDER BY idx"
        ))?;
        let rows = stmt.query_map([run_id], |r| RawSample::read(r, 0))?;
        rows.map(|row| row?.into_sample(Some(run_id))).collect()
    }

    pub fn run(&self, id: i64) -> Result<Option<RunRecord>, StoreError> {
        let conn = self.lock();
        let raw = conn
            .query_row(
                &format!("{RUN_SELECT} FROM runs WHERE id = ?1"),
                [id],
                row_to_raw,
            )
            .optional()?;
        raw.map(RawRun::into_record).transpose()
    }

    pub fn count_runs(&self) -> Result<u64, StoreError> {
        Ok(self
            .lock()
            .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get::<_, i64>(0))? as u64)
    }

    /// SQLite's own consistency check: "ok" when the file is sound.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        Ok(self
            .lock()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
    }

    /// Writes the WAL back into the main file (at shutdown).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.lock()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .optional()?;
        Ok(())
    }
}

struct RawRun {
    id: i64,
    target: String,
    scenario: String,
    model: String,
    started_at: f64,
    duration_s: f64,
    outcome: String,
    error: Option<String>,
    server: ServerIdentity,
    summary: String,
    load_before: Option<String>,
    load_after: Option<String>,
    build: Option<String>,
    replica: String,
}

fn row_to_raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRun> {
    Ok(RawRun {
        id: r.get(0)?,
        target: r.get(1)?,
        scenario: r.get(2)?,
        model: r.get(3)?,
        started_at: r.get(4)?,
        duration_s: r.get(5)?,
        outcome: r.get(6)?,
        error: r.get(7)?,
        server: ServerIdentity {
            version: r.get(8)?,
            model_root: r.get(9)?,
            system_fingerprint: r.get(10)?,
            max_model_len: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
            image: r.get(17)?,
            image_digest: r.get(18)?,
        },
        summary: r.get(12)?,
        load_before: r.get(13)?,
        load_after: r.get(14)?,
        build: r.get(15)?,
        replica: r.get(16)?,
    })
}

/// An outcome label this build does not know, in `what` (a run's or a
/// request's).
fn unknown_label(what: String, label: &str) -> StoreError {
    StoreError::Unreadable {
        what,
        problem: format!("{label:?} is no outcome this build knows"),
    }
}

/// A JSON column of run `id` read as `T`.
fn json_column<T: serde::de::DeserializeOwned>(
    id: i64,
    column: &str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Unreadable {
        what: format!("run {id}'s {column}"),
        problem: format!("is unreadable ({e})"),
    })
}

impl RawRun {
    fn into_record(self) -> Result<RunRecord, StoreError> {
        let id = self.id;
        Ok(RunRecord {
            id: Some(id),
            target: self.target,
            scenario: self.scenario,
            model: self.model,
            started_at: from_ts(self.started_at),
            duration_s: self.duration_s,
            outcome: RunOutcome::parse(&self.outcome)
                .ok_or_else(|| unknown_label(format!("run {id}'s outcome"), &self.outcome))?,
            error: self.error,
            server: self.server,
            summary: json_column(id, "summary", &self.summary)?,
            load_before: self
                .load_before
                .map(|s| json_column(id, "load_before", &s))
                .transpose()?,
            load_after: self
                .load_after
                .map(|s| json_column(id, "load_after", &s))
                .transpose()?,
            build: self.build,
            replica: self.replica,
            samples: Vec::new(),
            answers: Vec::new(),
            fingerprint_churn: false,
        })
    }
}

fn insert_samples(conn: &Connection, run_id: i64, samples: &[SampleRow]) -> Result<(), StoreError> {
    let mut insert = conn.prepare(
        "INSERT INTO samples (run_id, idx, outcome, ttft_s, tpot_s, e2el_s, itls,
            prompt_tokens, output_tokens, served_by)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for s in samples {
        insert.execute(params![
            run_id,
            s.index as i64,
            s.outcome.as_str(),
            s.ttft_s,
            s.tpot_s,
            s.e2el_s,
            serde_json::to_string(&s.itls_s)?,
            s.prompt_tokens,
            s.output_tokens,
            s.served_by,
        ])?;
    }
    Ok(())
}

/// `SELECT` of the sample columns `RawSample::read` reads, in its order
/// (the samples table as `s`).
const SAMPLE_COLUMNS: &str = "s.idx, s.outcome, s.ttft_s, s.tpot_s, s.e2el_s, s.itls, \
    s.prompt_tokens, s.output_tokens, s.served_by";

/// One stored sample as SQLite holds it.
struct RawSample {
    index: i64,
    outcome: String,
    ttft_s: Option<f64>,
    tpot_s: Option<f64>,
    e2el_s: Option<f64>,
    itls: String,
    prompt_tokens: u32,
    output_tokens: u32,
    served_by: Option<String>,
}

impl RawSample {
    /// Reads [`SAMPLE_COLUMNS`] starting at column `at`.
    fn read(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<RawSample> {
        Ok(RawSample {
            index: r.get(at)?,
            outcome: r.get(at + 1)?,
            ttft_s: r.get(at + 2)?,
            tpot_s: r.get(at + 3)?,
            e2el_s: r.get(at + 4)?,
            itls: r.get(at + 5)?,
            prompt_tokens: r.get(at + 6)?,
            output_tokens: r.get(at + 7)?,
            served_by: r.get(at + 8)?,
        })
    }

    /// The sample, of run `run` when it is known.
    fn into_sample(self, run: Option<i64>) -> Result<SampleRow, StoreError> {
        let what = |column: &str| match run {
            Some(id) => format!("run {id}'s request {} {column}", self.index),
            None => format!("a request's {column}"),
        };
        Ok(SampleRow {
            index: self.index as usize,
            outcome: Outcome::parse(&self.outcome)
                .ok_or_else(|| unknown_label(what("outcome"), &self.outcome))?,
            ttft_s: self.ttft_s,
            tpot_s: self.tpot_s,
            e2el_s: self.e2el_s,
            itls_s: serde_json::from_str(&self.itls).map_err(|e| StoreError::Unreadable {
                what: what("itls"),
                problem: format!("is unreadable ({e})"),
            })?,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            served_by: self.served_by,
        })
    }
}

#[cfg(test)]
mod comparison_tests;
#[cfg(test)]
mod history_tests;
#[cfg(test)]
mod read_only_tests;
#[cfg(test)]
pub(crate) mod tests;
