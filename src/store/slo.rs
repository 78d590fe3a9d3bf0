//! The objectives' counts: the good and total events each filed run or
//! heartbeat gave an objective, when they were counted (the moment the
//! exported counters moved), for which target and replica; summed over
//! any window for the status page and the API, pruned with the runs.

use chrono::{DateTime, Utc};
use rusqlite::{TransactionBehavior, params};

use super::{Store, StoreError, ts};

/// Good and total events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counted {
    pub good: u64,
    pub total: u64,
}

impl Store {
    /// Keeps what one run or heartbeat of `target` (`replica` empty
    /// through the service) counted at `at`: `(objective, counted)` pairs,
    /// those without events left out. All or none: a write refused part
    /// way (another process took the store) is tried again whole, and
    /// must not count the objectives before it twice.
    pub fn insert_slo_counts(
        &self,
        at: DateTime<Utc>,
        target: &str,
        replica: &str,
        counts: &[(String, Counted)],
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO slo_counts (slo, at, target, replica, good, total)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (slo, c) in counts.iter().filter(|(_, c)| c.total > 0) {
                insert.execute(params![
                    slo,
                    ts(at),
                    target,
                    replica,
                    c.good as i64,
                    c.total as i64
                ])?;
            }
        }
        Ok(tx.commit()?)
    }

    /// What `slo` counted after each of `since` (exclusive) up to `now`
    /// (inclusive), in the order given: one scan of the longest span.
    pub fn slo_counts(
        &self,
        slo: &str,
        now: DateTime<Utc>,
        since: &[DateTime<Utc>],
    ) -> Result<Vec<Counted>, StoreError> {
        let Some(earliest) = since.iter().min() else {
            return Ok(Vec::new());
        };
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT at, good, total FROM slo_counts
             WHERE slo = ?1 AND at > ?2 AND at <= ?3",
        )?;
        let bounds: Vec<f64> = since.iter().map(|s| ts(*s)).collect();
        let mut out = vec![Counted::default(); since.len()];
        let rows = stmt.query_map(params![slo, ts(*earliest), ts(now)], |r| {
            Ok((
                r.get::<_, f64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (at, good, total) = row?;
            for (counted, bound) in out.iter_mut().zip(&bounds) {
                if at > *bound {
                    counted.good += good.max(0) as u64;
                    counted.total += total.max(0) as u64;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_summed_per_window_and_pruned_with_the_runs() {
        let store = Store::in_memory().unwrap();
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let c = |good, total| Counted { good, total };
        for (s, good, total) in [(0, 10, 10), (60, 5, 10), (120, 0, 4)] {
            store
                .insert_slo_counts(at(s), "t", "", &[("a".into(), c(good, total))])
                .unwrap();
        }
        store
            .insert_slo_counts(
                at(90),
                "t",
                "r:1",
                &[("b".into(), c(1, 1)), ("a".into(), c(0, 0))],
            )
            .unwrap();
        let counted = store
            .slo_counts("a", at(120), &[at(-1), at(0), at(100), at(120)])
            .unwrap();
        assert_eq!(counted, [c(15, 24), c(5, 14), c(0, 4), c(0, 0)]);
        assert_eq!(store.slo_counts("b", at(120), &[at(0)]).unwrap(), [c(1, 1)]);
        // Counted after `now` is not in the window.
        assert_eq!(
            store.slo_counts("a", at(60), &[at(-1)]).unwrap(),
            [c(15, 20)]
        );
        store
            .prune(at(100), std::time::Duration::from_secs(30))
            .unwrap();
        assert_eq!(
            store.slo_counts("a", at(120), &[at(-1)]).unwrap(),
            [c(0, 4)]
        );
    }

    /// A write that fails at its second objective leaves nothing of the
    /// first: tried again, it counts each once.
    #[test]
    fn counts_refused_part_way_are_not_kept_in_part() {
        let store = Store::in_memory().unwrap();
        store
            .lock()
            .execute_batch(
                "CREATE TEMP TRIGGER refuse_second BEFORE INSERT ON main.slo_counts
                 WHEN NEW.slo = 'second' BEGIN SELECT RAISE(ABORT, 'refused'); END",
            )
            .unwrap();
        let at = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let one = Counted { good: 1, total: 1 };
        let counts = [("first".to_owned(), one), ("second".to_owned(), one)];
        assert!(store.insert_slo_counts(at, "t", "", &counts).is_err());
        let since = [at - chrono::Duration::seconds(1)];
        assert_eq!(
            store.slo_counts("first", at, &since).unwrap(),
            [Counted::default()]
        );
        store
            .lock()
            .execute_batch("DROP TRIGGER temp.refuse_second")
            .unwrap();
        store.insert_slo_counts(at, "t", "", &counts).unwrap();
        assert_eq!(store.slo_counts("first", at, &since).unwrap(), [one]);
    }
}
