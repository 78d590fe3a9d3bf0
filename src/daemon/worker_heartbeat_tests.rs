//! Heartbeats in the worker, on tokio's paused clock: their schedule
//! between runs, and a wedge seen and recovered.

use super::*;

/// Runs one service worker on `live` for `for_s`.
async fn run_beating(live: Arc<LiveConfig>, runs: Scripted, for_s: u64, parts: Watched) {
    run_watched(live, runs, for_s, &watch::channel(0).0, parts).await;
}

#[tokio::test(start_paused = true)]
async fn heartbeats_come_every_interval_between_runs_never_during_one() {
    let live = Arc::new(LiveConfig::new(
        beating("*/10 * * * * *", "", "interval = \"4s\"\ntimeout = \"2s\""),
        None,
    ));
    // Runs of 3 s every 10 s.
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let parts = watched();
    let (metrics, liveness) = (parts.0.clone(), parts.2.clone());
    run_beating(live, runs.clone(), 60, parts).await;
    let beats: Vec<f64> = runs
        .heartbeats
        .lock()
        .unwrap()
        .iter()
        .map(|b| b.1)
        .collect();
    assert!(beats.len() >= 6, "{beats:?}");
    assert!(
        (beats[0] - 4.0).abs() < 0.1,
        "the first one interval after start: {beats:?}"
    );
    // At least one interval apart; a run's requests stand in for a
    // heartbeat, so the next comes one interval after the run.
    assert!(gaps(&beats).iter().all(|g| *g >= 4.0 - 1e-6), "{beats:?}");
    // Never two probes at once: no heartbeat while a run is in flight.
    let spans = runs.runs.lock().unwrap().clone();
    assert_eq!(spans.len(), 6);
    for b in &beats {
        assert!(
            !spans.iter().any(|(s, e)| s < b && b < e),
            "{b} in {spans:?}"
        );
    }
    assert_eq!(liveness.state(), Some(Generating::Generating));
    assert_eq!(
        counter(&metrics, "sentinel_heartbeats_total", "outcome=\"ok\""),
        beats.len() as f64
    );
    assert_eq!(counter(&metrics, "sentinel_target_generating", ""), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_wedge_seen_by_a_heartbeat_is_not_generating_until_a_token_comes() {
    let live = Arc::new(LiveConfig::new(
        beating("0 0 * * * *", "", "interval = \"15s\"\ntimeout = \"20s\""),
        None,
    ));
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    let script = runs.clone();
    let parts = watched();
    let (metrics, liveness) = (parts.0.clone(), parts.2.clone());
    let wedge = async {
        // Wedged from 10 s to 70 s: heartbeats wait their 20 s timeout.
        tokio::time::sleep(Duration::from_secs(10)).await;
        *script.beat.lock().unwrap() = step(20, RunOutcome::Failed(Outcome::NoFirstToken));
        tokio::time::sleep(Duration::from_secs(40)).await;
        // Seen by the heartbeat of 15 s (ended at 35 s) at the latest.
        let during = (
            liveness.state(),
            counter(&metrics, "sentinel_target_generating", ""),
            counter(&metrics, "sentinel_target_answering", ""),
        );
        tokio::time::sleep(Duration::from_secs(20)).await;
        *script.beat.lock().unwrap() = step(0, RunOutcome::Ok);
        during
    };
    let ((), during) = tokio::join!(run_beating(live, runs.clone(), 120, parts), wedge);
    // A wedge is not down: the server answers.
    assert_eq!(during, (Some(Generating::NotGenerating), 0.0, 1.0));
    assert_eq!(liveness.state(), Some(Generating::Generating));
    assert!(
        counter(
            &metrics,
            "sentinel_heartbeats_total",
            "outcome=\"no_first_token\""
        ) >= 2.0
    );
    assert_eq!(counter(&metrics, "sentinel_target_generating", ""), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_replica_heartbeat_waits_for_the_service_run_however_long() {
    let live = Arc::new(LiveConfig::new(
        beating("0 0 * * * *", "", "interval = \"2s\"\ntimeout = \"1s\""),
        None,
    ));
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    let start: DateTime<Utc> = "2026-01-01T00:00:00.5Z".parse().unwrap();
    let (metrics, board) = (
        Arc::new(Metrics::new().unwrap()),
        Arc::new(TargetStates::default()),
    );
    let (upgrades, _) = watch::channel(0);
    let turn = Arc::new(tokio::sync::RwLock::new(()));
    let stop = CancellationToken::new();
    let worker = Worker {
        name: "t".into(),
        liveness: Arc::new(Liveness::new(
            "t",
            "10.0.0.1:8000",
            metrics.clone(),
            board.clone(),
            Clock::tokio(start),
        )),
        released: CancellationToken::new(),
        parallel: Some(Arc::new(tokio::sync::Semaphore::new(1))),
        replica: Some(Replica {
            label: "10.0.0.1:8000".into(),
            base_url: "http://10.0.0.1:8000".into(),
            placement: None,
        }),
        turn: turn.clone(),
        live,
        runs: runs.clone(),
        metrics,
        board,
        upgrades: upgrades.subscribe(),
        clock: Clock::tokio(start),
    };
    let task = tokio::spawn(worker.run(stop.clone()));
    // The service's runs, 9 s each (far past the heartbeat's 1 s
    // timeout), hold the target's turn alone; they go through the
    // balancer to this replica.
    let mut service_runs = Vec::new();
    for from in [10.0, 30.0, 50.0] {
        let now = runs.origin.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs_f64(from - now)).await;
        let held = turn.write().await;
        tokio::time::sleep(Duration::from_secs(9)).await;
        drop(held);
        service_runs.push((from, from + 9.0));
    }
    stop.cancel();
    task.await.unwrap();
    let beats: Vec<f64> = runs
        .heartbeats
        .lock()
        .unwrap()
        .iter()
        .map(|b| b.1)
        .collect();
    assert!(beats.len() >= 15, "{beats:?}");
    for at in &beats {
        assert!(
            !service_runs.iter().any(|(s, e)| s < at && at < e),
            "heartbeat at {at} during a service run: {service_runs:?}"
        );
    }
    // Each waited for the turn and went right after the run.
    for (_, end) in &service_runs[..2] {
        assert!(beats.iter().any(|b| (b - end).abs() < 1e-6), "{beats:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_answering_errors_is_backed_off_and_its_retry_after_binds_heartbeats() {
    let live = Arc::new(LiveConfig::new(
        beating("0 0 * * * *", "", "interval = \"2s\"\ntimeout = \"1s\""),
        None,
    ));
    // Completions answer 503 with Retry-After: 60 while /health says 200:
    // "not generating", yet not silent.
    let runs = Scripted::new(step(0, RunOutcome::Ok));
    *runs.beat.lock().unwrap() = Step {
        takes: Duration::ZERO,
        outcome: RunOutcome::Failed(Outcome::Http5xx),
        retry_after: Some(Duration::from_secs(60)),
    };
    let parts = watched();
    let liveness = parts.2.clone();
    run_beating(live, runs.clone(), 200, parts).await;
    assert_eq!(liveness.state(), Some(Generating::NotGenerating));
    let beats: Vec<f64> = runs
        .heartbeats
        .lock()
        .unwrap()
        .iter()
        .map(|b| b.1)
        .collect();
    // Every 2 s before; now every Retry-After: at 2 s, 62 s, 122 s, 182 s.
    assert!((3..=4).contains(&beats.len()), "{beats:?}");
    assert!(gaps(&beats).iter().all(|g| *g >= 60.0 - 1e-6), "{beats:?}");
    // The heartbeats not sent meanwhile still count, as the server was
    // last found: not generating, every 2 s.
    let counted = runs.beats_counted.lock().unwrap().clone();
    assert!(counted.len() >= 90, "{} counted", counted.len());
    assert!(counted.iter().all(|g| !g), "{counted:?}");
}
