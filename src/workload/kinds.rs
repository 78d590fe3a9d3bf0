//! Scenario kinds beyond plain text: structured output (`json_schema`,
//! sent as `response_format`) and tool calls (`tools` with a forced
//! `tool_choice`). Each says what it adds to the request body and how a
//! completed answer is judged; an answer that fails is `invalid_output`.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::client::{Capture, CapturedOutput, Endpoint, OutputCheck};
use crate::workload::dataset::Dataset;

/// What a scenario's requests ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ScenarioKind {
    /// Text of exactly the requested length (`ignore_eos`, `min_tokens`).
    #[default]
    Text,
    /// A JSON object matching a schema (`response_format`).
    #[value(name = "json_schema")]
    JsonSchema,
    /// A call of the one tool offered (`tools`, `tool_choice`).
    #[value(name = "tool_call")]
    ToolCall,
    /// A fixed prompt set answered greedily with log-probabilities, kept
    /// per build to tell when an upgrade changes what the model answers.
    Drift,
    /// Conversations of several turns, each sending the history so far
    /// (chat endpoint); latency per turn index.
    #[value(name = "multi_turn")]
    MultiTurn,
}

impl ScenarioKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ScenarioKind::Text => "text",
            ScenarioKind::JsonSchema => "json_schema",
            ScenarioKind::ToolCall => "tool_call",
            ScenarioKind::Drift => "drift",
            ScenarioKind::MultiTurn => "multi_turn",
        }
    }

    /// Why requests of this kind, from `dataset` when there is one, cannot
    /// go to `endpoint`, if they cannot.
    pub fn endpoint_problem(self, dataset: Option<&Dataset>, endpoint: Endpoint) -> Option<String> {
        if let Some(needed) = self.required_endpoint()
            && needed != endpoint
        {
            return Some(format!(
                "a {} scenario needs the {} endpoint",
                self.as_str(),
                needed.as_str()
            ));
        }
        dataset.and_then(|d| d.check_endpoint(endpoint).err())
    }

    /// Structured answers end where their structure does: forcing the
    /// length past it would make them invalid.
    pub fn exact_length(self) -> bool {
        matches!(
            self,
            ScenarioKind::Text | ScenarioKind::Drift | ScenarioKind::MultiTurn
        )
    }

    /// The endpoint the kind needs, if only one will do.
    pub fn required_endpoint(self) -> Option<Endpoint> {
        matches!(self, ScenarioKind::ToolCall | ScenarioKind::MultiTurn).then_some(Endpoint::Chat)
    }

    /// Fields added to every request body.
    pub fn extra(self, endpoint: Endpoint) -> Option<Map<String, Value>> {
        let value = match self {
            ScenarioKind::Text | ScenarioKind::MultiTurn => return None,
            ScenarioKind::Drift => match endpoint {
                Endpoint::Completions => json!({"logprobs": 1}),
                Endpoint::Chat => json!({"logprobs": true, "top_logprobs": 1}),
            },
            ScenarioKind::JsonSchema => json!({
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "city_report", "schema": schema(), "strict": true},
                },
            }),
            ScenarioKind::ToolCall => json!({
                "tools": [{
                    "type": "function",
                    "function": {
                        "name": TOOL_NAME,
                        "description": "Report a city's name and population.",
                        "parameters": schema(),
                    },
                }],
                "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}},
            }),
        };
        value.as_object().cloned()
    }

    pub fn capture(self) -> Capture {
        match self {
            ScenarioKind::Text => Capture::None,
            ScenarioKind::JsonSchema | ScenarioKind::ToolCall | ScenarioKind::MultiTurn => {
                Capture::Text
            }
            ScenarioKind::Drift => Capture::Logprobs,
        }
    }

    pub fn check(self) -> Option<OutputCheck> {
        match self {
            ScenarioKind::Text | ScenarioKind::Drift | ScenarioKind::MultiTurn => None,
            ScenarioKind::JsonSchema => Some(check_json),
            ScenarioKind::ToolCall => Some(check_tool_call),
        }
    }
}

const TOOL_NAME: &str = "report_city";

/// The kind named as in the configuration (`kind = "tool_call"`).
impl std::str::FromStr for ScenarioKind {
    type Err = String;

    fn from_str(name: &str) -> Result<ScenarioKind, String> {
        use clap::ValueEnum;
        <ScenarioKind as ValueEnum>::from_str(name, false).map_err(|_| {
            let names: Vec<&str> = ScenarioKind::value_variants()
                .iter()
                .map(|k| k.as_str())
                .collect();
            format!(
                "{name:?} is not a scenario kind; kinds: {}",
                names.join(", ")
            )
        })
    }
}

/// The drift canary's prompts: short, varied, answered the same way every
/// time by a deterministic server.
pub const DRIFT_PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "Translate to German: good morning, my friend.",
    "The three primary colors are",
    "Explain in one sentence why the sky is blue.",
    "List the first five prime numbers:",
    "Once upon a time, in a small village,",
];

/// The schema both kinds ask for; [`CityReport`] is the same shape.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer"},
        },
        "required": ["city", "population"],
        "additionalProperties": false,
    })
}

/// An answer that matches [`schema`]: both keys, their types, no others.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read only to be checked
struct CityReport {
    city: String,
    population: i64,
}

fn matches_schema(text: &str, what: &str) -> Result<(), String> {
    let value: Value = serde_json::from_str(text.trim()).map_err(|e| {
        format!(
            "{what} is not JSON ({e}): {}",
            crate::text::truncate(text, 80)
        )
    })?;
    serde_json::from_value::<CityReport>(value)
        .map(|_| ())
        .map_err(|e| format!("{what} does not match the schema: {e}"))
}

fn check_json(output: &CapturedOutput) -> Result<(), String> {
    if output.truncated {
        return Err("the answer is longer than the probe keeps".into());
    }
    matches_schema(&output.text, "the answer")
}

fn check_tool_call(output: &CapturedOutput) -> Result<(), String> {
    let Some((name, arguments)) = output.tool_calls.first() else {
        return Err("no tool call arrived".into());
    };
    if name != TOOL_NAME {
        return Err(format!(
            "the tool called is {:?}, not {TOOL_NAME:?}",
            crate::text::truncate(name, 40)
        ));
    }
    matches_schema(arguments, "the tool call's arguments")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(text: &str, calls: &[(&str, &str)]) -> CapturedOutput {
        CapturedOutput {
            text: text.into(),
            tool_calls: calls
                .iter()
                .map(|(n, a)| (n.to_string(), a.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn json_answers_must_parse_and_match() {
        let check = ScenarioKind::JsonSchema.check().unwrap();
        assert!(check(&output(r#" {"city":"Oslo","population":700000}"#, &[])).is_ok());
        let cut = check(&output(r#"{"city":"Oslo","popu"#, &[])).unwrap_err();
        assert!(cut.starts_with("the answer is not JSON"), "{cut}");
        let wrong = check(&output(r#"{"city":"Oslo","population":"many"}"#, &[])).unwrap_err();
        assert!(
            wrong.starts_with("the answer does not match the schema"),
            "{wrong}"
        );
        let extra = check(&output(r#"{"city":"a","population":1,"x":1}"#, &[])).unwrap_err();
        assert!(extra.contains("unknown field `x`"), "{extra}");
    }

    #[test]
    fn tool_calls_must_name_the_tool_with_parseable_arguments() {
        let check = ScenarioKind::ToolCall.check().unwrap();
        let args = r#"{"city":"Oslo","population":7}"#;
        assert!(check(&output("", &[("report_city", args)])).is_ok());
        assert_eq!(
            check(&output("Oslo", &[])).unwrap_err(),
            "no tool call arrived"
        );
        assert!(check(&output("", &[("other", args)])).is_err());
        assert!(check(&output("", &[("report_city", "{\"city\":")])).is_err());
        let body = ScenarioKind::ToolCall.extra(Endpoint::Chat).unwrap();
        assert_eq!(body["tool_choice"]["function"]["name"], "report_city");
        assert!(ScenarioKind::Text.extra(Endpoint::Chat).is_none());
    }
}
