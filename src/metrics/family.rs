//! One metric family's series, kept ready to print: each series is its
//! label text as it appears on `/metrics` (`{model="m",target="t"}`, label
//! names sorted) and its value, so encoding is copying text and formatting
//! numbers. About 160 bytes a series, where a general-purpose registry
//! keeps each label as its own pair of strings (about 1.5 kB a series at
//! seven labels) and copies all of them on every scrape.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::MetricsError;

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
    /// This family's changes, and the page's.
    changes: AtomicU64,
    page_changes: Arc<AtomicU64>,
    printed: Mutex<Printed>,
}

/// The family's text as of `changes`.
#[derive(Default)]
struct Printed {
    changes: u64,
    text: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn valid_name(name: &str, colon: bool) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'));
    first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
}

impl Family {
    pub fn new(
        name: &str,
        help: &str,
        labels: &[&str],
        kind: Kind,
        page_changes: Arc<AtomicU64>,
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
            page_changes,
            printed: Mutex::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn has_label(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }

    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn changed(&self) {
        // The family first: a page printed between the two sees the family
        // changed and only misses the page-wide mark, which the next scrape
        // then catches.
        self.changes.fetch_add(1, Ordering::Release);
        self.page_changes.fetch_add(1, Ordering::Release);
    }

    /// The label text of the series with these values (declared order);
    /// `None` when the count is wrong, a writer's mistake that must not
    /// take the daemon down.
    fn key(&self, values: &[&str]) -> Option<Box<str>> {
        if values.len() != self.labels.len() {
            debug_assert!(false, "{}: {} label values", self.name, values.len());
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

    /// Applies `write` to the series (created at zero first), and marks
    /// the family changed.
    fn write(&self, values: &[&str], write: impl FnOnce(&mut Value)) {
        let Some(key) = self.key(values) else { return };
        let mut series = lock(&self.series);
        let value = series.entry(key).or_insert_with(|| match &self.kind {
            Kind::Histogram(bounds) => Value::Histogram(Box::new(Buckets {
                counts: vec![0; bounds.len()].into_boxed_slice(),
                sum: 0.0,
                count: 0,
            })),
            _ => Value::Scalar(0.0),
        });
        write(value);
        drop(series);
        self.changed();
    }

    pub fn set(&self, values: &[&str], to: f64) {
        self.write(values, |v| {
            if let Value::Scalar(x) = v {
                *x = to;
            }
        });
    }

    pub fn add(&self, values: &[&str], by: f64) {
        self.write(values, |v| {
            if let Value::Scalar(x) = v {
                *x += by;
            }
        });
    }

    /// Creates the series at zero, or keeps it.
    pub fn declare(&self, values: &[&str]) {
        self.write(values, |_| {});
    }

    /// Observes every value (NaN skipped) into one histogram series.
    pub fn observe_all(&self, values: &[&str], observed: impl IntoIterator<Item = f64>) {
        let Kind::Histogram(bounds) = &self.kind else {
            return;
        };
        self.write(values, |v| {
            let Value::Histogram(b) = v else { return };
            for x in observed.into_iter().filter(|x| !x.is_nan()) {
                if let Some(i) = bounds.iter().position(|&bound| x <= bound) {
                    b.counts[i] += 1;
                }
                b.sum += x;
                b.count += 1;
            }
        });
    }

    /// Removes one series (declared order); absent is fine.
    pub fn remove(&self, values: &[&str]) {
        let Some(key) = self.key(values) else { return };
        if lock(&self.series).remove(&key).is_some() {
            self.changed();
        }
    }

    /// Removes the series with exactly these labels, named; absent, or
    /// other label names, is fine.
    pub fn remove_named(&self, labels: &HashMap<&str, &str>) {
        if labels.len() != self.labels.len() {
            return;
        }
        let values: Option<Vec<&str>> = self
            .labels
            .iter()
            .map(|l| labels.get(l.as_str()).copied())
            .collect();
        if let Some(values) = values {
            self.remove(&values);
        }
    }

    /// Removes the series whose labels `gone` says no longer describe
    /// anything; returns how many. `hint`, when given, is text every such
    /// series' label text holds, so the others are not parsed.
    pub fn remove_where(
        &self,
        hint: Option<&str>,
        gone: &dyn Fn(&HashMap<&str, &str>) -> bool,
    ) -> usize {
        let mut series = lock(&self.series);
        let before = series.len();
        series.retain(|key, _| {
            if hint.is_some_and(|h| !key.contains(h)) {
                return true;
            }
            let Some(parsed) = parse_labels(key) else {
                return true;
            };
            let labels: HashMap<&str, &str> =
                parsed.iter().map(|(n, v)| (*n, v.as_ref())).collect();
            !gone(&labels)
        });
        let removed = before - series.len();
        drop(series);
        if removed > 0 {
            self.changed();
        }
        removed
    }

    /// Removes every series.
    pub fn reset(&self) {
        lock(&self.series).clear();
        self.changed();
    }

    /// Appends the family's text (nothing when it has no series), printed
    /// again only when the family changed since last time.
    pub fn print_into(&self, page: &mut String) {
        let mut printed = lock(&self.printed);
        let now = self.changes();
        if printed.changes != now {
            printed.text.clear();
            self.print(&mut printed.text);
            printed.text.shrink_to_fit();
            printed.changes = now;
        }
        page.push_str(&printed.text);
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

/// The inverse of [`escape_value`].
fn unescape_value(raw: &str) -> String {
    let mut value = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            value.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => value.push('\n'),
            Some(other) => value.push(other),
            None => value.push('\\'),
        }
    }
    value
}

/// `name="value"` as it appears in label text: a hint that finds the
/// series carrying that label without parsing the others.
pub fn label_text(name: &str, value: &str) -> String {
    let mut text = format!("{name}=\"");
    escape_value(value, &mut text);
    text.push('"');
    text
}

/// The labels of a series' label text as [`Family::key`] wrote it, values
/// unescaped; `None` for text it did not write.
fn parse_labels(key: &str) -> Option<Vec<(&str, Cow<'_, str>)>> {
    let inner = key.strip_prefix('{')?.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let bytes = after.as_bytes();
        let mut end = 0;
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        let raw = after.get(..end)?;
        let value = if raw.contains('\\') {
            Cow::Owned(unescape_value(raw))
        } else {
            Cow::Borrowed(raw)
        };
        labels.push((name, value));
        rest = after.get(end + 1..)?;
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Some(labels)
}

#[cfg(test)]
mod tests;
