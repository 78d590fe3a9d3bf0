//! Structured answers the simulator gives: a JSON example of the schema a
//! request's `response_format` names, or a call of the first tool it
//! offers, streamed a few characters per token and ending where the
//! structure does (cut short when `max_tokens` is smaller, as a real
//! server's would be).

use serde_json::{Value, json};

/// One output token's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    /// Opens a tool call.
    ToolName(String),
    ToolArguments(String),
    /// A greedy token and its log-probability, for requests asking for
    /// log-probabilities.
    Scored(String, f64),
}

/// Words of the greedy answers.
const WORDS: [&str; 16] = [
    " the", " sea", " blue", " one", " two", " red", " sky", " time", " light", " stone", " wind",
    " north", " tree", " bird", " road", " fire",
];

/// A deterministic greedy answer of `tokens` tokens to `prompt`: the same
/// prompt and `seed` give the same tokens and log-probabilities, another
/// seed (other numerics) another answer.
pub fn greedy(prompt: &str, seed: u64, tokens: u32) -> Vec<Piece> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    (0..tokens)
        .map(|i| {
            let mut h = DefaultHasher::new();
            (prompt, seed, i).hash(&mut h);
            let x = h.finish();
            let word = WORDS[(x % WORDS.len() as u64) as usize];
            let logprob = -(((x >> 8) % 1000) as f64) / 1000.0;
            Piece::Scored(word.to_owned(), logprob)
        })
        .collect()
}

/// Characters of structured text per output token.
const CHARS_PER_TOKEN: usize = 4;

/// The answer's pieces when the request asks for structure.
pub fn structured(response_format: Option<&Value>, tools: Option<&[Value]>) -> Option<Vec<Piece>> {
    if let Some(tool) = tools.and_then(|t| t.first()) {
        let function = &tool["function"];
        let name = function["name"].as_str().unwrap_or("tool").to_owned();
        let arguments = example(&function["parameters"], 0).to_string();
        let mut pieces = vec![Piece::ToolName(name)];
        pieces.extend(split(&arguments).map(Piece::ToolArguments));
        return Some(pieces);
    }
    let format = response_format?;
    let schema = match format["type"].as_str()? {
        "json_schema" => &format["json_schema"]["schema"],
        "json_object" => &Value::Null,
        _ => return None,
    };
    let text = example(schema, 0).to_string();
    Some(split(&text).map(Piece::Text).collect())
}

fn split(text: &str) -> impl Iterator<Item = String> + '_ {
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = chars
        .chunks(CHARS_PER_TOKEN)
        .map(|c| c.iter().collect())
        .collect();
    pieces.into_iter()
}

/// A value of the schema's shape: every property, simple values.
fn example(schema: &Value, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    match schema["type"].as_str() {
        Some("string") => json!("sim"),
        Some("integer") => json!(42),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("array") => json!([example(&schema["items"], depth + 1)]),
        Some("null") => Value::Null,
        _ => {
            let mut object = serde_json::Map::new();
            if let Some(properties) = schema["properties"].as_object() {
                for (key, property) in properties.iter().take(64) {
                    object.insert(key.clone(), example(property, depth + 1));
                }
            }
            Value::Object(object)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_examples_and_tool_calls_reassemble() {
        let schema = json!({"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer"}}});
        let format = json!({"type":"json_schema","json_schema":{"name":"x","schema":schema}});
        let pieces = structured(Some(&format), None).unwrap();
        let text: String = pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.as_str(),
                _ => "",
            })
            .collect();
        assert_eq!(text, r#"{"city":"sim","population":42}"#);
        let tools = [json!({"type":"function","function":{"name":"f","parameters":schema}})];
        let call = structured(None, Some(&tools)).unwrap();
        assert_eq!(call[0], Piece::ToolName("f".into()));
        assert!(structured(None, None).is_none());
    }
}
