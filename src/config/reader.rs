//! A TOML table walker that collects every problem with its field path
//! instead of stopping at the first, and reports keys nobody asked for.

use std::collections::BTreeSet;
use std::time::Duration;

use toml::{Table, Value};

/// One configuration problem: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path such as `targets[1].timeouts.connect`.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Error sink shared by all readers of one document.
#[derive(Debug, Default)]
pub struct Errors(pub Vec<FieldError>);

impl Errors {
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Reads the keys of one table; `finish` reports the keys never read.
pub struct Fields<'a> {
    table: &'a Table,
    path: String,
    seen: BTreeSet<&'static str>,
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

impl<'a> Fields<'a> {
    pub fn new(table: &'a Table, path: impl Into<String>) -> Self {
        Fields {
            table,
            path: path.into(),
            seen: BTreeSet::new(),
        }
    }

    pub fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// This table's own path, e.g. `targets[0].replicas`.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// Whether `key` holds an array (for keys that take a word or a list).
    pub fn is_array(&self, key: &str) -> bool {
        matches!(self.table.get(key), Some(Value::Array(_)))
    }

    fn raw(&mut self, key: &'static str) -> Option<&'a Value> {
        self.seen.insert(key);
        self.table.get(key)
    }

    fn wrong(&self, errors: &mut Errors, key: &str, want: &str, got: &Value) {
        errors.push(
            self.path_of(key),
            format!("expected {want}, found {}", type_name(got)),
        );
    }

    pub fn string(&mut self, key: &'static str, errors: &mut Errors) -> Option<String> {
        match self.raw(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.wrong(errors, key, "a string", other);
                None
            }
        }
    }

    /// A string that `T` parses; its parse error is the field's message.
    pub fn parsed<T: std::str::FromStr<Err = String>>(
        &mut self,
        key: &'static str,
        errors: &mut Errors,
    ) -> Option<T> {
        let text = self.string(key, errors)?;
        text.parse()
            .map_err(|message| errors.push(self.path_of(key), message))
            .ok()
    }

    pub fn boolean(&mut self, key: &'static str, errors: &mut Errors) -> Option<bool> {
        match self.raw(key)? {
            Value::Boolean(b) => Some(*b),
            other => {
                self.wrong(errors, key, "true or false", other);
                None
            }
        }
    }

    /// An integer within `min..=max` (`Ok`), or a string (`Err`, the
    /// string): a key that takes a number or a name.
    pub fn integer_or_string(
        &mut self,
        key: &'static str,
        min: u64,
        max: u64,
        errors: &mut Errors,
    ) -> Option<Result<u64, String>> {
        match self.raw(key)? {
            Value::String(s) => Some(Err(s.clone())),
            Value::Integer(_) => self.integer(key, min, max, errors).map(Ok),
            other => {
                self.wrong(errors, key, "an integer or a string", other);
                None
            }
        }
    }

    /// A non-negative integer within `min..=max`.
    pub fn integer(
        &mut self,
        key: &'static str,
        min: u64,
        max: u64,
        errors: &mut Errors,
    ) -> Option<u64> {
        match self.raw(key)? {
            Value::Integer(i) if *i >= min as i64 && (*i as u64) <= max && *i >= 0 => {
                Some(*i as u64)
            }
            Value::Integer(i) => {
                errors.push(
                    self.path_of(key),
                    format!("{i} is out of range: must be between {min} and {max}"),
                );
                None
            }
            other => {
                self.wrong(errors, key, "an integer", other);
                None
            }
        }
    }

    /// A number within `min..=max` (integers accepted).
    pub fn number(
        &mut self,
        key: &'static str,
        min: f64,
        max: f64,
        errors: &mut Errors,
    ) -> Option<f64> {
        let value = match self.raw(key)? {
            Value::Float(f) => *f,
            Value::Integer(i) => *i as f64,
            other => {
                self.wrong(errors, key, "a number", other);
                return None;
            }
        };
        if value.is_nan() || value < min || value > max {
            errors.push(
                self.path_of(key),
                format!("{value} is out of range: must be between {min} and {max}"),
            );
            return None;
        }
        Some(value)
    }

    /// A duration written like `"30s"`, `"5m"`, `"1h 30m"` or `"250ms"`.
    pub fn duration(&mut self, key: &'static str, errors: &mut Errors) -> Option<Duration> {
        let text = self.string(key, errors)?;
        match humantime::parse_duration(&text) {
            Ok(d) if d > crate::limits::MAX_DURATION => {
                errors.push(
                    self.path_of(key),
                    format!("{text:?} is longer than the 3650 days any duration may be"),
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                errors.push(
                    self.path_of(key),
                    format!(
                        "{text:?} is not a duration ({e}); write e.g. \"30s\", \"5m\", \"250ms\""
                    ),
                );
                None
            }
        }
    }

    /// A duration that must be positive.
    pub fn positive_duration(
        &mut self,
        key: &'static str,
        errors: &mut Errors,
    ) -> Option<Duration> {
        let d = self.duration(key, errors)?;
        if d.is_zero() {
            errors.push(self.path_of(key), "must be longer than zero");
            return None;
        }
        Some(d)
    }

    /// A positive duration of at most `max`.
    pub fn bounded_duration(
        &mut self,
        key: &'static str,
        max: Duration,
        errors: &mut Errors,
    ) -> Option<Duration> {
        let d = self.positive_duration(key, errors)?;
        if d > max {
            errors.push(
                self.path_of(key),
                format!(
                    "{} is more than the {} allowed",
                    humantime::format_duration(d),
                    humantime::format_duration(max)
                ),
            );
            return None;
        }
        Some(d)
    }

    pub fn table(&mut self, key: &'static str, errors: &mut Errors) -> Option<Fields<'a>> {
        let path = self.path_of(key);
        match self.raw(key)? {
            Value::Table(t) => Some(Fields::new(t, path)),
            other => {
                self.wrong(errors, key, "a table", other);
                None
            }
        }
    }

    pub fn tables(&mut self, key: &'static str, errors: &mut Errors) -> Vec<Fields<'a>> {
        let path = self.path_of(key);
        match self.raw(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| match item {
                    Value::Table(t) => Some(Fields::new(t, format!("{path}[{i}]"))),
                    other => {
                        errors.push(
                            format!("{path}[{i}]"),
                            format!("expected a table, found {}", type_name(other)),
                        );
                        None
                    }
                })
                .collect(),
            Some(other) => {
                self.wrong(errors, key, "an array of tables ([[...]])", other);
                Vec::new()
            }
        }
    }

    pub fn strings(&mut self, key: &'static str, errors: &mut Errors) -> Option<Vec<String>> {
        let path = self.path_of(key);
        match self.raw(key)? {
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => out.push(s.clone()),
                        other => errors.push(
                            format!("{path}[{i}]"),
                            format!("expected a string, found {}", type_name(other)),
                        ),
                    }
                }
                Some(out)
            }
            other => {
                self.wrong(errors, key, "an array of strings", other);
                None
            }
        }
    }

    /// An array of integers, each checked by the caller.
    pub fn integers(&mut self, key: &'static str, errors: &mut Errors) -> Option<Vec<i64>> {
        let path = self.path_of(key);
        match self.raw(key)? {
            Value::Array(items) => Some(
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, item)| match item {
                        Value::Integer(n) => Some(*n),
                        other => {
                            errors.push(
                                format!("{path}[{i}]"),
                                format!("expected an integer, found {}", type_name(other)),
                            );
                            None
                        }
                    })
                    .collect(),
            ),
            other => {
                self.wrong(errors, key, "an array of integers", other);
                None
            }
        }
    }

    /// Reports every key that no reader asked for.
    pub fn finish(self, errors: &mut Errors) {
        for key in self.table.keys() {
            if !self.seen.contains(key.as_str()) {
                let expected: Vec<&str> = self.seen.iter().copied().collect();
                errors.push(
                    self.path_of(key),
                    format!("unknown key; expected one of: {}", expected.join(", ")),
                );
            }
        }
    }
}
