//! `[[scenarios]]`: the probe workloads (lengths, concurrency, how long a
//! run is, warm-up, SLOs, schedule, deadline), from a preset or written
//! out; several concurrency levels expand one scenario into several.

use std::time::Duration;

use super::reader::{Errors, Fields};
use super::{Schedule, check_name, endpoint, presets, schedule};
use crate::client::Endpoint;
use crate::limits;
use crate::stats::bench::Slos;

/// How long one run is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunLength {
    Requests(u32),
    /// Keep sending for this long, at most `max_requests`.
    Duration {
        duration: Duration,
        max_requests: u32,
    },
}

#[derive(Debug, Clone)]
pub struct ScenarioConfig {
    pub name: String,
    /// The name as written: differs from `name` when several concurrency
    /// levels expanded one scenario into `<name>-c<N>`.
    pub written_name: String,
    pub preset: Option<String>,
    pub input_len: u32,
    pub output_len: u32,
    pub range_ratio: f64,
    pub concurrency: u32,
    pub length: RunLength,
    pub warmup: u32,
    pub slos: Slos,
    pub schedule: Option<Schedule>,
    /// A run still going after this is aborted and counted as failed.
    pub deadline: Duration,
    /// Overrides the target's endpoint.
    pub endpoint: Option<Endpoint>,
}

/// Defaults of a scenario that neither sets nor inherits from a preset.
pub const DEFAULT_NUM_REQUESTS: u32 = 16;
pub const DEFAULT_DURATION_MAX_REQUESTS: u32 = 1000;
pub const DEFAULT_WARMUP: u32 = 1;
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// Token lengths and concurrency levels, written or from the preset.
struct Shape {
    input_len: Option<u32>,
    output_len: Option<u32>,
    range_ratio: f64,
    concurrency: Vec<u32>,
}

pub fn scenario(f: &mut Fields, errors: &mut Errors) -> Vec<ScenarioConfig> {
    let name = f.string("name", errors);
    match &name {
        Some(n) => check_name(f, n, errors),
        None => errors.push(f.path_of("name"), "is required"),
    }
    let preset_name = f.string("preset", errors);
    let preset = preset_name.as_deref().and_then(|p| {
        let found = presets::find(p);
        if found.is_none() {
            errors.push(
                f.path_of("preset"),
                format!(
                    "no preset named {p:?}; presets: {}",
                    presets::names().join(", ")
                ),
            );
        }
        found
    });
    let shape = shape(f, preset, errors);
    let length = run_length(f, preset, errors);
    let warmup = f
        .integer("warmup", 0, limits::MAX_WARMUP, errors)
        .map_or(DEFAULT_WARMUP, |w| w as u32);
    let mut slos = Slos::default();
    if let Some(mut s) = f.table("slo", errors) {
        slos.ttft_s = s.positive_duration("ttft", errors).map(|d| d.as_secs_f64());
        slos.tpot_s = s.positive_duration("tpot", errors).map(|d| d.as_secs_f64());
        slos.e2el_s = s.positive_duration("e2el", errors).map(|d| d.as_secs_f64());
        s.finish(errors);
    }
    let schedule = schedule(f, errors);
    let deadline = f
        .bounded_duration("deadline", limits::MAX_REQUEST_TIMEOUT, errors)
        .unwrap_or(DEFAULT_DEADLINE);
    let endpoint = endpoint(f, errors);
    let Some(name) = name else { return Vec::new() };
    let (Some(input_len), Some(output_len)) = (shape.input_len, shape.output_len) else {
        return Vec::new();
    };
    let requests = match length {
        RunLength::Requests(n) => n,
        RunLength::Duration { max_requests, .. } => max_requests,
    };
    if let Err(message) = limits::check_run_tokens(
        input_len,
        output_len,
        shape.range_ratio,
        u64::from(requests),
        u64::from(warmup),
    ) {
        errors.push(f.path_of("input_len"), message);
    }
    let many = shape.concurrency.len() > 1;
    shape
        .concurrency
        .into_iter()
        .map(|c| ScenarioConfig {
            name: if many {
                format!("{name}-c{c}")
            } else {
                name.clone()
            },
            written_name: name.clone(),
            preset: preset_name.clone(),
            input_len,
            output_len,
            range_ratio: shape.range_ratio,
            concurrency: c,
            length,
            warmup,
            slos,
            schedule: schedule.clone(),
            deadline,
            endpoint,
        })
        .collect()
}

fn shape(f: &mut Fields, preset: Option<&presets::Preset>, errors: &mut Errors) -> Shape {
    let scale = f.number("scale", 0.0001, 1.0e3, errors).unwrap_or(1.0);
    let scaled = |len: u32| ((f64::from(len) * scale).round() as u32).max(1);
    let input_len = f
        .integer("input_len", 1, limits::MAX_LEN, errors)
        .map(|v| v as u32)
        .or(preset.map(|p| scaled(p.input_len)));
    let output_len = f
        .integer("output_len", 1, limits::MAX_LEN, errors)
        .map(|v| v as u32)
        .or(preset.map(|p| scaled(p.output_len)));
    for (key, v) in [("input_len", input_len), ("output_len", output_len)] {
        if v.is_none() && !f.has(key) {
            errors.push(f.path_of(key), "is required (or name a preset)");
        }
    }
    let range_ratio = match f.number("range_ratio", 0.0, 1.0, errors) {
        Some(r) if r >= 1.0 => {
            errors.push(f.path_of("range_ratio"), "must be below 1");
            0.0
        }
        Some(r) => r,
        None => preset.map_or(0.0, |p| p.range_ratio),
    };
    let concurrency = match f.integer("concurrency", 1, limits::MAX_CONCURRENCY, errors) {
        Some(c) => vec![c as u32],
        None => preset.map_or(vec![1], |p| p.concurrency.to_vec()),
    };
    Shape {
        input_len,
        output_len,
        range_ratio,
        concurrency,
    }
}

/// A number of requests, or a duration with a request cap.
fn run_length(f: &mut Fields, preset: Option<&presets::Preset>, errors: &mut Errors) -> RunLength {
    let num_requests = f
        .integer("num_requests", 1, limits::MAX_REQUESTS, errors)
        .map(|v| v as u32);
    let duration = f.bounded_duration("duration", limits::MAX_REQUEST_TIMEOUT, errors);
    let max_requests = f
        .integer("max_requests", 1, limits::MAX_REQUESTS, errors)
        .map(|v| v as u32);
    if max_requests.is_some() && duration.is_none() {
        errors.push(f.path_of("max_requests"), "only applies with duration");
    }
    match (num_requests, duration) {
        (Some(_), Some(_)) => {
            errors.push(
                f.path_of("duration"),
                "set either num_requests or duration, not both",
            );
            RunLength::Requests(1)
        }
        (_, Some(d)) => RunLength::Duration {
            duration: d,
            max_requests: max_requests.unwrap_or(DEFAULT_DURATION_MAX_REQUESTS),
        },
        (Some(n), None) => RunLength::Requests(n),
        (None, None) => {
            RunLength::Requests(preset.map_or(DEFAULT_NUM_REQUESTS, |p| p.num_requests))
        }
    }
}
