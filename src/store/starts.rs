//! What a build's completed runs say of the deployments and server
//! starts that served them, asked under the lock of the query they shape:
//! the build's first runs, its deployments and each one's first runs, its
//! newest starts and each one's first runs, and whether a later start
//! followed a run at the same address. Which of them are a warm-up is a
//! rule of the verdict's ([`Warmup`]); the store only answers.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, ToSql, params};

use super::baselines::PairKey;
use super::{Store, StoreError, from_ts, ts};

/// Where each of a build's returns began, newest first, in seconds since
/// the epoch, on the parameters that hold the target, the model and the
/// build (e.g. `"?1"`): each time the target changed away from the build
/// and later changed back to it, the time it changed away.
pub(super) fn returns_sql(target: &str, model: &str, build: &str) -> String {
    format!(
        "SELECT v.at FROM version_changes v
         WHERE v.target = {target} AND v.model = {model} AND v.from_build = {build}
           AND EXISTS (SELECT 1 FROM version_changes w WHERE w.target = {target}
             AND w.model = {model} AND w.to_build = {build} AND w.at >= v.at)
         ORDER BY v.at DESC, v.id DESC"
    )
}

/// [`Store::redeployed_since`] as a scalar subquery, on parameters as
/// [`returns_sql`]'s: the newest return's start (NULL for a first
/// deployment).
pub(super) fn redeployed_since_sql(target: &str, model: &str, build: &str) -> String {
    format!("({} LIMIT 1)", returns_sql(target, model, build))
}

/// A build's completed runs that started at or after a time and are not
/// among some ids: the condition ([`KeptSince::condition`]) and its six
/// parameters ([`KeptSince::params`]).
pub(super) struct KeptSince<'a> {
    key: &'a PairKey,
    build: &'a str,
    /// Seconds since the epoch (the earliest there is, for any time).
    since: f64,
    /// The ids left out, as a JSON array.
    left_out_json: String,
}

impl<'a> KeptSince<'a> {
    /// The condition, on parameters 1-4 as [`OF_BUILD`]'s, the time in
    /// parameter 5 and the JSON array of ids in parameter 6.
    pub fn condition() -> String {
        format!("{OF_BUILD} AND started_at >= ?5 AND id NOT IN (SELECT value FROM json_each(?6))")
    }

    /// The runs of `build` that started at or after `since` (any, without
    /// it), leaving out `left_out`.
    pub fn new(
        key: &'a PairKey,
        build: &'a str,
        since: Option<DateTime<Utc>>,
        left_out: &[i64],
    ) -> Result<Self, StoreError> {
        Ok(KeptSince {
            key,
            build,
            since: since.map_or(f64::MIN, ts),
            left_out_json: serde_json::to_string(left_out)?,
        })
    }

    pub fn params(&self) -> [&dyn ToSql; 6] {
        [
            &self.key.target,
            &self.key.model,
            &self.key.scenario,
            &self.build,
            &self.since,
            &self.left_out_json,
        ]
    }
}

/// The completed runs of one pair's build, on parameters 1-4: target,
/// model, scenario, build.
const OF_BUILD: &str =
    "target = ?1 AND model = ?2 AND scenario = ?3 AND build = ?4 AND outcome = 'ok'";

/// Which of a build's completed runs a query leaves out as its warm-up,
/// decided from what [`BuildRuns`] answers.
pub trait Warmup {
    /// The ids of the runs left out.
    fn left_out(&self, runs: &BuildRuns<'_>) -> Result<Vec<i64>, StoreError>;
}

/// No run left out.
pub struct NoWarmup;

impl Warmup for NoWarmup {
    fn left_out(&self, _: &BuildRuns<'_>) -> Result<Vec<i64>, StoreError> {
        Ok(Vec::new())
    }
}

/// One run as its server start knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRun {
    pub id: i64,
    /// The address that served it (empty through the service).
    pub replica: String,
    /// When it started, in seconds since the epoch.
    pub started_at: f64,
}

/// One build's completed runs, read through one connection.
pub struct BuildRuns<'c> {
    conn: &'c Connection,
    key: &'c PairKey,
    build: &'c str,
}

impl<'c> BuildRuns<'c> {
    pub(super) fn new(conn: &'c Connection, key: &'c PairKey, build: &'c str) -> Self {
        BuildRuns { conn, key, build }
    }

    /// The ids of the build's first `n` completed runs, oldest first.
    pub fn first(&self, n: usize) -> Result<Vec<i64>, StoreError> {
        super::baselines::ok_run_ids_limited(self.conn, self.key, self.build, n)
    }

    /// Where each of the build's deployments after its first began, the
    /// newest `n`, newest first, in seconds since the epoch: each time the
    /// target changed away from the build and later back to it, the time
    /// it changed away (the build's runs since are its return's; the time
    /// the change back was seen may come after its first runs).
    pub fn returns(&self, n: usize) -> Result<Vec<f64>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare_cached(&format!("{} LIMIT ?4", returns_sql("?1", "?2", "?3")))?;
        let k = self.key;
        Ok(stmt
            .query_map(params![k.target, k.model, self.build, n], |r| r.get(0))?
            .collect::<Result<_, _>>()?)
    }

    /// The ids of the build's first `n` completed runs that started at or
    /// after `at` (seconds since the epoch), oldest first.
    pub fn first_since(&self, at: f64, n: usize) -> Result<Vec<i64>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT id FROM runs WHERE {OF_BUILD} AND started_at >= ?5
             ORDER BY started_at, id LIMIT ?6"
        ))?;
        let k = self.key;
        Ok(stmt
            .query_map(
                params![k.target, k.model, k.scenario, self.build, at, n],
                |r| r.get(0),
            )?
            .collect::<Result<_, _>>()?)
    }

    /// The start times (`process_start_time_seconds`) of the newest `n`
    /// server starts that served the build's runs, newest first. Runs with
    /// no reading of it belong to none. Each start is found by one index
    /// seek from the last (a skip scan of `runs_by_server_start`): the
    /// cost grows with `n`, not with the runs.
    pub fn newest_starts(&self, n: usize) -> Result<Vec<f64>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare_cached(&format!(
            "WITH RECURSIVE starts(s, n) AS (
                 SELECT MAX(server_started), 1 FROM runs
                 WHERE {OF_BUILD} AND server_started IS NOT NULL
                 UNION ALL
                 SELECT (SELECT MAX(server_started) FROM runs
                         WHERE {OF_BUILD} AND server_started < starts.s), n + 1
                 FROM starts WHERE s IS NOT NULL AND n < ?5)
             SELECT s FROM starts WHERE s IS NOT NULL"
        ))?;
        let k = self.key;
        Ok(stmt
            .query_map(params![k.target, k.model, k.scenario, self.build, n], |r| {
                r.get(0)
            })?
            .collect::<Result<_, _>>()?)
    }

    /// The first `n` completed runs of the build that the start at
    /// `started` served, oldest first.
    pub fn first_of_start(&self, started: f64, n: usize) -> Result<Vec<StartRun>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT id, replica, started_at FROM runs WHERE {OF_BUILD} AND server_started = ?5
             ORDER BY started_at, id LIMIT ?6"
        ))?;
        let k = self.key;
        Ok(stmt
            .query_map(
                params![k.target, k.model, k.scenario, self.build, started, n],
                |r| {
                    Ok(StartRun {
                        id: r.get(0)?,
                        replica: r.get(1)?,
                        started_at: r.get(2)?,
                    })
                },
            )?
            .collect::<Result<_, _>>()?)
    }

    /// Whether a run of the build, served at `run`'s address by a start
    /// later than `started`, began after `run`.
    pub fn followed_at_its_address(
        &self,
        started: f64,
        run: &StartRun,
    ) -> Result<bool, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE {OF_BUILD}
               AND server_started > ?5 AND replica = ?6 AND started_at > ?7)"
        ))?;
        let k = self.key;
        Ok(stmt.query_row(
            params![
                k.target,
                k.model,
                k.scenario,
                self.build,
                started,
                run.replica,
                run.started_at
            ],
            |r| r.get(0),
        )?)
    }
}

/// The ids `warmup` leaves out of the build's runs, sorted.
pub(super) fn left_out(
    conn: &Connection,
    key: &PairKey,
    build: &str,
    warmup: &dyn Warmup,
) -> Result<Vec<i64>, StoreError> {
    let mut ids = warmup.left_out(&BuildRuns::new(conn, key, build))?;
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

impl Store {
    /// The ids of one build's completed runs that `warmup` leaves out,
    /// sorted.
    pub fn left_out_runs(
        &self,
        key: &PairKey,
        build: &str,
        warmup: &dyn Warmup,
    ) -> Result<Vec<i64>, StoreError> {
        left_out(&self.lock(), key, build, warmup)
    }

    /// How many completed runs of one build `warmup` leaves in, of those
    /// that started at or after `since` (all, without it).
    pub fn count_ok_runs_after_warmup(
        &self,
        key: &PairKey,
        build: &str,
        warmup: &dyn Warmup,
        since: Option<DateTime<Utc>>,
    ) -> Result<usize, StoreError> {
        let conn = self.lock();
        let kept = KeptSince::new(key, build, since, &left_out(&conn, key, build, warmup)?)?;
        let n: i64 = conn.query_row(
            &format!("SELECT COUNT(*) FROM runs WHERE {}", KeptSince::condition()),
            kept.params().as_slice(),
            |r| r.get(0),
        )?;
        Ok(n.max(0) as usize)
    }

    /// Where the build's current deployment began, when it is not its
    /// first: the latest time the target changed away from it before it
    /// last changed back (a rollback, then the build again). Its runs
    /// since are that deployment's; `None` for a first deployment, whose
    /// runs are all its own.
    pub fn redeployed_since(
        &self,
        target: &str,
        model: &str,
        build: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let at: Option<f64> = self.lock().query_row(
            &format!("SELECT {}", redeployed_since_sql("?1", "?2", "?3")),
            params![target, model, build],
            |r| r.get(0),
        )?;
        Ok(at.map(from_ts))
    }
}
