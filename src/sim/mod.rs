//! The simulated vLLM: an OpenAI-compatible streaming server that behaves
//! like vLLM where a probe can tell (usage chunk, empty-text chunks,
//! `/version`, `/tokenize`, `vllm:` metrics), with configurable latency and
//! fault injection, changeable at run time through `/admin/config`.
//! Started on any listener, so tests run it in-process on port 0.

mod answers;
mod chunks;
mod endpoints;
mod metrics;
mod prefix_cache;
mod process;
pub mod proxy;
mod stream;
pub mod timer;

pub use endpoints::router;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use metrics::SimMetrics;

/// A fault the simulator can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// HTTP 500 with a vLLM-style error body.
    Http500,
    /// HTTP 429 (rate limited).
    Http429,
    /// HTTP 503 with a reason, as a gateway's flow control or a saturated
    /// pool answers.
    Http503,
    /// A 200 stream that sends an error object after the first tokens.
    StreamError,
    /// Accepts the request and never answers.
    Hang,
    /// Sends the first tokens, then nothing more (connection kept open).
    Stall,
    /// Sends the first tokens, then breaks the connection mid-stream.
    Truncate,
    /// A 200 response whose body is not an event stream.
    Garbage,
    /// Stops after half the requested tokens with `finish_reason: stop`, as
    /// a server that ignores `ignore_eos` does.
    ShortOutput,
}

/// The simulator's behaviour. Every field can be changed at run time with
/// `POST /admin/config` (a partial JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    pub model: String,
    /// Reported by `/version` and in `system_fingerprint`.
    pub version: String,
    /// Reported as the model's `root`; changes with an image's weights.
    pub model_root: String,
    pub max_model_len: u64,
    /// Time to first token at no load, before the per-prompt-token part.
    pub ttft_ms: f64,
    /// Prefill cost per prompt token, added to the TTFT.
    pub prefill_ms_per_token: f64,
    /// Gap between output chunks at no load.
    pub itl_ms: f64,
    /// Sigma of a log-normal multiplier applied to each latency (0 = exact).
    pub jitter: f64,
    /// Latencies grow by this fraction for every other running request.
    pub load_factor: f64,
    /// Requests run at once; more wait (counted as `num_requests_waiting`).
    pub max_num_seqs: usize,
    /// Every n-th output token is sent with empty text (partial UTF-8), 0 = never.
    pub empty_text_every: u32,
    /// Chat answers open with this many reasoning deltas (`reasoning`),
    /// counted in the output tokens and in `reasoning_tokens`.
    pub reasoning_tokens: u32,
    /// Greedy answers (to requests asking for log-probabilities) follow
    /// from the prompt and this: changing it changes what the model
    /// answers, as other weights or numerics would.
    pub answer_seed: u64,
    pub fault: Option<Fault>,
    /// The fault hits every n-th request (1 = all of them).
    pub fault_every: u64,
    /// When set, requests need `Authorization: Bearer <this>`.
    pub api_key: Option<String>,
    /// Name the KV-cache gauge as vLLM before 0.9 did (`gpu_cache_usage_perc`).
    /// Read at start only.
    pub legacy_metric_names: bool,
    /// Which server to pass for: vLLM, or SGLang (its metric names,
    /// `/get_server_info` instead of `/version`, no `system_fingerprint`).
    /// Read at start only.
    pub server_kind: SimServerKind,
    /// `/version` says this instead of `version` (an image change half
    /// done, or a proxy answering for another server).
    pub version_reported: Option<String>,
    /// A new `system_fingerprint` on every request (a server that puts a
    /// request-specific value there).
    pub fingerprint_per_request: bool,
    /// A wedged engine behind a live API server: `/health`, `/version`,
    /// `/v1/models` and `/metrics` answer, generation requests are
    /// accepted and get no token (streams in flight stop) until it ends.
    pub wedged: bool,
    /// The first this many generation requests after the process starts
    /// (and after `POST /admin/restart`) are `cold_factor` times slower,
    /// as a freshly started server's first runs are.
    pub cold_requests: u64,
    pub cold_factor: f64,
}

/// The server the simulator passes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SimServerKind {
    #[default]
    Vllm,
    Sglang,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: "sim-model".into(),
            version: "0.32.0".into(),
            model_root: "sim-org/sim-model".into(),
            max_model_len: 8192,
            ttft_ms: 40.0,
            prefill_ms_per_token: 0.0,
            itl_ms: 8.0,
            jitter: 0.0,
            load_factor: 0.0,
            max_num_seqs: 256,
            empty_text_every: 0,
            reasoning_tokens: 0,
            answer_seed: 0,
            fault: None,
            fault_every: 1,
            api_key: None,
            legacy_metric_names: false,
            server_kind: SimServerKind::Vllm,
            version_reported: None,
            fingerprint_per_request: false,
            wedged: false,
            cold_requests: 0,
            cold_factor: 3.0,
        }
    }
}

/// Counters of what the simulator served, for tests to compare against.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct SimStats {
    pub requests: u64,
    pub completed_streams: u64,
    pub faults_injected: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    /// The most generation requests in progress at once so far (accepted,
    /// hung or streaming).
    #[serde(default)]
    pub max_in_flight: u64,
}

#[derive(Default)]
struct Counters {
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    requests: AtomicU64,
    completed_streams: AtomicU64,
    faults_injected: AtomicU64,
    prompt_tokens: AtomicU64,
    output_tokens: AtomicU64,
}

/// Shared state of one simulator instance.
pub struct SimState {
    config: RwLock<SimConfig>,
    /// `config.wedged`, read on every token without the lock.
    wedged: std::sync::atomic::AtomicBool,
    metrics: SimMetrics,
    counters: Counters,
    slots: Arc<Semaphore>,
    max_num_seqs: usize,
    /// `x-request-id`s received, in order (bounded).
    request_ids: Mutex<Vec<String>>,
    /// The other `x-` headers of each generation request, in order
    /// (bounded): what a gateway or a probe's configuration added.
    headers_seen: Mutex<Vec<Vec<(String, String)>>>,
    /// Per-request timings, kept only when a self-test asks for them.
    traces: Mutex<Option<std::collections::HashMap<String, RequestTrace>>>,
    prefix_cache: Mutex<prefix_cache::PrefixCache>,
    process: process::Process,
}

/// A generation request in progress (see [`SimState::enter`]).
struct InFlight(Arc<SimState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// When the simulator received a request and when it handed each output
/// chunk to the connection; same clock as the client when in-process.
#[derive(Debug, Clone)]
pub struct RequestTrace {
    pub arrived: std::time::Instant,
    /// When each output chunk was scheduled (the injected latencies).
    pub due: Vec<std::time::Instant>,
    pub emitted: Vec<std::time::Instant>,
}

const REQUEST_ID_LOG_LIMIT: usize = 100_000;
/// Generation requests whose headers are kept.
pub const HEADERS_LOG_LIMIT: usize = 1_000;

impl SimState {
    pub fn new(config: SimConfig) -> Arc<Self> {
        let max = config.max_num_seqs.max(1);
        Arc::new(SimState {
            wedged: std::sync::atomic::AtomicBool::new(config.wedged),
            metrics: SimMetrics::new(&config.model, metrics::names_of(&config)),
            config: RwLock::new(config),
            counters: Counters::default(),
            slots: Arc::new(Semaphore::new(max)),
            max_num_seqs: max,
            request_ids: Mutex::new(Vec::new()),
            headers_seen: Mutex::new(Vec::new()),
            traces: Mutex::new(None),
            prefix_cache: Mutex::default(),
            process: process::Process::default(),
        })
    }

    pub fn config(&self) -> SimConfig {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Applies a partial update (the same JSON `/admin/config` takes).
    pub fn update(&self, patch: serde_json::Value) -> Result<SimConfig, String> {
        let mut guard = self.config.write().unwrap_or_else(|p| p.into_inner());
        let mut merged = serde_json::to_value(&*guard).map_err(|e| e.to_string())?;
        let (Some(target), Some(fields)) = (merged.as_object_mut(), patch.as_object()) else {
            return Err("the update must be a JSON object".into());
        };
        for (k, v) in fields {
            target.insert(k.clone(), v.clone());
        }
        let next: SimConfig = serde_json::from_value(merged).map_err(|e| e.to_string())?;
        self.wedged.store(next.wedged, Ordering::Relaxed);
        *guard = next.clone();
        Ok(next)
    }

    /// Waits while the engine is wedged (see [`SimConfig::wedged`]).
    pub(crate) async fn until_unwedged(&self) {
        while self.wedged.load(Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Wedges the engine at once, or ends the wedge.
    pub fn set_wedged(&self, wedged: bool) {
        let _ = self.update(serde_json::json!({ "wedged": wedged }));
    }

    pub fn stats(&self) -> SimStats {
        let c = &self.counters;
        SimStats {
            requests: c.requests.load(Ordering::Relaxed),
            completed_streams: c.completed_streams.load(Ordering::Relaxed),
            faults_injected: c.faults_injected.load(Ordering::Relaxed),
            prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
            output_tokens: c.output_tokens.load(Ordering::Relaxed),
            max_in_flight: c.max_in_flight.load(Ordering::Relaxed),
        }
    }

    /// Generation requests in progress now (accepted, hung or streaming).
    pub fn requests_in_flight(&self) -> u64 {
        self.counters.in_flight.load(Ordering::Relaxed)
    }

    /// Counts a generation request in progress until the guard drops.
    fn enter(self: &Arc<Self>) -> InFlight {
        let c = &self.counters;
        let now = c.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        c.max_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Starts keeping a [`RequestTrace`] per `x-request-id`.
    pub fn enable_traces(&self) {
        *self.traces.lock().unwrap_or_else(|p| p.into_inner()) = Some(Default::default());
    }

    /// Takes the traces collected so far.
    pub fn take_traces(&self) -> std::collections::HashMap<String, RequestTrace> {
        let mut guard = self.traces.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn tracing(&self) -> bool {
        self.traces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn store_trace(&self, id: String, trace: RequestTrace) {
        if let Some(map) = self
            .traces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            map.insert(id, trace);
        }
    }

    /// The `x-` headers (but `x-request-id`) of each generation request
    /// received, in order, for the first [`HEADERS_LOG_LIMIT`].
    pub fn headers_seen(&self) -> Vec<Vec<(String, String)>> {
        self.headers_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note_headers(&self, headers: &HeaderMap) {
        let mut seen = self.headers_seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= HEADERS_LOG_LIMIT {
            return;
        }
        seen.push(
            headers
                .iter()
                .filter(|(n, _)| n.as_str().starts_with("x-") && n.as_str() != "x-request-id")
                .map(|(n, v)| {
                    let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (n.as_str().to_owned(), value)
                })
                .collect(),
        );
    }

    pub fn request_ids(&self) -> Vec<String> {
        self.request_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn authorized(&self, headers: &HeaderMap, config: &SimConfig) -> bool {
        match &config.api_key {
            None => true,
            Some(key) => headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|given| given == key),
        }
    }
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<SimState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Without TCP_NODELAY, Nagle's algorithm holds small SSE chunks back
    // and the simulator's chunk times would drift from their schedule.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// A simulator running in the background of the current runtime.
pub struct SimHandle {
    pub addr: SocketAddr,
    pub state: Arc<SimState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl SimHandle {
    /// Binds `addr` (use port 0 for any free port) and starts serving.
    pub async fn start(addr: &str, config: SimConfig) -> std::io::Result<SimHandle> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = SimState::new(config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state.clone(), async {
            let _ = stopped.await;
        }));
        Ok(SimHandle {
            addr,
            state,
            stop: Some(stop),
            task,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and ends the server task (streams in flight are cut).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
