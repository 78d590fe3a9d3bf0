//! Reading values out of a Prometheus text exposition (vLLM's `/metrics`,
//! a DCGM exporter) through the `openmetrics-parser` crate.

use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{MetricsExposition, PrometheusType, PrometheusValue};

#[derive(Debug, thiserror::Error)]
#[error("not a Prometheus text exposition: {0}")]
pub struct ExpositionError(String);

/// A parsed exposition.
pub struct Exposition(MetricsExposition<PrometheusType, PrometheusValue>);

/// One scalar sample with its labels.
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
    pub fn parse(text: &str) -> Result<Exposition, ExpositionError> {
        // The parser wants a final newline, which some exporters omit.
        let owned;
        let text = if text.ends_with('\n') {
            text
        } else {
            owned = format!("{text}\n");
            &owned
        };
        parse_prometheus(text)
            .map(Exposition)
            .map_err(|e| ExpositionError(format!("{e:?}").chars().take(200).collect()))
    }

    /// Parses only the lines of families whose names start with one of
    /// `prefixes`, so an odd line elsewhere on the page cannot spoil the
    /// values we need. A page with none of them is an error: it is not the
    /// exposition we were pointed at.
    pub fn parse_families(text: &str, prefixes: &[&str]) -> Result<Exposition, ExpositionError> {
        let wanted = |name: &str| prefixes.iter().any(|p| name.starts_with(p));
        let mut kept = String::new();
        let mut samples = 0;
        for line in text.lines() {
            let trimmed = line.trim_start();
            let name = if let Some(rest) = trimmed.strip_prefix('#') {
                let mut words = rest.split_whitespace();
                match words.next() {
                    Some("HELP" | "TYPE") => words.next().unwrap_or(""),
                    _ => continue,
                }
            } else {
                samples += 1;
                trimmed.split(['{', ' ']).next().unwrap_or("")
            };
            if wanted(name) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        if samples == 0 || (kept.is_empty() && !text.contains("# TYPE")) {
            return Err(ExpositionError("no metric samples".into()));
        }
        if kept.is_empty() {
            return Ok(Exposition(MetricsExposition::new()));
        }
        Exposition::parse(&kept)
    }

    /// Scalar samples (gauge, counter, untyped) of the first family found
    /// under any of `names`: the new name first, then the old ones.
    pub fn scalars(&self, names: &[&str]) -> Vec<Scalar> {
        for name in names {
            let family = self.0.families.get(*name).or_else(|| {
                // Counters may be keyed with or without their `_total`.
                name.strip_suffix("_total")
                    .and_then(|base| self.0.families.get(base))
            });
            let Some(family) = family else { continue };
            let label_names = family.get_label_names().to_vec();
            let mut out = Vec::new();
            for sample in family.iter_samples() {
                let value = match &sample.value {
                    PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                    PrometheusValue::Counter(c) => c.value.as_f64(),
                    _ => continue,
                };
                let labels = match sample.get_labelset() {
                    Ok(set) => set.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    Err(_) => label_names
                        .iter()
                        .map(|n| (n.clone(), String::new()))
                        .collect(),
                };
                out.push(Scalar { labels, value });
            }
            return out;
        }
        Vec::new()
    }

    /// The sum over all series of the first family found (several engines
    /// or models on one server add up); `None` when absent.
    pub fn sum(&self, names: &[&str]) -> Option<f64> {
        let values = self.scalars(names);
        if values.is_empty() {
            return None;
        }
        Some(
            values
                .iter()
                .map(|s| s.value)
                .filter(|v| v.is_finite())
                .sum(),
        )
    }
}
