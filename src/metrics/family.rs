//! One metric family's series, kept ready to print: each series is its
//! label text as it appears on `/metrics` (`{model="m",target="t"}`, label
//! names sorted) and its value, so encoding is copying text and formatting
//! numbers. About 200 bytes a series, where a general-purpose registry
//! keeps each label as its own pair of strings (about 1.5 kB a series at
//! seven labels) and copies all of them on every scrape.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use super::MetricsError;
use crate::telemetry::exposition::{self, is_name_char, is_name_start};

/// What a family holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Gauge,
    Counter,
    /// Cumulative buckets with these upper bounds (`+Inf` implied).
    Histogram(Vec<f64>),
}

/// A series' value.
enum Value {
    Scalar(f64),
    Histogram(Box<Buckets>),
}

/// Per-bucket (not cumulative) counts, the sum and the count.
struct Buckets {
    counts: Box<[u64]>,
    sum: f64,
    count: u64,
}

/// A family: its header, label names and series, the text it was last
/// printed as, and the change counters that say when to print it again.
pub struct Family {
    name: String,
    kind: Kind,
    header: String,
    /// Label names as declared (the order writers pass values in).
    labels: Vec<String>,
    /// Declared positions in name order: how label text is written.
    sorted: Vec<usize>,
    /// `le` values of the bounds, printed once.
    bounds_text: Vec<String>,
    series: Mutex<BTreeMap<Box<str>, Value>>,
    /// Writes that moved something: what says when to print it again.
    changes: AtomicU64,
    printed: Mutex<Printed>,
}

/// The family's text as of `changes`; shared, not copied, by the pages
/// that carry it.
#[derive(Default)]
struct Printed {
    changes: u64,
    text: Bytes,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A metric name as the text format allows it; label names the same
/// without colons.
fn valid_name(name: &str, colon: bool) -> bool {
    let allowed = |c: char| colon || c != ':';
    name.starts_with(|c| is_name_start(c) && allowed(c))
        && name.chars().all(|c| is_name_char(c) && allowed(c))
}

impl Family {
    pub fn new(
        name: &str,
        help: &str,
        labels: &[&str],
        kind: Kind,
    ) -> Result<Family, MetricsError> {
        if !valid_name(name, true) {
            return Err(MetricsError::Name(name.to_owned()));
        }
        for (i, label) in labels.iter().enumerate() {
            let reserved =
                label.starts_with("__") || (*label == "le" && matches!(kind, Kind::Histogram(_)));
            if !valid_name(label, false) || reserved || labels[..i].contains(label) {
                return Err(MetricsError::Label(name.to_owned(), label.to_string()));
            }
        }
        let mut sorted: Vec<usize> = (0..labels.len()).collect();
        sorted.sort_by_key(|&i| labels[i]);
        let bounds_text = match &kind {
            Kind::Histogram(bounds) => bounds.iter().map(|b| b.to_string()).collect(),
            _ => Vec::new(),
        };
        let type_name = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram(_) => "histogram",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        Ok(Family {
            header: format!("# HELP {name} {help}\n# TYPE {name} {type_name}\n"),
            name: name.to_owned(),
            kind,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            sorted,
            bounds_text,
            series: Mutex::default(),
            changes: AtomicU64::new(1),
            printed: Mutex::default(),
        })
    }

    pub fn has_label(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }

    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The label text of the series with these values (declared order);
    /// `None` when the count is wrong, a writer's mistake that must not
    /// take the daemon down.
    fn key(&self, values: &[&str]) -> Option<Box<str>> {
        if values.len() != self.labels.len() {
            return None;
        }
        if values.is_empty() {
            return Some("".into());
        }
        let mut key = String::with_capacity(16 * values.len());
        for (n, &i) in self.sorted.iter().enumerate() {
            key.push(if n == 0 { '{' } else { ',' });
            key.push_str(&self.labels[i]);
            key.push_str("=\"");
            escape_value(values[i], &mut key);
            key.push('"');
        }
        key.push('}');
        Some(key.into_boxed_str())
    }

    /// Applies `write` to the series (created at zero first); the family
    /// is marked changed when the series is new or `write` says it moved,
    /// so telemetry read again unchanged does not make it print again.
    fn write(&self, values: &[&str], write: impl FnOnce(&mut Value) -> bool) {
        let Some(key) = self.key(values) else { return };
        let mut series = lock(&self.series);
        let mut created = false;
        let value = series.entry(key).or_insert_with(|| {
            created = true;
            match &self.kind {
                Kind::Histogram(bounds) => Value::Histogram(Box::new(Buckets {
                    counts: vec![0; bounds.len()].into_boxed_slice(),
                    sum: 0.0,
                    count: 0,
                })),
                _ => Value::Scalar(0.0),
            }
        });
        let moved = write(value) || created;
        drop(series);
        if moved {
            self.changed();
        }
    }

    pub fn set(&self, values: &[&str], to: f64) {
        self.write(values, |v| set_scalar(v, to));
    }

    pub fn add(&self, values: &[&str], by: f64) {
        self.write(values, |v| match v {
            Value::Scalar(x) if by != 0.0 => {
                *x += by;
                true
            }
            _ => false,
        });
    }

    /// Creates the series at zero, or keeps it.
    pub fn declare(&self, values: &[&str]) {
        self.write(values, |_| false);
    }

    /// Observes every value (NaN skipped) into one histogram series.
    pub fn observe_all(&self, values: &[&str], observed: impl IntoIterator<Item = f64>) {
        let Kind::Histogram(bounds) = &self.kind else {
            return;
        };
        self.write(values, |v| {
            let Value::Histogram(b) = v else { return false };
            let before = b.count;
            for x in observed.into_iter().filter(|x| !x.is_nan()) {
                if let Some(i) = bounds.iter().position(|&bound| x <= bound) {
                    b.counts[i] += 1;
                }
                b.sum += x;
                b.count += 1;
            }
            b.count != before
        });
    }

    /// Removes one series (declared order); absent is fine.
    pub fn remove(&self, values: &[&str]) {
        let Some(key) = self.key(values) else { return };
        if lock(&self.series).remove(&key).is_some() {
            self.changed();
        }
    }

    /// Removes `target`'s series whose labels `gone` says no longer
    /// describe anything; returns how many.
    pub fn remove_of_target(
        &self,
        target: &str,
        gone: &dyn Fn(&HashMap<&str, &str>) -> bool,
    ) -> usize {
        let hint = label_text("target", target);
        let mut series = lock(&self.series);
        let before = series.len();
        series.retain(|key, _| {
            of_target(key, &hint, target).is_none_or(|labels| {
                !gone(
                    &labels
                        .iter()
                        .map(|(n, v)| (n.as_str(), v.as_str()))
                        .collect(),
                )
            })
        });
        let removed = before - series.len();
        drop(series);
        if removed > 0 {
            self.changed();
        }
        removed
    }

    /// Makes `rows` (label values in declared order, and a value) the whole
    /// of `target`'s series in this gauge family: the others it had are
    /// removed. Marked changed only when something moved.
    pub fn replace_target(&self, target: &str, rows: &[(&[&str], f64)]) {
        if matches!(self.kind, Kind::Histogram(_)) {
            return;
        }
        let fresh: Vec<(Box<str>, f64)> = rows
            .iter()
            .filter_map(|(values, v)| Some((self.key(values)?, *v)))
            .collect();
        let hint = label_text("target", target);
        let mut series = lock(&self.series);
        let before = series.len();
        series.retain(|key, _| {
            fresh.iter().any(|(k, _)| k == key) || of_target(key, &hint, target).is_none()
        });
        let mut moved = series.len() != before;
        for (key, to) in fresh {
            let value = series.entry(key).or_insert_with(|| {
                moved = true;
                Value::Scalar(to)
            });
            moved |= set_scalar(value, to);
        }
        drop(series);
        if moved {
            self.changed();
        }
    }

    /// Removes every series.
    pub fn reset(&self) {
        lock(&self.series).clear();
        self.changed();
    }

    /// The family's text (empty when it has no series), printed again only
    /// when the family changed since last time.
    pub fn text(&self) -> Bytes {
        let mut printed = lock(&self.printed);
        let now = self.changes();
        if printed.changes != now {
            let mut text = String::with_capacity(printed.text.len());
            self.print(&mut text);
            printed.text = Bytes::from(text);
            printed.changes = now;
        }
        printed.text.clone()
    }

    fn print(&self, out: &mut String) {
        let series = lock(&self.series);
        if series.is_empty() {
            return;
        }
        out.push_str(&self.header);
        for (key, value) in series.iter() {
            match value {
                Value::Scalar(x) => self.sample(out, "", key, None, *x),
                Value::Histogram(b) => {
                    let mut cumulative = 0;
                    for (count, le) in b.counts.iter().zip(&self.bounds_text) {
                        cumulative += count;
                        self.sample(out, "_bucket", key, Some(le), cumulative as f64);
                    }
                    self.sample(out, "_bucket", key, Some("+Inf"), b.count as f64);
                    self.sample(out, "_sum", key, None, b.sum);
                    self.sample(out, "_count", key, None, b.count as f64);
                }
            }
        }
    }

    /// One line: `name{labels} value`, with `le` last on buckets.
    fn sample(&self, out: &mut String, suffix: &str, key: &str, le: Option<&str>, value: f64) {
        out.push_str(&self.name);
        out.push_str(suffix);
        match le {
            None => out.push_str(key),
            Some(le) => {
                // `{labels}` becomes `{labels,le="bound"}`.
                match key.strip_suffix('}') {
                    Some(open) => {
                        out.push_str(open);
                        out.push_str(",le=\"");
                    }
                    None => out.push_str("{le=\""),
                }
                out.push_str(le);
                out.push_str("\"}");
            }
        }
        out.push(' ');
        push_value(out, value);
        out.push('\n');
    }
}

/// Sets a gauge's value; whether it moved (bit for bit, so NaN stays NaN).
fn set_scalar(value: &mut Value, to: f64) -> bool {
    match value {
        Value::Scalar(x) if x.to_bits() != to.to_bits() => {
            *x = to;
            true
        }
        _ => false,
    }
}

/// A sample value as Rust's `Display` writes it (what the Prometheus crate
/// prints), by faster routes where they give the same text: integers
/// (counts) and plain decimals; other values through `Display`.
fn push_value(out: &mut String, value: f64) {
    let magnitude = value.abs();
    if value.fract() == 0.0 && magnitude < 1e15 && !(value == 0.0 && value.is_sign_negative()) {
        out.push_str(itoa::Buffer::new().format(value as i64));
    } else if (1e-4..1e15).contains(&magnitude) {
        out.push_str(ryu::Buffer::new().format_finite(value));
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Escapes a label value as the text format wants: `\`, `"` and newline.
fn escape_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `name="value"` as it appears in label text: a hint that finds the
/// series carrying that label without parsing the others.
pub fn label_text(name: &str, value: &str) -> String {
    let mut text = format!("{name}=\"");
    escape_value(value, &mut text);
    text.push('"');
    text
}

/// Whether the series `key` (label text as [`Family::key`] writes it)
/// is `target`'s: `hint` (its `target="…"` text) is looked for first, so
/// only the target's series are parsed, with the exposition parser.
fn of_target(key: &str, hint: &str, target: &str) -> Option<Vec<(String, String)>> {
    if !key.contains(hint) {
        return None;
    }
    let (labels, _) = exposition::parse_labels(key.strip_prefix('{')?)?;
    labels
        .iter()
        .any(|(n, v)| n == "target" && v == target)
        .then_some(labels)
}

#[cfg(test)]
mod tests;
