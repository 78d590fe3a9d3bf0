//! The worker alone, on tokio's paused clock: a scripted [`Runs`] stands
//! in for the probe, so hours of schedule pass in milliseconds and every
//! timing is exact.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::client::Outcome;

const DOWN: RunOutcome = RunOutcome::Failed(Outcome::Connect);

/// One scripted run: how long it takes and how it ends.
#[derive(Clone, Copy)]
pub(crate) struct Step {
    pub(crate) takes: Duration,
    pub(crate) outcome: RunOutcome,
    pub(crate) retry_after: Option<Duration>,
}

pub(crate) fn step(takes_s: u64, outcome: RunOutcome) -> Step {
    Step {
        takes: Duration::from_secs(takes_s),
        outcome,
        retry_after: None,
    }
}

#[derive(Clone)]
pub(crate) struct Scripted {
    pub(crate) origin: Instant,
    steps: Arc<Mutex<VecDeque<Step>>>,
    otherwise: Step,
    upgrades_pending: Arc<Mutex<u32>>,
    /// How often the worker asked for pending upgrade runs.
    upgrade_checks: Arc<Mutex<u32>>,
    /// (start, end) of each run in seconds since `origin`.
    runs: Arc<Mutex<Vec<(f64, f64)>>>,
    running: Arc<Mutex<u32>>,
    pub(crate) most_at_once: Arc<Mutex<u32>>,
    /// The replica each run probed ("" for the service) and when it
    /// started, in start order.
    pub(crate) probed: Arc<Mutex<Vec<(String, f64)>>>,
    /// The same for heartbeats.
    pub(crate) heartbeats: Arc<Mutex<Vec<(String, f64)>>>,
    /// Each run's replica, start and end.
    pub(crate) spans: Arc<Mutex<Vec<(String, f64, f64)>>>,
    /// How a heartbeat goes.
    pub(crate) beat: Arc<Mutex<Step>>,
    /// What was counted toward the objectives: each heartbeat's
    /// `generating`, and how many runs were skipped while down.
    pub(crate) beats_counted: Arc<Mutex<Vec<bool>>>,
    pub(crate) skips_counted: Arc<Mutex<u32>>,
}

impl Scripted {
    pub(crate) fn new(otherwise: Step) -> Self {
        Scripted {
            origin: Instant::now(),
            steps: Arc::default(),
            otherwise,
            upgrades_pending: Arc::default(),
            upgrade_checks: Arc::default(),
            runs: Arc::default(),
            running: Arc::default(),
            most_at_once: Arc::default(),
            probed: Arc::default(),
            heartbeats: Arc::default(),
            spans: Arc::default(),
            beat: Arc::new(Mutex::new(step(0, RunOutcome::Ok))),
            beats_counted: Arc::default(),
            skips_counted: Arc::default(),
        }
    }

    fn starts(&self) -> Vec<f64> {
        self.runs.lock().unwrap().iter().map(|r| r.0).collect()
    }
}

impl Runs for Scripted {
    async fn run_once(
        &self,
        _: &Config,
        _: &TargetConfig,
        replica: Option<&Replica>,
        _: &ScenarioConfig,
        _: &Liveness,
    ) -> RunEnd {
        let start = self.origin.elapsed().as_secs_f64();
        self.probed
            .lock()
            .unwrap()
            .push((replica.map(|r| r.label.clone()).unwrap_or_default(), start));
        {
            let mut n = self.running.lock().unwrap();
            *n += 1;
            let mut most = self.most_at_once.lock().unwrap();
            *most = (*most).max(*n);
        }
        let s = self
            .steps
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(self.otherwise);
        tokio::time::sleep(s.takes).await;
        *self.running.lock().unwrap() -= 1;
        let end = self.origin.elapsed().as_secs_f64();
        self.runs.lock().unwrap().push((start, end));
        self.spans.lock().unwrap().push((
            replica.map(|r| r.label.clone()).unwrap_or_default(),
            start,
            end,
        ));
        RunEnd {
            outcome: s.outcome,
            retry_after: s.retry_after,
        }
    }

    async fn heartbeat(
        &self,
        _: &Config,
        _: &TargetConfig,
        replica: Option<&Replica>,
    ) -> HeartbeatEnd {
        let at = self.origin.elapsed().as_secs_f64();
        self.heartbeats
            .lock()
            .unwrap()
            .push((replica.map(|r| r.label.clone()).unwrap_or_default(), at));
        let s = *self.beat.lock().unwrap();
        tokio::time::sleep(s.takes).await;
        let evidence = match s.outcome {
            RunOutcome::Ok => Evidence::Token {
                ttft: Some(Duration::from_millis(30)),
            },
            DOWN => Evidence::Unreachable {
                why: "refused".into(),
            },
            _ => Evidence::NoToken { waited: s.takes },
        };
        let outcome = match s.outcome {
            RunOutcome::Ok => Outcome::Ok,
            RunOutcome::Failed(o) => o,
            _ => Outcome::NoFirstToken,
        };
        HeartbeatEnd {
            outcome,
            evidence: Some(evidence),
            silent: matches!(outcome, Outcome::NoFirstToken | Outcome::Stalled),
            retry_after: s.retry_after,
        }
    }

    async fn pending_upgrade(&self, _: &Config, target: &TargetConfig) -> Option<String> {
        *self.upgrade_checks.lock().unwrap() += 1;
        let mut n = self.upgrades_pending.lock().unwrap();
        (*n > 0).then(|| {
            *n -= 1;
            target.scenarios[0].clone()
        })
    }

    async fn filed(&self) {}

    async fn heartbeat_counted(&self, _: &str, _: Option<&Replica>, generating: bool) {
        self.beats_counted.lock().unwrap().push(generating);
    }

    async fn skipped_run_counted(&self, _: &str, _: Option<&Replica>, _: &str) {
        *self.skips_counted.lock().unwrap() += 1;
    }
}

/// The worker's schedule alone: heartbeats off (see [`beating`]).
fn config(schedule: &str, extra: &str) -> Config {
    beating(schedule, extra, "enabled = false")
}

/// With `[targets.heartbeat]` set to `heartbeat`.
fn beating(schedule: &str, extra: &str, heartbeat: &str) -> Config {
    Config::from_text(
        &format!(
            "[store]\npath = \"/tmp/worker-test.db\"\n[scheduler]\nschedule = \"{schedule}\"\n\
backoff_initial = \"4s\"\nbackoff_max = \"16s\"\n{extra}\n\
[[targets]]\nname = \"t\"\nbase_url = \"http://127.0.0.1:9\"\nscenarios = [\"s\"]\n\
[targets.heartbeat]\n{heartbeat}\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nnum_requests = 1\nwarmup = 0\n"
        ),
        "the test configuration",
    )
    .unwrap()
}

/// Starts a worker at 00:00:00.5 UTC (virtual) and stops it after `for_s`.
async fn run_worker(live: Arc<LiveConfig>, runs: Scripted, for_s: u64) -> Arc<Metrics> {
    run_worker_told(live, runs, for_s, watch::channel(0).0).await
}

/// The same, told of build changes through `upgrades`.
async fn run_worker_told(
    live: Arc<LiveConfig>,
    runs: Scripted,
    for_s: u64,
    upgrades: watch::Sender<u64>,
) -> Arc<Metrics> {
    let parts = watched();
    let metrics = parts.0.clone();
    run_watched(live, runs, for_s, &upgrades, parts).await;
    metrics
}

/// A service worker's metrics, board and liveness, for tests that watch
/// them while it runs.
pub(super) type Watched = (Arc<Metrics>, Arc<TargetStates>, Arc<Liveness>);

pub(super) fn watched() -> Watched {
    let metrics = Arc::new(Metrics::new().unwrap());
    let board = Arc::new(TargetStates::default());
    let start: DateTime<Utc> = "2026-01-01T00:00:00.5Z".parse().unwrap();
    let liveness = Arc::new(Liveness::new(
        "t",
        "",
        metrics.clone(),
        board.clone(),
        Clock::tokio(start),
    ));
    (metrics, board, liveness)
}

/// Runs one service worker on `live` for `for_s` (virtual), starting at
/// 00:00:00.5 UTC, told of build changes through `upgrades`.
pub(super) async fn run_watched(
    live: Arc<LiveConfig>,
    runs: Scripted,
    for_s: u64,
    upgrades: &watch::Sender<u64>,
    (metrics, board, liveness): Watched,
) {
    let start: DateTime<Utc> = "2026-01-01T00:00:00.5Z".parse().unwrap();
    let worker = Worker {
        name: "t".into(),
        liveness,
        released: CancellationToken::new(),
        replica: None,
        parallel: None,
        turn: Default::default(),
        live,
        runs,
        metrics,
        board,
        upgrades: upgrades.subscribe(),
        clock: Clock::tokio(start),
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(for_s)).await;
    stop.cancel();
    task.await.unwrap();
}

fn counter(metrics: &Metrics, family: &str, label: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(family) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn gaps(starts: &[f64]) -> Vec<f64> {
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_up_to_its_cap_and_skipped_ticks_are_counted() {
    let live = Arc::new(LiveConfig::new(config("* * * * * *", ""), None));
    let runs = Scripted::new(step(0, DOWN));
    let metrics = run_worker(live, runs.clone(), 60).await;
    let gaps = gaps(&runs.starts());
    // Every second is a tick; a run that finds the target down backs it
    // off 4 s, 8 s, then 16 s (the cap) each time.
    let expected = [4.0, 8.0, 16.0, 16.0];
    assert!(gaps.len() >= 4, "{gaps:?}");
    for (g, e) in gaps.iter().zip(expected) {
        assert!(
            (e..=e + 1.0).contains(g),
            "gaps {gaps:?}, expected {expected:?}"
        );
    }
    let skipped = counter(
        &metrics,
        "sentinel_scheduler_skipped_runs_total",
        "reason=\"backoff\"",
    );
    assert!(skipped >= 40.0, "{skipped} ticks skipped while backed off");
    // Each counts toward the objectives as the run it stands for would.
    assert_eq!(f64::from(*runs.skips_counted.lock().unwrap()), skipped);
}

#[tokio::test(start_paused = true)]
async fn a_target_that_answers_again_clears_its_backoff() {
    let live = Arc::new(LiveConfig::new(config("* * * * * *", ""), None));
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    runs.steps
        .lock()
        .unwrap()
        .extend([step(0, DOWN), step(0, DOWN)]);
    run_worker(live, runs.clone(), 30).await;
    let gaps = gaps(&runs.starts());
    assert!(
        (4.0..=5.0).contains(&gaps[0]) && (8.0..=9.0).contains(&gaps[1]),
        "{gaps:?}"
    );
    assert!(
        gaps[2..].iter().all(|g| *g <= 1.01),
        "back to every tick: {gaps:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn ticks_missed_while_busy_are_counted_once_not_replayed() {
    let live = Arc::new(LiveConfig::new(config("*/10 * * * * *", ""), None));
    // Each run takes 35.5 s against a 10 s schedule.
    let runs = Scripted::new(Step {
        takes: Duration::from_millis(35_500),
        outcome: RunOutcome::Ok,
        retry_after: None,
    });
    let metrics = run_worker(live, runs.clone(), 100).await;
    let starts = runs.starts();
    // Due at 10 s; then at once after each run: 45.5 s, 81 s. No replay
    // of the ticks in between, never two at once.
    assert_eq!(starts.len(), 3, "{starts:?}");
    assert!(
        (starts[1] - 45.0).abs() < 1.0 && (starts[2] - 80.5).abs() < 1.0,
        "{starts:?}"
    );
    assert_eq!(*runs.most_at_once.lock().unwrap(), 1);
    let busy = counter(
        &metrics,
        "sentinel_scheduler_skipped_runs_total",
        "reason=\"busy\"",
    );
    assert_eq!(busy, 5.0, "ticks 30, 40, then 60, 70, 80 were missed");
    let delayed = counter(&metrics, "sentinel_scheduler_delayed_runs_total", "");
    assert_eq!(delayed, 2.0);
    // Start delays: the first on time, then 25.5 s (due at 20 s) and 31 s
    // (due at 50 s) behind the run before.
    let delay = |bucket: &str| {
        counter(
            &metrics,
            "sentinel_scheduler_start_delay_seconds_bucket",
            &format!("le=\"{bucket}\""),
        )
    };
    assert_eq!(
        [delay("0.01"), delay("15"), delay("60"), delay("+Inf")],
        [1.0, 1.0, 3.0, 3.0]
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_replans_a_waiting_worker() {
    let live = Arc::new(LiveConfig::new(config("0 0 * * * *", ""), None));
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    let reloader = live.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        reloader.replace(config("*/10 * * * * *", "")).unwrap();
    });
    run_worker(live, runs.clone(), 25).await;
    // Hourly at first (next run at 01:00); after the reload at 5 s, every
    // 10 s: runs at 10 s and 20 s.
    let starts = runs.starts();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!((starts[0] - 9.5).abs() < 0.6, "{starts:?}");
}

#[tokio::test(start_paused = true)]
async fn reloads_that_leave_a_schedule_as_it_was_lose_none_of_its_runs() {
    // Every 20 s with up to 15 s of jitter; the same file reloaded every
    // 4 s, and a new build announced between (another target's, say).
    let same = || config("*/20 * * * * *", "jitter = \"15s\"");
    let live = Arc::new(LiveConfig::new(same(), None));
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    let (upgrades, reloader) = (watch::channel(0).0, live.clone());
    let announcer = upgrades.clone();
    tokio::spawn(async move {
        for i in 0..25u64 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            match i % 2 {
                0 => reloader.replace(same()).unwrap(),
                _ => announcer.send_modify(|n| *n += 1),
            }
        }
    });
    // Ended before the tick of 100 s (99.5 s from the start, which is
    // half a second past one) can start, whatever its jitter.
    run_worker_told(live, runs.clone(), 99, upgrades).await;
    // Ticks at 20, 40, 60 and 80 s: each run goes, within its jitter.
    let starts = runs.starts();
    assert_eq!(starts.len(), 4, "{starts:?}");
    for (run, tick) in starts.iter().zip([20.0, 40.0, 60.0, 80.0]) {
        assert!((tick - 0.5..=tick + 15.0).contains(run), "{starts:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_build_gets_its_upgrade_rounds_back_to_back() {
    let live = Arc::new(LiveConfig::new(
        config("0 0 * * * *", "[detector]\nupgrade_round_gap = \"2s\""),
        None,
    ));
    let runs = Scripted::new(step(1, RunOutcome::Ok));
    *runs.upgrades_pending.lock().unwrap() = 3;
    let metrics = run_worker(live, runs.clone(), 60).await;
    let starts = runs.starts();
    assert_eq!(starts.len(), 3, "{starts:?}");
    assert_eq!(gaps(&starts), vec![3.0, 3.0], "2 s gap after each 1 s run");
    assert_eq!(
        counter(&metrics, "sentinel_upgrade_runs_total", "scenario=\"s\""),
        3.0
    );
}

#[tokio::test(start_paused = true)]
async fn upgrade_rounds_stay_within_the_rate_factor_however_often_a_build_is_claimed() {
    // A server that claims a new build all the time: every check finds
    // upgrade runs pending.
    let live = Arc::new(LiveConfig::new(
        config("*/10 * * * * *", "max_rate_factor = 1.5"),
        None,
    ));
    let runs = Scripted::new(step(1, RunOutcome::Ok));
    *runs.upgrades_pending.lock().unwrap() = 100_000;
    let seconds = 600;
    let metrics = run_worker(live.clone(), runs.clone(), seconds).await;
    let scheduled = counter(&metrics, "sentinel_scheduler_start_delay_seconds_count", "");
    let upgrade = counter(&metrics, "sentinel_upgrade_runs_total", "scenario=\"s\"");
    let total = runs.starts().len() as f64;
    // One verdict's worth at once, then half the scheduled rate (60 runs
    // scheduled in 600 s): at most 30 more.
    let at_once = live.current().verdict_policy.runs_for_verdict() as f64;
    assert!(
        upgrade <= at_once + 0.5 * (seconds as f64 / 10.0) + 1.0,
        "{upgrade} upgrade runs, {scheduled} scheduled"
    );
    assert!(
        upgrade >= at_once,
        "a new build still gets its verdict's runs: {upgrade}"
    );
    assert_eq!(total, scheduled + upgrade);
    assert!(
        counter(
            &metrics,
            "sentinel_scheduler_skipped_runs_total",
            "reason=\"rate\""
        ) > 0.0
    );
}

#[tokio::test(start_paused = true)]
async fn a_build_change_is_checked_for_upgrade_runs_when_told_not_between_runs() {
    let live = Arc::new(LiveConfig::new(
        config("*/10 * * * * *", "[detector]\nupgrade_round_gap = \"2s\""),
        None,
    ));
    let runs = Scripted::new(step(1, RunOutcome::Ok));
    let upgrades = watch::channel(0).0;
    let (told, script) = (upgrades.clone(), runs.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(25)).await;
        *script.upgrades_pending.lock().unwrap() = 2;
        told.send_modify(|n| *n += 1);
    });
    let metrics = run_worker_told(live, runs.clone(), 45, upgrades).await;
    // Scheduled at 9.5 s and 19.5 s; told at 25 s: two upgrade runs,
    // each after the 2 s gap (27 s, 30 s); the tick of 29.5 s runs when
    // they are done (31 s), the next at 39.5 s.
    let starts = runs.starts();
    assert_eq!(starts, [9.5, 19.5, 27.0, 30.0, 31.0, 39.5]);
    assert_eq!(
        counter(&metrics, "sentinel_upgrade_runs_total", "scenario=\"s\""),
        2.0
    );
    // Asked once at start, then three times after being told (two runs
    // pending, then none); never between the scheduled runs.
    assert_eq!(*runs.upgrade_checks.lock().unwrap(), 4);
}

#[tokio::test(start_paused = true)]
async fn retry_after_keeps_the_worker_away_that_long() {
    let live = Arc::new(LiveConfig::new(config("* * * * * *", ""), None));
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    runs.steps.lock().unwrap().push_back(Step {
        takes: Duration::ZERO,
        outcome: RunOutcome::Partial,
        retry_after: Some(Duration::from_secs(30)),
    });
    run_worker(live, runs.clone(), 45).await;
    let gaps = gaps(&runs.starts());
    assert!((30.0..=31.0).contains(&gaps[0]), "{gaps:?}");
}

/// A service worker and three replica workers sharing `max_parallel`
/// permits, every run 3 s long on a 1 s schedule, for a minute.
async fn fleet_of_three(max_parallel: usize) -> Scripted {
    let live = Arc::new(LiveConfig::new(config("* * * * * *", ""), None));
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let start: DateTime<Utc> = "2026-01-01T00:00:00.5Z".parse().unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let board = Arc::new(TargetStates::default());
    let (upgrades, _) = watch::channel(0);
    let permits = Arc::new(Semaphore::new(max_parallel));
    let stop = CancellationToken::new();
    let replicas = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"].map(|l| {
        Some(Replica {
            label: l.into(),
            base_url: format!("http://{l}"),
            placement: None,
        })
    });
    let mut tasks = Vec::new();
    let turn = Arc::new(tokio::sync::RwLock::new(()));
    for replica in std::iter::once(None).chain(replicas) {
        let parallel = replica.is_some().then(|| permits.clone());
        let label = replica.as_ref().map_or("", |r| r.label.as_str()).to_owned();
        let worker = Worker {
            name: "t".into(),
            liveness: Arc::new(Liveness::new(
                "t",
                &label,
                metrics.clone(),
                board.clone(),
                Clock::tokio(start),
            )),
            released: CancellationToken::new(),
            replica,
            parallel,
            turn: turn.clone(),
            live: live.clone(),
            runs: runs.clone(),
            metrics: metrics.clone(),
            board: board.clone(),
            upgrades: upgrades.subscribe(),
            clock: Clock::tokio(start),
        };
        tasks.push(tokio::spawn(worker.run(stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    runs
}

#[tokio::test(start_paused = true)]
async fn replicas_share_max_parallel_and_the_service_probes_alone() {
    for max_parallel in [1, 2] {
        let runs = fleet_of_three(max_parallel).await;
        // The service's probes go through the balancer to some replica:
        // never at once with a replica's own.
        let most = *runs.most_at_once.lock().unwrap() as usize;
        assert_eq!(most, max_parallel, "max_parallel {max_parallel}");
        let spans = runs.spans.lock().unwrap().clone();
        for (_, s0, e0) in spans.iter().filter(|s| s.0.is_empty()) {
            for (r, s1, e1) in spans.iter().filter(|s| !s.0.is_empty()) {
                assert!(
                    !(s0 < e1 && s1 < e0),
                    "service run {s0}-{e0} overlapped {r}'s {s1}-{e1}"
                );
            }
        }
        let probed = runs.probed.lock().unwrap().clone();
        let of = |l: &str| probed.iter().filter(|(p, _)| p == l).count();
        // The turn is fair: the service and every replica get theirs.
        let service = of("");
        let each: Vec<usize> = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
            .iter()
            .map(|l| of(l))
            .collect();
        eprintln!("max_parallel {max_parallel}: service {service} runs, replicas {each:?}");
        assert!(service >= 5, "{probed:?}");
        let total: usize = each.iter().sum();
        assert!(total >= 5 * max_parallel, "{each:?}");
        assert!(each.iter().all(|n| *n * 4 >= total), "{each:?}");
    }
}

#[path = "worker_heartbeat_tests.rs"]
mod heartbeats;
