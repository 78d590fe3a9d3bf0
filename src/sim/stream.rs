//! The simulator's completion endpoints: vLLM-shaped SSE streams with
//! scheduled chunk times, and the injected faults.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rand_distr::{Distribution, LogNormal};
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;

use super::answers::{self, Piece};
use super::chunks::ChunkFormat;
use super::{Fault, SimConfig, SimState, timer};

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    #[serde(default)]
    pub content: serde_json::Value,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    response_format: Option<serde_json::Value>,
    #[serde(default)]
    tools: Option<Vec<serde_json::Value>>,
    /// A number on the completions endpoint, `true` on the chat endpoint.
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
}

/// The simulator's tokenizer: one token per whitespace-separated word plus
/// a beginning-of-sequence token.
pub fn prompt_tokens(prompt: &str) -> u32 {
    1 + prompt.split_whitespace().count() as u32
}

/// Chat prompts add a template: `<s>`, the role word per message, and the
/// assistant prefix.
pub fn chat_prompt_tokens(messages: &[ChatMessage]) -> u32 {
    let words: usize = messages
        .iter()
        .map(|m| match &m.content {
            serde_json::Value::String(s) => s.split_whitespace().count(),
            other => other.to_string().split_whitespace().count(),
        })
        .sum();
    2 + messages.len() as u32 + words as u32
}

/// The prompt's words as the prefix cache sees them: the prompt, or the
/// messages' contents one after another.
fn prompt_text(request: &CompletionRequest) -> String {
    match (&request.prompt, &request.messages) {
        (Some(serde_json::Value::String(p)), _) => p.clone(),
        (_, Some(messages)) => messages
            .iter()
            .map(|m| match &m.content {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

pub fn error_response(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": error_type(status), "param": null, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "BadRequestError",
        401 => "AuthenticationError",
        404 => "NotFoundError",
        429 => "RateLimitError",
        _ => "InternalServerError",
    }
}

pub async fn completions(
    State(sim): State<Arc<SimState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(sim, headers, body, false).await
}

pub async fn chat_completions(
    State(sim): State<Arc<SimState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(sim, headers, body, true).await
}

/// Checks the caller and the body: the request and its prompt length, or
/// the status and message a server would answer with.
fn accept(
    sim: &SimState,
    config: &SimConfig,
    headers: &HeaderMap,
    body: &Bytes,
    chat: bool,
) -> Result<(CompletionRequest, u32), (StatusCode, String)> {
    if !sim.authorized(headers, config) {
        return Err((StatusCode::UNAUTHORIZED, "Unauthorized".into()));
    }
    let request: CompletionRequest = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })?;
    if let Some(model) = &request.model
        && model != &config.model
    {
        return Err((
            StatusCode::NOT_FOUND,
            format!("The model `{model}` does not exist."),
        ));
    }
    let prompt_tokens = if chat {
        chat_prompt_tokens(request.messages.as_deref().unwrap_or_default())
    } else {
        match &request.prompt {
            Some(serde_json::Value::String(p)) => prompt_tokens(p),
            Some(serde_json::Value::Array(ids)) => 1 + ids.len() as u32,
            _ => {
                return Err((StatusCode::BAD_REQUEST, "prompt must be a string".into()));
            }
        }
    };
    Ok((request, prompt_tokens))
}

/// The response of a fault that replaces the stream altogether, if any.
async fn failed_response(fault: Option<Fault>) -> Option<Response> {
    match fault? {
        Fault::Http500 => Some(error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "simulated engine failure",
        )),
        Fault::Http429 => Some(error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "simulated rate limit",
        )),
        Fault::Http503 => Some(error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "simulated overload: the pool is saturated and the request was shed",
        )),
        Fault::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Some(error_response(StatusCode::GATEWAY_TIMEOUT, "hung"))
        }
        Fault::Garbage => Some(
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                Bytes::from_static(
                    b"\x00\xff\xfegarbage{{{ not an event stream\n\ndata: {broken json\n\n",
                ),
            )
                .into_response(),
        ),
        _ => None,
    }
}

/// Serves one completion the way vLLM does: accepted, maybe failed by an
/// injected fault, queued for a slot, then streamed on its schedule. The
/// steps share a dozen values, so they stay in one function.
async fn handle(sim: Arc<SimState>, headers: HeaderMap, body: Bytes, chat: bool) -> Response {
    let arrived = Instant::now();
    let config = sim.config();
    let (request, prompt_tokens) = match accept(&sim, &config, &headers, &body, chat) {
        Ok(accepted) => accepted,
        Err((status, message)) => return error_response(status, &message),
    };
    let requested_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(16)
        .max(1);
    let serial = sim.counters.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let in_flight = sim.enter();
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok());
    let trace_id = request_id.filter(|_| sim.tracing()).map(str::to_owned);
    sim.note_headers(&headers);
    if let Some(id) = request_id {
        let mut ids = sim.request_ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.len() < super::REQUEST_ID_LOG_LIMIT {
            ids.push(id.to_owned());
        }
    }
    let fault = config
        .fault
        .filter(|_| serial.is_multiple_of(config.fault_every.max(1)));
    // A structured answer ends where its structure does.
    let wants_logprobs = request
        .logprobs
        .as_ref()
        .is_some_and(|v| v.as_bool() != Some(false) && !v.is_null());
    let answer = answers::structured(request.response_format.as_ref(), request.tools.as_deref())
        .or_else(|| {
            wants_logprobs.then(|| {
                answers::greedy(&prompt_text(&request), config.answer_seed, requested_tokens)
            })
        });
    let requested_tokens = answer.as_ref().map_or(requested_tokens, |a| {
        requested_tokens.min(a.len().max(1) as u32)
    });
    let output_tokens = if fault == Some(Fault::ShortOutput) {
        (requested_tokens / 2).max(1)
    } else {
        requested_tokens
    };
    if fault.is_some() {
        sim.counters.faults_injected.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(response) = failed_response(fault).await {
        return response;
    }
    // A wedged engine: accepted, and no answer until the wedge ends.
    sim.until_unwedged().await;

    sim.metrics.waiting.inc();
    let permit = sim
        .slots
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    sim.metrics.waiting.dec();
    sim.metrics.running.inc();
    sim.counters
        .prompt_tokens
        .fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
    sim.metrics.prompt_tokens.inc_by(u64::from(prompt_tokens));
    sim.metrics
        .prefix_cache_queries
        .inc_by(u64::from(prompt_tokens));
    let hits = sim
        .prefix_cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .lookup(&prompt_text(&request));
    sim.metrics.prefix_cache_hits.inc_by(hits);
    let start = Instant::now();
    let running = sim.metrics.running.get().max(1) as f64;
    let cold = sim.process.next_request(&config);
    let schedule = Schedule::new(&config, prompt_tokens, output_tokens, running, start, cold);
    let trace = trace_id.map(|id| {
        (
            id,
            super::RequestTrace {
                arrived,
                due: schedule.due.clone(),
                emitted: Vec::with_capacity(output_tokens as usize),
            },
        )
    });

    let include_usage = request.stream_options.is_some_and(|o| o.include_usage);
    let format = ChunkFormat::new(&config, chat, serial);
    if !request.stream {
        return non_streaming(sim.clone(), permit, schedule, format, prompt_tokens).await;
    }
    let stream = StreamState {
        sim: sim.clone(),
        _permit: Running {
            sim: sim.clone(),
            _permit: permit,
        },
        _in_flight: in_flight,
        schedule,
        format,
        prompt_tokens,
        include_usage,
        fault,
        answer,
        next: 0,
        finished: false,
        trace,
    };
    let stream = futures_util::stream::unfold(stream, |mut s| async move {
        let item = s.step().await?;
        Some((item, s))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// When each output chunk is due.
struct Schedule {
    start: Instant,
    /// Absolute due time of each output token.
    due: Vec<Instant>,
}

impl Schedule {
    fn new(
        config: &SimConfig,
        prompt_tokens: u32,
        output_tokens: u32,
        running: f64,
        start: Instant,
        cold: f64,
    ) -> Self {
        // A cold process is slower at every step, as the load makes it.
        let load = (1.0 + config.load_factor.max(0.0) * (running - 1.0)) * cold;
        let ttft = (config.ttft_ms + config.prefill_ms_per_token * f64::from(prompt_tokens))
            .max(0.0)
            * load;
        let itl = config.itl_ms.max(0.0) * load;
        let jitter = (config.jitter > 0.0)
            .then(|| LogNormal::new(0.0, config.jitter).expect("sigma is positive"));
        let mut rng = rand::rng();
        let mut scale = |ms: f64| {
            let f = jitter.as_ref().map_or(1.0, |j| j.sample(&mut rng));
            Duration::from_secs_f64(ms * f / 1000.0)
        };
        let mut due = Vec::with_capacity(output_tokens as usize);
        let mut at = start + scale(ttft);
        due.push(at);
        for _ in 1..output_tokens {
            at += scale(itl);
            due.push(at);
        }
        Schedule { start, due }
    }
}

/// Releases the running slot however the stream ends (finished, failed or
/// dropped because the client went away).
struct Running {
    sim: Arc<SimState>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.sim.metrics.running.dec();
    }
}

struct StreamState {
    sim: Arc<SimState>,
    _permit: Running,
    _in_flight: super::InFlight,
    schedule: Schedule,
    format: ChunkFormat,
    prompt_tokens: u32,
    include_usage: bool,
    fault: Option<Fault>,
    /// The structured answer's pieces, one per token.
    answer: Option<Vec<Piece>>,
    next: u32,
    finished: bool,
    trace: Option<(String, super::RequestTrace)>,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        if let Some((id, trace)) = self.trace.take() {
            self.sim.store_trace(id, trace);
        }
    }
}

impl StreamState {
    fn total(&self) -> u32 {
        self.schedule.due.len() as u32
    }

    /// The token after which a mid-stream fault strikes.
    fn fault_point(&self) -> u32 {
        (self.total() / 2).max(1)
    }

    async fn step(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.finished {
            return None;
        }
        let k = self.next;
        let mid_fault = self
            .fault
            .filter(|_| k == self.fault_point() && k < self.total());
        match mid_fault {
            Some(Fault::StreamError) => {
                self.finished = true;
                let mut out = b"data: ".to_vec();
                out.extend_from_slice(
                    br#"{"error":{"message":"simulated error inside the stream","type":"InternalServerError","param":null,"code":500}}"#,
                );
                out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
                return Some(Ok(Bytes::from(out)));
            }
            Some(Fault::Stall) => {
                std::future::pending::<()>().await;
            }
            Some(Fault::Truncate) => {
                self.finished = true;
                return Some(Err(std::io::Error::other("simulated connection loss")));
            }
            _ => {}
        }
        if k >= self.total() {
            self.finished = true;
            let mut out = Vec::with_capacity(512);
            if self.include_usage {
                self.format
                    .usage(self.prompt_tokens, self.total(), &mut out);
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
            self.sim
                .counters
                .completed_streams
                .fetch_add(1, Ordering::Relaxed);
            self.sim
                .metrics
                .request_success
                .with_label_values(&["length"])
                .inc();
            self.sim
                .metrics
                .e2e
                .observe(self.schedule.start.elapsed().as_secs_f64());
            return Some(Ok(Bytes::from(out)));
        }
        let due = self.schedule.due[k as usize];
        timer::sleep_until(due).await;
        self.sim.until_unwedged().await;
        let mut out = Vec::with_capacity(320);
        let piece = self.answer.as_ref().and_then(|a| a.get(k as usize));
        self.format.token(k, k + 1 == self.total(), piece, &mut out);
        self.next += 1;
        self.sim
            .counters
            .output_tokens
            .fetch_add(1, Ordering::Relaxed);
        self.sim.metrics.generation_tokens.inc();
        if let Some((_, trace)) = &mut self.trace {
            trace.emitted.push(Instant::now());
        }
        if k == 0 {
            self.sim.metrics.ttft.observe(
                due.saturating_duration_since(self.schedule.start)
                    .as_secs_f64(),
            );
        } else {
            let gap = due.saturating_duration_since(self.schedule.due[k as usize - 1]);
            self.sim.metrics.itl.observe(gap.as_secs_f64());
        }
        Some(Ok(Bytes::from(out)))
    }
}

async fn non_streaming(
    sim: Arc<SimState>,
    permit: OwnedSemaphorePermit,
    schedule: Schedule,
    format: ChunkFormat,
    prompt_tokens: u32,
) -> Response {
    let _running = Running {
        sim: sim.clone(),
        _permit: permit,
    };
    let total = schedule.due.len() as u32;
    if let Some(last) = schedule.due.last() {
        timer::sleep_until(*last).await;
    }
    sim.counters
        .output_tokens
        .fetch_add(u64::from(total), Ordering::Relaxed);
    sim.counters
        .completed_streams
        .fetch_add(1, Ordering::Relaxed);
    let text = " tok".repeat(total as usize);
    let choice = if format.chat {
        serde_json::json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
    } else {
        serde_json::json!({"index": 0, "text": text, "finish_reason": "length"})
    };
    axum::Json(serde_json::json!({
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": total, "total_tokens": prompt_tokens + total},
        "system_fingerprint": format.fingerprint,
    }))
    .into_response()
}
