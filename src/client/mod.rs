//! OpenAI-compatible streaming client: sends one completion request and
//! records raw monotonic instants (send, each choice-bearing chunk, end),
//! token counts from `usage`, and a bounded outcome. Phases and metrics are
//! derived later from these raw timings, never inside the read loop.

pub mod gateway;
pub mod http;
pub mod progress;
pub mod record;
pub mod server_api;
pub mod sse;
mod stream;
mod wire;

use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Serialize};

pub use crate::secret::{Secret, SecretSource};
pub use crate::vocabulary::outcome::Outcome;
pub use gateway::{GatewayRules, RequestHeaders};
pub use record::{CapturedOutput, ChatMessage, PreparedRequest, RequestRecord};
pub use stream::chunk_limit;
use stream::{Failure, Reached, ReadRules, ReadTo, StreamReader};

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
    /// From the start to the first choice-bearing chunk.
    pub first_token: Duration,
    /// Longest silence after the first token: a stream that stops sending
    /// fails now, not when the whole-request timeout ends it.
    pub stall: Duration,
    pub request: Duration,
}

impl Timeouts {
    pub const DEFAULT_CONNECT: Duration = Duration::from_secs(5);
    pub const DEFAULT_FIRST_TOKEN: Duration = Duration::from_secs(120);
    pub const DEFAULT_STALL: Duration = Duration::from_secs(30);
    pub const DEFAULT_REQUEST: Duration = Duration::from_secs(600);
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Self::DEFAULT_CONNECT,
            first_token: Self::DEFAULT_FIRST_TOKEN,
            stall: Self::DEFAULT_STALL,
            request: Self::DEFAULT_REQUEST,
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
    pub api_key: Option<Secret>,
    pub timeouts: Timeouts,
    /// Send vLLM's `ignore_eos` so outputs are exactly `max_tokens` long;
    /// a shorter output is then reported as `short_output`.
    pub ignore_eos: bool,
    /// Send `min_tokens` equal to `max_tokens` too: models with stop tokens
    /// besides the end-of-sequence one stop early under `ignore_eos` alone.
    pub min_tokens: bool,
    /// What of the answer each record keeps.
    pub capture: Capture,
    /// Fields added to every request body (`response_format`, `tools`,
    /// `logprobs`).
    pub extra: Option<serde_json::Map<String, serde_json::Value>>,
    /// Judges a completed answer (kept by `capture`): an error makes the
    /// request `invalid_output`.
    pub check: Option<OutputCheck>,
    /// Where each request notes that it was sent and got its first token,
    /// for whoever watches the run while it is in flight.
    pub progress: Option<std::sync::Arc<progress::RunProgress>>,
    /// Headers every request carries besides the key (a gateway's).
    pub headers: RequestHeaders,
    /// What the answers of a gateway in front of the server say.
    pub gateway: GatewayRules,
    /// A response header naming the build that answered (lowercase),
    /// kept in each record.
    pub build_header: Option<String>,
}

/// Whether an answer is what was asked for, and why not.
pub type OutputCheck = fn(&CapturedOutput) -> Result<(), String>;

/// What of the answer a record keeps: nothing (the usual probe), the text
/// and tool calls (to check them), or the tokens and log-probabilities too
/// (to compare builds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Capture {
    #[default]
    None,
    Text,
    Logprobs,
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

impl StreamingClient {
    /// The measured requests start (see [`progress::RunProgress::measuring`]).
    pub fn measuring(&self) {
        if let Some(progress) = &self.config.progress {
            progress.measuring();
        }
    }

    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let url = http::join_url(&config.base_url, config.endpoint.path())?;
        let http = http::build_http(&config.timeouts)?;
        let auth = config.api_key.as_ref().map(http::auth_header).transpose()?;
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
        let options = wire::BodyOptions {
            endpoint: self.config.endpoint,
            model: &self.config.model,
            ignore_eos: self.config.ignore_eos,
            min_tokens: self.config.min_tokens,
            extra: self.config.extra.as_ref(),
        };
        wire::request_body(&options, request)
    }

    /// Sends one request and records what happened. Never fails: every
    /// problem becomes the record's outcome. `origin` is the intended send
    /// time in an open-loop run; latency is measured from it.
    pub async fn send(&self, request: &PreparedRequest, origin: Option<Instant>) -> RequestRecord {
        let mut builder = self
            .http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("x-request-id", &request.request_id)
            .body(self.body(request));
        if let Some(auth) = &self.auth {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        let builder = self.config.headers.apply(builder);
        let sent = Instant::now();
        let start = origin.map_or(sent, |o| o.min(sent));
        let timeouts = self.config.timeouts;
        let rules = ReadRules {
            capture: self.config.capture,
            exact_length: self.config.ignore_eos,
        };
        let mut reader = StreamReader::new(
            RequestRecord::new(request, start, sent),
            timeouts.stall,
            rules,
        );
        let mut ticket = self.config.progress.as_deref().map(|p| p.sent());
        let exchange = Exchange {
            start,
            timeouts,
            gateway: &self.config.gateway,
            build_header: self.config.build_header.as_deref(),
        };
        let result = exchange.run(builder, &mut reader, ticket.as_mut()).await;
        drop(ticket);
        let mut record = reader.sink.finish(result, Instant::now());
        if let Some(check) = self.config.check.filter(|_| record.outcome.is_ok()) {
            let empty = CapturedOutput::default();
            if let Err(problem) = check(record.output.as_deref().unwrap_or(&empty)) {
                record.outcome = Outcome::InvalidOutput;
                record.error = Some(problem);
            }
        }
        // Server text may echo the key or a header it refused, or carry
        // control characters: none reaches a log, the store or a page.
        if let Some(error) = record.error.take() {
            let error = match &self.config.api_key {
                Some(key) => key.scrub(&error),
                None => error,
            };
            let error = self.config.headers.scrub(&error);
            record.error = Some(crate::text::clean(&error, crate::text::MAX_MESSAGE_LEN));
        }
        if let Some(progress) = &self.config.progress {
            progress.ended(&record);
        }
        record
    }
}

/// One request's exchange: when it started, its time limits, and what
/// the answers of a gateway in front of the server mean.
struct Exchange<'a> {
    start: Instant,
    timeouts: Timeouts,
    gateway: &'a GatewayRules,
    /// The response header naming the build that answered, if any.
    build_header: Option<&'a str>,
}

impl Exchange<'_> {
    /// The request's two phases under their deadlines: connect, headers
    /// and the stream up to the first choice by the first-token deadline;
    /// the rest by the whole-request deadline (and the reader's stall
    /// bound).
    async fn run(
        &self,
        builder: reqwest::RequestBuilder,
        reader: &mut StreamReader,
        ticket: Option<&mut progress::Ticket<'_>>,
    ) -> Result<(), Failure> {
        let (start, timeouts) = (self.start, self.timeouts);
        // Checked: a timeout beyond the clock's range means "a day", not a
        // panic (settings are validated; this is the last line).
        let after = |d: Duration| {
            start
                .checked_add(d)
                .unwrap_or(start + crate::limits::MAX_REQUEST_TIMEOUT)
        };
        let request_deadline = after(timeouts.request);
        let first_deadline = after(timeouts.first_token).min(request_deadline);

        let first = tokio::time::timeout_at(first_deadline.into(), async {
            let response = builder.send().await.map_err(send_failure)?;
            reader.sink.record.served_by = self.gateway.served_by(response.headers());
            if let Some(name) = self.build_header {
                reader.sink.record.build_tag = http::build_tag(&response, name);
            }
            let status = response.status();
            if !status.is_success() {
                reader.sink.record.retry_after = http::retry_after(&response);
                if let Some(to) = http::redirect_target(&response) {
                    return Err(Failure::new(
                        Outcome::from_status(status.as_u16()),
                        format!("HTTP {status}: {}", http::redirect_refused(&to)),
                    ));
                }
                let message = http::error_message(response).await;
                let detail = match message.is_empty() {
                    true => format!("HTTP {status}"),
                    false => format!("HTTP {status}: {}", stream::server_text(&message)),
                };
                if self.gateway.sheds(status.as_u16()) {
                    return Err(Failure::new(
                        Outcome::Shed,
                        format!("shed by the gateway: {detail}"),
                    ));
                }
                return Err(Failure::new(Outcome::from_status(status.as_u16()), detail));
            }
            let mut response = response;
            let reached = reader.read(&mut response, ReadTo::FirstChoice).await?;
            Ok((response, reached))
        })
        .await
        .map_err(|_| {
            Failure::silent(
                Outcome::NoFirstToken,
                format!("no first token within {:?}", first_deadline - start),
            )
        })?;
        let mut response = match first? {
            (_, Reached::End) => return Ok(()),
            (response, Reached::FirstChoice) => response,
        };
        if let Some(ticket) = ticket {
            ticket.first_token();
        }
        tokio::time::timeout_at(
            request_deadline.into(),
            reader.read(&mut response, ReadTo::End),
        )
        .await
        .map_err(|_| {
            Failure::new(
                Outcome::Timeout,
                format!("request not finished within {:?}", timeouts.request),
            )
        })?
        .map(|_| ())
    }
}

/// The outcome of a request that could not be sent or got no answer.
fn send_failure(e: reqwest::Error) -> Failure {
    let outcome = if http::is_local(&e) {
        Outcome::Local
    } else if e.is_connect() {
        Outcome::Connect
    } else if e.is_timeout() {
        Outcome::Timeout
    } else {
        Outcome::StreamError
    };
    Failure::new(outcome, http::error_chain(&e))
}
