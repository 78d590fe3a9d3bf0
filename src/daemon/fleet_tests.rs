//! A target's fleet of workers on tokio's paused clock, with scripted runs
//! and a static replica list: permits hold across a change of replica
//! settings, and a replica taken off the list gets no new run.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::Config;
use crate::daemon::worker::scripted_tests::{Scripted, step};
use crate::vocabulary::records::RunOutcome;

const REPLICAS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

/// One target, every second, its service and `replicas` probed with one
/// replica at a time; `refresh` only tells one configuration from another.
fn config(replicas: &[&str], refresh: &str) -> Config {
    config_probing(replicas, refresh, "both")
}

/// The same with `probe` set to `probe`.
fn config_probing(replicas: &[&str], refresh: &str, probe: &str) -> Config {
    let urls: Vec<String> = replicas.iter().map(|r| format!("\"http://{r}\"")).collect();
    Config::from_text(
        &format!(
            "[store]\npath = \"/tmp/fleet-test.db\"\n[scheduler]\nschedule = \"* * * * * *\"\n\
[[targets]]\nname = \"t\"\nbase_url = \"http://127.0.0.1:9\"\nscenarios = [\"s\"]\n\
[targets.replicas]\nstatic = [{}]\nprobe = \"{probe}\"\nmax_parallel = 1\nrefresh = \"{refresh}\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nnum_requests = 1\nwarmup = 0\n",
            urls.join(", ")
        ),
        "the test configuration",
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn permits_hold_across_new_replica_settings_and_a_removed_replica_stops() {
    let live = Arc::new(LiveConfig::new(config(&REPLICAS, "30s"), None));
    // Every run takes 3 s on a 1 s schedule: workers are always busy.
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let start: DateTime<Utc> = "2026-01-01T00:00:00.5Z".parse().unwrap();
    let parts = WorkerParts {
        live: live.clone(),
        runs: runs.clone(),
        metrics: Arc::new(Metrics::new().unwrap()),
        board: Arc::new(TargetStates::default()),
        upgrades: tokio::sync::watch::channel(0).0,
        clock: Clock::tokio(start),
    };
    let stop = CancellationToken::new();
    let fleet = tokio::spawn(Fleet::new(parts, "t").run(stop.clone()));
    // New replica settings in the middle of runs: every replica worker is
    // replaced under new permits. Then the third replica leaves the list.
    // The service probes alone (its turn), so a round of the service and
    // three replicas takes 18 s: the third replica leaves after one.
    for (at, replicas, refresh) in [(10.5, &REPLICAS[..], "20s"), (40.5, &REPLICAS[..2], "20s")] {
        let now = runs.origin.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs_f64(at - now)).await;
        live.replace(config(replicas, refresh)).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.cancel();
    fleet.await.unwrap();

    let probed = runs.probed.lock().unwrap().clone();
    // One listed replica at a time (max_parallel 1), the service besides;
    // only the run of the replica taken off the list at 40.5 s may go on
    // beside them, without its permit (but with its turn).
    let spans = runs.spans.lock().unwrap().clone();
    let listed: Vec<&(String, f64, f64)> = spans
        .iter()
        .filter(|(l, _, end)| !l.is_empty() && (l != REPLICAS[2] || *end <= 40.5))
        .collect();
    for (i, a) in listed.iter().enumerate() {
        for b in &listed[i + 1..] {
            assert!(a.2 <= b.1 || b.2 <= a.1, "{a:?} and {b:?} at once");
        }
    }
    assert!(*runs.most_at_once.lock().unwrap() <= 2, "{probed:?}");
    // The service never probes beside a replica's run, not even beside
    // the last run of the replica taken off the list: it may still serve
    // behind the balancer.
    for (_, s0, e0) in spans.iter().filter(|s| s.0.is_empty()) {
        for (r, s1, e1) in spans.iter().filter(|s| !s.0.is_empty()) {
            assert!(
                !(s0 < e1 && s1 < e0),
                "service run {s0}-{e0} beside {r}'s {s1}-{e1}"
            );
        }
    }
    let starts_of = |label: &str| -> Vec<f64> {
        probed
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, t)| *t)
            .collect()
    };
    for label in ["", REPLICAS[0], REPLICAS[1]] {
        assert!(
            starts_of(label).iter().any(|t| *t > 45.0),
            "{label:?} still probed after the changes: {probed:?}"
        );
    }
    let third = starts_of(REPLICAS[2]);
    assert!(third.iter().any(|t| *t > 11.0), "restarted: {third:?}");
    assert!(
        third.iter().all(|t| *t < 40.5),
        "no run of a removed replica: {third:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_replica_no_longer_probed_mid_run_keeps_the_turn_until_its_run_ends() {
    let live = Arc::new(LiveConfig::new(config(&REPLICAS[..2], "30s"), None));
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let start: DateTime<Utc> = "2026-01-01T00:00:00.5Z".parse().unwrap();
    let parts = WorkerParts {
        live: live.clone(),
        runs: runs.clone(),
        metrics: Arc::new(Metrics::new().unwrap()),
        board: Arc::new(TargetStates::default()),
        upgrades: tokio::sync::watch::channel(0).0,
        clock: Clock::tokio(start),
    };
    let stop = CancellationToken::new();
    let fleet = tokio::spawn(Fleet::new(parts, "t").run(stop.clone()));
    // One second into the second replica's first run, a reload stops
    // probing replicas (they still serve behind the balancer); the
    // service is waiting for the turn.
    let started = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let probed = runs.probed.lock().unwrap().clone();
        if let Some((_, at)) = probed.iter().find(|(l, _)| l == REPLICAS[1]) {
            break *at;
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    live.replace(config_probing(&REPLICAS[..2], "30s", "service"))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    stop.cancel();
    fleet.await.unwrap();
    let spans = runs.spans.lock().unwrap().clone();
    let last = spans
        .iter()
        .find(|(l, s, _)| l == REPLICAS[1] && *s == started)
        .expect("the replica's run ended and was recorded");
    let service: Vec<_> = spans.iter().filter(|s| s.0.is_empty()).collect();
    assert!(service.iter().any(|s| s.1 >= last.2), "{spans:?}");
    for (_, s, e) in service {
        assert!(
            !(*s < last.2 && last.1 < *e),
            "service run {s}-{e} beside the replica's last run {last:?}"
        );
    }
}

/// The worker parts of [`config`]'s target over `runs`, on a paused clock.
fn parts_over(runs: &Scripted) -> WorkerParts<Scripted> {
    WorkerParts {
        live: Arc::new(LiveConfig::new(config(&REPLICAS[..1], "30s"), None)),
        runs: runs.clone(),
        metrics: Arc::new(Metrics::new().unwrap()),
        board: Arc::new(TargetStates::default()),
        upgrades: tokio::sync::watch::channel(0).0,
        clock: Clock::tokio("2026-01-01T00:00:00.5Z".parse().unwrap()),
    }
}

/// Pod `name` at `address`, as Kubernetes lists it.
fn pod(name: &str, address: &str) -> Replica {
    Replica {
        label: name.into(),
        base_url: format!("http://{address}"),
        placement: None,
    }
}

/// When the first run of the fleet started.
async fn first_run_at(runs: &Scripted) -> f64 {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some((_, at)) = runs.probed.lock().unwrap().first() {
            return *at;
        }
    }
}

/// `later` was probed, and only after the run of `earlier` (its label and
/// start) had ended.
fn assert_probed_after(runs: &Scripted, (label, started): (&str, f64), later: &str) {
    let spans = runs.spans.lock().unwrap().clone();
    let earlier = spans
        .iter()
        .find(|(l, s, _)| l == label && *s == started)
        .expect("the earlier run recorded");
    let after: Vec<_> = spans.iter().filter(|(l, ..)| l == later).collect();
    assert!(!after.is_empty(), "{spans:?}");
    for (_, s, _) in after {
        assert!(*s >= earlier.2, "{later} probed at {s}, beside {earlier:?}");
    }
}

/// A new pod given the address of one that left mid-run (a node's own
/// address, or one the network reuses) is not probed until the gone
/// pod's run has ended: one address never sees two probes at once.
#[tokio::test(start_paused = true)]
async fn a_new_pod_at_a_gone_pods_address_waits_for_its_run() {
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let mut fleet = Fleet::new(parts_over(&runs), "t");
    let stop = CancellationToken::new();
    let a = fleet.start(Some(pod("vllm-a", "10.0.0.9:8000")), None, &stop);
    let started = first_run_at(&runs).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.retire(Some("vllm-a".into()), true, a);
    let b = fleet.start(Some(pod("vllm-b", "10.0.0.9:8000")), None, &stop);
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.cancel();
    let _ = b.handle.await;
    assert_probed_after(&runs, ("vllm-a", started), "vllm-b");
}

/// Pods that come and go by new names leave nothing behind once their
/// workers have stopped, though no new worker ever waited for them.
#[tokio::test(start_paused = true)]
async fn workers_of_pods_gone_are_forgotten_once_stopped() {
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let mut fleet = Fleet::new(parts_over(&runs), "t");
    let stop = CancellationToken::new();
    for i in 0..20 {
        let running = fleet.start(
            Some(pod(&format!("vllm-{i}"), &format!("10.0.1.{i}:8000"))),
            None,
            &stop,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        fleet.retire(Some(format!("vllm-{i}")), true, running);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    fleet.forget_stopped();
    assert_eq!(fleet.retired.len(), 0);
    assert!(fleet.released.is_empty());
    stop.cancel();
}

/// A reconcile that moves one pod off an address and gives the address to
/// a new pod listed before it stops the moved pod's worker before it
/// starts the new one: the new pod waits for the run in flight at its
/// address, though the permits (three) would let both run.
#[tokio::test(start_paused = true)]
async fn a_reconcile_retires_what_goes_before_it_starts_anything() {
    let runs = Scripted::new(step(3, RunOutcome::Ok));
    let mut fleet = Fleet::new(parts_over(&runs), "t");
    let stop = CancellationToken::new();
    let config = fleet.parts.live.current();
    let mut replicas = config.target("t").unwrap().replicas.clone().unwrap();
    replicas.max_parallel = 3;
    fleet.follow_source(Some(replicas)).await;
    fleet.probe_replicas = true;
    fleet.found = vec![pod("vllm-b", "10.0.0.9:8000")];
    fleet.reconcile(&stop);
    let started = first_run_at(&runs).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // vllm-a is listed first and takes vllm-b's address; vllm-b moves.
    fleet.found = vec![
        pod("vllm-a", "10.0.0.9:8000"),
        pod("vllm-b", "10.0.0.7:8000"),
    ];
    fleet.reconcile(&stop);
    tokio::time::sleep(Duration::from_secs(10)).await;
    fleet.shut(stop).await;
    assert_probed_after(&runs, ("vllm-b", started), "vllm-a");
}
