//! Reading values out of a Prometheus text exposition (vLLM's `/metrics`,
//! SGLang's, a DCGM exporter), line by line, accepting what Prometheus
//! accepts: untyped families, one family's samples with different label
//! sets, HELP or TYPE without samples, escaped label values, timestamps,
//! OpenMetrics exemplars and `# EOF`, NaN and ±Inf, families in any order.
//! A line that is not valid costs that line only.
//!
//! Written here rather than taken from a crate: `openmetrics-parser`
//! refuses whole pages over untyped samples and differing label sets (both
//! what dcgm-exporter serves in Kubernetes), and `prometheus-parse` cannot
//! read names with `:` (every vLLM and SGLang metric) or label values with
//! commas or escapes.

use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
#[error("not a Prometheus text exposition: {0}")]
pub struct ExpositionError(String);

/// Why a page gave nothing we read.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Exposition(#[from] ExpositionError),
    #[error("none of the families read here is on the page (expected {expected})")]
    NoFamilies { expected: &'static str },
    #[error("no GPU on the page matches dcgm_match {matchers} ({on_page} devices on the page)")]
    NoneSelected { matchers: String, on_page: usize },
}

/// A parsed exposition: the samples by metric name, in page order.
#[derive(Debug, Default)]
pub struct Exposition {
    samples: HashMap<String, Vec<Scalar>>,
    /// Lines that were neither samples, comments nor blank.
    pub skipped_lines: usize,
}

/// One sample with its labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Scalar {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Exposition {
    /// Every sample line of the page. A page with lines but not one valid
    /// sample or comment is not an exposition.
    pub fn parse(text: &str) -> Result<Exposition, ExpositionError> {
        Self::parse_wanted(text, |_| true)
    }

    /// Keeps only the samples of families whose names start with one of
    /// `prefixes`. A page without a single sample is an error: it is not
    /// the exposition we were pointed at.
    pub fn parse_families(text: &str, prefixes: &[&str]) -> Result<Exposition, ExpositionError> {
        Self::parse_wanted(text, |name| prefixes.iter().any(|p| name.starts_with(p)))
    }

    fn parse_wanted(
        text: &str,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<Exposition, ExpositionError> {
        let mut page = Exposition::default();
        let mut valid_samples = 0usize;
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_sample(line) {
                Some((name, scalar)) => {
                    valid_samples += 1;
                    if wanted(name) {
                        page.samples
                            .entry(name.to_owned())
                            .or_default()
                            .push(scalar);
                    }
                }
                None => page.skipped_lines += 1,
            }
        }
        if valid_samples == 0 {
            let why = if page.skipped_lines > 0 {
                format!(
                    "none of its {} lines is a metric sample",
                    page.skipped_lines
                )
            } else {
                "no metric samples".to_owned()
            };
            return Err(ExpositionError(why));
        }
        Ok(page)
    }

    /// The samples of the first family found under any of `names`: the
    /// new name first, then the old ones.
    pub fn scalars(&self, names: &[&str]) -> Vec<Scalar> {
        for name in names {
            let found = self.samples.get(*name).or_else(|| {
                // Counters may be written with or without their `_total`.
                name.strip_suffix("_total")
                    .and_then(|base| self.samples.get(base))
            });
            if let Some(found) = found {
                return found.clone();
            }
        }
        Vec::new()
    }
}

/// The sum of the finite values of `series` (several engines or models on
/// one server add up); `None` when there are none.
pub fn total(series: &[Scalar]) -> Option<f64> {
    (!series.is_empty()).then(|| {
        series
            .iter()
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .sum()
    })
}

pub(crate) fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// `name{labels} value [timestamp] [# exemplar]`; `None` for anything else.
fn parse_sample(line: &str) -> Option<(&str, Scalar)> {
    if !line.starts_with(is_name_start) {
        return None;
    }
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remaining) = parse_labels(after)?;
        labels = parsed;
        rest = remaining;
    }
    // An OpenMetrics exemplar follows " # ".
    let rest = rest.split(" # ").next().unwrap_or(rest);
    let mut fields = rest.split_whitespace();
    let value = parse_value(fields.next()?)?;
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<f64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some((name, Scalar { labels, value }))
}

/// The labels up to the closing brace, and what follows it.
pub(crate) fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        if !s.starts_with(is_name_start) {
            return None;
        }
        let end = s.find(|c: char| !is_name_char(c))?;
        let key = &s[..end];
        s = s[end..].trim_start().strip_prefix('=')?.trim_start();
        s = s.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let close = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.to_owned(), value));
        s = s[close + 1..].trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return None;
        }
    }
}

/// A sample value: Go's float syntax, including NaN and ±Inf.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok().filter(|v| v.is_finite()),
    }
}

#[cfg(test)]
#[path = "exposition_tests.rs"]
mod tests;
