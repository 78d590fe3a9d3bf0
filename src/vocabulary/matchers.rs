//! Label matchers as PromQL writes them (`{pod=~"vllm-.*", namespace="llm"}`):
//! a target's `dcgm_match`, which keeps the GPUs of a node's DCGM page that
//! serve the target. Regular expressions are anchored, as in PromQL, and a
//! label a series lacks matches as the empty string.

use std::fmt;

use regex::Regex;

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct MatcherError(String);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Equal,
    NotEqual,
    Matches,
    NotMatches,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Equal => "=",
            Op::NotEqual => "!=",
            Op::Matches => "=~",
            Op::NotMatches => "!~",
        }
    }
}

#[derive(Debug, Clone)]
struct Matcher {
    label: String,
    op: Op,
    value: String,
    /// The anchored pattern, for `=~` and `!~`.
    pattern: Option<Regex>,
}

impl Matcher {
    fn matches(&self, value: &str) -> bool {
        match (self.op, &self.pattern) {
            (Op::Equal, _) => value == self.value,
            (Op::NotEqual, _) => value != self.value,
            (Op::Matches, Some(p)) => p.is_match(value),
            (Op::NotMatches, Some(p)) => !p.is_match(value),
            (_, None) => false,
        }
    }
}

/// All of them must match.
#[derive(Debug, Clone)]
pub struct LabelMatchers(Vec<Matcher>);

impl LabelMatchers {
    /// `{a="x", b=~"y.*"}`; the braces may be left out.
    pub fn parse(text: &str) -> Result<LabelMatchers, MatcherError> {
        let trimmed = text.trim();
        let inner = match trimmed.strip_prefix('{') {
            Some(rest) => rest
                .strip_suffix('}')
                .ok_or_else(|| MatcherError("opens `{` but does not close it".into()))?,
            None => trimmed,
        };
        let mut matchers = Vec::new();
        let mut rest = inner.trim_start();
        while !rest.is_empty() {
            let (matcher, after) = parse_one(rest)?;
            matchers.push(matcher);
            rest = after.trim_start();
            if let Some(after_comma) = rest.strip_prefix(',') {
                rest = after_comma.trim_start();
            } else if !rest.is_empty() {
                return Err(MatcherError(format!(
                    "expected `,` or the end after the matcher on `{}`, found {:?}",
                    matchers.last().map_or("", |m: &Matcher| m.label.as_str()),
                    rest
                )));
            }
        }
        if matchers.is_empty() {
            return Err(MatcherError(
                "has no matchers; write for example {pod=~\"vllm-.*\", namespace=\"llm\"}".into(),
            ));
        }
        Ok(LabelMatchers(matchers))
    }

    /// Whether a series with these labels is selected.
    pub fn matches(&self, labels: &[(String, String)]) -> bool {
        self.0.iter().all(|m| {
            let value = labels
                .iter()
                .find(|(k, _)| *k == m.label)
                .map_or("", |(_, v)| v.as_str());
            m.matches(value)
        })
    }
}

impl fmt::Display for LabelMatchers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}{}{:?}", m.label, m.op.as_str(), m.value)?;
        }
        f.write_str("}")
    }
}

/// One `label op "value"` at the start of `s`, and what follows it.
fn parse_one(s: &str) -> Result<(Matcher, &str), MatcherError> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    let label = &s[..end];
    if label.is_empty() || label.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(MatcherError(format!("expected a label name at {s:?}")));
    }
    let rest = s[end..].trim_start();
    let (op, rest) = [Op::Matches, Op::NotMatches, Op::NotEqual, Op::Equal]
        .into_iter()
        .find_map(|op| rest.strip_prefix(op.as_str()).map(|r| (op, r)))
        .ok_or_else(|| {
            MatcherError(format!(
                "expected =, !=, =~ or !~ after `{label}`, found {rest:?}"
            ))
        })?;
    let (value, rest) = quoted(rest.trim_start())
        .ok_or_else(|| MatcherError(format!("the value of `{label}` must be a quoted string")))?;
    let pattern = match op {
        Op::Matches | Op::NotMatches => Some(
            Regex::new(&format!("^(?:{value})$"))
                .map_err(|e| MatcherError(format!("`{label}`: not a regular expression: {e}")))?,
        ),
        Op::Equal | Op::NotEqual => None,
    };
    let matcher = Matcher {
        label: label.to_owned(),
        op,
        value,
        pattern,
    };
    Ok((matcher, rest))
}

/// A double-quoted string with `\"`, `\\` and `\n` escapes, and what follows.
fn quoted(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = body.char_indices();
    loop {
        match chars.next()? {
            (i, '"') => return Some((value, &body[i + 1..])),
            (_, '\\') => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            (_, c) => value.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matches_as_promql_does() {
        let m = LabelMatchers::parse(r#"{pod=~"vllm-.*", namespace="llm", gpu!="3"}"#).unwrap();
        let ours = labels(&[("pod", "vllm-0"), ("namespace", "llm"), ("gpu", "0")]);
        assert!(m.matches(&ours));
        // Anchored: a pod merely containing "vllm-" is not one.
        let other = labels(&[("pod", "not-vllm-0"), ("namespace", "llm")]);
        assert!(!m.matches(&other));
        // A missing label is the empty string.
        assert!(!m.matches(&labels(&[("gpu", "0")])));
        let absent = LabelMatchers::parse(r#"pod!~".+""#).unwrap();
        assert!(absent.matches(&labels(&[("gpu", "1")])));
        assert!(!absent.matches(&labels(&[("pod", "x")])));
        assert_eq!(
            m.to_string(),
            r#"{pod=~"vllm-.*", namespace="llm", gpu!="3"}"#
        );
    }

    #[test]
    fn bad_matchers_say_what_is_wrong() {
        let cases = [
            ("{}", "has no matchers"),
            (r#"{pod=~"("}"#, "not a regular expression"),
            (r#"{pod=vllm}"#, "must be a quoted string"),
            (r#"{pod~"x"}"#, "expected =, !=, =~ or !~"),
            (r#"{pod="x" namespace="y"}"#, "expected `,`"),
            (r#"{pod="x""#, "does not close"),
            (r#"{="x"}"#, "expected a label name"),
        ];
        for (text, expected) in cases {
            let e = LabelMatchers::parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
