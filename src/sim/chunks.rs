//! The simulator's SSE chunks, rendered the way vLLM writes them: the
//! chat role chunk, text or reasoning or tool-call deltas, the usage
//! message with the build's fingerprint.

use super::SimConfig;
use super::answers::Piece;

/// Pre-rendered pieces of the chunk JSON.
pub struct ChunkFormat {
    pub chat: bool,
    head: String,
    /// vLLM's `vllm-<version>-<hash>`; SGLang sends none (`null`).
    pub fingerprint: Option<String>,
    empty_every: u32,
    /// Chat tokens before this index are reasoning.
    reasoning: u32,
}

impl ChunkFormat {
    pub fn new(config: &SimConfig, chat: bool, serial: u64) -> Self {
        let model = serde_json::to_string(&config.model).expect("strings serialize");
        let (prefix, object) = if chat {
            ("chatcmpl", "chat.completion.chunk")
        } else {
            ("cmpl", "text_completion")
        };
        let created = crate::clock::Clock::System.now().timestamp().max(0) as u64;
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&config.version, &config.model_root).hash(&mut h);
            if config.fingerprint_per_request {
                serial.hash(&mut h);
            }
            h.finish() & 0xffff_ffff
        };
        ChunkFormat {
            chat,
            head: format!(
                r#"{{"id":"{prefix}-sim{serial}","object":"{object}","created":{created},"model":{model},"#
            ),
            fingerprint: (config.server_kind == super::SimServerKind::Vllm)
                .then(|| format!("vllm-{}-{hash:08x}", config.version)),
            empty_every: config.empty_text_every,
            reasoning: if chat { config.reasoning_tokens } else { 0 },
        }
    }

    pub fn token(&self, k: u32, last: bool, piece: Option<&Piece>, out: &mut Vec<u8>) {
        let quoted = |t: &str| serde_json::to_string(t).expect("strings serialize");
        let text = match piece {
            Some(Piece::Text(t) | Piece::ToolArguments(t) | Piece::Scored(t, _)) => quoted(t),
            Some(Piece::ToolName(_)) => quoted(""),
            None if self.empty_every > 0 && (k + 1).is_multiple_of(self.empty_every) => quoted(""),
            None => quoted(" tok"),
        };
        let finish = if last { r#""length""# } else { "null" };
        let logprobs = match piece {
            Some(Piece::Scored(_, lp)) if self.chat => format!(
                r#"{{"content":[{{"token":{text},"logprob":{lp},"bytes":null,"top_logprobs":[]}}]}}"#
            ),
            Some(Piece::Scored(_, lp)) => format!(
                r#"{{"tokens":[{text}],"token_logprobs":[{lp}],"top_logprobs":null,"text_offset":[0]}}"#
            ),
            _ => "null".to_owned(),
        };
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(self.head.as_bytes());
        if self.chat {
            if k == 0 {
                out.extend_from_slice(
                    br#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
                );
                out.extend_from_slice(b"\n\ndata: ");
                out.extend_from_slice(self.head.as_bytes());
            }
            let delta = match piece {
                Some(Piece::ToolName(name)) => format!(
                    r#"{{"tool_calls":[{{"index":0,"id":"call_sim","type":"function","function":{{"name":{},"arguments":""}}}}]}}"#,
                    quoted(name)
                ),
                Some(Piece::ToolArguments(_)) => {
                    format!(r#"{{"tool_calls":[{{"index":0,"function":{{"arguments":{text}}}}}]}}"#)
                }
                _ if k < self.reasoning => format!(r#"{{"reasoning":{text}}}"#),
                _ => format!(r#"{{"content":{text}}}"#),
            };
            out.extend_from_slice(
                format!(r#""choices":[{{"index":0,"delta":{delta},"logprobs":{logprobs},"finish_reason":{finish}}}]}}"#)
                    .as_bytes(),
            );
        } else {
            out.extend_from_slice(
                format!(
                    r#""choices":[{{"index":0,"text":{text},"logprobs":{logprobs},"finish_reason":{finish},"stop_reason":null}}],"usage":null}}"#
                )
                .as_bytes(),
            );
        }
        out.extend_from_slice(b"\n\n");
    }

    pub fn usage(&self, prompt: u32, completion: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(
            format!(
                r#""choices":[],"usage":{{"prompt_tokens":{prompt},"total_tokens":{},"completion_tokens":{completion}{}}},"system_fingerprint":{}}}"#,
                prompt + completion,
                match self.reasoning.min(completion) {
                    0 => String::new(),
                    n => format!(r#","completion_tokens_details":{{"reasoning_tokens":{n}}}"#),
                },
                serde_json::to_string(&self.fingerprint).unwrap_or_default()
            )
            .as_bytes(),
        );
        out.extend_from_slice(b"\n\n");
    }
}
