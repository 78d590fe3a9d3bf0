//! One worker per target's service and one per replica: turns the cron
//! schedules into runs, one at a time (never two probes at once against
//! one replica; a target's replica workers share `max_parallel` permits),
//! coalesces ticks missed while busy or paused instead of replaying them,
//! backs off a target (or replica) found down or asking for a pause, gives
//! a new build its upgrade rounds first, and re-plans when the
//! configuration is reloaded.
//! What one run does is behind [`Runs`], so the worker is tested alone on
//! tokio's paused clock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::{RwLock, Semaphore, watch};

pub use crate::clock::Clock;
use tokio_util::sync::CancellationToken;

use super::execute::RunEnd;
use super::heartbeat::HeartbeatEnd;
use super::liveness::Liveness;
pub use super::schedule::{Backoff, missed_ticks, plan_next};
use super::schedule::{UpgradeBudget, chrono_of};
use crate::config::live::LiveConfig;
use crate::config::schedules::Schedule;
use crate::config::{Config, ScenarioConfig, TargetConfig};
use crate::discovery::Replica;
use crate::metrics::Metrics;
use crate::state::TargetStates;
use crate::verdict::liveness::{Evidence, Generating};
use crate::vocabulary::records::RunOutcome;

/// What one run is, to the worker.
pub trait Runs: Send + Sync + 'static {
    /// Runs one scenario against the target (through its service, or
    /// against one replica) and records it.
    /// `liveness` takes what the run's requests show while in flight.
    fn run_once(
        &self,
        config: &Config,
        target: &TargetConfig,
        replica: Option<&Replica>,
        scenario: &ScenarioConfig,
        liveness: &Liveness,
    ) -> impl Future<Output = RunEnd> + Send;

    /// Sends one heartbeat (see [`super::heartbeat`]).
    fn heartbeat(
        &self,
        config: &Config,
        target: &TargetConfig,
        replica: Option<&Replica>,
    ) -> impl Future<Output = HeartbeatEnd> + Send;

    /// The next scenario a new build's verdict still needs a run of.
    fn pending_upgrade(
        &self,
        config: &Config,
        target: &TargetConfig,
    ) -> impl Future<Output = Option<String>> + Send;

    /// Resolves once every run handed over so far is filed (and exported).
    fn filed(&self) -> impl Future<Output = ()> + Send;

    /// Counts a heartbeat toward the objectives: after it, the target (or
    /// replica) generates or not.
    fn heartbeat_counted(
        &self,
        _target: &str,
        _replica: Option<&Replica>,
        _generating: bool,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Counts a run skipped because the target is backed off, found down,
    /// toward the objectives: one bad request, as a run that could not
    /// reach it counts (an outage must burn the budget at the schedule's
    /// rate, not at the back-off's).
    fn skipped_run_counted(
        &self,
        _target: &str,
        _replica: Option<&Replica>,
        _scenario: &str,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }
}

#[derive(Debug, Clone)]
struct Due {
    tick: DateTime<Utc>,
    at: DateTime<Utc>,
    /// The schedule (as written, and its jitter) the time came from: a
    /// reload that leaves it unchanged keeps the time, so a run whose
    /// tick has passed but whose jittered start has not is not lost.
    from: (String, Duration),
}

impl Due {
    /// The next tick of `schedule` after `now`, with its jitter drawn.
    fn next(schedule: &Schedule, now: DateTime<Utc>, rng: &mut StdRng) -> Option<Due> {
        let (tick, at) = plan_next(schedule, now, rng)?;
        let from = (schedule.expression.clone(), schedule.jitter);
        Some(Due { tick, at, from })
    }

    /// Whether this time was planned from `schedule` as it is now.
    fn planned_from(&self, schedule: &Schedule) -> bool {
        (self.from.0.as_str(), self.from.1) == (schedule.expression.as_str(), schedule.jitter)
    }
}

/// What waiting ended with.
enum Woken {
    Due,
    Heartbeat,
    Replan,
    Stop,
}

/// One worker (a target's service, or one of its replicas) and
/// everything it is handed.
pub struct Worker<R> {
    /// The target's name.
    pub name: String,
    /// The replica probed; `None`: the service (`base_url`).
    pub replica: Option<Replica>,
    /// Shared by the target's replica workers: a run holds a permit, so at
    /// most `max_parallel` replicas are probed at once.
    pub parallel: Option<Arc<Semaphore>>,
    /// The target's probing turn (see `Fleet`): a replica's probes share
    /// it, the service's hold it alone.
    pub turn: Arc<RwLock<()>>,
    pub live: Arc<LiveConfig>,
    pub runs: R,
    pub metrics: Arc<Metrics>,
    pub board: Arc<TargetStates>,
    pub upgrades: watch::Receiver<u64>,
    pub clock: Clock,
    /// Whether what this worker probes generates.
    pub liveness: Arc<Liveness>,
    /// Cancelled when the replica leaves the list: a run in flight then
    /// finishes without holding a permit, so a replica that hangs after
    /// leaving delays no other replica (it keeps the target's turn).
    pub released: CancellationToken,
}

/// A worker's hold on its target's probing turn (shared or alone), kept
/// while it probes.
type Turn = Box<dyn Send + Sync>;

/// The worker's own state between runs.
struct Plan {
    rng: StdRng,
    due: HashMap<String, Due>,
    down: DownState,
    /// Whether a new build may need upgrade runs: at start, after a build
    /// change or a reload, until the check finds none. Checking waits for
    /// the target's runs to be filed, so it is not done between every two.
    check_upgrades: bool,
    upgrade_budget: UpgradeBudget,
    /// When the next heartbeat is due; `None` when heartbeats are off.
    heartbeat_at: Option<DateTime<Utc>>,
    /// Whether the last heartbeat met a silence (true before the first:
    /// a wedge seen by a run is looked after too).
    last_beat_silent: bool,
}

impl<R: Runs> Worker<R> {
    /// Runs the target's schedule until `stop` (the target was removed, or
    /// shutdown). A probe in flight finishes under the configuration it
    /// started with.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut plan = Plan {
            rng: StdRng::seed_from_u64(rand::random()),
            due: HashMap::new(),
            down: DownState::default(),
            check_upgrades: true,
            upgrade_budget: UpgradeBudget {
                runs: 0.0,
                at: None,
                exhausted: false,
            },
            heartbeat_at: None,
            last_beat_silent: true,
        };
        let mut generation = self.live.subscribe();
        while !stop.is_cancelled() {
            let config = self.live.current();
            let Some(target) = config.target(&self.name).cloned() else {
                break;
            };
            // A reload while a run was going: schedules may have changed,
            // so plan again from now.
            if generation.has_changed().unwrap_or(false) {
                generation.borrow_and_update();
                plan.check_upgrades = true;
            }
            if self.upgrades.has_changed().unwrap_or(false) {
                self.upgrades.borrow_and_update();
                plan.check_upgrades = true;
            }
            self.plan(&config, &target, &mut plan);
            if let Some(scenario) = self.pending_upgrade(&config, &target, &mut plan).await {
                if !self
                    .upgrade_round(&config, &target, &scenario, &mut plan, &stop)
                    .await
                {
                    break;
                }
                continue;
            }
            match self.wait(&plan, &mut generation, &stop).await {
                Woken::Stop => break,
                Woken::Replan => {
                    plan.check_upgrades = true;
                    continue;
                }
                Woken::Heartbeat => {
                    self.heartbeat(&config, &target, &mut plan, &stop).await;
                    continue;
                }
                Woken::Due => {}
            }
            if !self.run_due(&config, &target, &mut plan, &stop).await {
                break;
            }
        }
        if self.replica.is_none() {
            self.board.set_next_due(&self.name, Vec::new());
        }
    }

    /// The scenario a new build still needs an upgrade run of, when one
    /// may and the target is not backed off.
    async fn pending_upgrade(
        &self,
        config: &Config,
        target: &TargetConfig,
        plan: &mut Plan,
    ) -> Option<ScenarioConfig> {
        if !plan.check_upgrades
            || plan.down.backing_off(self.clock.now())
            || !self.runs_upgrade_rounds(target)
        {
            return None;
        }
        let pending = self.runs.pending_upgrade(config, target).await;
        plan.check_upgrades = pending.is_some();
        let scenario = config.scenario(&pending?).cloned()?;
        if !plan.upgrade_budget.take(config, target, self.clock.now()) {
            if !plan.upgrade_budget.exhausted {
                plan.upgrade_budget.exhausted = true;
                tracing::warn!(
                    target = %self.name, replica = self.replica_label(),
                    max_rate_factor = config.scheduler.max_rate_factor,
                    "upgrade rounds paused: more would probe the target above max_rate_factor times its schedule; scheduled runs go on"
                );
            }
            self.metrics
                .schedule
                .run_skipped(&self.name, &scenario.name, "rate");
            return None;
        }
        Some(scenario)
    }

    /// The replica's `host:port`, empty for the service, for log lines.
    fn replica_label(&self) -> &str {
        self.replica.as_ref().map_or("", |r| r.label.as_str())
    }

    /// Upgrade rounds are the service worker's, or, when only replicas
    /// are probed, every replica worker's.
    fn runs_upgrade_rounds(&self, target: &TargetConfig) -> bool {
        self.replica.is_none() || !target.probe_mode().service()
    }

    /// One run, once this replica worker holds one of the target's
    /// permits; `None` when `stop` came first. `planned` is a scheduled
    /// run's planned start, whose delay is exported.
    async fn probe(
        &self,
        config: &Config,
        target: &TargetConfig,
        scenario: &ScenarioConfig,
        planned: Option<DateTime<Utc>>,
        stop: &CancellationToken,
    ) -> Option<RunEnd> {
        let _permit = match &self.parallel {
            Some(permits) => tokio::select! {
                permit = permits.clone().acquire_owned() => permit.ok(),
                _ = stop.cancelled() => return None,
            },
            None => None,
        };
        let _turn = tokio::select! {
            turn = self.take_turn() => turn,
            _ = stop.cancelled() => return None,
        };
        if let Some(at) = planned {
            let late = (self.clock.now() - at)
                .num_microseconds()
                .unwrap_or(i64::MAX);
            self.metrics
                .schedule
                .run_started(&self.name, &scenario.name, late as f64 / 1e6);
        }
        let run = self.runs.run_once(
            config,
            target,
            self.replica.as_ref(),
            scenario,
            &self.liveness,
        );
        tokio::pin!(run);
        tokio::select! {
            end = &mut run => return Some(end),
            // The turn stays: a replica off the list may still serve (a
            // reload that only stopped probing it), and the service's
            // probes must not meet this run there.
            _ = self.released.cancelled() => drop(_permit),
        }
        Some(run.await)
    }

    /// Waits for this worker's turn at the target: shared among replica
    /// workers, alone for the service's.
    async fn take_turn(&self) -> Turn {
        match self.replica {
            Some(_) => Box::new(self.turn.clone().read_owned().await),
            None => Box::new(self.turn.clone().write_owned().await),
        }
    }

    /// Gives every scenario without a due time its next one, and the
    /// heartbeat its time (one interval after start: a run due at once
    /// goes first).
    fn plan(&self, config: &Config, target: &TargetConfig, plan: &mut Plan) {
        let now = self.clock.now();
        plan.heartbeat_at = match (target.heartbeat.enabled, plan.heartbeat_at) {
            (false, _) => None,
            (true, None) => Some(now + chrono_of(target.heartbeat.interval)),
            (true, Some(at)) => Some(at.min(now + chrono_of(target.heartbeat.interval))),
        };
        let schedule_of = |s: &String| {
            let scenario = config
                .scenario(s)
                .filter(|_| target.scenarios.contains(s))?;
            Some(config.schedule_for(target, scenario))
        };
        // A time planned from another schedule than the scenario's now
        // (a reload changed it, or the scenario went) is planned again.
        plan.due
            .retain(|s, due| schedule_of(s).is_some_and(|now| due.planned_from(now)));
        for s in &target.scenarios {
            if let (false, Some(schedule)) = (plan.due.contains_key(s), schedule_of(s))
                && let Some(due) = Due::next(schedule, now, &mut plan.rng)
            {
                plan.due.insert(s.clone(), due);
            }
        }
        if self.replica.is_none() {
            self.board.set_next_due(
                &self.name,
                plan.due.iter().map(|(s, d)| (s.clone(), d.at)).collect(),
            );
        }
    }

    /// After a version change, the new build's runs come first, back to
    /// back (still one at a time), until its verdict can be reached.
    /// Returns false when the worker must stop.
    async fn upgrade_round(
        &self,
        config: &Config,
        target: &TargetConfig,
        scenario: &ScenarioConfig,
        plan: &mut Plan,
        stop: &CancellationToken,
    ) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(config.verdict_policy.upgrade_round_gap) => {}
            _ = stop.cancelled() => return false,
        }
        tracing::info!(target = %self.name, replica = self.replica_label(), scenario = %scenario.name, "upgrade round: probing the new build");
        self.metrics
            .schedule
            .upgrade_run(&self.name, &scenario.name);
        let Some(end) = self.probe(config, target, scenario, None, stop).await else {
            return false;
        };
        self.after(config, &mut plan.down, end);
        self.ran(target, plan, end);
        !(stop.is_cancelled() || end.outcome == RunOutcome::Aborted)
    }

    /// Sleeps until the first due run, a reload, a build change or `stop`.
    async fn wait(
        &mut self,
        plan: &Plan,
        generation: &mut watch::Receiver<u64>,
        stop: &CancellationToken,
    ) -> Woken {
        let next_run = plan.due.values().map(|d| d.at).min();
        let (next_at, woken) = match (next_run, plan.heartbeat_at) {
            (Some(run), Some(beat)) if beat < run => (Some(beat), Woken::Heartbeat),
            (None, Some(beat)) => (Some(beat), Woken::Heartbeat),
            (run, _) => (run, Woken::Due),
        };
        let wait = next_at.map(|at| (at - self.clock.now()).to_std().unwrap_or(Duration::ZERO));
        let sleep = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => woken,
            // A new build: its upgrade rounds are checked at once.
            _ = self.upgrades.changed() => Woken::Replan,
            _ = stop.cancelled() => Woken::Stop,
            _ = generation.changed() => {
                generation.borrow_and_update();
                Woken::Replan
            }
        }
    }

    /// Runs everything due now in order, one at a time, counting the ticks
    /// missed meanwhile. Returns false when the worker must stop.
    async fn run_due(
        &self,
        config: &Config,
        target: &TargetConfig,
        plan: &mut Plan,
        stop: &CancellationToken,
    ) -> bool {
        loop {
            let now = self.clock.now();
            let Some((scenario_name, (tick, planned))) = plan
                .due
                .iter()
                .filter(|(_, d)| d.at <= now)
                .min_by_key(|(_, d)| d.at)
                .map(|(s, d)| (s.clone(), (d.tick, d.at)))
            else {
                return true;
            };
            let Some(scenario) = config.scenario(&scenario_name).cloned() else {
                plan.due.remove(&scenario_name);
                continue;
            };
            let schedule = config.schedule_for(target, &scenario);
            for _ in 0..missed_ticks(schedule, tick, now) {
                self.metrics
                    .schedule
                    .run_skipped(&self.name, &scenario_name, "busy");
            }
            match Due::next(schedule, now, &mut plan.rng) {
                Some(due) => {
                    plan.due.insert(scenario_name.clone(), due);
                }
                None => {
                    plan.due.remove(&scenario_name);
                }
            }
            if plan.down.backing_off(now) {
                self.metrics
                    .schedule
                    .run_skipped(&self.name, &scenario_name, "backoff");
                // Asked to wait (`Retry-After`), the server is not down.
                if !plan.down.asked_to_wait(now) {
                    self.runs
                        .skipped_run_counted(&self.name, self.replica.as_ref(), &scenario_name)
                        .await;
                }
                continue;
            }
            let Some(end) = self
                .probe(config, target, &scenario, Some(planned), stop)
                .await
            else {
                return false;
            };
            self.after(config, &mut plan.down, end);
            self.ran(target, plan, end);
            if stop.is_cancelled() || end.outcome == RunOutcome::Aborted {
                return false;
            }
        }
    }

    /// A run that went well was the liveness evidence while it ran: the
    /// next heartbeat is one interval after it. One whose server went
    /// silent or away is followed by a heartbeat at once, so a wedge that
    /// began mid-stream is told within one heartbeat timeout.
    fn ran(&self, target: &TargetConfig, plan: &mut Plan, end: RunEnd) {
        if let Some(at) = plan.heartbeat_at.as_mut() {
            let wait = if end.outcome.target_down() {
                Duration::ZERO
            } else {
                target.heartbeat.interval
            };
            *at = self.clock.now() + chrono_of(wait);
        }
    }

    /// Sends a heartbeat, unless the target is down and backed off, and
    /// plans the next one. Never at once with a run: the worker does one
    /// thing at a time, and it waits for the target's turn like a run.
    async fn heartbeat(
        &self,
        config: &Config,
        target: &TargetConfig,
        plan: &mut Plan,
        stop: &CancellationToken,
    ) {
        let now = self.clock.now();
        plan.heartbeat_at = Some(now + chrono_of(target.heartbeat.interval));
        // Backed off, only a server known to be wedged (silent) is still
        // asked: its recovery is what the heartbeat is for. One found
        // down, answering errors, asking to wait, or not known yet is left
        // alone like its runs.
        let wedged =
            plan.last_beat_silent && self.liveness.state() == Some(Generating::NotGenerating);
        if plan.down.backing_off(now) && (!wedged || plan.down.asked_to_wait(now)) {
            // Not sent, it still counts toward the objectives as the
            // target was last found, so that liveness burns its budget at
            // the heartbeat's rate while the target is down.
            if let Some(state) = self.liveness.state() {
                self.runs
                    .heartbeat_counted(
                        &self.name,
                        self.replica.as_ref(),
                        state == Generating::Generating,
                    )
                    .await;
            }
            return;
        }
        let end = {
            // The target's turn, as a run takes it: a service run held up
            // by a wedged replica behind the balancer delays that
            // replica's heartbeat until the run is cut, which its own
            // requests' first-token wait bounds.
            let _turn = tokio::select! {
                turn = self.take_turn() => turn,
                _ = stop.cancelled() => return,
            };
            self.runs
                .heartbeat(config, target, self.replica.as_ref())
                .await
        };
        plan.last_beat_silent = end.silent;
        self.metrics
            .liveness
            .heartbeat(&self.name, self.replica_label(), end.outcome);
        let Some(evidence) = end.evidence else {
            return;
        };
        // The heartbeat counts like a run for the back-off: a server
        // found down is left alone, one that generates again is not.
        let outcome = match &evidence {
            Evidence::Token { .. } => RunOutcome::Ok,
            Evidence::NoToken { .. } => RunOutcome::Failed(end.outcome),
            Evidence::Unreachable { .. } => RunOutcome::Failed(crate::client::Outcome::Connect),
        };
        self.liveness.note(evidence, &target.heartbeat);
        if let Some(state) = self.liveness.state() {
            let generating = state == Generating::Generating;
            self.runs
                .heartbeat_counted(&self.name, self.replica.as_ref(), generating)
                .await;
        }
        self.after(
            config,
            &mut plan.down,
            RunEnd {
                outcome,
                retry_after: end.retry_after,
            },
        );
        plan.heartbeat_at = Some(self.clock.now() + chrono_of(target.heartbeat.interval));
    }
}

#[path = "worker_backoff.rs"]
mod backoff;
use backoff::DownState;

#[cfg(test)]
#[path = "worker_tests.rs"]
pub(crate) mod scripted_tests;
