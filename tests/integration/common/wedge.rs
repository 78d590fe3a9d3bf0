//! Wedging a server under a running daemon and a real Prometheus loaded
//! with the shipped rules, and timing what follows: the liveness state,
//! the `SentinelEngineNotGenerating` alert, the recovery and the alert's
//! resolution. Shared by the simulator's test and the real vLLM's.

use std::time::{Duration, Instant};

use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::telemetry::exposition::Exposition;

use super::{Killed, metrics, until, value};

/// How long each step took, in seconds.
pub struct WedgeFigures {
    pub to_not_generating: f64,
    pub to_alert: f64,
    pub to_recovery: f64,
    pub to_resolved: f64,
}

/// Every figure is printed; the tests assert on some of them.
impl std::fmt::Debug for WedgeFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WedgeFigures")
            .field("to_not_generating", &self.to_not_generating)
            .field("to_alert", &self.to_alert)
            .field("to_recovery", &self.to_recovery)
            .field("to_resolved", &self.to_resolved)
            .finish()
    }
}

/// The daemon of a wedge test: one target `name` at `base_url` with one
/// small scenario (`lengths`: input and output tokens) on `schedule`;
/// `target_extra` goes into the target's table (endpoint, replicas,
/// heartbeat settings).
pub fn daemon_config(
    store: &std::path::Path,
    schedule: &str,
    lengths: (u32, u32),
    (name, base_url): (&str, &str),
    target_extra: &str,
) -> String {
    format!(
        "[scheduler]\nschedule = \"{schedule}\"\nshutdown_grace = \"2s\"\n\
[store]\npath = \"{}\"\n\
[[scenarios]]\nname = \"chat\"\ninput_len = {}\noutput_len = {}\nconcurrency = 2\nnum_requests = 4\nwarmup = 0\n\
[[targets]]\nname = \"{name}\"\nbase_url = \"{base_url}\"\n{target_extra}\n",
        store.display(),
        lengths.0,
        lengths.1
    )
}

/// `sentinel_target_generating` of the target's `replica` ("" for the
/// service).
pub fn generating(page: &Exposition, target: &str, replica: &str) -> Option<f64> {
    value(
        page,
        "sentinel_target_generating",
        &[("target", target), ("replica", replica)],
    )
}

/// Prometheus scraping the daemon every 15 s and evaluating the shipped
/// rules every 15 s, as the alert's timing assumes.
pub fn prometheus_for(dir: &std::path::Path, handle: &DaemonHandle) -> (Killed, u16) {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/alerts/sentinel-rules.yml");
    super::prom::start_prometheus(
        dir,
        &format!(
            "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nrule_files:\n  - {rules}\nscrape_configs:\n  - job_name: sentinel\n    static_configs:\n      - targets: [\"{}\"]\n",
            handle.addr
        ),
    )
}

/// The `SentinelEngineNotGenerating` alerts firing now.
async fn firing(http: &reqwest::Client, prom_port: u16) -> Vec<serde_json::Value> {
    let Ok(reply) = http
        .get(format!("http://127.0.0.1:{prom_port}/api/v1/alerts"))
        .send()
        .await
    else {
        return Vec::new();
    };
    let body: serde_json::Value = reply.json().await.unwrap_or_default();
    body["data"]["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| {
            a["state"] == "firing" && a["labels"]["alertname"] == "SentinelEngineNotGenerating"
        })
        .collect()
}

/// Wedges the server with `wedge` once `target`'s `replica` ("" for the
/// service) generates, waits for the state and the alert, ends the wedge
/// with `unwedge`, waits for the recovery and the alert's end; asserts
/// along the way what must hold between (answering during the wedge, the
/// alert critical and naming what was wedged).
pub async fn time_a_wedge(
    handle: &DaemonHandle,
    prom_port: u16,
    at: (&str, &str),
    wedge: impl FnOnce(),
    unwedge: impl FnOnce(),
) -> WedgeFigures {
    time_a_held_wedge(
        handle,
        prom_port,
        at,
        wedge,
        std::future::ready(()),
        unwedge,
    )
    .await
}

/// [`time_a_wedge`], keeping the wedge after the alert until `held` is
/// done too (at most 150 s more): for a test that watches something else
/// the wedge must last for, such as a service behind a balancer, whose
/// heartbeats reach the wedged replica only when the balancer sends them
/// there.
pub async fn time_a_held_wedge(
    handle: &DaemonHandle,
    prom_port: u16,
    (target, replica): (&str, &str),
    wedge: impl FnOnce(),
    held: impl std::future::Future<Output = ()>,
    unwedge: impl FnOnce(),
) -> WedgeFigures {
    let http = reqwest::Client::new();
    until(Duration::from_secs(60), "a first heartbeat", async || {
        (generating(&metrics(handle).await, target, replica) == Some(1.0)).then_some(())
    })
    .await;
    let wedged = Instant::now();
    wedge();
    until(Duration::from_secs(90), "not generating", async || {
        (generating(&metrics(handle).await, target, replica) == Some(0.0)).then_some(())
    })
    .await;
    let to_not_generating = wedged.elapsed().as_secs_f64();
    let page = metrics(handle).await;
    assert_eq!(
        value(
            &page,
            "sentinel_target_answering",
            &[("target", target), ("replica", replica)]
        ),
        Some(1.0),
        "a wedge is not down"
    );
    let status = super::get_text(handle, "/").await;
    assert!(
        status.contains("not generating since"),
        "on the status page"
    );
    let of_this = |a: &serde_json::Value| {
        a["labels"]["target"] == target && a["labels"]["replica"].as_str().unwrap_or("") == replica
    };
    let alerts = until(Duration::from_secs(180), "the alert", async || {
        let a: Vec<_> = firing(&http, prom_port)
            .await
            .into_iter()
            .filter(of_this)
            .collect();
        (!a.is_empty()).then_some(a)
    })
    .await;
    let to_alert = wedged.elapsed().as_secs_f64();
    assert_eq!(alerts[0]["labels"]["severity"], "critical");
    if tokio::time::timeout(Duration::from_secs(150), held)
        .await
        .is_err()
    {
        panic!("the wedge was held 150 s after the alert for what the test watches; it never came");
    }
    let resumed = Instant::now();
    unwedge();
    until(Duration::from_secs(60), "generating again", async || {
        (generating(&metrics(handle).await, target, replica) == Some(1.0)).then_some(())
    })
    .await;
    let to_recovery = resumed.elapsed().as_secs_f64();
    until(Duration::from_secs(180), "the alert resolved", async || {
        firing(&http, prom_port).await.is_empty().then_some(())
    })
    .await;
    let to_resolved = resumed.elapsed().as_secs_f64();
    let figures = WedgeFigures {
        to_not_generating,
        to_alert,
        to_recovery,
        to_resolved,
    };
    eprintln!("{figures:?}");
    figures
}
