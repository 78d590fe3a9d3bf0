//! Workload runner: sends prepared requests in a closed loop at fixed
//! concurrency, or in an open loop at a request rate with arrival times
//! computed up front, and collects the raw records. Warm-up requests go
//! first and are discarded.

pub mod arrivals;
pub mod conversation;
pub mod dataset;
pub mod kinds;
pub mod prompts;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::task::AbortOnDropHandle;

use crate::client::{Outcome, PreparedRequest, RequestRecord, StreamingClient};

/// Set once a request ended because the server went silent (no first
/// token in time, or a stall) and no request has finished well since it
/// went silent: a server that stopped answering is sent no more requests,
/// so the run ends within about one timeout instead of one per request
/// left. One stalled request on a server that keeps answering others, or a
/// request cut by the whole-request limit while still streaming, is not a
/// lost server.
#[derive(Clone, Default)]
pub(crate) struct ServerLost(Arc<std::sync::Mutex<Lost>>);

#[derive(Default)]
struct Lost {
    /// When the latest request that went well finished.
    last_ok: Option<Instant>,
    lost: bool,
}

impl ServerLost {
    fn note(&self, record: &RequestRecord) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if record.outcome == Outcome::Ok {
            state.last_ok = Some(state.last_ok.map_or(record.end, |t| t.max(record.end)));
        } else if record.server_silent {
            let silent_since = record.chunk_times.last().copied().unwrap_or(record.sent);
            if state.last_ok.is_none_or(|ok| ok < silent_since) {
                state.lost = true;
            }
        }
    }

    fn lost(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).lost
    }
}

/// How requests are sent.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadShape {
    /// Most requests in flight at once; `None` means no limit.
    pub concurrency: Option<usize>,
    /// Open-loop arrival rate in requests per second; `None` sends as fast
    /// as the concurrency allows (closed loop).
    pub request_rate: Option<f64>,
    /// Gamma shape of the inter-arrival gaps; 1.0 is Poisson.
    pub burstiness: f64,
    /// Seed of the arrival process.
    pub seed: u64,
    /// Stop starting new requests this long after the first dispatch
    /// (duration-bounded runs); requests in flight still finish.
    pub dispatch_window: Option<Duration>,
}

/// Called after each measured request completes (progress bars, counters).
pub type OnComplete = Arc<dyn Fn(&RequestRecord) + Send + Sync>;

/// Raw results of one run, in request order.
#[derive(Debug)]
pub struct RunOutput {
    pub records: Vec<RequestRecord>,
    /// First dispatch of a measured request.
    pub started: Instant,
    /// Last completion.
    pub finished: Instant,
}

impl RunOutput {
    pub fn duration(&self) -> Duration {
        self.finished.saturating_duration_since(self.started)
    }
}

/// Sends `warmup` (discarded) and then `requests` with the given shape.
pub async fn run(
    client: &StreamingClient,
    warmup: Vec<PreparedRequest>,
    requests: Vec<PreparedRequest>,
    shape: &LoadShape,
    on_complete: Option<OnComplete>,
) -> RunOutput {
    // One for the warm-up and the measured requests: a server lost in the
    // warm-up is not sent the run.
    let lost = ServerLost::default();
    let mut warmup_records = Vec::new();
    if !warmup.is_empty() {
        let limit = shape.concurrency.unwrap_or(warmup.len()).min(warmup.len());
        warmup_records = closed_loop(client, Arc::new(warmup), limit, None, None, &lost).await;
    }
    // A run cut short counts what it sent from here: the warm-up is not
    // measured, and counts toward no objective.
    client.measuring();
    let requests = Arc::new(requests);
    let started = Instant::now();
    let mut records = match shape.request_rate {
        Some(rate) if rate.is_finite() && rate > 0.0 => {
            open_loop(client, requests, shape, rate, started, on_complete, &lost).await
        }
        _ => {
            let limit = shape.concurrency.unwrap_or(requests.len()).max(1);
            let stop_at = shape.dispatch_window.map(|w| started + w);
            closed_loop(client, requests, limit, on_complete, stop_at, &lost).await
        }
    };
    if records.is_empty() && lost.lost() {
        // The server was lost in the warm-up, so no measured request was
        // sent: the warm-up's failures are what the run has to show.
        records = warmup_records
            .into_iter()
            .filter(|r| !r.outcome.is_ok())
            .collect();
    }
    records.sort_by_key(|r| r.index);
    let finished = records.iter().map(|r| r.end).max().unwrap_or(started);
    RunOutput {
        records,
        started,
        finished,
    }
}

/// `limit` workers each take the next request as soon as theirs finished,
/// so at most `limit` are ever in flight.
async fn closed_loop(
    client: &StreamingClient,
    requests: Arc<Vec<PreparedRequest>>,
    limit: usize,
    on_complete: Option<OnComplete>,
    stop_at: Option<Instant>,
    lost: &ServerLost,
) -> Vec<RequestRecord> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..limit.min(requests.len()))
        .map(|_| {
            let (client, requests, next, on_complete, lost) = (
                client.clone(),
                requests.clone(),
                next.clone(),
                on_complete.clone(),
                lost.clone(),
            );
            AbortOnDropHandle::new(tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    if lost.lost() || stop_at.is_some_and(|t| Instant::now() >= t) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else {
                        break;
                    };
                    let record = client.send(request, None).await;
                    lost.note(&record);
                    if let Some(f) = &on_complete {
                        f(&record);
                    }
                    done.push(record);
                }
                done
            }))
        })
        .collect();
    let mut records = Vec::with_capacity(requests.len());
    for worker in workers {
        if let Ok(done) = worker.await {
            records.extend(done);
        }
    }
    records
}

/// Dispatches each request at its precomputed arrival time. Latency runs
/// from the intended time, so a late dispatch is charged to the request
/// (no coordinated omission); a wait for a concurrency slot is not, since
/// the cap is the probe's own choice.
async fn open_loop(
    client: &StreamingClient,
    requests: Arc<Vec<PreparedRequest>>,
    shape: &LoadShape,
    rate: f64,
    started: Instant,
    on_complete: Option<OnComplete>,
    lost: &ServerLost,
) -> Vec<RequestRecord> {
    let offsets = arrivals::arrival_offsets(requests.len(), rate, shape.burstiness, shape.seed);
    let slots = shape
        .concurrency
        .map(|c| Arc::new(Semaphore::new(c.max(1))));
    let mut tasks = Vec::with_capacity(requests.len());
    let stop_at = shape.dispatch_window.map(|w| started + w);
    for (i, offset) in offsets.into_iter().enumerate() {
        let intended = started + offset;
        if stop_at.is_some_and(|t| intended >= t) {
            break;
        }
        tokio::time::sleep_until(intended.into()).await;
        if lost.lost() {
            break;
        }
        let (client, requests, slots, on_complete, lost) = (
            client.clone(),
            requests.clone(),
            slots.clone(),
            on_complete.clone(),
            lost.clone(),
        );
        tasks.push(AbortOnDropHandle::new(tokio::spawn(async move {
            let _permit = match &slots {
                Some(s) => Some(
                    s.clone()
                        .acquire_owned()
                        .await
                        .expect("semaphore never closed"),
                ),
                None => None,
            };
            // Waiting for a slot may outlast the server.
            if lost.lost() {
                return None;
            }
            let origin = if slots.is_some() {
                Instant::now().max(intended)
            } else {
                intended
            };
            let record = client.send(&requests[i], Some(origin)).await;
            lost.note(&record);
            if let Some(f) = &on_complete {
                f(&record);
            }
            Some(record)
        })));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok(Some(record)) = task.await {
            records.push(record);
        }
    }
    records
}
