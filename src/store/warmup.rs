//! Which completed runs of a build are its warm-up: its first
//! `warmup_runs`, and the first `warmup_runs` of every start of the server
//! its runs were served by (a freshly started server's first runs are
//! slower whatever the build: a pod restarted on the same image must not
//! read as a slowdown, nor its cold runs join a baseline or a history).
//! A start that served one run and gave way to a later one at the same
//! address is no restart.

use rusqlite::{Connection, params};

use super::baselines::PairKey;
use super::{Store, StoreError};

/// How many of a build's newest server starts are read for their warm-up.
const STARTS_READ: usize = 64;

/// The completed runs of one pair's build, on parameters 1-4: target,
/// model, scenario, build.
const OF_BUILD: &str =
    "target = ?1 AND model = ?2 AND scenario = ?3 AND build = ?4 AND outcome = 'ok'";

/// The ids of the build's warm-up runs, in id order. Runs with no reading
/// of the server's start count only toward the build's first.
pub(super) fn warmup_ids(
    conn: &Connection,
    key: &PairKey,
    build: &str,
    warmup: usize,
) -> Result<Vec<i64>, StoreError> {
    if warmup == 0 {
        return Ok(Vec::new());
    }
    let of_build = params![key.target, key.model, key.scenario, build];
    // The newest starts, each found by one index seek from the last (a
    // skip scan of `runs_by_server_start`), each start's first runs by one
    // more: the cost grows with the starts, not with the runs, and is
    // bounded. Older starts' runs are past any history or candidate, and a
    // baseline, once formed, is stored.
    let starts: Vec<f64> = conn
        .prepare_cached(&format!(
            "WITH RECURSIVE starts(s, n) AS (
                 SELECT MAX(server_started), 1 FROM runs
                 WHERE {OF_BUILD} AND server_started IS NOT NULL
                 UNION ALL
                 SELECT (SELECT MAX(server_started) FROM runs
                         WHERE {OF_BUILD} AND server_started < starts.s), n + 1
                 FROM starts WHERE s IS NOT NULL AND n < {STARTS_READ})
             SELECT s FROM starts WHERE s IS NOT NULL"
        ))?
        .query_map(of_build, |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut ids = super::baselines::ok_run_ids_limited(conn, key, build, warmup)?;
    let mut of_start = conn.prepare_cached(&format!(
        "SELECT id, replica, started_at FROM runs WHERE {OF_BUILD} AND server_started = ?5
         ORDER BY started_at, id LIMIT ?6"
    ))?;
    let mut gave_way = conn.prepare_cached(&format!(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE {OF_BUILD}
           AND server_started > ?5 AND replica = ?6 AND started_at > ?7)"
    ))?;
    let read = i64::try_from(warmup.max(2)).unwrap_or(i64::MAX);
    for start in starts {
        let first: Vec<(i64, String, f64)> = of_start
            .query_map(
                params![key.target, key.model, key.scenario, build, start, read],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?
            .collect::<Result<_, _>>()?;
        // A start that served one run and gave way to a later one at the
        // same address is no restart: a page whose start time changes on
        // every read (a pool of short-lived processes answering for the
        // server) would leave no run judged. Another replica's runs in
        // between (a fleet, a service's replicas answering in turn) are
        // no such thing.
        if let [(_, replica, at)] = first.as_slice() {
            let later = params![
                key.target,
                key.model,
                key.scenario,
                build,
                start,
                replica,
                at
            ];
            if gave_way.query_row(later, |r| r.get::<_, bool>(0))? {
                continue;
            }
        }
        ids.extend(first.into_iter().take(warmup).map(|(id, _, _)| id));
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

impl Store {
    /// How many completed runs of one build are past its warm-up.
    pub fn count_ok_runs_after_warmup(
        &self,
        key: &PairKey,
        build: &str,
        warmup: usize,
    ) -> Result<usize, StoreError> {
        let all = self.count_ok_runs(key, build)?;
        let conn = self.lock();
        Ok(all.saturating_sub(warmup_ids(&conn, key, build, warmup)?.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::records::{RunOutcome, RunRecord, ServerLoad};

    /// The pair [`served`] runs are of.
    fn pair() -> PairKey {
        PairKey {
            target: "a".into(),
            model: "m".into(),
            scenario: "s".into(),
        }
    }

    /// Run `i` of build 0.32.0, served by a server started at `started`.
    fn served(i: i64, started: Option<f64>) -> RunRecord {
        let mut r = super::super::tests::run("a", "s", 100 - i, 0.1);
        r.load_before = Some(ServerLoad {
            server_started_s: started,
            ..ServerLoad::default()
        });
        r
    }

    #[test]
    fn each_start_of_the_server_has_its_own_warm_up() {
        let store = Store::in_memory().unwrap();
        let key = pair();
        let (first, restarted) = (Some(1.7e9), Some(1.7e9 + 600.0));
        // Run 0 without a reading, 1-4 on the first start, a failed run,
        // 6-10 after a restart, 11 and 12 again on the first start (a
        // service whose replicas answer in turn: no new start).
        let mut ids = Vec::new();
        for i in 0..13 {
            let mut r = served(
                i,
                if (6..=10).contains(&i) {
                    restarted
                } else {
                    first
                },
            );
            if i == 0 {
                r.load_before = None;
            }
            if i == 5 {
                r.outcome = RunOutcome::Failed(crate::vocabulary::Outcome::Timeout);
            }
            ids.push(store.insert_run(&r).unwrap());
        }
        let warm: Vec<i64> = [0, 1, 2, 6, 7].iter().map(|&i| ids[i]).collect();
        let conn = store.lock();
        assert_eq!(
            warmup_ids(&conn, &key, "0.32.0", 2).unwrap(),
            warm,
            "the build's first two, the first start's first two (runs 1 and 2: run 0 has no reading), the restart's first two"
        );
        assert_eq!(
            warmup_ids(&conn, &key, "0.32.0", 0).unwrap(),
            Vec::<i64>::new()
        );
        drop(conn);
        assert_eq!(
            store.count_ok_runs_after_warmup(&key, "0.32.0", 2).unwrap(),
            7
        );
        let past: Vec<i64> = store
            .newest_ok_runs(&key, "0.32.0", 2, &[], 100)
            .unwrap()
            .iter()
            .map(|r| r.id.unwrap())
            .collect();
        let expected: Vec<i64> = [3, 4, 8, 9, 10, 11, 12].iter().map(|&i| ids[i]).collect();
        assert_eq!(past, expected);
        let baseline = store
            .form_baseline(&key, "0.32.0", 2, 4, chrono::Utc::now())
            .unwrap()
            .unwrap();
        assert_eq!(
            baseline.run_ids,
            expected[..4].to_vec(),
            "no cold run in it"
        );
    }

    #[test]
    fn a_start_time_that_changes_on_every_read_is_no_restart() {
        let store = Store::in_memory().unwrap();
        let key = pair();
        let ids: Vec<i64> = (0..100)
            .map(|i| {
                let r = served(i, Some(1.7e9 + i as f64));
                store.insert_run(&r).unwrap()
            })
            .collect();
        let conn = store.lock();
        assert_eq!(
            warmup_ids(&conn, &key, "0.32.0", 2).unwrap(),
            [ids[0], ids[1], ids[99]],
            "the build's first two, and the newest run until a later start follows it"
        );
    }

    #[test]
    fn a_replicas_restart_is_one_while_other_replicas_run_after_it() {
        let store = Store::in_memory().unwrap();
        let key = pair();
        // Replicas a and b in turn; b restarts at its 9th run, and a's
        // next run is the newest.
        let mut ids = Vec::new();
        for i in 0..19 {
            let (replica, started) = match i % 2 {
                0 => ("10.0.0.1:8000", 1.7e9),
                _ if i >= 17 => ("10.0.0.2:8000", 1.7e9 + 900.0),
                _ => ("10.0.0.2:8000", 1.7e9 + 1.0),
            };
            let mut r = served(i, Some(started));
            r.replica = replica.into();
            ids.push(store.insert_run(&r).unwrap());
        }
        let conn = store.lock();
        let warm = warmup_ids(&conn, &key, "0.32.0", 2).unwrap();
        assert!(
            warm.contains(&ids[17]),
            "b's first run since its restart: {warm:?}"
        );
    }
}
