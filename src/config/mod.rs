//! The daemon's configuration: a TOML file read into a fresh, validated
//! [`Config`]. Unknown keys are errors, every error names its field path,
//! and all errors are reported together.

pub mod detector_notify;
pub mod live;
pub mod presets;
pub mod reader;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::client::{Endpoint, SecretSource, Timeouts};
use crate::limits;
use crate::stats::bench::Slos;
use reader::{Errors, FieldError, Fields};

/// Every problem found in one configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{origin} is not valid TOML: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin} has {} problem(s):\n{}", .errors.len(), render(.errors))]
    Invalid {
        origin: String,
        errors: Vec<FieldError>,
    },
}

fn render(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  - {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigError {
    /// The field errors, empty for read and syntax errors.
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            ConfigError::Invalid { errors, .. } => errors,
            _ => &[],
        }
    }
}

/// A cron schedule with random jitter added to every tick.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// As written by the user.
    pub expression: String,
    pub cron: cron::Schedule,
    /// Each tick is delayed by a uniform random amount up to this, so many
    /// sentinels (or targets) do not probe in lockstep.
    pub jitter: Duration,
}

impl Schedule {
    /// Parses a 5-field crontab line (minute precision), or the cron crate's
    /// 6/7-field form with seconds (and years).
    pub fn parse(expression: &str, jitter: Duration) -> Result<Schedule, String> {
        let fields = expression.split_whitespace().count();
        let full = match fields {
            5 => format!("0 {expression}"),
            6 | 7 => expression.to_owned(),
            n => {
                return Err(format!(
                    "{expression:?} has {n} fields; write 5 (min hour day month weekday) or 6 with seconds first"
                ));
            }
        };
        let cron = cron::Schedule::from_str(&full)
            .map_err(|e| format!("{expression:?} is not a cron expression: {e}"))?;
        if cron.upcoming(chrono::Utc).next().is_none() {
            return Err(format!("{expression:?} never fires"));
        }
        Ok(Schedule {
            expression: expression.to_owned(),
            cron,
            jitter,
        })
    }

    /// The next tick strictly after `after` (jitter not included).
    /// Seconds between the next two ticks: the schedule's period, which
    /// staleness alerts multiply.
    pub fn interval_seconds(&self) -> Option<f64> {
        let mut ticks = self.cron.upcoming(chrono::Utc);
        let a = ticks.next()?;
        let b = ticks.next()?;
        Some((b - a).num_milliseconds() as f64 / 1000.0)
    }

    pub fn next_after(
        &self,
        after: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        self.cron.after(&after).next()
    }
}

#[derive(Debug, Clone)]
pub struct ExporterConfig {
    pub listen: SocketAddr,
    /// Bearer token guarding the write endpoints of the HTTP API.
    pub admin_token: Option<SecretSource>,
    /// Most exporter connections at once; lowered at start to a quarter of
    /// the file-descriptor limit.
    pub max_connections: usize,
    /// A client that has not sent its whole request header by then is
    /// disconnected.
    pub header_timeout: Duration,
    /// Series of a model its target replaced are removed after this.
    pub stale_series_after: Duration,
}

/// Defaults of the `[exporter]` section.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
    /// Runs older than this are deleted.
    pub retention: Duration,
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// First wait after a run found the target down; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long probes in flight may finish after SIGTERM before they are aborted.
    pub shutdown_grace: Duration,
    /// For scenarios and targets that set none.
    pub default_schedule: Schedule,
}

#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// How often each target's `/metrics`, `/version` and GPU counters are read.
    pub scrape_interval: Duration,
    pub scrape_timeout: Duration,
    /// Read GPU counters from NVML on this host when a driver is present.
    pub nvml: bool,
}

#[derive(Debug, Clone)]
pub struct TargetConfig {
    pub name: String,
    pub base_url: String,
    /// `None`: the first model `/v1/models` lists.
    pub model: Option<String>,
    pub api_key: Option<SecretSource>,
    pub endpoint: Endpoint,
    pub timeouts: Timeouts,
    /// vLLM's Prometheus endpoint; `None` disables the load scrape.
    pub metrics_url: Option<String>,
    pub dcgm_url: Option<String>,
    /// The scenarios probed on this target, in order.
    pub scenarios: Vec<String>,
    /// Overrides the scenarios' own schedules on this target.
    pub schedule: Option<Schedule>,
}

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

#[derive(Debug, Clone)]
pub struct Config {
    pub exporter: ExporterConfig,
    pub store: StoreConfig,
    pub scheduler: SchedulerConfig,
    pub telemetry: TelemetryConfig,
    pub verdict_policy: crate::detect::policy::VerdictPolicy,
    pub notify: detector_notify::NotifyConfig,
    pub targets: Vec<TargetConfig>,
    pub scenarios: Vec<ScenarioConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            cause: source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates; `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    origin: origin.to_owned(),
                    message: e.to_string().trim().to_owned(),
                })?;
        let mut errors = Errors::default();
        let config = build(&table, &mut errors);
        if errors.0.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                errors: errors.0,
            })
        }
    }

    pub fn scenario(&self, name: &str) -> Option<&ScenarioConfig> {
        self.scenarios.iter().find(|s| s.name == name)
    }

    pub fn target(&self, name: &str) -> Option<&TargetConfig> {
        self.targets.iter().find(|t| t.name == name)
    }

    /// The schedule of one (target, scenario) pair: the target's if it has
    /// one, else the scenario's, else the default.
    pub fn schedule_for<'a>(
        &'a self,
        target: &'a TargetConfig,
        scenario: &'a ScenarioConfig,
    ) -> &'a Schedule {
        target
            .schedule
            .as_ref()
            .or(scenario.schedule.as_ref())
            .unwrap_or(&self.scheduler.default_schedule)
    }
}

/// Names become metric labels and file names: keep them plain.
fn check_name(fields: &Fields, name: &str, errors: &mut Errors) {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        errors.push(
            fields.path_of("name"),
            format!("{name:?} must be 1-64 characters of letters, digits, '-', '_' or '.'"),
        );
    }
}

const API_KEY_HINT: &str = "use api_key_env or api_key_file";

/// An http(s) URL without credentials; `hint` says where the secret goes.
fn check_url(
    fields: &Fields,
    key: &str,
    url: &str,
    hint: &str,
    errors: &mut Errors,
) -> Option<String> {
    match reqwest::Url::parse(url) {
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            errors.push(
                fields.path_of(key),
                format!("{url:?} must be an http:// or https:// URL"),
            );
            None
        }
        Ok(u) if !u.username().is_empty() || u.password().is_some() => {
            // URLs show up in logs and status pages; credentials must not.
            errors.push(
                fields.path_of(key),
                format!("must not carry credentials; {hint}"),
            );
            None
        }
        Ok(_) => Some(url.trim_end_matches('/').to_owned()),
        Err(e) => {
            errors.push(fields.path_of(key), format!("{url:?} is not a URL: {e}"));
            None
        }
    }
}

fn key_source(
    fields: &mut Fields,
    env_key: &'static str,
    file_key: &'static str,
    errors: &mut Errors,
) -> Option<SecretSource> {
    let env = fields.string(env_key, errors);
    let file = fields.string(file_key, errors);
    match (env, file) {
        (Some(_), Some(_)) => {
            errors.push(
                fields.path_of(env_key),
                format!("set either {env_key} or {file_key}, not both"),
            );
            None
        }
        (Some(name), None) if name.is_empty() => {
            errors.push(fields.path_of(env_key), "must name an environment variable");
            None
        }
        (Some(name), None) => Some(SecretSource::Env(name)),
        (None, Some(path)) => Some(SecretSource::File(PathBuf::from(path))),
        (None, None) => None,
    }
}

fn schedule(fields: &mut Fields, errors: &mut Errors) -> Option<Schedule> {
    let jitter = fields.duration("jitter", errors).unwrap_or(Duration::ZERO);
    let expression = fields.string("schedule", errors)?;
    match Schedule::parse(&expression, jitter) {
        Ok(s) => Some(s),
        Err(message) => {
            errors.push(fields.path_of("schedule"), message);
            None
        }
    }
}

fn endpoint(fields: &mut Fields, errors: &mut Errors) -> Option<Endpoint> {
    match fields.string("endpoint", errors)?.as_str() {
        "completions" => Some(Endpoint::Completions),
        "chat" => Some(Endpoint::Chat),
        other => {
            errors.push(
                fields.path_of("endpoint"),
                format!("{other:?} must be \"completions\" or \"chat\""),
            );
            None
        }
    }
}

fn build(table: &toml::Table, errors: &mut Errors) -> Config {
    let mut root = Fields::new(table, "");

    let exporter = {
        let mut listen = "127.0.0.1:9464".parse().expect("literal address");
        let mut admin_token = None;
        let mut max_connections = DEFAULT_MAX_CONNECTIONS;
        let mut header_timeout = DEFAULT_HEADER_TIMEOUT;
        let mut stale_series_after = crate::metrics::stale::DEFAULT_GRACE;
        if let Some(mut f) = root.table("exporter", errors) {
            if let Some(text) = f.string("listen", errors) {
                match text.parse() {
                    Ok(a) => listen = a,
                    Err(_) => errors.push(
                        f.path_of("listen"),
                        format!("{text:?} is not an address like 127.0.0.1:9464"),
                    ),
                }
            }
            admin_token = key_source(&mut f, "admin_token_env", "admin_token_file", errors);
            if let Some(n) = f.integer("max_connections", 1, 1_000_000, errors) {
                max_connections = n as usize;
            }
            if let Some(d) = f.bounded_duration("header_timeout", Duration::from_secs(600), errors)
            {
                header_timeout = d;
            }
            if let Some(d) = f.positive_duration("stale_series_after", errors) {
                stale_series_after = d;
            }
            f.finish(errors);
        }
        ExporterConfig {
            listen,
            admin_token,
            max_connections,
            header_timeout,
            stale_series_after,
        }
    };

    let store = {
        let mut path = PathBuf::from("vllm-sentinel.db");
        let mut retention = Duration::from_secs(90 * 86_400);
        if let Some(mut f) = root.table("store", errors) {
            if let Some(p) = f.string("path", errors) {
                if p.is_empty() {
                    errors.push(f.path_of("path"), "must not be empty");
                }
                path = PathBuf::from(p);
            }
            if let Some(r) = f.positive_duration("retention", errors) {
                retention = r;
            }
            f.finish(errors);
        }
        StoreConfig { path, retention }
    };

    let scheduler = {
        let mut s = SchedulerConfig {
            backoff_initial: Duration::from_secs(30),
            backoff_max: Duration::from_secs(15 * 60),
            shutdown_grace: Duration::from_secs(30),
            default_schedule: Schedule::parse("*/10 * * * *", Duration::from_secs(30))
                .expect("literal cron"),
        };
        if let Some(mut f) = root.table("scheduler", errors) {
            if let Some(d) = f.positive_duration("backoff_initial", errors) {
                s.backoff_initial = d;
            }
            if let Some(d) = f.positive_duration("backoff_max", errors) {
                s.backoff_max = d;
            }
            if let Some(d) = f.duration("shutdown_grace", errors) {
                s.shutdown_grace = d;
            }
            if let Some(d) = schedule(&mut f, errors) {
                s.default_schedule = d;
            }
            if s.backoff_max < s.backoff_initial {
                errors.push(
                    f.path_of("backoff_max"),
                    "must not be shorter than backoff_initial",
                );
            }
            f.finish(errors);
        }
        s
    };

    let telemetry = {
        let mut t = TelemetryConfig {
            scrape_interval: Duration::from_secs(15),
            scrape_timeout: Duration::from_secs(5),
            nvml: true,
        };
        if let Some(mut f) = root.table("telemetry", errors) {
            if let Some(d) = f.positive_duration("scrape_interval", errors) {
                t.scrape_interval = d;
            }
            if let Some(d) = f.positive_duration("scrape_timeout", errors) {
                t.scrape_timeout = d;
            }
            if let Some(b) = f.boolean("nvml", errors) {
                t.nvml = b;
            }
            f.finish(errors);
        }
        t
    };

    let verdict_policy = detector_notify::verdict_policy(&mut root, errors);
    let notify = detector_notify::notify(&mut root, errors);

    let mut scenarios = Vec::new();
    for mut f in root.tables("scenarios", errors) {
        scenarios.extend(scenario(&mut f, errors));
        f.finish(errors);
    }
    let mut seen = std::collections::HashSet::new();
    for (i, s) in scenarios.iter().enumerate() {
        if !seen.insert(s.name.clone()) {
            errors.push(
                format!("scenarios[{i}].name"),
                format!("{:?} is used by more than one scenario", s.name),
            );
        }
    }

    let mut targets = Vec::new();
    let target_tables = root.tables("targets", errors);
    if target_tables.is_empty() && !root.has("targets") {
        errors.push("targets", "at least one [[targets]] is required");
    }
    for mut f in target_tables {
        if let Some(t) = target(&mut f, &scenarios, errors) {
            if targets.iter().any(|o: &TargetConfig| o.name == t.name) {
                errors.push(
                    f.path_of("name"),
                    format!("{:?} is used by more than one target", t.name),
                );
            }
            targets.push(t);
        }
        f.finish(errors);
    }
    if scenarios.is_empty() && !root.has("scenarios") {
        errors.push("scenarios", "at least one [[scenarios]] is required");
    }
    root.finish(errors);
    Config {
        exporter,
        store,
        scheduler,
        telemetry,
        verdict_policy,
        notify,
        targets,
        scenarios,
    }
}

fn target(
    f: &mut Fields,
    scenarios: &[ScenarioConfig],
    errors: &mut Errors,
) -> Option<TargetConfig> {
    let name = f.string("name", errors);
    if let Some(n) = &name {
        check_name(f, n, errors);
    } else {
        errors.push(f.path_of("name"), "is required");
    }
    let base_url = match f.string("base_url", errors) {
        Some(u) => check_url(f, "base_url", &u, API_KEY_HINT, errors),
        None => {
            errors.push(f.path_of("base_url"), "is required");
            None
        }
    };
    let model = f
        .string("model", errors)
        .filter(|m| m != "auto" && !m.is_empty());
    let api_key = key_source(f, "api_key_env", "api_key_file", errors);
    let endpoint = endpoint(f, errors).unwrap_or(Endpoint::Completions);
    let mut timeouts = Timeouts::default();
    if let Some(mut t) = f.table("timeouts", errors) {
        if let Some(d) = t.bounded_duration("connect", limits::MAX_CONNECT_TIMEOUT, errors) {
            timeouts.connect = d;
        }
        if let Some(d) = t.bounded_duration("first_token", limits::MAX_REQUEST_TIMEOUT, errors) {
            timeouts.first_token = d;
        }
        if let Some(d) = t.bounded_duration("stall", limits::MAX_REQUEST_TIMEOUT, errors) {
            timeouts.stall = d;
        }
        if let Some(d) = t.bounded_duration("request", limits::MAX_REQUEST_TIMEOUT, errors) {
            timeouts.request = d;
        }
        t.finish(errors);
    }
    let server_metrics = f.boolean("server_metrics", errors).unwrap_or(true);
    let metrics_url = match f.string("metrics_url", errors) {
        Some(u) => check_url(f, "metrics_url", &u, API_KEY_HINT, errors),
        None if server_metrics => base_url.as_ref().map(|b| format!("{b}/metrics")),
        None => None,
    };
    let metrics_url = if server_metrics { metrics_url } else { None };
    let dcgm_url = f
        .string("dcgm_url", errors)
        .and_then(|u| check_url(f, "dcgm_url", &u, API_KEY_HINT, errors));
    let names = f
        .strings("scenarios", errors)
        .unwrap_or_else(|| scenarios.iter().map(|s| s.name.clone()).collect());
    // A scenario with several concurrency levels expands to `<name>-c<N>`;
    // naming it as written selects them all.
    let selects = |n: &String, s: &ScenarioConfig| &s.name == n || &s.written_name == n;
    for (i, n) in names.iter().enumerate() {
        if !scenarios.iter().any(|s| selects(n, s)) {
            let known: Vec<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
            errors.push(
                format!("{}[{i}]", f.path_of("scenarios")),
                format!("no scenario named {n:?}; defined: {}", known.join(", ")),
            );
        }
    }
    let expanded = scenarios
        .iter()
        .filter(|s| names.iter().any(|n| selects(n, s)))
        .map(|s| s.name.clone())
        .collect();
    let schedule = schedule(f, errors);
    Some(TargetConfig {
        name: name?,
        base_url: base_url?,
        model,
        api_key,
        endpoint,
        timeouts,
        metrics_url,
        dcgm_url,
        scenarios: expanded,
        schedule,
    })
}

fn scenario(f: &mut Fields, errors: &mut Errors) -> Vec<ScenarioConfig> {
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
    let concurrency: Vec<u32> = match f.integer("concurrency", 1, limits::MAX_CONCURRENCY, errors) {
        Some(c) => vec![c as u32],
        None => preset.map_or(vec![1], |p| p.concurrency.to_vec()),
    };
    let num_requests = f
        .integer("num_requests", 1, limits::MAX_REQUESTS, errors)
        .map(|v| v as u32);
    let duration = f.bounded_duration("duration", limits::MAX_REQUEST_TIMEOUT, errors);
    let max_requests = f
        .integer("max_requests", 1, limits::MAX_REQUESTS, errors)
        .map(|v| v as u32);
    let length = match (num_requests, duration) {
        (Some(_), Some(_)) => {
            errors.push(
                f.path_of("duration"),
                "set either num_requests or duration, not both",
            );
            RunLength::Requests(1)
        }
        (_, Some(d)) => RunLength::Duration {
            duration: d,
            max_requests: max_requests.unwrap_or(1000),
        },
        (Some(n), None) => RunLength::Requests(n),
        (None, None) => RunLength::Requests(preset.map_or(16, |p| p.num_requests)),
    };
    if max_requests.is_some() && duration.is_none() {
        errors.push(f.path_of("max_requests"), "only applies with duration");
    }
    let warmup = f
        .integer("warmup", 0, limits::MAX_WARMUP, errors)
        .unwrap_or(1) as u32;
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
        .unwrap_or(Duration::from_secs(600));
    let endpoint = endpoint(f, errors);
    let Some(name) = name else { return Vec::new() };
    let (Some(input_len), Some(output_len)) = (input_len, output_len) else {
        return Vec::new();
    };
    let requests = match length {
        RunLength::Requests(n) => n,
        RunLength::Duration { max_requests, .. } => max_requests,
    };
    if let Err(message) = limits::check_run_tokens(
        input_len,
        output_len,
        range_ratio,
        u64::from(requests),
        u64::from(warmup),
    ) {
        errors.push(f.path_of("input_len"), message);
    }
    let many = concurrency.len() > 1;
    concurrency
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
            range_ratio,
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

#[cfg(test)]
mod tests;
