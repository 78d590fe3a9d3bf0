//! What each filed run and heartbeat counts toward the objectives: the
//! counters on `/metrics` and the rows in the store move at the same
//! moment, from the same tally, so the status page and Prometheus measure
//! the same events over the same windows.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::slo::{self, Tally};
use crate::store::AsyncStore;
use crate::store::slo::Counted;
use crate::vocabulary::records::RunRecord;

/// Counts one run (its records, one per build that served it);
/// `replica_address` is the probed replica's `host:port` when its label is
/// a pod's name.
pub async fn count_run(
    config: &Config,
    metrics: &Metrics,
    store: &AsyncStore,
    now: chrono::DateTime<chrono::Utc>,
    records: &[RunRecord],
    replica_address: Option<&str>,
) {
    let Some(first) = records.first() else {
        return;
    };
    let counts = config
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
    keep(metrics, store, now, &first.target, &first.replica, counts).await;
}

/// Counts one heartbeat of `target`'s service (`replica` empty) or one
/// replica (and its address when it is named otherwise), after which it
/// generates or not.
pub async fn count_heartbeat(
    config: &Config,
    metrics: &Metrics,
    store: &AsyncStore,
    now: chrono::DateTime<chrono::Utc>,
    target: &str,
    (replica, replica_address): (&str, Option<&str>),
    generating: bool,
) {
    let counts = config
        .slos
        .iter()
        .map(|o| {
            let tally = slo::tally_heartbeat(o, target, (replica, replica_address), generating);
            (o.name.clone(), tally)
        })
        .collect();
    keep(metrics, store, now, target, replica, counts).await;
}

async fn keep(
    metrics: &Metrics,
    store: &AsyncStore,
    now: chrono::DateTime<chrono::Utc>,
    target: &str,
    replica: &str,
    counts: Vec<(String, Tally)>,
) {
    let counted: Vec<(String, Counted)> = counts
        .into_iter()
        .filter(|(_, t)| t.total > 0)
        .map(|(name, t)| {
            metrics.slos.count(&name, t.good, t.total);
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
    let (target, replica) = (target.to_owned(), replica.to_owned());
    // Written again while another process holds the store, as a run is;
    // a last failure is counted and logged by the store's handler, and the
    // counters have moved regardless.
    let _ = store
        .call_until_free(move |s| s.insert_slo_counts(now, &target, &replica, &counted))
        .await;
}
