//! The "client is not the bottleneck" check, built in: the probe client
//! against the in-process simulator with known injected latencies. Reports
//! sustained requests per second with short responses, and the timing
//! error (measured minus injected TTFT and ITL). The simulator is the
//! reference and gets a core of its own when there is one (`placement`).

use std::sync::Arc;
use std::time::Duration;

use crate::client::{Endpoint, Outcome};
use crate::probe::{self, ProbeError, ProbeSpec};
use crate::sim::{SimConfig, SimState};
use crate::stats;

mod placement;
mod sim_thread;

pub use placement::Placement;
use sim_thread::SimThread;

/// Sizes of the self-test; the defaults are what the README reports.
#[derive(Debug, Clone)]
pub struct SelftestPlan {
    pub capacity_concurrency: Vec<usize>,
    pub capacity_requests: usize,
    pub capacity_output_tokens: u32,
    pub timing_concurrency: usize,
    pub timing_requests: usize,
    pub injected_ttft_ms: f64,
    pub injected_itl_ms: f64,
    pub timing_output_tokens: u32,
    /// Log-normal sigma of the steady timing run.
    pub timing_jitter: f64,
    /// Give the simulator a core of its own at real-time priority, and the
    /// timing runs' client the other cores (where the system allows it);
    /// otherwise both share every core at normal priority.
    pub isolate: bool,
}

impl Default for SelftestPlan {
    fn default() -> Self {
        SelftestPlan {
            capacity_concurrency: vec![100, 1000],
            capacity_requests: 30_000,
            capacity_output_tokens: 4,
            timing_concurrency: 256,
            timing_requests: 2048,
            injected_ttft_ms: 50.0,
            injected_itl_ms: 10.0,
            timing_output_tokens: 16,
            timing_jitter: 0.3,
            isolate: true,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CapacityResult {
    pub concurrency: usize,
    pub requests: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub chunks_per_s: f64,
}

/// Signed error distribution in milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ErrorSummary {
    pub samples: usize,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub p99_abs_ms: f64,
}

impl ErrorSummary {
    fn of(errors_ms: &[f64]) -> Self {
        let sorted = stats::sorted(errors_ms);
        let abs: Vec<f64> = errors_ms.iter().map(|e| e.abs()).collect();
        ErrorSummary {
            samples: errors_ms.len(),
            median_ms: stats::percentile_sorted(&sorted, 50.0),
            p99_ms: stats::percentile_sorted(&sorted, 99.0),
            p99_abs_ms: stats::percentile_sorted(&stats::sorted(&abs), 99.0),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TimingResult {
    /// `steady`: per-request jitter spreads chunk times; `lockstep`: every
    /// stream's chunks are due at the same instants (a worst case).
    pub name: String,
    pub jitter: f64,
    pub concurrency: usize,
    pub requests: usize,
    pub failed: usize,
    pub injected_ttft_ms: f64,
    pub injected_itl_ms: f64,
    pub ttft_error: ErrorSummary,
    pub itl_error: ErrorSummary,
    /// Client's send instant to the simulator's handler start.
    pub request_delivery: ErrorSummary,
    /// Simulator handing a chunk to the connection to the client recording
    /// it: the client's own share of the timing error.
    pub client_receive_lag: ErrorSummary,
    /// Measured TTFT minus the simulator's first write after the client's
    /// send: the error from the first chunk on, without request delivery.
    pub ttft_client_error: ErrorSummary,
    /// Measured chunk gaps minus the gaps between the simulator's writes:
    /// the error without the simulator's own lateness.
    pub itl_client_error: ErrorSummary,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SelftestReport {
    /// Where the simulator and the client ran.
    pub placement: Placement,
    pub capacity: Vec<CapacityResult>,
    pub timing: Vec<TimingResult>,
}

fn spec(base_url: String, concurrency: usize, requests: usize, output: u32) -> ProbeSpec {
    ProbeSpec {
        base_url,
        endpoint: Endpoint::Completions,
        input_len: 8,
        output_len: output,
        num_requests: requests,
        concurrency: Some(concurrency),
        warmup: concurrency,
        percentiles: vec![50.0, 99.0],
        run_id: "selftest".into(),
        // Calibration costs server calls before the run; the simulator's
        // lengths are exact anyway.
        calibrate: false,
        ..ProbeSpec::default()
    }
}

/// Runs the self-test: the simulator on its own thread; the capacity runs
/// on the caller's runtime (every core, as the daemon runs), the timing runs
/// on a runtime kept off the simulator's core when there is one to spare.
pub async fn run(plan: &SelftestPlan) -> Result<SelftestReport, ProbeError> {
    let sim = SimThread::start(
        SimConfig {
            ttft_ms: 0.0,
            itl_ms: 0.0,
            max_num_seqs: 1_000_000,
            ..SimConfig::default()
        },
        Placement::plan(plan.isolate),
    )?;
    let mut capacity = Vec::new();
    for &c in &plan.capacity_concurrency {
        let s = spec(
            sim.base_url.clone(),
            c,
            plan.capacity_requests,
            plan.capacity_output_tokens,
        );
        let result = probe::run(&s, None).await?;
        let chunks: usize = result.records.iter().map(|r| r.chunk_times.len()).sum();
        let secs = result.duration.as_secs_f64();
        capacity.push(CapacityResult {
            concurrency: c,
            requests: result.records.len(),
            failed: result.metrics.failed,
            duration_s: secs,
            requests_per_s: result.metrics.completed as f64 / secs,
            chunks_per_s: chunks as f64 / secs,
        });
    }
    let job = timing_runs(sim.base_url.clone(), sim.state.clone(), plan.clone());
    let timing = match sim.placement.client_runtime() {
        None => job.await?,
        Some(runtime) => on_client_cores(&sim.placement, runtime, job).await?,
    };
    let placement = sim.placement.clone();
    drop(sim);
    Ok(SelftestReport {
        placement,
        capacity,
        timing,
    })
}

/// Runs `job` on the client's own runtime, on a thread kept on the
/// client's cores (`block_on` polls the job itself on that thread).
async fn on_client_cores(
    placement: &Placement,
    runtime: std::io::Result<tokio::runtime::Runtime>,
    job: impl Future<Output = Result<Vec<TimingResult>, ProbeError>> + Send + 'static,
) -> Result<Vec<TimingResult>, ProbeError> {
    let runtime = runtime
        .map_err(|e| ProbeError::Invalid(format!("cannot start the client's runtime: {e}")))?;
    let placement = placement.clone();
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("selftest-client".into())
        .spawn(move || {
            placement.pin_to_client_cpus();
            let _ = done.send(runtime.block_on(job));
        })
        .map_err(|e| ProbeError::Invalid(format!("cannot start the client's thread: {e}")))?;
    result
        .await
        .map_err(|_| ProbeError::Invalid("the timing run's thread ended early".into()))?
}

/// The two timing runs, steady and lockstep.
async fn timing_runs(
    base_url: String,
    sim: Arc<SimState>,
    plan: SelftestPlan,
) -> Result<Vec<TimingResult>, ProbeError> {
    let mut timing = Vec::new();
    for (name, jitter) in [("steady", plan.timing_jitter), ("lockstep", 0.0)] {
        timing.push(timing_run(&base_url, &sim, &plan, name, jitter).await?);
    }
    Ok(timing)
}

/// One timing run. Errors are taken against each request's own schedule
/// as the simulator recorded it, so log-normal jitter (which spreads chunk
/// times the way independent requests do) is still exactly known.
async fn timing_run(
    base_url: &str,
    sim: &SimState,
    plan: &SelftestPlan,
    name: &str,
    jitter: f64,
) -> Result<TimingResult, ProbeError> {
    sim.update(serde_json::json!({
        "ttft_ms": plan.injected_ttft_ms,
        "itl_ms": plan.injected_itl_ms,
        "jitter": jitter,
    }))
    .map_err(ProbeError::Invalid)?;
    let s = spec(
        base_url.to_owned(),
        plan.timing_concurrency,
        plan.timing_requests,
        plan.timing_output_tokens,
    );
    sim.enable_traces();
    let result = probe::run(&s, None).await?;
    let traces = sim.take_traces();
    let (mut ttft_errors, mut itl_errors, mut delivery, mut receive_lag) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ttft_client, mut itl_client) = (Vec::new(), Vec::new());
    for r in result.records.iter().filter(|r| r.outcome == Outcome::Ok) {
        let Some(trace) = traces.get(&format!("sentinel-selftest-{}", s.warmup + r.index)) else {
            continue;
        };
        if let (Some(ttft), Some(due)) = (r.ttft(), trace.due.first()) {
            ttft_errors.push(ms(ttft) - ms(due.saturating_duration_since(trace.arrived)));
        }
        for (gap, due) in r.itls().zip(trace.due.windows(2)) {
            itl_errors.push(ms(gap) - ms(due[1].saturating_duration_since(due[0])));
        }
        delivery.push(ms(trace.arrived.saturating_duration_since(r.sent)));
        for (got, emitted) in r.chunk_times.iter().zip(&trace.emitted) {
            receive_lag.push(ms(got.saturating_duration_since(*emitted)));
        }
        if let (Some(ttft), Some(first)) = (r.ttft(), trace.emitted.first()) {
            ttft_client.push(ms(ttft) - ms(first.saturating_duration_since(r.sent)));
        }
        for (gap, emitted) in r.itls().zip(trace.emitted.windows(2)) {
            itl_client.push(ms(gap) - ms(emitted[1].saturating_duration_since(emitted[0])));
        }
    }
    Ok(TimingResult {
        name: name.to_owned(),
        jitter,
        concurrency: plan.timing_concurrency,
        requests: result.records.len(),
        failed: result.metrics.failed,
        injected_ttft_ms: plan.injected_ttft_ms,
        injected_itl_ms: plan.injected_itl_ms,
        ttft_error: ErrorSummary::of(&ttft_errors),
        itl_error: ErrorSummary::of(&itl_errors),
        request_delivery: ErrorSummary::of(&delivery),
        client_receive_lag: ErrorSummary::of(&receive_lag),
        ttft_client_error: ErrorSummary::of(&ttft_client),
        itl_client_error: ErrorSummary::of(&itl_client),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The report as people read it.
pub fn render(report: &SelftestReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{:=^64}", " Client self-test (in-process simulator) ");
    let _ = writeln!(out, "{}", report.placement);
    let _ = writeln!(
        out,
        "{:<12} {:>10} {:>8} {:>12} {:>14}",
        "concurrency", "requests", "failed", "requests/s", "chunks/s"
    );
    for c in &report.capacity {
        let _ = writeln!(
            out,
            "{:<12} {:>10} {:>8} {:>12.0} {:>14.0}",
            c.concurrency, c.requests, c.failed, c.requests_per_s, c.chunks_per_s
        );
    }
    for t in &report.timing {
        let _ = writeln!(
            out,
            "{:-^64}",
            format!(
                " Timing error, {} (jitter {}), concurrency {} ",
                t.name, t.jitter, t.concurrency
            )
        );
        let _ = writeln!(
            out,
            "{:<38} {:>8} {:>8} {:>8}",
            "measured - injected (ms)", "median", "p99", "p99 |e|"
        );
        for (name, e) in [
            (
                format!("TTFT (injected ~{} ms)", t.injected_ttft_ms),
                &t.ttft_error,
            ),
            (
                format!("ITL (injected ~{} ms)", t.injected_itl_ms),
                &t.itl_error,
            ),
            (
                "request delivery (send -> server)".to_owned(),
                &t.request_delivery,
            ),
            (
                "client receive lag (server -> client)".to_owned(),
                &t.client_receive_lag,
            ),
            (
                "TTFT after delivery (vs server's write)".to_owned(),
                &t.ttft_client_error,
            ),
            (
                "ITL vs the server's actual writes".to_owned(),
                &t.itl_client_error,
            ),
        ] {
            let _ = writeln!(
                out,
                "{name:<38} {:>8.3} {:>8.3} {:>8.3}",
                e.median_ms, e.p99_ms, e.p99_abs_ms
            );
        }
        if t.failed > 0 {
            let _ = writeln!(out, "failed requests: {} of {}", t.failed, t.requests);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small self-test end to end: every request is measured against the
    /// simulator's own record of it, and the report has every row.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_selftest_accounts_for_every_request_and_chunk() {
        let plan = SelftestPlan {
            capacity_concurrency: vec![8],
            capacity_requests: 200,
            timing_concurrency: 16,
            timing_requests: 64,
            injected_ttft_ms: 20.0,
            injected_itl_ms: 5.0,
            timing_output_tokens: 6,
            ..SelftestPlan::default()
        };
        let report = run(&plan).await.unwrap();
        assert_eq!(report.capacity[0].requests, 200);
        assert_eq!(report.capacity[0].failed, 0);
        assert_eq!(report.timing.len(), 2);
        for t in &report.timing {
            assert_eq!((t.requests, t.failed), (64, 0));
            assert_eq!(t.ttft_error.samples, 64);
            assert_eq!(t.ttft_client_error.samples, 64);
            // 6 tokens: 5 gaps per request, each matched to the simulator's.
            assert_eq!(t.itl_error.samples, 64 * 5);
            assert_eq!(t.itl_client_error.samples, 64 * 5);
            assert_eq!(t.client_receive_lag.samples, 64 * 6);
            // Measured latency can only come after what the server did.
            assert!(t.ttft_client_error.median_ms >= 0.0, "{t:?}");
            assert!(t.request_delivery.median_ms >= 0.0, "{t:?}");
        }
        // The simulator was given a core of its own (its timer thread is
        // really pinned there, off the client's cores), or the report says
        // why not.
        let placement = &report.placement;
        match placement.simulator_cpu {
            Some(cpu) => {
                assert!(!placement.client_cpus.is_empty(), "{placement:?}");
                assert!(!placement.client_cpus.contains(&cpu), "{placement:?}");
                let timer = crate::sim::timer::timer_thread();
                let set = nix::sched::sched_getaffinity(timer.tid).unwrap();
                assert!(set.is_set(cpu).unwrap(), "{placement:?}");
                for &client in &placement.client_cpus {
                    assert!(!set.is_set(client).unwrap(), "{placement:?}");
                }
            }
            None => assert!(!placement.notes.is_empty(), "{placement:?}"),
        }
        // Real-time priority, when the report claims it, is what the timer
        // thread really runs under; otherwise the report says it was refused.
        let (policy, params) = thread_priority::thread_schedule_policy_param(
            crate::sim::timer::timer_thread().pthread,
        )
        .unwrap();
        match placement.simulator_realtime_priority {
            Some(priority) => {
                assert_eq!(
                    policy,
                    thread_priority::ThreadSchedulePolicy::Realtime(
                        thread_priority::RealtimeThreadSchedulePolicy::Fifo
                    )
                );
                assert_eq!(params.sched_priority, i32::from(priority));
            }
            None => assert!(
                placement.notes.iter().any(|n| n.contains("refused")),
                "{placement:?}"
            ),
        }
        let text = render(&report);
        assert!(text.contains(&placement.to_string()), "{text}");
        for row in [
            "TTFT (injected ~20 ms)",
            "ITL vs the server's actual writes",
            "request delivery",
        ] {
            assert!(text.contains(row), "{text}");
        }
    }
}
