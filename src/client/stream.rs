//! Reading one streamed answer: the SSE decoder feeds a sink that turns
//! each event into the record (a choice's arrival, usage, fingerprint) or
//! the failure that ends the read; the reader bounds silence between
//! chunks. This is the per-chunk hot path: one JSON parse that skips the
//! text, one `Instant` pushed, nothing else.

use std::time::{Duration, Instant};

use super::record::{CapturedOutput, MAX_CAPTURED_TEXT, RequestRecord};
use super::sse::SseDecoder;
use super::wire::{Choice, ChoiceCount, ChoiceSet, Choices, StreamMessage};
use super::{Capture, Outcome};

/// What ended a request early.
pub struct Failure {
    pub outcome: Outcome,
    pub detail: String,
    /// The server sent nothing for a whole timeout (no first token, or a
    /// stall), as a server whose engine died does.
    pub server_silent: bool,
}

impl Failure {
    pub fn new(outcome: Outcome, detail: impl Into<String>) -> Self {
        Failure {
            outcome,
            detail: detail.into(),
            server_silent: false,
        }
    }

    /// A timeout because the server went silent: `NoFirstToken` before
    /// the first token, `Stalled` after it.
    pub fn silent(outcome: Outcome, detail: impl Into<String>) -> Self {
        Failure {
            server_silent: true,
            ..Failure::new(outcome, detail)
        }
    }
}

/// Server text inside an error line, bounded before it is formatted in;
/// the whole line is cleaned once when the record is finished.
pub fn server_text(text: &str) -> String {
    crate::text::truncate(text, crate::text::MAX_MESSAGE_LEN)
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

/// The record being filled from one stream's events.
pub struct StreamSink {
    pub record: RequestRecord,
    done_seen: bool,
    chunk_limit: usize,
    rules: ReadRules,
}

/// What a read keeps and expects besides timings.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadRules {
    pub capture: Capture,
    /// Outputs must be as long as requested (`ignore_eos` was sent): a
    /// shorter one is `short_output`.
    pub exact_length: bool,
}

impl StreamSink {
    pub fn new(record: RequestRecord, rules: ReadRules) -> Self {
        let chunk_limit = chunk_limit(record.requested_output_tokens);
        StreamSink {
            record,
            done_seen: false,
            chunk_limit,
            rules,
        }
    }

    /// What one choice says: reasoning or answer (TTFO), and the answer
    /// itself when it is kept.
    fn note_choice(&mut self, choice: &Choice, at: Instant) {
        let record = &mut self.record;
        let delta = choice.delta.as_ref();
        let text = choice
            .text
            .as_deref()
            .or(delta.and_then(|d| d.content.as_deref()))
            .unwrap_or("");
        let tool_calls = delta.and_then(|d| d.tool_calls.as_deref()).unwrap_or(&[]);
        let reasoning = delta.is_some_and(|d| d.reasoning().is_some());
        if reasoning {
            record.reasoning_chunks += 1;
        }
        // Only the first two messages say whether the stream opened with a
        // role alone: later ones cost one comparison.
        let names_role = || delta.is_some_and(|d| d.role.is_some());
        match record.chunk_times.len() {
            1 if text.is_empty() && tool_calls.is_empty() && !reasoning && names_role() => {
                record.role_opening = true;
            }
            // A server that names the role on every message (TGI, Ollama):
            // an empty opening was a token like the others.
            2 if record.role_opening && names_role() => record.role_opening = false,
            _ => {}
        }
        if record.first_answer.is_none() && (!text.is_empty() || !tool_calls.is_empty()) {
            record.first_answer = Some(at);
        }
        if self.rules.capture == Capture::None {
            return;
        }
        let output = record.output.get_or_insert_with(Box::default);
        push_bounded(&mut output.text, text, &mut output.truncated);
        for call in tool_calls {
            let index = call.index.unwrap_or(0) as usize;
            // Indexes come from the server: only the next one opens a call.
            if index == output.tool_calls.len() && index < 16 {
                output.tool_calls.push(Default::default());
            }
            let (Some((name, arguments)), Some(function)) =
                (output.tool_calls.get_mut(index), &call.function)
            else {
                continue;
            };
            push_bounded(
                name,
                function.name.as_deref().unwrap_or(""),
                &mut output.truncated,
            );
            let part = function.arguments.as_deref().unwrap_or("");
            push_bounded(arguments, part, &mut output.truncated);
        }
        if self.rules.capture == Capture::Logprobs {
            note_logprobs(output, choice);
        }
    }

    /// One SSE event's data, received at `at`.
    pub fn accept(&mut self, event: &[u8], at: Instant) -> Result<(), Failure> {
        // Nothing after `[DONE]` belongs to the answer.
        if event == b"[DONE]" || self.done_seen {
            self.done_seen = true;
            return Ok(());
        }
        // What the choices say matters until the answer starts (TTFO), or
        // throughout when the answer is kept; otherwise they are counted.
        if self.rules.capture != Capture::None || self.record.first_answer.is_none() {
            self.take(parse::<Choices>(event)?, at)
        } else {
            self.take(parse::<ChoiceCount>(event)?, at)
        }
    }

    /// One parsed message.
    fn take<'a, C: ChoiceSet<'a>>(
        &mut self,
        message: StreamMessage<'a, C>,
        at: Instant,
    ) -> Result<(), Failure> {
        if let Some(error) = message.error {
            let text = match error.get("message").and_then(|m| m.as_str()) {
                Some(text) => server_text(text),
                None => server_text(&error.to_string()),
            };
            return Err(Failure::new(
                Outcome::StreamError,
                format!("error in stream: {text}"),
            ));
        }
        if message.object.as_deref() == Some("error") {
            let text = message.message.as_deref().unwrap_or("unspecified error");
            return Err(Failure::new(
                Outcome::StreamError,
                format!("error in stream: {}", server_text(text)),
            ));
        }
        let record = &mut self.record;
        if let Some(choices) = message.choices.filter(|c| c.count() > 0) {
            if record.chunk_times.len() >= self.chunk_limit {
                return Err(Failure::new(
                    Outcome::StreamError,
                    format!(
                        "more output than requested: over {} choice messages where {} tokens were asked for",
                        record.chunk_times.len(),
                        record.requested_output_tokens
                    ),
                ));
            }
            record.chunk_times.push(at);
            if let Some(choice) = choices.first() {
                self.note_choice(choice, at);
            }
        }
        let record = &mut self.record;
        if let Some(usage) = message.usage {
            if usage.prompt_tokens.is_some() {
                record.prompt_tokens = usage.prompt_tokens;
            }
            if usage.completion_tokens.is_some() {
                record.completion_tokens = usage.completion_tokens;
            }
            if let Some(n) = usage
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
            {
                record.reasoning_tokens = Some(n);
            }
        }
        if let Some(fp) = message.system_fingerprint
            && record.system_fingerprint.is_none()
        {
            record.system_fingerprint =
                Some(crate::text::clean_identifier(&fp, crate::text::MAX_ID_LEN));
        }
        Ok(())
    }

    /// The record with its outcome: the failure that ended the read, or
    /// what a stream that ended by itself lacked.
    pub fn finish(mut self, result: Result<(), Failure>, end: Instant) -> RequestRecord {
        let record = &mut self.record;
        record.end = end;
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
            Ok(())
                if self.rules.exact_length
                    && record.output_tokens() < record.requested_output_tokens =>
            {
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
            record.server_silent = f.server_silent;
        }
        self.record
    }
}

/// Bytes of an unreadable message shown in its error.
const PREVIEW_LEN: usize = 80;

/// One event's JSON, its choices read as `C`.
fn parse<'a, C: serde::Deserialize<'a>>(event: &'a [u8]) -> Result<StreamMessage<'a, C>, Failure> {
    serde_json::from_slice(event).map_err(|e| {
        let preview = String::from_utf8_lossy(&event[..event.len().min(4 * PREVIEW_LEN)]);
        let preview = crate::text::truncate(&preview, PREVIEW_LEN);
        Failure::new(
            Outcome::StreamError,
            format!("unreadable stream message ({e}): {preview}"),
        )
    })
}

/// Appends `part` to `text` up to [`MAX_CAPTURED_TEXT`] bytes, at a
/// character boundary.
fn push_bounded(text: &mut String, part: &str, truncated: &mut bool) {
    let room = MAX_CAPTURED_TEXT.saturating_sub(text.len());
    if part.len() <= room {
        text.push_str(part);
        return;
    }
    *truncated = true;
    let mut end = room;
    while !part.is_char_boundary(end) {
        end -= 1;
    }
    text.push_str(&part[..end]);
}

/// The generated tokens and their log-probabilities of one choice, bounded
/// like the chunks themselves.
fn note_logprobs(output: &mut CapturedOutput, choice: &Choice) {
    let Some(logprobs) = &choice.logprobs else {
        return;
    };
    let mut push = |token: &str, logprob: Option<f64>| {
        if output.tokens.len() < 8192 {
            let token = crate::text::truncate(token, 64);
            output.tokens.push((token, logprob.unwrap_or(f64::NAN)));
        }
    };
    if let Some(entries) = &logprobs.content {
        for entry in entries {
            push(&entry.token, entry.logprob);
        }
    } else if let Some(tokens) = &logprobs.tokens {
        let values = logprobs.token_logprobs.as_deref().unwrap_or(&[]);
        for (i, token) in tokens.iter().enumerate() {
            push(token, values.get(i).copied().flatten());
        }
    }
}

/// How far one read goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadTo {
    /// Up to the chunk that carries the first choice (bounded by the
    /// first-token deadline outside).
    FirstChoice,
    /// To the end of the body, failing when the server is silent for
    /// longer than the stall timeout.
    End,
}

/// Where a read stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    FirstChoice,
    End,
}

/// A stream past the decoder's bound is a broken stream: the request fails
/// with a bounded outcome and the rest of the body is never read.
fn oversized(error: super::sse::SseError) -> Failure {
    Failure::new(Outcome::StreamError, error.to_string())
}

/// How long the body may stay open after `[DONE]` before the read ends
/// without its end (at most the stall timeout).
const DONE_GRACE: Duration = Duration::from_secs(1);

/// The decoder and the sink of one response.
pub struct StreamReader {
    decoder: SseDecoder,
    pub sink: StreamSink,
    stall: Duration,
}

impl StreamReader {
    pub fn new(record: RequestRecord, stall: Duration, rules: ReadRules) -> Self {
        StreamReader {
            decoder: SseDecoder::new(),
            sink: StreamSink::new(record, rules),
            stall,
        }
    }

    pub async fn read(
        &mut self,
        response: &mut reqwest::Response,
        to: ReadTo,
    ) -> Result<Reached, Failure> {
        // The stall timer is armed once and moved only when it fires while
        // tokens are still arriving, so a chunk costs one stored instant,
        // not a timer update. Silence is counted from the last
        // choice-bearing message, not the last byte: a proxy's keep-alive
        // comments and empty-choice events keep coming from a server whose
        // engine generates nothing.
        let mut last_token = Instant::now();
        let mut tokens_seen = self.sink.record.chunk_times.len();
        let mut done_at: Option<Instant> = None;
        let stall_timer = tokio::time::sleep(self.stall);
        tokio::pin!(stall_timer);
        loop {
            let chunk = if to == ReadTo::End {
                tokio::select! {
                    biased;
                    chunk = response.chunk() => chunk,
                    () = &mut stall_timer => {
                        let due = match done_at {
                            Some(done) => done + self.stall.min(DONE_GRACE),
                            None => last_token + self.stall,
                        };
                        if due <= Instant::now() {
                            if done_at.is_some() {
                                // The answer is whole; only the body's end
                                // is missing.
                                return Ok(Reached::End);
                            }
                            let chunks = self.sink.record.chunk_times.len();
                            // Silent before any token is no first token,
                            // whichever timer saw it.
                            let outcome = if chunks == 0 {
                                Outcome::NoFirstToken
                            } else {
                                Outcome::Stalled
                            };
                            return Err(Failure::silent(outcome, format!(
                                "stalled after {chunks} chunk{}: no token for {:?}",
                                if chunks == 1 { "" } else { "s" },
                                self.stall
                            )));
                        }
                        stall_timer.as_mut().reset(due.into());
                        continue;
                    }
                }
            } else {
                response.chunk().await
            };
            let chunk = chunk.map_err(|e| {
                Failure::new(
                    Outcome::StreamError,
                    format!("stream broke: {}", super::http::error_chain(&e)),
                )
            })?;
            let at = Instant::now();
            let mut result = Ok(());
            let sink = &mut self.sink;
            let Some(bytes) = chunk else {
                self.decoder
                    .finish(|event| {
                        if result.is_ok() {
                            result = sink.accept(event, at);
                        }
                    })
                    .map_err(oversized)?;
                return result.map(|()| Reached::End);
            };
            self.decoder
                .feed(&bytes, |event| {
                    if result.is_ok() {
                        result = sink.accept(event, at);
                    }
                })
                .map_err(oversized)?;
            result?;
            let tokens = self.sink.record.chunk_times.len();
            if tokens != tokens_seen {
                (tokens_seen, last_token) = (tokens, at);
            }
            if self.sink.done_seen && done_at.is_none() {
                // A server (or a proxy) may hold the body open after
                // `[DONE]`; the read waits for its end only briefly, so
                // that the connection is kept when the end follows.
                done_at = Some(at);
                stall_timer
                    .as_mut()
                    .reset((at + self.stall.min(DONE_GRACE)).into());
            }
            if to == ReadTo::FirstChoice && !self.sink.record.chunk_times.is_empty() {
                return Ok(Reached::FirstChoice);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::PreparedRequest;

    fn sink() -> StreamSink {
        let t = Instant::now();
        let request = PreparedRequest {
            request_id: "r".into(),
            max_tokens: 2,
            ..Default::default()
        };
        let rules = ReadRules {
            capture: Capture::None,
            exact_length: true,
        };
        StreamSink::new(RequestRecord::new(&request, t, t), rules)
    }

    #[test]
    fn events_count_empty_text_choices_and_skip_usage_only() {
        let mut s = sink();
        let t = Instant::now();
        for event in [
            &br#"{"choices":[{"text":""}]}"#[..],
            br#"{"choices":[{"text":"x"}]}"#,
            br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2},"system_fingerprint":"vllm-0.32.0-ab"}"#,
            b"[DONE]",
        ] {
            assert!(s.accept(event, t).is_ok());
        }
        let r = s.finish(Ok(()), t);
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.chunk_times.len(), 2);
        assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(5), Some(2)));
        assert_eq!(r.system_fingerprint.as_deref(), Some("vllm-0.32.0-ab"));
    }

    /// As real vLLM 0.32 streams 4 tokens of chat: a role message, then
    /// one message a token (an empty one for a token ending mid-UTF-8).
    const VLLM_CHAT: [&[u8]; 6] = [
        br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        br#"{"choices":[{"index":0,"delta":{"content":"qu"},"finish_reason":null}]}"#,
        br#"{"choices":[{"index":0,"delta":{"content":" number"},"finish_reason":null}]}"#,
        br#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}"#,
        br#"{"choices":[{"index":0,"delta":{"content":"\ufffd{"},"finish_reason":"length"}]}"#,
        b"[DONE]",
    ];

    #[test]
    fn without_usage_a_chat_streams_role_message_is_no_token() {
        let mut s = sink();
        let t = Instant::now();
        for event in VLLM_CHAT {
            assert!(s.accept(event, t).is_ok());
        }
        let r = s.finish(Ok(()), t);
        assert_eq!(r.outcome, Outcome::Ok);
        // Timed from the role message, counted without it.
        assert_eq!((r.chunk_times.len(), r.output_tokens()), (5, 4));
        // A role with text (another server's opening) is a token.
        let mut s = sink();
        for event in [
            &br#"{"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}"#[..],
            br#"{"choices":[{"delta":{"content":"!"}}]}"#,
            b"[DONE]",
        ] {
            assert!(s.accept(event, t).is_ok());
        }
        assert_eq!(s.finish(Ok(()), t).output_tokens(), 2);
        // A server naming the role on every message opens with a token,
        // even an empty one (a token ending mid-UTF-8).
        let mut s = sink();
        for event in [
            &br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#[..],
            br#"{"choices":[{"delta":{"role":"assistant","content":"\ufffd!"}}]}"#,
            br#"{"choices":[{"delta":{"role":"assistant","content":"?"}}]}"#,
            b"[DONE]",
        ] {
            assert!(s.accept(event, t).is_ok());
        }
        assert_eq!(s.finish(Ok(()), t).output_tokens(), 3);
    }

    #[test]
    fn error_objects_and_garbage_become_stream_errors() {
        for event in [
            &br#"{"error":{"message":"boom","type":"InternalServerError","code":500}}"#[..],
            &br#"{"object":"error","message":"bad"}"#[..],
            &b"\x00\xffnot json"[..],
        ] {
            let failure = sink().accept(event, Instant::now()).expect_err("a failure");
            assert_eq!(failure.outcome, Outcome::StreamError);
        }
    }

    #[test]
    fn a_stream_without_done_or_usage_is_truncated() {
        let mut s = sink();
        let t = Instant::now();
        s.accept(br#"{"choices":[{"text":"x"}]}"#, t).ok();
        let r = s.finish(Ok(()), t);
        assert_eq!(r.outcome, Outcome::StreamError);
        assert!(r.error.unwrap().contains("truncated"));
    }
}
