//! Which of a build's completed runs are its warm-up: its first
//! `warmup_runs`, the first `warmup_runs` of each time it was deployed
//! again (after a rollback), and the first `warmup_runs` of every start of
//! the server its runs were served by (a freshly started server's first
//! runs are slower whatever the build: a pod restarted on the same image
//! must not read as a slowdown, nor its cold runs join a baseline or a
//! history). A start that served one run and gave way to a later one at
//! the same address is no restart.

use crate::store::StoreError;
use crate::store::starts::{BuildRuns, Warmup};

/// How many of a build's newest server starts are read for their warm-up:
/// older starts' runs are past any history or candidate, and a baseline,
/// once formed, is stored.
const STARTS_READ: usize = 64;

/// How many of a build's newest deployments are read for their warm-up.
const DEPLOYMENTS_READ: usize = 16;

/// The warm-up of `[detector] warmup_runs` runs per build, per deployment
/// and per start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmupRule(pub usize);

impl Warmup for WarmupRule {
    fn left_out(&self, runs: &BuildRuns<'_>) -> Result<Vec<i64>, StoreError> {
        let WarmupRule(warmup) = *self;
        if warmup == 0 {
            return Ok(Vec::new());
        }
        let mut ids = runs.first(warmup)?;
        // A deployment starts the server whether or not its page says
        // when it started: a return's first runs too.
        for since in runs.returns(DEPLOYMENTS_READ)? {
            ids.extend(runs.first_since(since, warmup)?);
        }
        for start in runs.newest_starts(STARTS_READ)? {
            // Two runs read at least, to tell a start that served one.
            let first = runs.first_of_start(start, warmup.max(2))?;
            // A start that served one run and gave way to a later one at
            // the same address is no restart: a page whose start time
            // changes on every read (a pool of short-lived processes
            // answering for the server) would leave no run judged.
            // Another replica's runs in between (a fleet, a service's
            // replicas answering in turn) are no such thing.
            if let [only] = first.as_slice()
                && runs.followed_at_its_address(start, only)?
            {
                continue;
            }
            ids.extend(first.iter().take(warmup).map(|run| run.id));
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::baselines::PairKey;
    use crate::vocabulary::records::{RunOutcome, RunRecord, ServerLoad};
    use chrono::TimeZone;

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
        let at = chrono::Utc
            .with_ymd_and_hms(2026, 11, 25, 12, 0, 0)
            .unwrap()
            + chrono::Duration::minutes(i);
        let mut r = RunRecord::failed("a", "s", "m", at, 1.0, RunOutcome::Ok, String::new());
        r.server.version = Some("0.32.0".into());
        r.summary.completed = 1;
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
        let left_out = |warmup| {
            store
                .left_out_runs(&key, "0.32.0", &WarmupRule(warmup))
                .unwrap()
        };
        assert_eq!(
            left_out(2),
            warm,
            "the build's first two, the first start's first two (runs 1 and 2: run 0 has no reading), the restart's first two"
        );
        assert_eq!(left_out(0), Vec::<i64>::new());
        assert_eq!(
            store
                .count_ok_runs_after_warmup(&key, "0.32.0", &WarmupRule(2), None)
                .unwrap(),
            7
        );
        let past: Vec<i64> = store
            .newest_ok_runs(&key, "0.32.0", &WarmupRule(2), None, &[], 100)
            .unwrap()
            .iter()
            .map(|r| r.id.unwrap())
            .collect();
        let expected: Vec<i64> = [3, 4, 8, 9, 10, 11, 12].iter().map(|&i| ids[i]).collect();
        assert_eq!(past, expected);
        let baseline = store
            .form_baseline(&key, "0.32.0", &WarmupRule(2), 4, chrono::Utc::now())
            .unwrap()
            .unwrap();
        assert_eq!(
            baseline.run_ids,
            expected[..4].to_vec(),
            "no cold run in it"
        );
    }

    #[test]
    fn a_build_deployed_again_has_a_warm_up_again() {
        let store = Store::in_memory().unwrap();
        let key = pair();
        // 0.32.0, 0.33.0 for 20 runs, 0.32.0 again (a rollback), none of
        // them with a start time read.
        let mut ids = Vec::new();
        for i in 0..45 {
            let mut r = served(i, None);
            if (5..25).contains(&i) {
                r.server.version = Some("0.33.0".into());
            }
            ids.push(store.insert_run(&r).unwrap());
        }
        let back = store.redeployed_since("a", "m", "0.32.0").unwrap();
        assert_eq!(
            back,
            Some(served(5, None).started_at),
            "its return's runs are those since it was left"
        );
        assert_eq!(
            store.left_out_runs(&key, "0.32.0", &WarmupRule(2)).unwrap(),
            [ids[0], ids[1], ids[25], ids[26]],
            "the first two of each deployment"
        );
        assert_eq!(
            store
                .count_ok_runs_after_warmup(&key, "0.32.0", &WarmupRule(2), back)
                .unwrap(),
            18,
            "runs since the rollback past its warm-up"
        );
    }

    #[test]
    fn a_first_deployment_seen_after_its_first_runs_has_one_warm_up() {
        let store = Store::in_memory().unwrap();
        let key = pair();
        for i in 0..30 {
            store.insert_run(&served(i, None)).unwrap();
        }
        // The watcher saw 0.33.0 at run 33's time; its runs from run 30 on
        // are filed after.
        let mut new = served(33, None).server;
        new.version = Some("0.33.0".into());
        let seen = served(33, None).started_at;
        let scope = crate::store::fleet::FleetScope::default();
        store
            .observe_identity("a", "m", &new, seen, &scope)
            .unwrap();
        let ids: Vec<i64> = (30..40)
            .map(|i| {
                let mut r = served(i, None);
                r.server.version = Some("0.33.0".into());
                store.insert_run(&r).unwrap()
            })
            .collect();
        assert_eq!(store.redeployed_since("a", "m", "0.33.0").unwrap(), None);
        assert_eq!(
            store.left_out_runs(&key, "0.33.0", &WarmupRule(2)).unwrap(),
            [ids[0], ids[1]],
            "its first two, once"
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
        assert_eq!(
            store.left_out_runs(&key, "0.32.0", &WarmupRule(2)).unwrap(),
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
        let warm = store.left_out_runs(&key, "0.32.0", &WarmupRule(2)).unwrap();
        assert!(
            warm.contains(&ids[17]),
            "b's first run since its restart: {warm:?}"
        );
    }
}
