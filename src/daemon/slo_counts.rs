//! What each filed run, skipped run and heartbeat counts toward the
//! objectives: the counters on `/metrics` and the rows in the store move
//! at the same moment, from the same tally, so the status page and
//! Prometheus measure the same events over the same windows.

use chrono::{DateTime, Utc};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::slo::{self, Tally};
use crate::store::AsyncStore;
use crate::store::slo::Counted;
use crate::vocabulary::records::{RunOutcome, RunRecord};

/// Where and when counts are kept: the objectives configured, the
/// counters on `/metrics`, the store, and the moment counted.
pub struct Counting<'a> {
    pub config: &'a Config,
    pub metrics: &'a Metrics,
    pub store: &'a AsyncStore,
    pub now: DateTime<Utc>,
}

impl Counting<'_> {
    /// Counts one run (its records, one per build that served it);
    /// `replica_address` is the probed replica's `host:port` when its
    /// label is a pod's name.
    pub async fn run(&self, records: &[RunRecord], replica_address: Option<&str>) {
        let Some(first) = records.first() else {
            return;
        };
        let counts = self
            .config
            .slos
            .iter()
            .map(|o| {
                let mut tally = Tally::default();
                for r in records {
                    tally.add(slo::tally_run(o, r, replica_address));
                }
                (o.name.clone(), tally)
            })
            .collect();
        self.keep(&first.target, &first.replica, counts).await;
    }

    /// Counts a run of `scenario` skipped while the target is backed off
    /// (found down): one bad request, as a run that could not connect.
    pub async fn skipped(
        &self,
        target: &str,
        (replica, address): (&str, Option<&str>),
        scenario: &str,
    ) {
        let mut record = RunRecord::failed(
            target,
            scenario,
            "",
            self.now,
            0.0,
            RunOutcome::Failed(crate::client::Outcome::Connect),
            "skipped: the target is backed off, found down".into(),
        );
        record.replica = replica.to_owned();
        self.run(&[record], address).await;
    }

    /// Counts one heartbeat of `target`'s service (`replica` empty) or one
    /// replica (and its address when it is named otherwise), after which
    /// it generates or not.
    pub async fn heartbeat(
        &self,
        target: &str,
        (replica, replica_address): (&str, Option<&str>),
        generating: bool,
    ) {
        let counts = self
            .config
            .slos
            .iter()
            .map(|o| {
                let tally = slo::tally_heartbeat(o, target, (replica, replica_address), generating);
                (o.name.clone(), tally)
            })
            .collect();
        self.keep(target, replica, counts).await;
    }

    async fn keep(&self, target: &str, replica: &str, counts: Vec<(String, Tally)>) {
        let counted: Vec<(String, Counted)> = counts
            .into_iter()
            .filter(|(_, t)| t.total > 0)
            .map(|(name, t)| {
                self.metrics.slos.count(&name, t.good, t.total);
                (
                    name,
                    Counted {
                        good: t.good,
                        total: t.total,
                    },
                )
            })
            .collect();
        if counted.is_empty() {
            return;
        }
        let (target, replica, now) = (target.to_owned(), replica.to_owned(), self.now);
        // Written again while another process holds the store, as a run is;
        // a last failure is counted and logged by the store's handler, and
        // the counters have moved regardless.
        let _ = self
            .store
            .call_until_free(move |s| s.insert_slo_counts(now, &target, &replica, &counted))
            .await;
    }
}
