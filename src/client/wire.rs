//! The OpenAI-compatible JSON on the wire: the request bodies the probe
//! sends and the few fields of a stream message it reads.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::Endpoint;
use super::record::{ChatMessage, PreparedRequest};

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct UserMessage<'a> {
    role: &'a str,
    content: &'a str,
}

/// A chat request's messages: the prompt as one user message, or the
/// conversation a dataset line or an earlier turn gave.
#[derive(Serialize)]
#[serde(untagged)]
enum Messages<'a> {
    Prompt([UserMessage<'a>; 1]),
    Conversation(&'a [ChatMessage]),
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<Messages<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_tokens: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
    stream: bool,
    stream_options: StreamOptions,
    temperature: f64,
    /// The scenario kind's own fields (`response_format`, `tools`,
    /// `logprobs`), already built.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// How the body is shaped beyond the request itself.
pub struct BodyOptions<'a> {
    pub endpoint: Endpoint,
    pub model: &'a str,
    /// `ignore_eos`: outputs run to `max_tokens` past the end-of-sequence
    /// token.
    pub ignore_eos: bool,
    /// `min_tokens` equal to `max_tokens`: outputs run to the end past the
    /// model's other stop tokens too, which `ignore_eos` alone does not.
    pub min_tokens: bool,
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The streaming, greedy request body, with usage in the stream so token
/// counts come from the server.
pub fn request_body(options: &BodyOptions, request: &PreparedRequest) -> Vec<u8> {
    let chat = options.endpoint == Endpoint::Chat;
    let messages = chat.then(|| match &request.messages {
        Some(conversation) => Messages::Conversation(conversation),
        None => Messages::Prompt([UserMessage {
            role: "user",
            content: &request.prompt,
        }]),
    });
    let body = Body {
        model: options.model,
        prompt: (!chat).then_some(request.prompt.as_str()),
        messages,
        max_tokens: (!chat).then_some(request.max_tokens),
        max_completion_tokens: chat.then_some(request.max_tokens),
        min_tokens: options.min_tokens.then_some(request.max_tokens),
        ignore_eos: options.ignore_eos,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        temperature: 0.0,
        extra: options.extra,
    };
    serde_json::to_vec(&body).expect("serializing strings, numbers and JSON values cannot fail")
}

/// The fields of a stream message the client looks at, with its choices
/// read as `C`: [`Choices`] while what they say matters (before the first
/// answer token, or when the answer is kept), else only counted
/// ([`ChoiceCount`]), which costs what skipping them does. Text is borrowed
/// from the message when it has no escapes; everything else is skipped.
#[derive(Deserialize)]
#[serde(bound(deserialize = "C: Deserialize<'de>"))]
pub struct StreamMessage<'a, C> {
    #[serde(default)]
    pub choices: Option<C>,
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

/// A message's `choices` as the client reads them: how many, and the
/// first when it is read at all.
pub trait ChoiceSet<'a> {
    fn count(&self) -> usize;
    fn first(&self) -> Option<&Choice<'a>>;
}

/// The choices, the first one read. The probe asks for one completion per
/// request, so a second choice is counted and skipped.
pub struct Choices<'a> {
    count: usize,
    first: Option<Choice<'a>>,
}

impl<'a> ChoiceSet<'a> for Choices<'a> {
    fn count(&self) -> usize {
        self.count
    }

    fn first(&self) -> Option<&Choice<'a>> {
        self.first.as_ref()
    }
}

/// The choices, only counted.
pub struct ChoiceCount(usize);

impl<'a> ChoiceSet<'a> for ChoiceCount {
    fn count(&self) -> usize {
        self.0
    }

    fn first(&self) -> Option<&Choice<'a>> {
        None
    }
}

/// Reads an array: its first element as `F` (when `F` is not `()`),
/// the rest skipped, without allocating.
struct FirstOf<F>(std::marker::PhantomData<F>);

impl<'de, F: Deserialize<'de>> serde::de::Visitor<'de> for FirstOf<F> {
    type Value = (usize, Option<F>);

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of choices")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let first: Option<F> = seq.next_element()?;
        let mut count = usize::from(first.is_some());
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            count += 1;
        }
        Ok((count, first))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (count, first) = deserializer.deserialize_seq(FirstOf(std::marker::PhantomData))?;
        Ok(Choices { count, first })
    }
}

impl<'de> Deserialize<'de> for ChoiceCount {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (count, _) = deserializer
            .deserialize_seq(FirstOf::<serde::de::IgnoredAny>(std::marker::PhantomData))?;
        Ok(ChoiceCount(count))
    }
}

/// One choice of a stream message: `text` on the completions endpoint, a
/// `delta` on the chat endpoint.
#[derive(Deserialize)]
pub struct Choice<'a> {
    #[serde(default, borrow)]
    pub text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    pub logprobs: Option<Logprobs<'a>>,
}

/// What a chat delta carries: answer text, reasoning (`reasoning_content`
/// in vLLM before 0.10 and DeepSeek's API, `reasoning` since), or pieces of
/// tool calls.
#[derive(Deserialize)]
pub struct Delta<'a> {
    /// Named by the message that opens a chat stream (vLLM's carries no
    /// text: `{"role":"assistant","content":""}`).
    #[serde(default, borrow)]
    pub role: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub tool_calls: Option<Vec<ToolCallDelta<'a>>>,
}

impl Delta<'_> {
    pub fn reasoning(&self) -> Option<&str> {
        self.reasoning_content
            .as_deref()
            .or(self.reasoning.as_deref())
            .filter(|r| !r.is_empty())
    }
}

/// A piece of a streamed tool call: its index, and name or arguments text.
#[derive(Deserialize)]
pub struct ToolCallDelta<'a> {
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default, borrow)]
    pub function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
pub struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub arguments: Option<Cow<'a, str>>,
}

/// Token log-probabilities: `tokens` and `token_logprobs` on the
/// completions endpoint, `content` entries on the chat endpoint.
#[derive(Deserialize)]
pub struct Logprobs<'a> {
    #[serde(default, borrow)]
    pub tokens: Option<Vec<Cow<'a, str>>>,
    #[serde(default)]
    pub token_logprobs: Option<Vec<Option<f64>>>,
    #[serde(default, borrow)]
    pub content: Option<Vec<TokenLogprob<'a>>>,
}

#[derive(Deserialize)]
pub struct TokenLogprob<'a> {
    #[serde(borrow)]
    pub token: Cow<'a, str>,
    #[serde(default)]
    pub logprob: Option<f64>,
}

/// Token counts from the stream's `usage` message.
#[derive(Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(endpoint: Endpoint, min_tokens: bool, request: &PreparedRequest) -> serde_json::Value {
        let options = BodyOptions {
            endpoint,
            model: "m",
            ignore_eos: true,
            min_tokens,
            extra: None,
        };
        serde_json::from_slice(&request_body(&options, request)).unwrap()
    }

    #[test]
    fn min_tokens_goes_with_max_tokens_unless_turned_off() {
        let request = PreparedRequest {
            prompt: "hi".into(),
            max_tokens: 7,
            ..Default::default()
        };
        let completion = body(Endpoint::Completions, true, &request);
        assert_eq!(completion["max_tokens"], 7);
        assert_eq!(completion["min_tokens"], 7);
        assert_eq!(completion["ignore_eos"], true);
        assert!(completion.get("messages").is_none());
        let chat = body(Endpoint::Chat, false, &request);
        assert_eq!(chat["max_completion_tokens"], 7);
        assert!(chat.get("min_tokens").is_none());
        assert_eq!(chat["messages"][0]["content"], "hi");
        assert!(chat.get("prompt").is_none());
    }

    #[test]
    fn a_conversation_replaces_the_prompt_on_chat() {
        let request = PreparedRequest {
            prompt: "unused".into(),
            messages: Some(vec![
                ChatMessage {
                    role: "system".into(),
                    content: "be brief".into(),
                },
                ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                },
            ]),
            max_tokens: 3,
            ..Default::default()
        };
        let chat = body(Endpoint::Chat, true, &request);
        assert_eq!(chat["messages"][0]["role"], "system");
        assert_eq!(chat["messages"][1]["content"], "hi");
    }
}
