//! OpenAI-compatible streaming client: sends one completion request and
//! records raw monotonic instants (send, each choice-bearing chunk, end),
//! token counts from `usage`, and a bounded outcome. Phases and metrics are
//! derived later from these raw timings, never inside the read loop.

pub mod auth;
pub mod outcome;
pub mod server_api;
pub mod sse;

use std::borrow::Cow;
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Serialize};

pub use auth::{ApiKey, ApiKeySource};
pub use outcome::Outcome;
use sse::SseDecoder;

/// Which OpenAI API the probe speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `POST /v1/completions` with `prompt` and `max_tokens`.
    Completions,
    /// `POST /v1/chat/completions` with `messages` and `max_completion_tokens`.
    Chat,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
    }
}

/// Per-request time limits. Every request is bounded by `request`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    pub connect: Duration,
    pub first_token: Duration,
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            first_token: Duration::from_secs(120),
            request: Duration::from_secs(600),
        }
    }
}

/// Everything the client needs to talk to one server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL without the `/v1/...` path, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    pub endpoint: Endpoint,
    pub model: String,
    pub api_key: Option<ApiKey>,
    pub timeouts: Timeouts,
    /// Send vLLM's `ignore_eos` so outputs are exactly `max_tokens` long;
    /// a shorter output is then reported as `short_output`.
    pub ignore_eos: bool,
}

/// One request ready to send: the prompt is built before timing starts.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    pub index: usize,
    /// Sent as `x-request-id`, e.g. `sentinel-<run>-<n>`.
    pub request_id: String,
    pub prompt: String,
    pub max_tokens: u32,
}

/// Raw observations of one request; all derived numbers come from here.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub index: usize,
    /// Origin of every latency: the intended send time in an open-loop run,
    /// otherwise the instant just before the request was handed to the
    /// connection (after any concurrency wait).
    pub start: Instant,
    /// When the request was actually handed to the HTTP client.
    pub sent: Instant,
    /// Arrival of each SSE message whose `choices` array was non-empty.
    pub chunk_times: Vec<Instant>,
    pub end: Instant,
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    pub requested_output_tokens: u32,
    pub outcome: Outcome,
    /// Human-readable failure detail; never contains the API key.
    pub error: Option<String>,
    pub system_fingerprint: Option<String>,
    /// What a 429 or 503 answer's `Retry-After` asked for.
    pub retry_after: Option<Duration>,
}

impl RequestRecord {
    pub fn ttft(&self) -> Option<Duration> {
        self.chunk_times
            .first()
            .map(|t| t.saturating_duration_since(self.start))
    }

    /// Start to the last choice-bearing chunk (the usage chunk and `[DONE]`
    /// do not count).
    pub fn e2el(&self) -> Option<Duration> {
        self.chunk_times
            .last()
            .map(|t| t.saturating_duration_since(self.start))
    }

    /// Gaps between successive choice-bearing chunks.
    pub fn itls(&self) -> impl Iterator<Item = Duration> + '_ {
        self.chunk_times
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0]))
    }

    /// Output tokens as the server counted them; the number of choice
    /// chunks when the server sent no usage.
    pub fn output_tokens(&self) -> u32 {
        self.completion_tokens
            .unwrap_or(self.chunk_times.len() as u32)
    }

    /// The request as the statistics module sees it, in seconds relative
    /// to `run_start`.
    pub fn to_sample(&self, run_start: Instant) -> crate::stats::bench::RequestSample {
        crate::stats::bench::RequestSample {
            success: self.outcome.is_ok(),
            start_s: self
                .start
                .saturating_duration_since(run_start)
                .as_secs_f64(),
            ttft_s: self.ttft().map_or(0.0, |d| d.as_secs_f64()),
            itls_s: self.itls().map(|d| d.as_secs_f64()).collect(),
            latency_s: self.e2el().map_or(0.0, |d| d.as_secs_f64()),
            prompt_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.output_tokens(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid base URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
}

/// A streaming client bound to one server and endpoint.
#[derive(Debug, Clone)]
pub struct StreamingClient {
    http: reqwest::Client,
    url: reqwest::Url,
    auth: Option<HeaderValue>,
    config: ClientConfig,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct CompletionBody<'a> {
    model: &'a str,
    prompt: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
    stream: bool,
    stream_options: StreamOptions,
    temperature: f64,
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: [ChatMessage<'a>; 1],
    max_completion_tokens: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
    stream: bool,
    stream_options: StreamOptions,
    temperature: f64,
}

/// The fields of a stream message the client looks at. Everything else
/// (text, logprobs, deltas) is skipped without allocation.
#[derive(Deserialize)]
struct StreamMessage<'a> {
    #[serde(default)]
    choices: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
    #[serde(default, borrow)]
    object: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    system_fingerprint: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u32>,
    #[serde(default)]
    completion_tokens: Option<u32>,
}

/// What ended the read loop early.
struct Failure {
    outcome: Outcome,
    detail: String,
}

impl Failure {
    fn new(outcome: Outcome, detail: impl Into<String>) -> Self {
        Failure {
            outcome,
            detail: detail.into(),
        }
    }
}

/// The `Authorization` header for a key, marked sensitive so HTTP-level
/// logging never prints it. Shared by the streaming and metadata clients.
pub(crate) fn auth_header(key: &ApiKey) -> Result<HeaderValue, ClientError> {
    let mut value = HeaderValue::from_str(&key.bearer()).map_err(|_| {
        ClientError::Build("the API key contains characters not allowed in a header".into())
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Longest error body kept from a failed response.
const ERROR_BODY_LIMIT: usize = 512;

impl StreamingClient {
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let url = join_url(&config.base_url, config.endpoint.path())?;
        let http = build_http(&config.timeouts)?;
        let auth = config.api_key.as_ref().map(auth_header).transpose()?;
        Ok(StreamingClient {
            http,
            url,
            auth,
            config,
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The JSON body for one request, as sent.
    pub fn body(&self, request: &PreparedRequest) -> Vec<u8> {
        let stream_options = StreamOptions {
            include_usage: true,
        };
        let model = &self.config.model;
        let ignore_eos = self.config.ignore_eos;
        let encoded = match self.config.endpoint {
            Endpoint::Completions => serde_json::to_vec(&CompletionBody {
                model,
                prompt: &request.prompt,
                max_tokens: request.max_tokens,
                ignore_eos,
                stream: true,
                stream_options,
                temperature: 0.0,
            }),
            Endpoint::Chat => serde_json::to_vec(&ChatBody {
                model,
                messages: [ChatMessage {
                    role: "user",
                    content: &request.prompt,
                }],
                max_completion_tokens: request.max_tokens,
                ignore_eos,
                stream: true,
                stream_options,
                temperature: 0.0,
            }),
        };
        encoded.expect("serializing plain strings and numbers cannot fail")
    }

    /// Sends one request and records what happened. Never fails: every
    /// problem becomes the record's outcome. `origin` is the intended send
    /// time in an open-loop run; latency is measured from it.
    pub async fn send(&self, request: &PreparedRequest, origin: Option<Instant>) -> RequestRecord {
        let body = self.body(request);
        let mut builder = self
            .http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("x-request-id", &request.request_id)
            .body(body);
        if let Some(auth) = &self.auth {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        let sent = Instant::now();
        let start = origin.map_or(sent, |o| o.min(sent));
        let mut reader = StreamReader {
            decoder: SseDecoder::new(),
            record: RequestRecord {
                index: request.index,
                start,
                sent,
                chunk_times: Vec::with_capacity((request.max_tokens as usize + 2).min(8192)),
                end: sent,
                prompt_tokens: None,
                completion_tokens: None,
                requested_output_tokens: request.max_tokens,
                outcome: Outcome::Ok,
                error: None,
                system_fingerprint: None,
                retry_after: None,
            },
            done_seen: false,
        };
        let timeouts = self.config.timeouts;
        // Checked: a timeout beyond the clock's range means "a day", not a
        // panic (settings are validated; this is the last line).
        let after = |d: Duration| {
            start
                .checked_add(d)
                .unwrap_or(start + crate::limits::MAX_REQUEST_TIMEOUT)
        };
        let request_deadline = after(timeouts.request);
        let first_deadline = after(timeouts.first_token).min(request_deadline);

        // Phase one: connect, headers, and the stream up to the first choice.
        let first = tokio::time::timeout_at(first_deadline.into(), async {
            let response = builder.send().await.map_err(classify_send_error)?;
            let status = response.status();
            if !status.is_success() {
                reader.record.retry_after = retry_after(&response);
                let detail = read_error_body(response).await;
                return Err(Failure::new(
                    Outcome::from_status(status.as_u16()),
                    format!("HTTP {status}{detail}"),
                ));
            }
            let mut response = response;
            let ended = reader.read(&mut response, true).await?;
            Ok((response, ended))
        })
        .await;
        let result = match first {
            Err(_) => Err(Failure::new(
                Outcome::Timeout,
                format!("no first token within {:?}", first_deadline - start),
            )),
            Ok(Err(failure)) => Err(failure),
            Ok(Ok((_, true))) => Ok(()),
            Ok(Ok((mut response, false))) => {
                // Phase two: the rest of the stream, bounded by the request deadline.
                match tokio::time::timeout_at(
                    request_deadline.into(),
                    reader.read(&mut response, false),
                )
                .await
                {
                    Err(_) => Err(Failure::new(
                        Outcome::Timeout,
                        format!("request not finished within {:?}", timeouts.request),
                    )),
                    Ok(Err(failure)) => Err(failure),
                    Ok(Ok(_)) => Ok(()),
                }
            }
        };
        let mut record = reader.finish(result);
        // Server text may echo the key it refused, or carry control
        // characters: neither reaches a log, the store or a page.
        if let Some(error) = record.error.take() {
            let error = match &self.config.api_key {
                Some(key) => key.scrub(&error),
                None => error,
            };
            record.error = Some(crate::text::clean(&error, crate::text::MAX_MESSAGE_LEN));
        }
        record
    }
}

/// Longest `Retry-After` honoured: a server asking for more is still
/// probed again within the hour.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// `Retry-After` in seconds (the HTTP-date form is rare on API servers and
/// is ignored), capped.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && status != 503 {
        return None;
    }
    let seconds: u64 = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// Read-loop state for one response.
struct StreamReader {
    decoder: SseDecoder,
    record: RequestRecord,
    done_seen: bool,
}

impl StreamReader {
    /// Reads until the body ends (returns `true`), or, with
    /// `until_first_choice`, until the first choice-bearing message arrived
    /// (returns `false`).
    async fn read(
        &mut self,
        response: &mut reqwest::Response,
        until_first_choice: bool,
    ) -> Result<bool, Failure> {
        loop {
            let chunk = response.chunk().await.map_err(|e| {
                Failure::new(
                    Outcome::StreamError,
                    format!("stream broke: {}", error_chain(&e)),
                )
            })?;
            let Some(bytes) = chunk else {
                let mut failure = None;
                let at = Instant::now();
                let (record, done_seen) = (&mut self.record, &mut self.done_seen);
                self.decoder
                    .finish(|event| handle_event(event, at, record, done_seen, &mut failure));
                return match failure {
                    Some(f) => Err(f),
                    None => Ok(true),
                };
            };
            let at = Instant::now();
            let mut failure = None;
            let (record, done_seen) = (&mut self.record, &mut self.done_seen);
            self.decoder.feed(&bytes, |event| {
                if failure.is_none() {
                    handle_event(event, at, record, done_seen, &mut failure)
                }
            });
            if let Some(f) = failure {
                return Err(f);
            }
            if until_first_choice && !self.record.chunk_times.is_empty() {
                return Ok(false);
            }
        }
    }

    fn finish(mut self, result: Result<(), Failure>) -> RequestRecord {
        let record = &mut self.record;
        record.end = Instant::now();
        let failure = match result {
            Err(f) => Some(f),
            Ok(()) if record.chunk_times.is_empty() => Some(Failure::new(
                Outcome::StreamError,
                "stream ended without any choice-bearing message",
            )),
            Ok(()) if !self.done_seen && record.completion_tokens.is_none() => Some(Failure::new(
                Outcome::StreamError,
                "stream ended before [DONE] and without usage (truncated)",
            )),
            Ok(()) if record.output_tokens() < record.requested_output_tokens => {
                Some(Failure::new(
                    Outcome::ShortOutput,
                    format!(
                        "{} output tokens where {} were requested",
                        record.output_tokens(),
                        record.requested_output_tokens
                    ),
                ))
            }
            Ok(()) => None,
        };
        if let Some(f) = failure {
            record.outcome = f.outcome;
            record.error = Some(f.detail);
        }
        self.record
    }
}

fn handle_event(
    event: &[u8],
    at: Instant,
    record: &mut RequestRecord,
    done_seen: &mut bool,
    failure: &mut Option<Failure>,
) {
    if event == b"[DONE]" {
        *done_seen = true;
        return;
    }
    let message: StreamMessage = match serde_json::from_slice(event) {
        Ok(m) => m,
        Err(e) => {
            *failure = Some(Failure::new(
                Outcome::StreamError,
                format!("unreadable stream message ({e}): {}", preview(event)),
            ));
            return;
        }
    };
    if let Some(error) = message.error {
        let text = error
            .get("message")
            .and_then(|m| m.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| error.to_string());
        *failure = Some(Failure::new(
            Outcome::StreamError,
            format!("error in stream: {}", truncate(&text)),
        ));
        return;
    }
    if message.object.as_deref() == Some("error") {
        let text = message.message.as_deref().unwrap_or("unspecified error");
        *failure = Some(Failure::new(
            Outcome::StreamError,
            format!("error in stream: {}", truncate(text)),
        ));
        return;
    }
    if message.choices.as_ref().is_some_and(|c| !c.is_empty()) {
        if record.chunk_times.len() >= chunk_limit(record.requested_output_tokens) {
            *failure = Some(Failure::new(
                Outcome::StreamError,
                format!(
                    "more output than requested: over {} choice messages where {} tokens were asked for",
                    record.chunk_times.len(),
                    record.requested_output_tokens
                ),
            ));
            return;
        }
        record.chunk_times.push(at);
    }
    if let Some(usage) = message.usage {
        if usage.prompt_tokens.is_some() {
            record.prompt_tokens = usage.prompt_tokens;
        }
        if usage.completion_tokens.is_some() {
            record.completion_tokens = usage.completion_tokens;
        }
    }
    if let Some(fp) = message.system_fingerprint
        && record.system_fingerprint.is_none()
    {
        record.system_fingerprint = Some(crate::text::clean(&fp, crate::text::MAX_ID_LEN));
    }
}

/// Most choice-bearing messages read for a request of `requested` tokens:
/// a server may add a role-only first message and a finish message, and
/// counts tokens its own way, but a stream far beyond what was asked for is
/// a server that does not stop, and reading it on would hold the probe
/// until the request timeout.
pub fn chunk_limit(requested: u32) -> usize {
    let requested = requested as usize;
    requested + requested / 4 + 16
}

/// Whether a failed request died of our own resources (descriptors,
/// memory for sockets) rather than the target's.
fn is_local(e: &reqwest::Error) -> bool {
    use std::error::Error as _;
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && let Some(code) = io.raw_os_error()
            && [
                nix::libc::EMFILE,
                nix::libc::ENFILE,
                nix::libc::ENOBUFS,
                nix::libc::ENOMEM,
            ]
            .contains(&code)
        {
            return true;
        }
        source = s.source();
    }
    false
}

fn classify_send_error(e: reqwest::Error) -> Failure {
    let outcome = if is_local(&e) {
        Outcome::Local
    } else if e.is_connect() {
        Outcome::Connect
    } else if e.is_timeout() {
        Outcome::Timeout
    } else {
        Outcome::StreamError
    };
    Failure::new(outcome, error_chain(&e))
}

/// Reads a bounded prefix of an error response's body for the message.
async fn read_error_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_LIMIT);
    let text = String::from_utf8_lossy(&body);
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("detail"))
                .and_then(|m| m.as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| text.trim().to_owned());
    if message.is_empty() {
        String::new()
    } else {
        format!(": {}", truncate(&message))
    }
}

/// A reqwest error and its causes on one line, without the URL (which may
/// carry credentials).
pub fn error_chain(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = String::new();
    let stripped = e.to_string();
    text.push_str(stripped.split(" for url (").next().unwrap_or(&stripped));
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

fn preview(bytes: &[u8]) -> String {
    truncate(&String::from_utf8_lossy(&bytes[..bytes.len().min(80)]))
}

fn truncate(text: &str) -> String {
    crate::text::truncate(text, 200)
}

/// Joins a base URL and an absolute API path, keeping any path prefix of
/// the base (`http://gw/vllm` + `/v1/models`).
pub fn join_url(base: &str, path: &str) -> Result<reqwest::Url, ClientError> {
    let parsed = reqwest::Url::parse(base).map_err(|e| ClientError::BadUrl {
        url: base.to_owned(),
        reason: e.to_string(),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ClientError::BadUrl {
            url: base.to_owned(),
            reason: "the scheme must be http or https".into(),
        });
    }
    let joined = format!("{}{}", base.trim_end_matches('/'), path);
    reqwest::Url::parse(&joined).map_err(|e| ClientError::BadUrl {
        url: base.to_owned(),
        reason: e.to_string(),
    })
}

pub(crate) fn build_http(timeouts: &Timeouts) -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .connect_timeout(timeouts.connect)
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| ClientError::Build(error_chain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_join_keeps_prefix_and_rejects_bad_schemes() {
        assert_eq!(
            join_url("http://h:1/", "/v1/models").unwrap().as_str(),
            "http://h:1/v1/models"
        );
        assert_eq!(
            join_url("http://h:1/gw", "/v1/models").unwrap().as_str(),
            "http://h:1/gw/v1/models"
        );
        assert!(join_url("ftp://h", "/v1").is_err());
        assert!(join_url("not a url", "/v1").is_err());
    }

    #[test]
    fn auth_header_is_sensitive_and_rejects_unsendable_keys() {
        let header = auth_header(&ApiKey::new("sk-1")).unwrap();
        assert!(header.is_sensitive());
        assert_eq!(header.to_str().unwrap(), "Bearer sk-1");
        let err = auth_header(&ApiKey::new("bad\nkey"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not allowed in a header") && !err.contains("bad"),
            "{err}"
        );
        let api = server_api::ServerApi::new(
            "http://127.0.0.1:1",
            Some(&ApiKey::new("x\ny")),
            Duration::from_secs(1),
        );
        assert!(api.is_err(), "the metadata client refuses it too");
    }

    fn record() -> RequestRecord {
        let t = Instant::now();
        RequestRecord {
            index: 0,
            start: t,
            sent: t,
            chunk_times: vec![],
            end: t,
            prompt_tokens: None,
            completion_tokens: None,
            requested_output_tokens: 2,
            outcome: Outcome::Ok,
            error: None,
            system_fingerprint: None,
            retry_after: None,
        }
    }

    #[test]
    fn events_count_empty_text_choices_and_skip_usage_only() {
        let mut r = record();
        let (mut done, mut failure) = (false, None);
        let t = Instant::now();
        handle_event(
            br#"{"choices":[{"text":""}]}"#,
            t,
            &mut r,
            &mut done,
            &mut failure,
        );
        handle_event(
            br#"{"choices":[{"text":"x"}]}"#,
            t,
            &mut r,
            &mut done,
            &mut failure,
        );
        handle_event(
            br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2},"system_fingerprint":"vllm-0.32.0-ab"}"#,
            t,
            &mut r,
            &mut done,
            &mut failure,
        );
        handle_event(b"[DONE]", t, &mut r, &mut done, &mut failure);
        assert!(failure.is_none());
        assert!(done);
        assert_eq!(r.chunk_times.len(), 2);
        assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(5), Some(2)));
        assert_eq!(r.system_fingerprint.as_deref(), Some("vllm-0.32.0-ab"));
    }

    #[test]
    fn error_objects_and_garbage_become_stream_errors() {
        for event in [
            &br#"{"error":{"message":"boom","type":"InternalServerError","code":500}}"#[..],
            &br#"{"object":"error","message":"bad"}"#[..],
            &b"\x00\xffnot json"[..],
        ] {
            let mut r = record();
            let (mut done, mut failure) = (false, None);
            handle_event(event, Instant::now(), &mut r, &mut done, &mut failure);
            let f = failure.expect("a failure");
            assert_eq!(f.outcome, Outcome::StreamError);
        }
    }
}
