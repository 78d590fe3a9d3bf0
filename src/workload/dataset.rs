//! Users' own prompts: a JSONL file, one object per line with `prompt`
//! (completions) or `messages` (chat) and an optional `max_tokens`, drawn
//! in a seeded order. Read once, bounded, and every bad line named.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Deserialize;

use crate::client::{ChatMessage, Endpoint, PreparedRequest};

/// Largest dataset file read: prompts for probes, not a training corpus.
pub const MAX_DATASET_BYTES: u64 = 64 << 20;
/// Most lines kept.
pub const MAX_DATASET_LINES: usize = 100_000;

/// What one line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum DatasetInput {
    Prompt(String),
    Messages(Vec<ChatMessage>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct DatasetEntry {
    pub input: DatasetInput,
    /// The line's own output length; the scenario's otherwise.
    pub max_tokens: Option<u32>,
}

/// The prompts of one file.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub path: PathBuf,
    pub entries: Vec<DatasetEntry>,
    /// The first line with chat messages, if any: such a dataset needs the
    /// chat endpoint.
    pub first_messages_line: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} line {line}: {problem}")]
    Line {
        path: String,
        line: usize,
        problem: String,
    },
    #[error("{path}: {problem}")]
    File { path: String, problem: String },
}

/// A line as written; unknown keys (ids, labels) are allowed and skipped.
#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    messages: Option<Vec<LineMessage>>,
    #[serde(default)]
    max_tokens: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LineMessage {
    role: String,
    content: String,
}

impl Dataset {
    /// Reads and checks the whole file.
    pub fn load(path: &Path) -> Result<Dataset, DatasetError> {
        let shown = path.display().to_string();
        let read_error = |reason: String| DatasetError::Read {
            path: shown.clone(),
            reason,
        };
        // A regular file only (`/dev/zero` or a FIFO would be read until
        // memory ran out, or forever), and never past the limit.
        let bytes = crate::bounded_file::read(path, MAX_DATASET_BYTES)
            .map_err(|e| read_error(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            DatasetError::Line {
                path: shown.clone(),
                line,
                problem: "not UTF-8 text".into(),
            }
        })?;
        Self::parse(&text, path)
    }

    /// Checks the lines of `text`, read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Dataset, DatasetError> {
        let shown = path.display().to_string();
        let mut entries = Vec::new();
        let mut first_messages_line = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            if entries.len() == MAX_DATASET_LINES {
                return Err(DatasetError::File {
                    path: shown,
                    problem: format!("more than {MAX_DATASET_LINES} prompts"),
                });
            }
            let entry = parse_line(raw).map_err(|problem| DatasetError::Line {
                path: shown.clone(),
                line,
                problem,
            })?;
            if matches!(entry.input, DatasetInput::Messages(_)) && first_messages_line.is_none() {
                first_messages_line = Some(line);
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            return Err(DatasetError::File {
                path: shown,
                problem: "no prompts: one JSON object per line, with \"prompt\" or \"messages\""
                    .into(),
            });
        }
        Ok(Dataset {
            path: path.to_owned(),
            entries,
            first_messages_line,
        })
    }

    /// Whether `endpoint` can send every line.
    pub fn check_endpoint(&self, endpoint: Endpoint) -> Result<(), String> {
        match (endpoint, self.first_messages_line) {
            (Endpoint::Completions, Some(line)) => Err(format!(
                "{} line {line} has chat messages: use the chat endpoint",
                self.path.display()
            )),
            _ => Ok(()),
        }
    }

    /// An estimate of the longest prompt in tokens (about four bytes a
    /// token in English text), for the limits a run is held to; the
    /// server's own count is what a run reports.
    pub fn estimated_input_len(&self) -> u32 {
        let longest = self
            .entries
            .iter()
            .map(|e| match &e.input {
                DatasetInput::Prompt(p) => p.len(),
                DatasetInput::Messages(m) => m.iter().map(|m| m.content.len() + 8).sum(),
            })
            .max()
            .unwrap_or(1);
        (longest / 4 + 1).min(crate::limits::MAX_LEN as usize) as u32
    }

    /// The longest output a line asks for, or `default`.
    pub fn max_output(&self, default: u32) -> u32 {
        self.entries
            .iter()
            .map(|e| e.max_tokens.unwrap_or(default))
            .max()
            .unwrap_or(default)
    }

    /// Prompts given in the program rather than a file.
    pub fn of_prompts(name: &str, prompts: &[&str]) -> Dataset {
        Dataset {
            path: PathBuf::from(name),
            entries: prompts
                .iter()
                .map(|p| DatasetEntry {
                    input: DatasetInput::Prompt((*p).to_owned()),
                    max_tokens: None,
                })
                .collect(),
            first_messages_line: None,
        }
    }

    /// `count` requests, every line once before any repeats: in an order
    /// set by `seed`, or in file order without one (request `i` then asks
    /// line `i`, as long as `count` is at most the lines).
    pub fn requests(
        &self,
        count: usize,
        seed: Option<u64>,
        run_id: &str,
        first_index: usize,
        default_max_tokens: u32,
    ) -> Vec<PreparedRequest> {
        let mut rng = seed.map(StdRng::seed_from_u64);
        let mut order: Vec<usize> = Vec::with_capacity(count);
        while order.len() < count {
            let mut round: Vec<usize> = (0..self.entries.len()).collect();
            if let Some(rng) = &mut rng {
                round.shuffle(rng);
            }
            order.extend(round.into_iter().take(count - order.len()));
        }
        order
            .into_iter()
            .enumerate()
            .map(|(i, line)| {
                let entry = &self.entries[line];
                let (prompt, messages) = match &entry.input {
                    DatasetInput::Prompt(p) => (p.clone(), None),
                    DatasetInput::Messages(m) => (String::new(), Some(m.clone())),
                };
                PreparedRequest {
                    index: i,
                    request_id: format!("sentinel-{run_id}-{}", first_index + i),
                    prompt,
                    messages,
                    max_tokens: entry.max_tokens.unwrap_or(default_max_tokens),
                    turn: None,
                }
            })
            .collect()
    }
}

/// One line, or what is wrong with it.
fn parse_line(raw: &str) -> Result<DatasetEntry, String> {
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| format!("not JSON ({e})"))?;
    if !value.is_object() {
        return Err("not a JSON object".into());
    }
    let line: Line = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let input = match (line.prompt, line.messages) {
        (Some(_), Some(_)) => return Err("has both \"prompt\" and \"messages\"; give one".into()),
        (None, None) => return Err("has neither \"prompt\" nor \"messages\"".into()),
        (Some(serde_json::Value::String(p)), None) if !p.is_empty() => DatasetInput::Prompt(p),
        (Some(serde_json::Value::String(_)), None) => return Err("\"prompt\" is empty".into()),
        (Some(_), None) => return Err("\"prompt\" must be a string".into()),
        (None, Some(m)) if m.is_empty() => return Err("\"messages\" is empty".into()),
        (None, Some(m)) => DatasetInput::Messages(
            m.into_iter()
                .map(|m| ChatMessage {
                    role: m.role,
                    content: m.content,
                })
                .collect(),
        ),
    };
    let max_tokens = match line.max_tokens {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| (1..=crate::limits::MAX_LEN).contains(n))
                .ok_or_else(|| {
                    format!(
                        "\"max_tokens\" {v} must be a whole number between 1 and {}",
                        crate::limits::MAX_LEN
                    )
                })? as u32,
        ),
    };
    Ok(DatasetEntry { input, max_tokens })
}

/// A dataset shared by the runs of a scenario.
pub type SharedDataset = Arc<Dataset>;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Dataset, DatasetError> {
        Dataset::parse(text, Path::new("d.jsonl"))
    }

    #[test]
    fn prompts_messages_and_lengths_are_read() {
        let d = parse(
            "{\"prompt\":\"hello there\",\"id\":7}\n\n{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":5}\n",
        )
        .unwrap();
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[1].max_tokens, Some(5));
        assert_eq!(d.first_messages_line, Some(3));
        assert!(d.check_endpoint(Endpoint::Chat).is_ok());
        let e = d.check_endpoint(Endpoint::Completions).unwrap_err();
        assert_eq!(e, "d.jsonl line 3 has chat messages: use the chat endpoint");
        assert_eq!(d.max_output(9), 9);
    }

    #[test]
    fn bad_lines_are_named_with_their_number_and_problem() {
        for (text, want) in [
            (
                "{\"prompt\":\"a\"}\n{\"prompt\":1}",
                "d.jsonl line 2: \"prompt\" must be a string",
            ),
            (
                "{\"prompt\":\"a\"}\n\n[1]",
                "d.jsonl line 3: not a JSON object",
            ),
            (
                "{\"prompt\":\"a\",\"max_tokens\":0}",
                "d.jsonl line 1: \"max_tokens\" 0 must be a whole number between 1 and 1048576",
            ),
            (
                "{\"id\":1}",
                "d.jsonl line 1: has neither \"prompt\" nor \"messages\"",
            ),
            (
                "{\"prompt\":\"a\",\"messages\":[]}",
                "d.jsonl line 1: has both \"prompt\" and \"messages\"; give one",
            ),
            (
                "",
                "d.jsonl: no prompts: one JSON object per line, with \"prompt\" or \"messages\"",
            ),
        ] {
            assert_eq!(parse(text).unwrap_err().to_string(), want);
        }
        let broken = parse("{\"prompt\":\"a\"}\n{\"prompt\":")
            .unwrap_err()
            .to_string();
        assert!(
            broken.starts_with("d.jsonl line 2: not JSON (EOF while parsing"),
            "{broken}"
        );
        let role = parse("{\"messages\":[{\"content\":\"x\"}]}")
            .unwrap_err()
            .to_string();
        assert!(
            role.starts_with("d.jsonl line 1: missing field `role`"),
            "{role}"
        );
    }

    #[test]
    fn every_line_is_drawn_once_before_any_repeats_in_a_seeded_order() {
        let text: String = (0..5)
            .map(|i| format!("{{\"prompt\":\"p{i}\"}}\n"))
            .collect();
        let d = parse(&text).unwrap();
        let a = d.requests(12, Some(3), "r", 0, 4);
        let b = d.requests(12, Some(3), "r", 0, 4);
        let prompts =
            |rs: &[PreparedRequest]| rs.iter().map(|r| r.prompt.clone()).collect::<Vec<_>>();
        assert_eq!(prompts(&a), prompts(&b));
        let mut first: Vec<String> = prompts(&a[..5]);
        first.sort();
        assert_eq!(first, ["p0", "p1", "p2", "p3", "p4"]);
        assert_ne!(prompts(&a), prompts(&d.requests(12, Some(4), "r", 0, 4)));
        let in_order = d.requests(5, None, "r", 0, 4);
        assert_eq!(prompts(&in_order), ["p0", "p1", "p2", "p3", "p4"]);
        assert!(a.iter().all(|r| r.max_tokens == 4));
        assert_eq!(a[11].request_id, "sentinel-r-11");
    }
}
