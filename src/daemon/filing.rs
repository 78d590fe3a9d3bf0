//! A target's ended runs exported, filed in the store and judged, in the
//! order they ended, by one task per target. Its workers hand a run over
//! and go on to the next: no run starts late because the store is busy
//! with other targets' runs. Only the check for a new build's pending
//! upgrade runs waits until everything handed over is filed.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::verdicts::Verdicts;
use crate::config::Config;
use crate::config::live::LiveConfig;
use crate::metrics::Metrics;
use crate::state::TargetStates;
use crate::store::AsyncStore;
use crate::store::baselines::PairKey;
use crate::store::fleet::FleetScope;
use crate::verdict::filed::FiledRun;
use crate::vocabulary::records::{RunOutcome, RunRecord};
use crate::workload::kinds::ScenarioKind;

/// Runs handed over and not yet filed, at most: a store slower than the
/// schedule makes the workers wait rather than memory grow.
const QUEUE: usize = 32;

/// What filing a run uses.
pub struct Filing {
    pub live: Arc<LiveConfig>,
    pub metrics: Arc<Metrics>,
    pub board: Arc<TargetStates>,
    pub store: AsyncStore,
    pub verdicts: Verdicts,
}

enum Job {
    /// One run's records (one per build that served it), and the address
    /// of the replica probed when it is named otherwise (a pod).
    File(Vec<RunRecord>, Option<String>),
    /// What counts toward the objectives alone, nothing stored or
    /// exported besides: of `target`'s service or one replica.
    Count {
        target: String,
        replica: Probed,
        event: Event,
    },
    /// Answered once everything handed over before it is filed.
    Flush(oneshot::Sender<()>),
}

/// What a count is of.
enum Event {
    /// A run of this scenario skipped while the target is backed off
    /// (found down): one bad request.
    Skipped(String),
    /// A heartbeat, after which the target generates or not.
    Heartbeat { generating: bool },
}

/// The replica a run or heartbeat reached: its label (empty through the
/// service) and, for a pod, its address, taken when it was probed (the pod
/// may have left the list by the time it is filed).
pub struct Probed {
    pub label: String,
    pub address: Option<String>,
}

impl Probed {
    pub fn of(replica: Option<&crate::discovery::Replica>) -> Probed {
        Probed {
            label: replica.map(|r| r.label.clone()).unwrap_or_default(),
            address: replica
                .and_then(|r| r.placement.as_ref())
                .map(|p| p.address.clone()),
        }
    }
}

/// Where a target's workers hand their ended runs; cloned into each.
#[derive(Clone)]
pub struct Filer {
    jobs: mpsc::Sender<Job>,
}

/// Starts the target's filing task. It ends once every [`Filer`] is
/// dropped and what they handed over is filed, so shutdown, which awaits
/// it, loses no run.
pub fn spawn(filing: Filing) -> (Filer, JoinHandle<()>) {
    let (jobs, mut queue) = mpsc::channel(QUEUE);
    let task = tokio::spawn(async move {
        while let Some(job) = queue.recv().await {
            match job {
                Job::File(records, address) => {
                    let config = filing.live.current();
                    filing.finish(&config, records, address.as_deref()).await;
                }
                Job::Count {
                    target,
                    replica,
                    event,
                } => {
                    let config = filing.live.current();
                    let counting = filing.counting(&config);
                    let probed = (replica.label.as_str(), replica.address.as_deref());
                    match event {
                        Event::Skipped(scenario) => {
                            counting.skipped(&target, probed, &scenario).await;
                        }
                        Event::Heartbeat { generating } => {
                            counting.heartbeat(&target, probed, generating).await;
                        }
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    });
    (Filer { jobs }, task)
}

impl Filer {
    /// Hands a run over; waits only when the queue is full.
    pub async fn file(&self, records: Vec<RunRecord>, address: Option<String>) {
        // The task ends only after every filer is dropped.
        let _ = self.jobs.send(Job::File(records, address)).await;
    }

    /// Hands a heartbeat over, counted toward the objectives in order
    /// with the runs.
    pub async fn heartbeat(&self, target: &str, replica: Probed, generating: bool) {
        self.count(target, replica, Event::Heartbeat { generating })
            .await;
    }

    /// Hands a run skipped while the target is backed off over, counted
    /// toward the objectives in order with the runs.
    pub async fn skipped(&self, target: &str, replica: Probed, scenario: &str) {
        self.count(target, replica, Event::Skipped(scenario.to_owned()))
            .await;
    }

    async fn count(&self, target: &str, replica: Probed, event: Event) {
        let target = target.to_owned();
        let job = Job::Count {
            target,
            replica,
            event,
        };
        let _ = self.jobs.send(job).await;
    }

    /// Waits until everything handed over so far is filed and judged.
    pub async fn flush(&self) {
        let (done, filed) = oneshot::channel();
        if self.jobs.send(Job::Flush(done)).await.is_ok() {
            let _ = filed.await;
        }
    }
}

impl Filing {
    /// Counts toward the objectives of `config`, now.
    fn counting<'a>(&'a self, config: &'a Config) -> super::slo_counts::Counting<'a> {
        super::slo_counts::Counting {
            config,
            metrics: &self.metrics,
            store: &self.store,
            now: self.verdicts.clock.now(),
        }
    }

    /// Stores and exports a run (one record per build that served it),
    /// then judges its pairs; a store failure is reported by the store, and
    /// the run still reaches `/metrics`. `address` is the replica's when
    /// it is named otherwise (a pod).
    async fn finish(&self, config: &Config, mut records: Vec<RunRecord>, address: Option<&str>) {
        let (target, replica) = records
            .first()
            .map(|r| (r.target.clone(), r.replica.clone()))
            .unwrap_or_default();
        if config.target(&target).is_none() {
            // The run of a target a reload removed while it ran: kept as
            // history, but shown and judged no more (its verdict would
            // page again, its row come back on the status page).
            self.store_only(records).await;
            return;
        }
        let scope = self
            .board
            .fleet_scope(&target, config.verdict_policy.canary_window)
            .under(&config.verdict_policy);
        if records.len() > 1 {
            known_first(&mut records, &self.board.known_builds(&target));
        }
        let counting = self.counting(config);
        counting.run(&records, address).await;
        self.attribute(&records, counting.now);
        let mut to_judge = Vec::new();
        for record in records {
            to_judge.extend(self.finish_one(config, record, &scope).await);
        }
        let run = FiledRun {
            to_judge,
            replica_run: !replica.is_empty(),
            by_replica: !scope.replicas.is_empty(),
            rollout: self.board.rollout(&target),
            fleet: self.board.fleet(&target),
        };
        self.verdicts.judge_filed(config, run).await;
    }

    /// Stores the records of a run without exporting or judging it.
    async fn store_only(&self, records: Vec<RunRecord>) {
        for record in records {
            log_run(&record);
            let _ = self
                .store
                .call_until_free(move |s| s.insert_run_filed(&record, &FleetScope::default()))
                .await;
        }
    }

    /// Counts the requests through the service that a gateway attributed
    /// to an endpoint, on the board and on `/metrics`.
    fn attribute(&self, records: &[RunRecord], now: chrono::DateTime<chrono::Utc>) {
        let Some(target) = records
            .first()
            .filter(|r| r.replica.is_empty())
            .map(|r| r.target.as_str())
        else {
            return;
        };
        let served = records.iter().flat_map(|r| &r.samples).filter_map(|s| {
            let endpoint = s.served_by.as_deref()?;
            Some((endpoint, s.outcome))
        });
        let labelled = self.board.note_served(target, served, now);
        self.metrics.gateway.count(target, &labelled);
    }

    /// Files and exports one record; returns the pair and build to judge.
    async fn finish_one(
        &self,
        config: &Config,
        mut record: RunRecord,
        scope: &FleetScope,
    ) -> Option<(PairKey, String)> {
        // A drift canary is judged by its answers, not its latency.
        let drift_canary = config
            .scenarios
            .iter()
            .any(|s| s.name == record.scenario && s.kind == ScenarioKind::Drift);
        let judge = (record.outcome == RunOutcome::Ok && !drift_canary).then(|| PairKey {
            target: record.target.clone(),
            model: record.model.clone(),
            scenario: record.scenario.clone(),
        });
        let identity = record.server.clone();
        let mut condition = config
            .target(&record.target)
            .and_then(|t| super::identity::seen_in(&record, t, &self.board));
        let stored = record.clone();
        let scope_for_store = scope.clone();
        let filed = self
            .store
            .call_until_free(move |s| s.insert_run_filed(&stored, &scope_for_store))
            .await
            .ok();
        record.build = Some(match &filed {
            Some((_, observed)) => observed.build.clone(),
            None => identity.version.clone().unwrap_or_else(|| "unknown".into()),
        });
        log_run(&record);
        self.metrics.runs.record_run(&record, true);
        if !record.replica.is_empty() {
            let build = (record.summary.completed > 0)
                .then_some(record.build.as_deref())
                .flatten();
            let moved = self.board.set_replica_run(
                &record.target,
                &record.replica,
                build,
                record.outcome.as_str(),
                record.started_at,
            );
            // A replica now at another build loses its old build's series.
            if let (Some(_), Some(build)) = (moved, build) {
                self.metrics
                    .runs
                    .keep_replica_build(&record.target, &record.replica, build);
            }
        }
        if let Some((_, observed)) = &filed
            && record.summary.completed > 0
        {
            if observed.limited {
                condition = Some(crate::state::IdentityCondition::FingerprintChurn);
            }
            super::identity::note(&self.metrics, &self.board, &record.target, condition);
        }
        let (run_id, observed) = filed?;
        // Filing the run also files the server's identity: a build change a
        // run saw first is announced like one the watcher saw.
        if let Some(change) = &observed.change {
            self.verdicts
                .announce(&record.target, &record.model, &identity, change);
        }
        if record.summary.completed > 0 {
            self.verdicts.fleet_changed(&record.target, &observed);
        }
        if drift_canary && !record.answers.is_empty() {
            super::drift::judge(&self.verdicts, config, &record, run_id, &observed.build).await;
        }
        judge.map(|key| (key, observed.build))
    }
}

/// A run served by several builds files the one the target was known to
/// serve first: the others are the new ones (one build change, not one
/// per order the records happen to come in).
fn known_first(records: &mut [RunRecord], known: &[String]) {
    records.sort_by_key(|r| {
        let version = r.server.version.as_deref().unwrap_or("");
        !known.iter().any(|k| k == version)
    });
}

/// One line per run; server text is logged escaped (Debug), on one line
/// whatever it holds.
fn log_run(record: &RunRecord) {
    let outcome = record.outcome;
    match &record.error {
        Some(e) if outcome != RunOutcome::Ok => tracing::warn!(
            target = %record.target, replica = %record.replica, scenario = %record.scenario,
            outcome = outcome.as_str(), error = ?e, "run failed"
        ),
        _ => tracing::info!(
            target = %record.target, replica = %record.replica, scenario = %record.scenario,
            outcome = outcome.as_str(), build = record.build.as_deref().unwrap_or(""),
            completed = record.summary.completed, failed = record.summary.failed,
            ttft_p50_ms = crate::text::round_ms(record.summary.ttft.p50),
            tpot_p50_ms = crate::text::round_ms(record.summary.tpot.p50),
            "run finished"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    /// A run of `target`'s scenario `s` on model `m` that ended now.
    fn ok_run(target: &str) -> RunRecord {
        RunRecord::failed(
            target,
            "s",
            "m",
            Utc::now(),
            1.0,
            RunOutcome::Ok,
            String::new(),
        )
    }

    /// A filing task over `config`, an in-memory store and a new board.
    fn filing_of(
        config: Config,
    ) -> (
        Filer,
        JoinHandle<()>,
        Arc<Metrics>,
        Arc<TargetStates>,
        AsyncStore,
    ) {
        let metrics = Arc::new(Metrics::new().unwrap());
        let board = Arc::new(TargetStates::default());
        let store = AsyncStore::new(
            crate::store::Store::in_memory().unwrap(),
            Arc::new(|e| panic!("{e}")),
        );
        let verdicts = Verdicts {
            store: store.clone(),
            metrics: metrics.clone(),
            board: board.clone(),
            notifier: crate::notify::channel().0,
            upgrades: tokio::sync::watch::channel(0).0,
            nondeterministic: Arc::default(),
            clock: crate::clock::Clock::System,
        };
        let (filer, task) = spawn(Filing {
            live: Arc::new(LiveConfig::new(config, None)),
            metrics: metrics.clone(),
            board: board.clone(),
            store: store.clone(),
            verdicts,
        });
        (filer, task, metrics, board, store)
    }

    /// A run of a target the configuration no longer has is stored, and
    /// neither exported nor judged; a configured target's run is both.
    #[tokio::test]
    async fn a_removed_targets_run_is_stored_and_shown_no_more() {
        let config = Config::from_text(
            "[[targets]]\nname = \"b\"\nbase_url = \"http://127.0.0.1:9\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nnum_requests = 1\n",
            "the test configuration",
        )
        .unwrap();
        let (filer, task, metrics, board, store) = filing_of(config);
        for target in ["a", "b"] {
            filer.file(vec![ok_run(target)], None).await;
        }
        drop(filer);
        task.await.unwrap();
        let stored = store.blocking().runs(&Default::default()).unwrap();
        let mut targets: Vec<&str> = stored.iter().map(|r| r.target.as_str()).collect();
        targets.sort();
        assert_eq!(targets, ["a", "b"]);
        let page = metrics.encode();
        assert!(page.contains("target=\"b\""), "{page}");
        assert!(!page.contains("target=\"a\""), "{page}");
        assert!(!board.targets().contains_key("a"));
    }

    /// A pod's run counts toward an objective listing the pod's address by
    /// the address handed over with it, taken when it was probed: the pod
    /// has left the list (the board knows no replica) when it is filed.
    #[tokio::test]
    async fn a_pods_run_counts_by_the_address_it_was_probed_at() {
        let config = Config::from_text(
            "[[targets]]\nname = \"b\"\nbase_url = \"http://127.0.0.1:9\"\n\
[targets.replicas]\nstatic = [\"http://10.0.0.9:8000\"]\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nnum_requests = 1\n\
[[slos]]\nname = \"pod\"\nsli = \"success\"\nreplicas = [\"10.0.0.9:8000\"]\n\
objective = 99\nwindow = \"1d\"\n",
            "the test configuration",
        )
        .unwrap();
        let (filer, task, _, _, store) = filing_of(config);
        let failed = || {
            let mut run = ok_run("b");
            run.outcome = RunOutcome::Failed(crate::client::Outcome::Connect);
            run.replica = "vllm-a".into();
            vec![run]
        };
        filer.file(failed(), Some("10.0.0.9:8000".into())).await;
        // Named by its pod alone, a run is not the address's.
        filer.file(failed(), None).await;
        drop(filer);
        task.await.unwrap();
        let since = Utc::now() - chrono::Duration::hours(1);
        let counted = store
            .blocking()
            .slo_counts("pod", Utc::now(), &[since])
            .unwrap();
        assert_eq!((counted[0].good, counted[0].total), (0, 1));
    }

    #[test]
    fn the_build_known_to_serve_is_filed_first() {
        let record = |version: &str| {
            let mut r = ok_run("t");
            r.server.version = Some(version.to_owned());
            r
        };
        let mut records = vec![record("0.32.0"), record("0.33.0")];
        known_first(&mut records, &["0.33.0".to_owned()]);
        let order: Vec<_> = records
            .iter()
            .map(|r| r.server.version.clone().unwrap())
            .collect();
        assert_eq!(order, ["0.33.0", "0.32.0"]);
        // Nothing known: the order the probe gave.
        known_first(&mut records, &[]);
        assert_eq!(records[0].server.version.as_deref(), Some("0.33.0"));
    }
}
