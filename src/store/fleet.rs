//! Fleets: which builds serve a target now, with their shares, and
//! rollouts from one build to another. The builds serving are read from
//! the stored runs (so a restart loses nothing): with replicas, the build
//! of each replica's latest run (a share is replicas per build), plus any
//! build the service's last rounds saw; through the service alone, the
//! builds of the last rounds (a share is requests per build).

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::baselines::PairKey;
use super::starts::Warmup;
use super::{RawSample, SAMPLE_COLUMNS, Store, StoreError, from_ts, ts};
use crate::vocabulary::records::SampleRow;

/// What the fleet view is computed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetScope {
    /// Probe rounds a build must have been missing from to be gone.
    pub window: usize,
    /// The replicas discovered now (`host:port`); empty when the target is
    /// probed only through its service.
    pub replicas: Vec<String>,
    /// At most this many builds first seen in any hour: a server whose
    /// identity changes on every request files one build, not thousands.
    /// `None`: unbounded.
    pub new_builds_per_hour: Option<u32>,
    /// A rollout open this long ends as `stalled`; `None`: never.
    pub rollout_timeout: Option<std::time::Duration>,
}

impl FleetScope {
    /// A target probed through its service alone, judged over `window`
    /// rounds.
    pub fn service(window: usize) -> Self {
        FleetScope {
            window,
            replicas: Vec::new(),
            new_builds_per_hour: None,
            rollout_timeout: None,
        }
    }

    /// The same scope under the policy's bounds: new builds per hour and
    /// how long a rollout may stay open.
    pub fn under(mut self, policy: &crate::config::verdict_policy::VerdictPolicy) -> Self {
        self.new_builds_per_hour = Some(policy.max_new_builds_per_hour);
        self.rollout_timeout = Some(policy.rollout_timeout);
        self
    }
}

impl Default for FleetScope {
    fn default() -> Self {
        FleetScope::service(5)
    }
}

/// One build serving a target, and its share of the fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetBuild {
    pub build: String,
    /// Replicas per build over all replicas seen, or requests per build
    /// over the recent rounds of the service.
    pub share: f64,
    /// How many replicas (or requests) the share counts.
    pub count: u64,
    /// Whether the share counts replicas (else requests).
    pub by_replica: bool,
    /// The build's image reference and digest, when it was filed with one.
    pub image: Option<String>,
    pub image_digest: Option<String>,
}

/// A rollout from one build to another.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rollout {
    pub from_build: String,
    pub to_build: String,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    /// `finished` (the old build is gone), `abandoned` (the new one is),
    /// `superseded` (another build came before either) or `stalled` (both
    /// still serve after the detector's `rollout_timeout`: a mixed fleet,
    /// each build judged on its own baseline from then on).
    pub outcome: Option<String>,
}

const COMPLETED: &str = "json_extract(summary, '$.completed') > 0";

/// The names of the builds serving a target (see [`serving`]).
pub fn serving_names(
    conn: &Connection,
    target: &str,
    model: &str,
    scope: &FleetScope,
) -> Result<Vec<String>, StoreError> {
    Ok(serving(conn, target, model, scope)?
        .into_iter()
        .map(|b| b.build)
        .collect())
}

/// The builds serving a target, largest share first.
pub fn serving(
    conn: &Connection,
    target: &str,
    model: &str,
    scope: &FleetScope,
) -> Result<Vec<FleetBuild>, StoreError> {
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut add = |build: String, n: u64| match counts.iter_mut().find(|(b, _)| *b == build) {
        Some((_, c)) => *c += n,
        None => counts.push((build, n)),
    };
    let mut by_replica = false;
    if !scope.replicas.is_empty() {
        let mut latest = conn.prepare(&format!(
            "SELECT build FROM runs WHERE target = ?1 AND model = ?2 AND replica = ?3
               AND build IS NOT NULL AND {COMPLETED}
             ORDER BY started_at DESC LIMIT 1"
        ))?;
        for replica in &scope.replicas {
            if let Some(build) = latest
                .query_row(params![target, model, replica], |r| r.get::<_, String>(0))
                .optional()?
            {
                add(build, 1);
                by_replica = true;
            }
        }
    }
    // The service's rounds count too: with replicas, a build seen through
    // the service before any replica run found it serves (share 0 until a
    // replica run counts it), so no rollout starts or ends on the order in
    // which the workers happen to run.
    let mut stmt = conn.prepare(&format!(
        "SELECT build, SUM(json_extract(summary, '$.completed')) FROM runs
         WHERE target = ?1 AND model = ?2 AND replica = '' AND build IS NOT NULL
           AND {COMPLETED}
           AND started_at >= COALESCE((
             SELECT MIN(started_at) FROM (
               SELECT DISTINCT started_at FROM runs
               WHERE target = ?1 AND model = ?2 AND replica = '' AND {COMPLETED}
               ORDER BY started_at DESC LIMIT ?3)), 0)
         GROUP BY build"
    ))?;
    let rows = stmt.query_map(params![target, model, scope.window as i64], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
    })?;
    for row in rows {
        let (build, n) = row?;
        add(build, if by_replica { 0 } else { n.max(0) as u64 });
    }
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    let mut image = conn.prepare(
        "SELECT image, image_digest FROM builds WHERE target = ?1 AND model = ?2 AND label = ?3",
    )?;
    let mut builds: Vec<FleetBuild> = Vec::with_capacity(counts.len());
    for (build, count) in counts {
        let (image, image_digest) = image
            .query_row(params![target, model, build], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((None, None));
        builds.push(FleetBuild {
            share: if total > 0 {
                count as f64 / total as f64
            } else {
                0.0
            },
            build,
            count,
            by_replica,
            image,
            image_digest,
        });
    }
    builds.sort_by(|a, b| b.count.cmp(&a.count).then(a.build.cmp(&b.build)));
    Ok(builds)
}

/// The target's rollout in progress, if any.
pub fn open_rollout(
    conn: &Connection,
    target: &str,
    model: &str,
) -> Result<Option<Rollout>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT from_build, to_build, started_at FROM rollouts
             WHERE target = ?1 AND model = ?2 AND ended_at IS NULL ORDER BY id DESC LIMIT 1",
            params![target, model],
            |r| {
                Ok(Rollout {
                    from_build: r.get(0)?,
                    to_build: r.get(1)?,
                    started_at: from_ts(r.get(2)?),
                    ended_at: None,
                    outcome: None,
                })
            },
        )
        .optional()?)
}

/// Starts a rollout, ending one still open as superseded.
pub fn start_rollout(
    conn: &Connection,
    target: &str,
    model: &str,
    from: &str,
    to: &str,
    at: DateTime<Utc>,
) -> Result<Rollout, StoreError> {
    end_open(conn, target, model, at, "superseded")?;
    conn.execute(
        "INSERT INTO rollouts (target, model, from_build, to_build, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![target, model, from, to, ts(at)],
    )?;
    Ok(Rollout {
        from_build: from.to_owned(),
        to_build: to.to_owned(),
        started_at: at,
        ended_at: None,
        outcome: None,
    })
}

fn end_open(
    conn: &Connection,
    target: &str,
    model: &str,
    at: DateTime<Utc>,
    outcome: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE rollouts SET ended_at = ?3, outcome = ?4
         WHERE target = ?1 AND model = ?2 AND ended_at IS NULL",
        params![target, model, ts(at), outcome],
    )?;
    Ok(())
}

/// Ends the open rollout once one of its two builds no longer serves: the
/// old one gone is `finished`, the new one gone is `abandoned` (only after
/// `window` rounds since the rollout started: a build the watcher saw
/// first may not have served a probe yet). Returns the rollout it ended.
pub fn settle(
    conn: &Connection,
    target: &str,
    model: &str,
    fleet: &[FleetBuild],
    at: DateTime<Utc>,
    window: usize,
    rollout_timeout: Option<std::time::Duration>,
) -> Result<Option<Rollout>, StoreError> {
    let Some(mut open) = open_rollout(conn, target, model)? else {
        return Ok(None);
    };
    let serves = |build: &str| fleet.iter().any(|b| b.build == build);
    let timed_out = rollout_timeout
        .and_then(|t| chrono::Duration::from_std(t).ok())
        .is_some_and(|t| at - open.started_at >= t);
    let outcome = match (serves(&open.from_build), serves(&open.to_build)) {
        (false, true) => "finished",
        (true, false) if rounds_since(conn, target, model, open.started_at)? >= window => {
            "abandoned"
        }
        _ if timed_out => "stalled",
        _ => return Ok(None),
    };
    end_open(conn, target, model, at, outcome)?;
    if outcome == "abandoned" {
        // Back to the old build: it is the target's current build again.
        conn.execute(
            "INSERT INTO version_changes (target, model, at, from_build, to_build)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![target, model, ts(at), open.to_build, open.from_build],
        )?;
    }
    open.ended_at = Some(at);
    open.outcome = Some(outcome.to_owned());
    Ok(Some(open))
}

/// Probe rounds (distinct run starts, any replica) that reached the
/// server since `since`.
fn rounds_since(
    conn: &Connection,
    target: &str,
    model: &str,
    since: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let n: i64 = conn.query_row(
        &format!(
            "SELECT COUNT(DISTINCT started_at) FROM runs
             WHERE target = ?1 AND model = ?2 AND started_at >= ?3 AND {COMPLETED}"
        ),
        params![target, model, ts(since)],
        |r| r.get(0),
    )?;
    Ok(n.max(0) as usize)
}

impl Store {
    /// The successful requests of two builds of a pair measured at the
    /// same time: `(old build's, new build's)`. Through the service, the
    /// last `rounds` rounds in which both served; by replica (each run is
    /// one replica, one build), every replica run of either build since
    /// the new build's `rounds`-th latest replica run; of a build rolled
    /// out again after a rollback, neither before its return
    /// ([`Store::redeployed_since`]). The runs `warmup`
    /// leaves out of either build do not count: a replica just started on
    /// the new build is cold, and would read as the new build being
    /// slower.
    pub fn canary_samples(
        &self,
        key: &PairKey,
        old: &str,
        new: &str,
        rounds: usize,
        by_replica: bool,
        warmup: &dyn Warmup,
    ) -> Result<(Vec<SampleRow>, Vec<SampleRow>), StoreError> {
        let conn = self.lock();
        let mut cold = super::starts::left_out(&conn, key, old, warmup)?;
        cold.extend(super::starts::left_out(&conn, key, new, warmup)?);
        let cold = serde_json::to_string(&cold)?;
        // The new build (?5)'s return, when it came back after a rollback.
        let since_deployed = super::starts::redeployed_since_sql("?1", "?2", "?5");
        let sql = if by_replica {
            format!(
                "WITH since AS (
                   SELECT MIN(started_at) AS t FROM (
                     SELECT started_at FROM runs
                     WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND replica != ''
                       AND build = ?5
                     ORDER BY started_at DESC LIMIT ?6))
                 SELECT r.build, {SAMPLE_COLUMNS}
                 FROM samples s JOIN runs r ON r.id = s.run_id
                 WHERE r.target = ?1 AND r.model = ?2 AND r.scenario = ?3 AND r.replica != ''
                   AND r.build IN (?4, ?5) AND s.outcome = 'ok' AND s.ttft_s IS NOT NULL
                   AND r.id NOT IN (SELECT value FROM json_each(?7))
                   AND r.started_at >= (SELECT t FROM since)
                   AND r.started_at >= COALESCE({since_deployed}, 0)"
            )
        } else {
            format!(
                "WITH rounds AS (
                   SELECT started_at FROM runs
                   WHERE target = ?1 AND model = ?2 AND scenario = ?3 AND replica = ''
                     AND build IN (?4, ?5)
                   GROUP BY started_at HAVING COUNT(DISTINCT build) = 2
                   ORDER BY started_at DESC LIMIT ?6)
                 SELECT r.build, {SAMPLE_COLUMNS}
                 FROM samples s JOIN runs r ON r.id = s.run_id
                 WHERE r.target = ?1 AND r.model = ?2 AND r.scenario = ?3 AND r.replica = ''
                   AND r.build IN (?4, ?5) AND s.outcome = 'ok' AND s.ttft_s IS NOT NULL
                   AND r.id NOT IN (SELECT value FROM json_each(?7))
                   AND r.started_at IN (SELECT started_at FROM rounds)
                   AND r.started_at >= COALESCE({since_deployed}, 0)"
            )
        };
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(
            params![
                key.target,
                key.model,
                key.scenario,
                old,
                new,
                rounds as i64,
                cold
            ],
            |r| Ok((r.get::<_, String>(0)?, RawSample::read(r, 1)?)),
        )?;
        let (mut old_samples, mut new_samples) = (Vec::new(), Vec::new());
        for row in rows {
            let (build, raw) = row?;
            let sample = raw.into_sample(None)?;
            if build == new {
                new_samples.push(sample);
            } else {
                old_samples.push(sample);
            }
        }
        Ok((old_samples, new_samples))
    }

    /// The builds serving a target now; see [`serving`].
    pub fn fleet(
        &self,
        target: &str,
        model: &str,
        scope: &FleetScope,
    ) -> Result<Vec<FleetBuild>, StoreError> {
        serving(&self.lock(), target, model, scope)
    }

    /// The target's rollout in progress, if any.
    pub fn open_rollout(&self, target: &str, model: &str) -> Result<Option<Rollout>, StoreError> {
        open_rollout(&self.lock(), target, model)
    }

    /// The target's rollouts, newest first.
    pub fn rollouts(&self, target: &str, model: &str) -> Result<Vec<Rollout>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT from_build, to_build, started_at, ended_at, outcome FROM rollouts
             WHERE target = ?1 AND model = ?2 ORDER BY id DESC",
        )?;
        let rows = stmt.query_map(params![target, model], |r| {
            Ok(Rollout {
                from_build: r.get(0)?,
                to_build: r.get(1)?,
                started_at: from_ts(r.get(2)?),
                ended_at: r.get::<_, Option<f64>>(3)?.map(from_ts),
                outcome: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
