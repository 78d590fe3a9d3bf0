//! What goes into one request (the prepared prompt) and what comes out of
//! it (raw monotonic instants, token counts, outcome); every latency is
//! derived from the record later, never inside the read loop.

use std::time::{Duration, Instant};

use super::Outcome;

/// One request ready to send: the prompt is built before timing starts.
#[derive(Debug, Clone, Default)]
pub struct PreparedRequest {
    pub index: usize,
    /// Sent as `x-request-id`, e.g. `sentinel-<run>-<n>`.
    pub request_id: String,
    pub prompt: String,
    /// On the chat endpoint, sent instead of `prompt` as one user message.
    pub messages: Option<Vec<ChatMessage>>,
    pub max_tokens: u32,
    /// The turn of its conversation (1 first), in a multi-turn run.
    pub turn: Option<u32>,
}

/// One message of a chat conversation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Most bytes of answer text (or tool-call arguments) kept per request.
pub const MAX_CAPTURED_TEXT: usize = 64 * 1024;

/// What the answer said, kept only when the scenario checks or compares it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapturedOutput {
    /// Answer text (not reasoning), at most [`MAX_CAPTURED_TEXT`] bytes.
    pub text: String,
    /// Tool calls by index: name and arguments text as streamed.
    pub tool_calls: Vec<(String, String)>,
    /// Each generated token and its log-probability, when asked for.
    pub tokens: Vec<(String, f64)>,
    /// Text past the bound was dropped.
    pub truncated: bool,
}

/// Raw observations of one request; all derived numbers come from here.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub index: usize,
    /// The turn of its conversation, in a multi-turn run.
    pub turn: Option<u32>,
    /// Origin of every latency: the intended send time in an open-loop run,
    /// otherwise the instant just before the request was handed to the
    /// connection (after any concurrency wait).
    pub start: Instant,
    /// When the request was actually handed to the HTTP client.
    pub sent: Instant,
    /// Arrival of each SSE message whose `choices` array was non-empty.
    pub chunk_times: Vec<Instant>,
    /// Arrival of the first chunk with answer text or a tool call: after
    /// the reasoning, on a reasoning model.
    pub first_answer: Option<Instant>,
    /// Choice-bearing chunks that carried reasoning text, up to the first
    /// answer token (all of them when the answer is kept).
    pub reasoning_chunks: u32,
    /// The first choice message only named the chat role: it times the
    /// first token (as `vllm bench` does) but is no token of the output.
    pub role_opening: bool,
    /// `usage.completion_tokens_details.reasoning_tokens`, when sent.
    pub reasoning_tokens: Option<u32>,
    /// The answer, when the scenario keeps it.
    pub output: Option<Box<CapturedOutput>>,
    pub end: Instant,
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    pub requested_output_tokens: u32,
    pub outcome: Outcome,
    /// Human-readable failure detail; never contains the API key.
    pub error: Option<String>,
    pub system_fingerprint: Option<String>,
    /// What the target's `build_header` said of the build that answered.
    pub build_tag: Option<String>,
    /// What a 429 or 503 answer's `Retry-After` asked for.
    pub retry_after: Option<Duration>,
    /// The endpoint a gateway in front of the server named as the one
    /// that served the request (its `endpoint_header`).
    pub served_by: Option<String>,
    /// It timed out because the server sent nothing for a whole timeout
    /// (no first token, or a stall); not set for the whole-request limit,
    /// which a server still streaming can reach.
    pub server_silent: bool,
}

impl RequestRecord {
    /// An empty record for a request sent at `sent`, measured from `start`.
    pub fn new(request: &PreparedRequest, start: Instant, sent: Instant) -> Self {
        RequestRecord {
            index: request.index,
            turn: request.turn,
            start,
            sent,
            // One slot per token plus a role message and a finish message;
            // capped so a huge max_tokens does not reserve megabytes.
            chunk_times: Vec::with_capacity((request.max_tokens as usize + 2).min(8192)),
            first_answer: None,
            reasoning_chunks: 0,
            role_opening: false,
            reasoning_tokens: None,
            output: None,
            end: sent,
            prompt_tokens: None,
            completion_tokens: None,
            requested_output_tokens: request.max_tokens,
            outcome: Outcome::Ok,
            error: None,
            system_fingerprint: None,
            build_tag: None,
            retry_after: None,
            served_by: None,
            server_silent: false,
        }
    }

    pub fn ttft(&self) -> Option<Duration> {
        self.chunk_times
            .first()
            .map(|t| t.saturating_duration_since(self.start))
    }

    /// Time to the first answer token (TTFO): after the reasoning on a
    /// reasoning model, about TTFT on any other.
    pub fn ttfo(&self) -> Option<Duration> {
        self.first_answer
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

    /// Output tokens as the server counted them; when it sent no usage,
    /// the choice messages but a chat stream's opening one (vLLM streams
    /// one token per message, an empty one for a token ending mid-UTF-8).
    pub fn output_tokens(&self) -> u32 {
        self.completion_tokens.unwrap_or_else(|| {
            let messages = self.chunk_times.len() - usize::from(self.role_opening);
            messages as u32
        })
    }

    /// The request as the statistics module sees it, in seconds relative
    /// to `run_start`.
    /// The request as its run's record keeps it: how it ended, its
    /// latencies, tokens and the endpoint that served it.
    pub fn sample_row(&self) -> crate::vocabulary::records::SampleRow {
        let sample = self.to_sample(self.start);
        crate::vocabulary::records::SampleRow {
            index: self.index,
            outcome: self.outcome,
            ttft_s: self.ttft().map(|d| d.as_secs_f64()),
            tpot_s: sample.tpot_s(),
            e2el_s: self.e2el().map(|d| d.as_secs_f64()),
            itls_s: sample.itls_s,
            prompt_tokens: sample.prompt_tokens,
            output_tokens: sample.output_tokens,
            served_by: self.served_by.clone(),
        }
    }

    pub fn to_sample(&self, run_start: Instant) -> crate::stats::bench::RequestSample {
        crate::stats::bench::RequestSample {
            success: self.outcome.is_ok(),
            start_s: self
                .start
                .saturating_duration_since(run_start)
                .as_secs_f64(),
            ttft_s: self.ttft().map_or(0.0, |d| d.as_secs_f64()),
            ttfo_s: self.ttfo().map(|d| d.as_secs_f64()),
            reasoning: self.reasoning_chunks > 0 || self.reasoning_tokens.is_some_and(|n| n > 0),
            reasoning_tokens: self.reasoning_tokens.unwrap_or(0),
            turn: self.turn,
            itls_s: self.itls().map(|d| d.as_secs_f64()).collect(),
            latency_s: self.e2el().map_or(0.0, |d| d.as_secs_f64()),
            prompt_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.output_tokens(),
        }
    }
}
