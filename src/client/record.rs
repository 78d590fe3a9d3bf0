//! What goes into one request (the prepared prompt) and what comes out of
//! it (raw monotonic instants, token counts, outcome); every latency is
//! derived from the record later, never inside the read loop.

use std::time::{Duration, Instant};

use super::Outcome;

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
            start,
            sent,
            // One slot per token plus a role message and a finish message;
            // capped so a huge max_tokens does not reserve megabytes.
            chunk_times: Vec::with_capacity((request.max_tokens as usize + 2).min(8192)),
            end: sent,
            prompt_tokens: None,
            completion_tokens: None,
            requested_output_tokens: request.max_tokens,
            outcome: Outcome::Ok,
            error: None,
            system_fingerprint: None,
            retry_after: None,
            server_silent: false,
        }
    }

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
