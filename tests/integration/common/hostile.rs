//! A misbehaving OpenAI-compatible server on 127.0.0.1 port 0, switched
//! between behaviours at run time: what a broken proxy, a crashed engine
//! or a hostile peer sends. It records the `Authorization` headers it saw.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;

/// What the server does.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Behaves: one model, `/tokenize` one token per word plus one.
    Normal,
    /// `/tokenize` answers this JSON as its `count`, whatever the prompt.
    TokenizeCount(String),
    /// Streams choices forever, one every millisecond.
    Runaway,
    /// Completions answer 401 echoing the Authorization header.
    EchoKey401,
    /// `/version` (and the model id) carry a newline, ANSI codes and NUL.
    HostileText,
    /// Completions answer 429 with `Retry-After: N`.
    RateLimited(u64),
    /// Completions answer 500.
    AllFail,
    /// `/v1/models` lists this many models.
    ManyModels(usize),
    /// The model is named this (for model churn).
    Model(String),
    /// Completions send `data: xxx...` without ever ending the line.
    EndlessLine,
    /// Completions send `data:` lines forever without the blank line that
    /// would end the event.
    EndlessEvent,
    /// `/v1/models` answers a JSON list that never ends.
    EndlessModels,
    /// The same, one model (33 bytes) per chunk.
    EndlessModelsInPieces,
    /// `/metrics` and `/dcgm` never end (otherwise they are short pages).
    EndlessPages,
    /// Completions send one token, then only keep-alive comments
    /// (`: ping`), as a proxy in front of a wedged engine does.
    KeepAlive,
    /// Completions send one token, then only events without a choice.
    EmptyChoices,
    /// Completions answer whole, then hold the body open after `[DONE]`.
    DoneHeld,
    /// Completions answer 400 with a message that echoes the
    /// Authorization header where the message is cut (300 bytes).
    EchoKeyAtCut,
    /// Completions (and `/v1/models` with `RedirectModels`) answer 307 to
    /// this address.
    Redirect(String),
    RedirectModels(String),
}

const SERVER_LINE: &str = "vllm:num_requests_running{model_name=\"m\"} 1\n";
const DCGM_LINE: &str = "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\"} 50\n";

async fn server_page(State(state): State<Arc<HostileState>>) -> Response {
    match mode(&state) {
        Mode::EndlessPages => endless(SERVER_LINE),
        _ => SERVER_LINE.into_response(),
    }
}

async fn dcgm_page(State(state): State<Arc<HostileState>>) -> Response {
    match mode(&state) {
        Mode::EndlessPages => endless(DCGM_LINE),
        _ => DCGM_LINE.into_response(),
    }
}

/// A body with no end, 64 KiB at a time: whoever reads it must cut it off.
fn endless(piece: &'static str) -> Response {
    let piece = Bytes::from(piece.repeat(64 * 1024 / piece.len()));
    sse(async_stream(move |tx| async move {
        while tx.send(piece.clone()).await.is_ok() {}
    }))
}

pub struct HostileState {
    pub mode: Mutex<Mode>,
    pub auth_seen: Mutex<Vec<String>>,
    /// Every header of every request to `/v1/models` and completions.
    pub headers_seen: Mutex<Vec<String>>,
    pub max_model_len: Mutex<Option<u64>>,
}

pub struct HostileServer {
    pub url: String,
    pub state: Arc<HostileState>,
}

impl HostileServer {
    pub async fn start(mode: Mode) -> HostileServer {
        let state = Arc::new(HostileState {
            mode: Mutex::new(mode),
            auth_seen: Mutex::new(Vec::new()),
            headers_seen: Mutex::new(Vec::new()),
            max_model_len: Mutex::new(None),
        });
        let app = Router::new()
            .route("/v1/models", get(models))
            .route("/version", get(version))
            .route("/health", get(|| async { "" }))
            .route("/metrics", get(server_page))
            .route("/dcgm", get(dcgm_page))
            .route("/tokenize", post(tokenize))
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(completions))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        HostileServer { url, state }
    }

    pub fn set(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = mode;
    }
}

const HOSTILE_TEXT: &str =
    "0.1\n2026-01-01T00:00:00Z ERROR vllm_sentinel::daemon: FORGED LINE\x1b]0;owned\x07\0<script>";

fn mode(state: &HostileState) -> Mode {
    state.mode.lock().unwrap().clone()
}

fn model_name(state: &HostileState) -> String {
    match mode(state) {
        Mode::Model(name) => name,
        Mode::HostileText => format!("m{HOSTILE_TEXT}"),
        _ => "m".into(),
    }
}

fn redirect(to: &str) -> Response {
    (
        StatusCode::TEMPORARY_REDIRECT,
        [("location", to.to_owned())],
    )
        .into_response()
}

/// The request's headers, `name: value` each, as the server saw them.
fn header_lines(headers: &HeaderMap) -> Vec<String> {
    headers
        .iter()
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
        .collect()
}

async fn models(State(state): State<Arc<HostileState>>, headers: HeaderMap) -> Response {
    state
        .headers_seen
        .lock()
        .unwrap()
        .extend(header_lines(&headers));
    if let Mode::RedirectModels(to) = mode(&state) {
        return redirect(&format!("{to}/v1/models"));
    }
    const MODEL: &str = "{\"id\": \"m\", \"object\": \"model\"},";
    match mode(&state) {
        Mode::EndlessModels => return endless(MODEL),
        Mode::EndlessModelsInPieces => {
            return sse(async_stream(move |tx| async move {
                while tx.send(Bytes::from_static(MODEL.as_bytes())).await.is_ok() {}
            }));
        }
        _ => {}
    }
    let max_len = *state.max_model_len.lock().unwrap();
    let data: Vec<serde_json::Value> = match mode(&state) {
        Mode::ManyModels(n) => (0..n)
            .map(|i| serde_json::json!({"id": format!("model-{i:06}")}))
            .collect(),
        _ => vec![serde_json::json!({"id": model_name(&state), "max_model_len": max_len})],
    };
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

async fn version(State(state): State<Arc<HostileState>>) -> Response {
    let v = if mode(&state) == Mode::HostileText {
        HOSTILE_TEXT.to_owned()
    } else {
        "0.1".to_owned()
    };
    axum::Json(serde_json::json!({ "version": v })).into_response()
}

async fn tokenize(State(state): State<Arc<HostileState>>, body: Bytes) -> Response {
    let count = match mode(&state) {
        Mode::TokenizeCount(raw) => raw,
        _ => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let words = v["prompt"]
                .as_str()
                .unwrap_or("")
                .split_whitespace()
                .count();
            (words + 1).to_string()
        }
    };
    (
        [("content-type", "application/json")],
        format!("{{\"count\": {count}, \"max_model_len\": 4096, \"tokens\": []}}"),
    )
        .into_response()
}

fn chunk(text: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n"
    ))
}

async fn completions(
    State(state): State<Arc<HostileState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    state.auth_seen.lock().unwrap().push(auth.clone());
    state
        .headers_seen
        .lock()
        .unwrap()
        .extend(header_lines(&headers));
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let max_tokens = request["max_tokens"]
        .as_u64()
        .or(request["max_completion_tokens"].as_u64())
        .unwrap_or(4);
    match mode(&state) {
        Mode::EchoKey401 => (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": {
                "message": format!("Incorrect API key provided: {auth}\n\x1b[31mbad\x1b[0m"),
                "type": "invalid_request_error"
            }})),
        )
            .into_response(),
        Mode::RateLimited(after) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", after.to_string())],
            "slow down",
        )
            .into_response(),
        Mode::EchoKeyAtCut => {
            // The key starts 12 bytes before the 300-byte cut; the spaces
            // collapse when the line is cleaned, so the cut stays in view.
            let padding = format!("p{}", " ".repeat(300 - 12 - "you sent: Bearer ".len() - 1));
            (
                StatusCode::BAD_REQUEST,
                axum::Json(serde_json::json!({"error": {
                    "message": format!("{padding}you sent: {auth}")
                }})),
            )
                .into_response()
        }
        Mode::Redirect(to) | Mode::RedirectModels(to) => redirect(&format!("{to}/v1/completions")),
        Mode::KeepAlive | Mode::EmptyChoices => {
            let filler: &'static [u8] = match mode(&state) {
                Mode::KeepAlive => b": ping\n\n",
                _ => b"data: {\"id\":\"c\",\"choices\":[]}\n\n",
            };
            sse(async_stream(move |tx| async move {
                if tx.send(chunk("x")).await.is_err() {
                    return;
                }
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if tx.send(Bytes::from_static(filler)).await.is_err() {
                        return;
                    }
                }
            }))
        }
        Mode::AllFail => (StatusCode::INTERNAL_SERVER_ERROR, "engine dead").into_response(),
        Mode::EndlessLine => endless("data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        Mode::EndlessEvent => endless("data: {\"choices\": [{\"text\": \"x\"}]}\n"),
        Mode::Runaway => {
            let stream = async_stream(move |tx| async move {
                loop {
                    if tx.send(chunk("x")).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            sse(stream)
        }
        _ => {
            let fingerprint = if mode(&state) == Mode::HostileText {
                HOSTILE_TEXT
            } else {
                "fp-1"
            };
            let held = mode(&state) == Mode::DoneHeld;
            let stream = async_stream(move |tx| async move {
                for _ in 0..max_tokens {
                    if tx.send(chunk("x")).await.is_err() {
                        return;
                    }
                }
                let usage = serde_json::json!({
                    "choices": [], "system_fingerprint": fingerprint,
                    "usage": {"prompt_tokens": 8, "completion_tokens": max_tokens}
                });
                let _ = tx.send(Bytes::from(format!("data: {usage}\n\n"))).await;
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                if held {
                    // The body stays open until the reader goes away.
                    tx.closed().await;
                }
            });
            sse(stream)
        }
    }
}

fn sse(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let stream = tokio_stream_from(rx);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn async_stream<F, Fut>(f: F) -> tokio::sync::mpsc::Receiver<Bytes>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    rx
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok)))
}

/// A stored run's outcome label: `ok`, `config`, ... or the failing
/// request outcome (stored as `{"failed": "http_5xx"}`).
pub fn run_outcome(run: &serde_json::Value) -> &str {
    run["outcome"]
        .as_str()
        .or_else(|| run["outcome"]["failed"].as_str())
        .unwrap_or("?")
}

/// Peak resident memory of a process so far (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Current resident memory of a process (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
