//! `[[scenarios]]`: the probe workloads (lengths, concurrency, how long a
//! run is, warm-up, SLOs, schedule, deadline), from a preset or written
//! out; several concurrency levels expand one scenario into several. A
//! `dataset_path` is read in the load step (`read_datasets`), with the
//! checks that need its prompts.

use std::time::Duration;

use super::reader::{Errors, Fields};
use super::{FileRef, Schedule, check_name, endpoint, presets, schedule};
use crate::client::Endpoint;
use crate::limits;
use crate::stats::bench::Slos;
use crate::workload::dataset::{Dataset, SharedDataset};
use crate::workload::kinds::ScenarioKind;

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
    /// With a dataset and none written: estimated from its prompts when
    /// it is read ([`INPUT_LEN_FROM_DATASET`] until then).
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
    /// The users' own prompts: the file `dataset_path` names, read in the
    /// load step (once for all the concurrency levels of a scenario).
    pub dataset: Option<FileRef<SharedDataset>>,
    /// Tokens every request of a run shares at its start (0: none).
    pub shared_prefix_len: u32,
    /// What the requests ask for.
    pub kind: ScenarioKind,
    /// Turns per conversation (multi_turn scenarios).
    pub turns: u32,
}

/// Defaults of a scenario that neither sets nor inherits from a preset.
pub const DEFAULT_NUM_REQUESTS: u32 = 16;
pub const DEFAULT_DURATION_MAX_REQUESTS: u32 = 1000;
pub const DEFAULT_WARMUP: u32 = 1;
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);
pub const DEFAULT_TURNS: u32 = 3;
/// The `input_len` of a parsed scenario whose dataset, once read, gives it.
pub const INPUT_LEN_FROM_DATASET: u32 = 0;

/// Token lengths and concurrency levels, written or from the preset.
struct Shape {
    input_len: Option<u32>,
    output_len: Option<u32>,
    range_ratio: f64,
    concurrency: Vec<u32>,
}

/// What one `[[scenarios]]` table gave.
#[derive(Default)]
pub struct Written {
    /// Its scenarios (several when it lists several concurrency levels).
    pub scenarios: Vec<ScenarioConfig>,
    /// The name of a scenario whose own errors (a `dataset_path` that is
    /// no string, say) kept it from being built: a target naming it is
    /// not told a second time that no such scenario exists.
    pub unbuilt: Option<String>,
}

pub fn scenario(f: &mut Fields, errors: &mut Errors) -> Written {
    let name = f.string("name", errors);
    match &name {
        Some(n) => check_name(f, n, errors),
        None => errors.push(f.path_of("name"), "is required"),
    }
    let dataset: Option<FileRef<SharedDataset>> = f
        .string("dataset_path", errors)
        .map(|path| FileRef::named(f.path_of("dataset_path"), path));
    let kind: ScenarioKind = f.parsed("kind", errors).unwrap_or_default();
    let turns = f
        .integer("turns", 1, u64::from(limits::MAX_TURNS), errors)
        .map_or(DEFAULT_TURNS, |t| t as u32);
    if f.has("turns") && kind != ScenarioKind::MultiTurn {
        errors.push(
            f.path_of("turns"),
            "only applies with kind = \"multi_turn\"",
        );
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
    let shape = shape(f, preset, dataset.is_some(), errors);
    let shared_prefix_len = f
        .integer("shared_prefix_len", 1, limits::MAX_LEN, errors)
        .map_or(0, |n| n as u32);
    if let Some(input_len) = shape.input_len.filter(|_| dataset.is_none())
        && shared_prefix_len >= input_len
    {
        errors.push(
            f.path_of("shared_prefix_len"),
            format!("must be shorter than input_len ({input_len})"),
        );
    }
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
    let Some(name) = name else {
        return Written::default();
    };
    let (Some(input_len), Some(output_len)) = (shape.input_len, shape.output_len) else {
        return Written {
            scenarios: Vec::new(),
            unbuilt: Some(name),
        };
    };
    // A dataset's lengths are checked once it is read.
    if dataset.is_none()
        && let Err(message) =
            check_run_tokens(input_len, output_len, shape.range_ratio, length, warmup)
    {
        errors.push(f.path_of("input_len"), message);
    }
    let many = shape.concurrency.len() > 1;
    let scenarios = shape
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
            dataset: dataset.clone(),
            shared_prefix_len,
            kind,
            turns,
        })
        .collect();
    Written {
        scenarios,
        unbuilt: None,
    }
}

/// The tokens a run may ask for, prompts and outputs, within the limits.
fn check_run_tokens(
    input_len: u32,
    longest_output: u32,
    range_ratio: f64,
    length: RunLength,
    warmup: u32,
) -> Result<(), String> {
    let requests = match length {
        RunLength::Requests(n) => n,
        RunLength::Duration { max_requests, .. } => max_requests,
    };
    limits::check_run_tokens(
        input_len,
        longest_output,
        range_ratio,
        u64::from(requests),
        u64::from(warmup),
    )
}

/// The load step's part: reads each scenario's dataset once (the
/// concurrency levels of one scenario share it); one that cannot be used is
/// an error on its `dataset_path`. A dataset read gives the scenario its
/// `input_len` if none was written, and the lengths a run may ask for are
/// checked against its longest prompt and output. `places` are where each
/// scenario is written, in order.
pub(super) fn read_datasets(
    scenarios: &mut [ScenarioConfig],
    places: &[String],
    errors: &mut Errors,
) {
    // Each file named, by its field, and what reading it gave.
    let mut read: Vec<(String, Option<SharedDataset>)> = Vec::new();
    for (s, place) in scenarios.iter_mut().zip(places) {
        let Some(file) = &mut s.dataset else {
            continue;
        };
        let first = !read.iter().any(|(field, _)| field == file.field());
        if first {
            let dataset = Dataset::load(file.path())
                .map(std::sync::Arc::new)
                .map_err(|e| errors.push(file.field(), e.to_string()))
                .ok();
            read.push((file.field().to_owned(), dataset));
        }
        let Some(dataset) = read
            .iter()
            .find(|(field, _)| field == file.field())
            .and_then(|(_, dataset)| dataset.clone())
        else {
            continue;
        };
        if s.input_len == INPUT_LEN_FROM_DATASET {
            s.input_len = dataset.estimated_input_len();
        }
        // A dataset's lines may ask for more than the default output; said
        // once per scenario as written, not per concurrency level.
        if first
            && let Err(message) = check_run_tokens(
                s.input_len,
                dataset.max_output(s.output_len),
                s.range_ratio,
                s.length,
                s.warmup,
            )
        {
            errors.push(format!("{place}.input_len"), message);
        }
        file.set(dataset);
    }
}

/// A dataset's prompts stand for `input_len`: their lengths are the
/// server's count; lines without `max_tokens` get `output_len`.
const DATASET_DEFAULT_OUTPUT_LEN: u32 = 128;

/// `dataset`: the scenario names a dataset, read later.
fn shape(
    f: &mut Fields,
    preset: Option<&presets::Preset>,
    dataset: bool,
    errors: &mut Errors,
) -> Shape {
    let scale = f.number("scale", 0.0001, 1.0e3, errors).unwrap_or(1.0);
    let scaled = |len: u32| ((f64::from(len) * scale).round() as u32).max(1);
    let input_len = f
        .integer("input_len", 1, limits::MAX_LEN, errors)
        .map(|v| v as u32)
        .or(preset.map(|p| scaled(p.input_len)))
        .or(dataset.then_some(INPUT_LEN_FROM_DATASET));
    let output_len = f
        .integer("output_len", 1, limits::MAX_LEN, errors)
        .map(|v| v as u32)
        .or(preset.map(|p| scaled(p.output_len)))
        .or(dataset.then_some(DATASET_DEFAULT_OUTPUT_LEN));
    for (key, v) in [("input_len", input_len), ("output_len", output_len)] {
        // A dataset_path that is no string has its own error.
        if v.is_none() && !f.has(key) && !f.has("dataset_path") {
            errors.push(
                f.path_of(key),
                "is required (or name a preset, or a dataset_path)",
            );
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
