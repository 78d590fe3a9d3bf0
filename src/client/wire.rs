//! The OpenAI-compatible JSON on the wire: the request bodies the probe
//! sends and the few fields of a stream message it reads.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::Endpoint;

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

/// The streaming, greedy request body for `prompt`, with usage in the
/// stream so token counts come from the server.
pub fn request_body(
    endpoint: Endpoint,
    model: &str,
    prompt: &str,
    max_tokens: u32,
    ignore_eos: bool,
) -> Vec<u8> {
    let stream_options = StreamOptions {
        include_usage: true,
    };
    let encoded = match endpoint {
        Endpoint::Completions => serde_json::to_vec(&CompletionBody {
            model,
            prompt,
            max_tokens,
            ignore_eos,
            stream: true,
            stream_options,
            temperature: 0.0,
        }),
        Endpoint::Chat => serde_json::to_vec(&ChatBody {
            model,
            messages: [ChatMessage {
                role: "user",
                content: prompt,
            }],
            max_completion_tokens: max_tokens,
            ignore_eos,
            stream: true,
            stream_options,
            temperature: 0.0,
        }),
    };
    encoded.expect("serializing plain strings and numbers cannot fail")
}

/// The fields of a stream message the client looks at. Everything else
/// (text, logprobs, deltas) is skipped without allocation.
#[derive(Deserialize)]
pub struct StreamMessage<'a> {
    #[serde(default)]
    pub choices: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub error: Option<serde_json::Value>,
    #[serde(default, borrow)]
    pub object: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub message: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub system_fingerprint: Option<Cow<'a, str>>,
}

/// Token counts from the stream's `usage` message.
#[derive(Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens: Option<u32>,
}
