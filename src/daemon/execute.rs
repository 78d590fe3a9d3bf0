//! One scheduled run, start to finish: read the load, probe under a
//! deadline (aborted only after the shutdown grace period), read the load
//! again, then hand the run to the target's filing task.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::background::read_load;
use super::filing::{Filer, Probed};
use super::heartbeat::{self, HeartbeatEnd};
use super::liveness::{Liveness, attributed, watch_run};
use super::verdicts::Verdicts;
use crate::client::Secret;
use crate::client::progress::RunProgress;
use crate::config::{Config, RunLength, ScenarioConfig, TargetConfig};
use crate::discovery::Replica;
use crate::metrics::Metrics;
use crate::probe::{self, ProbeSpec};
use crate::state::TargetStates;
use crate::telemetry::TargetWatch;
use crate::vocabulary::records::ServerLoad;
use crate::vocabulary::records::{self, RUN_PERCENTILES, RunOutcome, RunRecord};

/// The probe settings of one (target, scenario) run.
pub fn spec_for(
    target: &TargetConfig,
    scenario: &ScenarioConfig,
    key: Option<Secret>,
    run_id: String,
) -> ProbeSpec {
    let (num_requests, dispatch_window) = match scenario.length {
        RunLength::Requests(n) => (n as usize, None),
        RunLength::Duration {
            duration,
            max_requests,
        } => (max_requests as usize, Some(duration)),
    };
    ProbeSpec {
        base_url: target.base_url.clone(),
        model: target.model.clone(),
        endpoint: scenario.endpoint.unwrap_or(target.endpoint),
        api_key: key,
        timeouts: target.timeouts,
        input_len: scenario.input_len,
        output_len: scenario.output_len,
        range_ratio: scenario.range_ratio,
        num_requests,
        concurrency: Some(scenario.concurrency as usize),
        request_rate: None,
        burstiness: 1.0,
        warmup: scenario.warmup as usize,
        percentiles: RUN_PERCENTILES.to_vec(),
        slos: scenario.slos,
        // A fresh seed per run: new prompts every time, so no run is
        // flattered by the prefix cache left by the previous one.
        seed: rand::random(),
        run_id,
        ignore_eos: true,
        min_tokens: true,
        calibrate: true,
        dispatch_window,
        dataset: scenario.dataset.as_ref().map(|d| d.get().clone()),
        shared_prefix_len: scenario.shared_prefix_len,
        metrics_url: target.metrics_url.clone(),
        kind: scenario.kind,
        turns: scenario.turns,
        progress: None,
        headers: crate::client::RequestHeaders::default(),
        gateway: target.gateway_rules(),
        build_header: target.build_header.clone(),
    }
}

/// The target as probed: through its service, or as one replica.
fn probed(target: &TargetConfig, replica: Option<&Replica>) -> TargetConfig {
    match replica {
        Some(r) => target.at_replica(&r.base_url),
        None => target.clone(),
    }
}

/// How a run ended, as the worker needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunEnd {
    pub outcome: RunOutcome,
    /// The longest `Retry-After` a 429 or 503 answer asked for: the target
    /// is left alone that long.
    pub retry_after: Option<Duration>,
}

/// How a bounded piece of work ended.
#[derive(Debug, PartialEq)]
pub enum Bounded<T> {
    Finished(T),
    /// It outlived its deadline.
    Deadline,
    /// Shutdown came and the grace period passed.
    Aborted,
}

/// Runs `work` until it finishes, its deadline passes, or shutdown plus
/// the grace period: a probe in flight at shutdown may finish within the
/// grace period, never longer.
pub async fn bounded<T>(
    work: impl Future<Output = T>,
    deadline: Duration,
    shutdown: &CancellationToken,
    grace: Duration,
) -> Bounded<T> {
    let aborted = async {
        shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = tokio::time::timeout(deadline, work) => match r {
            Ok(v) => Bounded::Finished(v),
            Err(_) => Bounded::Deadline,
        },
        _ = aborted => Bounded::Aborted,
    }
}

/// What a run reads from and writes to.
#[derive(Clone)]
pub struct RunContext {
    pub http: reqwest::Client,
    pub metrics: Arc<Metrics>,
    pub board: Arc<TargetStates>,
    pub filer: Filer,
    pub verdicts: Verdicts,
    pub shutdown: CancellationToken,
}

impl RunContext {
    /// Runs one scenario against one target (through its service, or
    /// against one replica) and records the result.
    pub async fn run_once(
        &self,
        config: &Config,
        target: &TargetConfig,
        replica: Option<&Replica>,
        scenario: &ScenarioConfig,
        liveness: &Liveness,
    ) -> RunEnd {
        let target = &probed(target, replica);
        if replica.is_none() {
            self.board.set_running(&target.name, Some(&scenario.name));
        }
        let started_at = self.verdicts.clock.now();
        let clock = std::time::Instant::now();
        let attempt = Attempt {
            target: &target.name,
            replica: replica.map(|r| r.label.clone()).unwrap_or_default(),
            scenario,
            started_at,
            model_label: self
                .board
                .model_label(&target.name, target.model.as_deref()),
            image: image_of(&self.board, &target.name, replica),
        };
        let key = match target.api_key.as_ref().map(|s| s.load(false)).transpose() {
            Ok(k) => k.flatten(),
            Err(e) => {
                let record = attempt.failed(RunOutcome::Config, 0.0, format!("API key: {e}"));
                return self.hand_over(vec![record], replica, None).await;
            }
        };
        let headers = match target.request_headers() {
            Ok(h) => h,
            Err(e) => {
                let record = attempt.failed(RunOutcome::Config, 0.0, e);
                return self.hand_over(vec![record], replica, None).await;
            }
        };
        // A key the watch cannot use is reported by the probe itself.
        let watch = TargetWatch::new(
            self.http.clone(),
            target.clone(),
            key.clone(),
            config.telemetry.scrape_timeout,
        )
        .ok();
        let load_before = match &watch {
            Some(w) => self.load_of(&attempt, w).await,
            None => None,
        };
        let run_id = format!(
            "{}-{}-{}",
            target.name,
            scenario.name,
            started_at.timestamp_millis()
        );
        let mut spec = spec_for(target, scenario, key.clone(), run_id);
        spec.headers = headers.clone();
        let progress = Arc::new(RunProgress::default());
        spec.progress = Some(progress.clone());
        let grace = config.scheduler.shutdown_grace;
        let probing = bounded(
            probe::run(&spec, None),
            scenario.deadline,
            &self.shutdown,
            grace,
        );
        let heartbeat = target.heartbeat;
        let result = if heartbeat.enabled {
            watch_run(probing, &progress, liveness, &heartbeat).await
        } else {
            Some(probing.await)
        };
        let elapsed = clock.elapsed().as_secs_f64();
        let (mut records, retry_after) = match result {
            Some(result) => self.record_of(&attempt, result, elapsed, grace, &progress),
            // A wedge is an outage, not a latency: the run is cut (its
            // requests would only wait out their timeouts on a server that
            // generates nothing), failed with that reason, and kept out of
            // baselines and verdicts.
            None => {
                let named = match replica {
                    None => attributed(&self.board.replicas_not_generating(&target.name)),
                    Some(_) => String::new(),
                };
                let reason = format!(
                    "the engine generated no token for {} during the run (not generating){named}",
                    humantime::format_duration(heartbeat.timeout),
                );
                let mut record = attempt.failed(RunOutcome::NotGenerating, elapsed, reason);
                count_sent(&mut record, &progress, crate::client::Outcome::NoFirstToken);
                (vec![record], None)
            }
        };
        // A run cut short still sent requests: each is counted, those in
        // flight as `timeout` (the run's deadline, or shutdown, ended them).
        for record in records
            .iter_mut()
            .filter(|r| matches!(r.outcome, RunOutcome::Deadline | RunOutcome::Aborted))
        {
            count_sent(record, &progress, crate::client::Outcome::Timeout);
        }
        if heartbeat.enabled
            && let Some(r) = records
                .iter()
                .find(|r| r.outcome == RunOutcome::Failed(crate::client::Outcome::Connect))
        {
            let why = r.error.clone().unwrap_or_default();
            liveness.note(
                crate::verdict::liveness::Evidence::Unreachable { why },
                &heartbeat,
            );
        }
        let load_after = match &watch {
            Some(w) if !records.iter().any(|r| r.outcome == RunOutcome::Aborted) => {
                self.load_of(&attempt, w).await
            }
            _ => None,
        };
        for record in &mut records {
            // Whatever the server said, the key never reaches the store, a
            // page or a log, and no control character does either.
            record.error = record
                .error
                .take()
                .map(|e| scrub(&headers.scrub(&e), key.as_ref()));
            record.load_before = load_before;
            record.load_after = load_after;
        }
        self.hand_over(records, replica, retry_after).await
    }

    /// One heartbeat against the target's service, or one replica.
    pub async fn heartbeat(
        &self,
        target: &TargetConfig,
        replica: Option<&Replica>,
    ) -> HeartbeatEnd {
        let target = &probed(target, replica);
        let key = target
            .api_key
            .as_ref()
            .and_then(|s| s.load(false).ok())
            .flatten();
        // Headers that cannot be read now: the heartbeat goes without them,
        // and the next run says why.
        let headers = target.request_headers().unwrap_or_default();
        let model = self
            .board
            .known_model(&target.name, target.model.as_deref());
        let id = format!(
            "sentinel-heartbeat-{}-{}",
            target.name,
            self.verdicts.clock.now().timestamp_millis()
        );
        heartbeat::beat(
            &self.http,
            target,
            model.as_deref(),
            key,
            &headers,
            &target.heartbeat,
            id,
        )
        .await
    }

    /// Hands the run to the target's filing task and says how it ended:
    /// its worst part's outcome.
    async fn hand_over(
        &self,
        records: Vec<RunRecord>,
        replica: Option<&Replica>,
        retry_after: Option<Duration>,
    ) -> RunEnd {
        let outcome = records
            .iter()
            .map(|r| r.outcome)
            .find(|o| *o != RunOutcome::Ok)
            .unwrap_or(RunOutcome::Ok);
        for record in records.iter().filter(|r| r.summary.completed > 0) {
            self.board.remember_model(&record.target, &record.model);
        }
        if let Some(record) = records.first().filter(|r| r.replica.is_empty()) {
            self.board.set_running(&record.target, None);
        }
        self.filer.file(records, Probed::of(replica).address).await;
        RunEnd {
            outcome,
            retry_after,
        }
    }

    /// The server's load around a run. The target's load gauges are the
    /// service's; a replica's load goes only into its run's record.
    async fn load_of(&self, attempt: &Attempt<'_>, watch: &TargetWatch) -> Option<ServerLoad> {
        let model = Some(attempt.model_label.as_str());
        if attempt.replica.is_empty() {
            read_load(&self.metrics, &self.board, attempt.target, watch, model).await
        } else {
            watch.load(model).await?.ok()
        }
    }

    /// The records of a bounded probe (one per build that served it), and
    /// how long the server asked the worker to stay away.
    fn record_of(
        &self,
        attempt: &Attempt<'_>,
        result: Bounded<Result<probe::ProbeResult, probe::ProbeError>>,
        elapsed: f64,
        grace: Duration,
        progress: &RunProgress,
    ) -> (Vec<RunRecord>, Option<Duration>) {
        let target = attempt.target;
        match result {
            Bounded::Aborted => {
                self.metrics.schedule.run_aborted(target, "shutdown");
                let error = format!("aborted at shutdown after the {grace:?} grace period");
                (
                    vec![attempt.failed(RunOutcome::Aborted, elapsed, error)],
                    None,
                )
            }
            Bounded::Deadline => {
                self.metrics.schedule.run_aborted(target, "deadline");
                let error = format!(
                    "the run exceeded its deadline of {:?}",
                    attempt.scenario.deadline
                );
                (
                    vec![attempt.failed(RunOutcome::Deadline, elapsed, error)],
                    None,
                )
            }
            Bounded::Finished(Err(e)) => (
                vec![attempt.failed(
                    crate::probe::record::outcome_of_error(&e),
                    elapsed,
                    e.to_string(),
                )],
                None,
            ),
            Bounded::Finished(Ok(result)) => {
                let retry_after = result.records.iter().filter_map(|r| r.retry_after).max();
                let slos = &attempt.scenario.slos;
                let parts = result
                    .split_by_build(&RUN_PERCENTILES, slos)
                    .unwrap_or_else(|| vec![result]);
                let records = parts
                    .iter()
                    .map(|part| {
                        let mut record = RunRecord::from_probe(
                            target,
                            &attempt.scenario.name,
                            attempt.started_at,
                            part,
                            !slos.is_empty(),
                            // Each measured request's row was kept as it
                            // ended; the warm-up's, shown when the server
                            // was lost in it, were not.
                            |r| progress.take_row(r.index).unwrap_or_else(|| r.sample_row()),
                        );
                        record.replica = attempt.replica.clone();
                        // What Kubernetes says the pod runs outranks what
                        // a header said.
                        if let Some((image, digest)) = &attempt.image {
                            record.server.image = image.clone();
                            record.server.image_digest = Some(digest.clone());
                        }
                        record
                    })
                    .collect();
                (records, retry_after)
            }
        }
    }
}

/// One run of one scenario against one target, as its failed record
/// would name it.
struct Attempt<'a> {
    target: &'a str,
    /// `host:port` of the replica probed; empty through the service.
    replica: String,
    scenario: &'a ScenarioConfig,
    started_at: chrono::DateTime<Utc>,
    model_label: String,
    /// The image the server runs and its digest, when Kubernetes says.
    image: Option<(Option<String>, String)>,
}

/// The image a run's server runs, when Kubernetes says: the replica's
/// pod's; through the Service, the one every ready pod runs (with several,
/// a run cannot tell which served it, and names none).
fn image_of(
    board: &TargetStates,
    target: &str,
    replica: Option<&Replica>,
) -> Option<(Option<String>, String)> {
    match replica {
        Some(r) => {
            let placement = r.placement.as_ref()?;
            Some((placement.image.clone(), placement.image_digest.clone()?))
        }
        None => board
            .service_image(target)
            .map(|(image, digest)| (Some(image).filter(|i| !i.is_empty()), digest)),
    }
}

impl Attempt<'_> {
    fn failed(&self, outcome: RunOutcome, elapsed: f64, error: String) -> RunRecord {
        let mut record = RunRecord::failed(
            self.target,
            &self.scenario.name,
            &self.model_label,
            self.started_at,
            elapsed,
            outcome,
            error,
        );
        record.replica = self.replica.clone();
        record
    }
}

/// A server's message without the key it may echo and without control
/// characters.
fn scrub(error: &str, key: Option<&Secret>) -> String {
    let error = match key {
        Some(key) => key.scrub(error),
        None => error.to_owned(),
    };
    crate::text::clean(&error, crate::text::MAX_MESSAGE_LEN)
}

/// Puts every measured request the run sent into `record` (cut short, it
/// has no samples of its own): those that ended as they ended, with their
/// latencies (an objective judges them as it judges any run's), those
/// still in flight as `in_flight`. The run itself completed nothing, so
/// its summary counts every request as failed: a cut run never names a
/// build, starts a rollout or feeds a baseline.
fn count_sent(record: &mut RunRecord, progress: &RunProgress, in_flight: crate::client::Outcome) {
    let sent = progress.tally(in_flight);
    record.summary.completed = 0;
    record.summary.failed = sent.len();
    record.samples = sent
        .into_iter()
        .enumerate()
        .map(|(index, sample)| records::SampleRow { index, ..sample })
        .collect();
}

impl super::worker::Runs for RunContext {
    async fn run_once(
        &self,
        config: &Config,
        target: &TargetConfig,
        replica: Option<&Replica>,
        scenario: &ScenarioConfig,
        liveness: &Liveness,
    ) -> RunEnd {
        RunContext::run_once(self, config, target, replica, scenario, liveness).await
    }

    async fn heartbeat(
        &self,
        _: &Config,
        target: &TargetConfig,
        replica: Option<&Replica>,
    ) -> HeartbeatEnd {
        RunContext::heartbeat(self, target, replica).await
    }

    async fn pending_upgrade(&self, config: &Config, target: &TargetConfig) -> Option<String> {
        // The answer depends on the verdicts of the runs handed over.
        self.filer.flush().await;
        self.verdicts.pending_upgrade(config, target).await
    }

    async fn filed(&self) {
        self.filer.flush().await;
    }

    async fn heartbeat_counted(&self, target: &str, replica: Option<&Replica>, generating: bool) {
        self.filer
            .heartbeat(target, Probed::of(replica), generating)
            .await;
    }

    async fn skipped_run_counted(&self, target: &str, replica: Option<&Replica>, scenario: &str) {
        self.filer
            .skipped(target, Probed::of(replica), scenario)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_run_is_cut_at_its_deadline() {
        let shutdown = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let r = bounded(
            tokio::time::sleep(Duration::from_secs(3600)),
            Duration::from_secs(90),
            &shutdown,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(r, Bounded::Deadline);
        assert_eq!(started.elapsed(), Duration::from_secs(90));
        let r = bounded(
            async { 7 },
            Duration::from_secs(90),
            &shutdown,
            Duration::ZERO,
        )
        .await;
        assert_eq!(r, Bounded::Finished(7));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_aborts_a_run_only_after_the_grace_period() {
        let shutdown = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            stop.cancel();
        });
        let r = bounded(
            tokio::time::sleep(Duration::from_secs(3600)),
            Duration::from_secs(600),
            &shutdown,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(r, Bounded::Aborted);
        assert_eq!(started.elapsed(), Duration::from_secs(40));
        // A run that ends within the grace period ends as itself.
        let r = bounded(
            async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "done"
            },
            Duration::from_secs(600),
            &shutdown,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(r, Bounded::Finished("done"));
    }
}
