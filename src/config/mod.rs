//! The daemon's configuration: a TOML file read into a fresh, validated
//! [`Config`], in two steps. [`Config::parse`] is pure: TOML text to plain
//! validated types, the files it names kept as paths ([`FileRef`]s) and
//! nothing read. [`ParsedConfig::load_files`] then reads each file named
//! once, bounded (the exporter's web configuration and the PEM files it
//! names, the SMTP CA bundle, datasets), and checks what needs their
//! content. [`Config::load`] (the daemon, `check-config`, reloads) and
//! [`Config::from_text`] take both steps. Unknown keys are errors, every
//! error names its field path, and all errors, the parse's and the files',
//! are reported together.

pub mod burn_alerts;
pub mod cluster;
pub mod detector_notify;
pub mod files;
pub mod gateway;
pub mod heartbeat;
pub mod kubernetes;
pub mod live;
pub mod presets;
pub mod reader;
pub mod replicas;
pub mod scenarios;
pub mod schedules;
pub mod sections;
pub mod slos;
pub mod targets;
pub mod verdict_policy;
pub mod web;

use std::path::{Path, PathBuf};

use crate::client::{Endpoint, SecretSource};
pub use files::FileRef;
use reader::{Errors, FieldError, Fields};
pub use replicas::{ProbeMode, ReplicaSource, ReplicasConfig};
pub use scenarios::{RunLength, ScenarioConfig};
pub use schedules::Schedule;
use schedules::schedule;
pub use sections::{ExporterConfig, SchedulerConfig, StoreConfig, TelemetryConfig};
pub use slos::SloConfig;
pub use targets::TargetConfig;

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

#[derive(Debug, Clone)]
pub struct Config {
    pub exporter: ExporterConfig,
    pub store: StoreConfig,
    pub scheduler: SchedulerConfig,
    pub telemetry: TelemetryConfig,
    pub verdict_policy: crate::config::verdict_policy::VerdictPolicy,
    pub notify: detector_notify::NotifyConfig,
    pub cluster: cluster::ClusterConfig,
    /// The targets this instance probes: every one of the file's, or
    /// those of its shard.
    pub targets: Vec<TargetConfig>,
    pub scenarios: Vec<ScenarioConfig>,
    /// The service-level objectives, over every target of the file (a
    /// shard counts the requests of its own targets).
    pub slos: Vec<SloConfig>,
}

impl Config {
    /// Keeps the targets of this instance's share: `pinned` (the command
    /// line's, kept across reloads) or else the file's `[cluster] shard`.
    fn sharded(mut self, pinned: Option<cluster::Shard>) -> Config {
        self.cluster.pinned = pinned;
        self.cluster.shard = pinned.or(self.cluster.shard);
        if let Some(shard) = self.cluster.shard {
            let all = self.targets.len();
            self.targets.retain(|t| shard.owns(&t.name));
            self.cluster.others = all - self.targets.len();
        }
        self
    }

    /// Reads the file at `path`, parses it and reads the files it names:
    /// every error of both steps together.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_shard(path, None)
    }

    /// Loads the file as instance `pinned` of its shards, whatever its own
    /// `[cluster] shard` says.
    pub fn load_shard(path: &Path, pinned: Option<cluster::Shard>) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            cause: source,
        })?;
        let (parsed, errors) = Config::parse_shard(&text, &path.display().to_string(), pinned)?;
        parsed.read_files(errors)
    }

    /// Parses and validates without reading anything: the files the text
    /// names are kept as paths, for [`ParsedConfig::load_files`]; `origin`
    /// names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<ParsedConfig, ConfigError> {
        let (parsed, errors) = Config::parse_shard(text, origin, None)?;
        parsed.invalid_if_any(errors)?;
        Ok(parsed)
    }

    /// Parses `text` and reads the files it names: every error of both
    /// steps together, as [`Config::load`] reports a file's.
    pub fn from_text(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let (parsed, errors) = Config::parse_shard(text, origin, None)?;
        parsed.read_files(errors)
    }

    /// The verdict settings of `text` for a replay: its `[detector]` and
    /// which of its scenarios are drift canaries. A whole configuration
    /// (one with targets or scenarios) is read and checked as the daemon
    /// reads it; a file of a `[detector]` section alone is enough too,
    /// any other key then named as unknown.
    pub fn verdict_settings(path: &Path) -> Result<VerdictSettings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            cause: source,
        })?;
        Config::verdict_settings_from_text(&text, &path.display().to_string())
    }

    /// [`Config::verdict_settings`] of a text; `origin` names it in errors.
    pub fn verdict_settings_from_text(
        text: &str,
        origin: &str,
    ) -> Result<VerdictSettings, ConfigError> {
        let table = toml_table(text, origin)?;
        if table.contains_key("targets") || table.contains_key("scenarios") {
            let config = Config::from_text(text, origin)?;
            let drift = config
                .scenarios
                .iter()
                .filter(|s| s.kind == crate::workload::kinds::ScenarioKind::Drift)
                .map(|s| s.name.clone())
                .collect();
            return Ok((config.verdict_policy, drift));
        }
        let mut errors = Errors::default();
        let mut root = Fields::new(&table, "");
        let policy = detector_notify::verdict_policy(&mut root, &mut errors);
        root.finish(&mut errors);
        if errors.0.is_empty() {
            Ok((policy, Default::default()))
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                errors: errors.0,
            })
        }
    }

    /// The parse, its field errors apart; only a syntax error stops it.
    fn parse_shard(
        text: &str,
        origin: &str,
        pinned: Option<cluster::Shard>,
    ) -> Result<(ParsedConfig, Errors), ConfigError> {
        let table = toml_table(text, origin)?;
        let mut errors = Errors::default();
        let (config, places) = build(&table, &mut errors);
        let parsed = ParsedConfig {
            config,
            origin: origin.to_owned(),
            pinned,
            places,
        };
        Ok((parsed, errors))
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

/// A configuration parsed and validated, the files it names not read yet:
/// what [`Config::parse`] gives. It shows the configuration as written
/// (every target, the shard not applied yet, each file's path); only
/// [`ParsedConfig::load_files`] makes a [`Config`] of it.
#[derive(Debug)]
pub struct ParsedConfig {
    config: Config,
    origin: String,
    pinned: Option<cluster::Shard>,
    places: Places,
}

/// Where each scenario and target is written (`scenarios[2]`,
/// `targets[0]`), in the order of `Config::scenarios` and
/// `Config::targets`: the load step's errors name these.
#[derive(Debug, Default)]
struct Places {
    scenarios: Vec<String>,
    targets: Vec<String>,
}

impl std::ops::Deref for ParsedConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

impl ParsedConfig {
    /// Every file the configuration names, each once, with its field.
    pub fn named_files(&self) -> Vec<(&str, &Path)> {
        let c = &self.config;
        let web = c.exporter.web.iter().map(|f| (f.field(), f.path()));
        let ca = c
            .notify
            .email
            .iter()
            .flat_map(|e| &e.ca_certificates)
            .map(|f| (f.field(), f.path()));
        let mut datasets: Vec<(&str, &Path)> = Vec::new();
        for f in c.scenarios.iter().flat_map(|s| &s.dataset) {
            if !datasets.iter().any(|(field, _)| *field == f.field()) {
                datasets.push((f.field(), f.path()));
            }
        }
        web.chain(ca).chain(datasets).collect()
    }

    /// Reads every file the configuration names, once, bounded, and checks
    /// what needs their content (a dataset's lengths, and its prompts
    /// against the endpoint each target sends them to): each failure is an
    /// error on the field naming the file, all reported together. Then
    /// keeps this instance's share of the targets.
    pub fn load_files(self) -> Result<Config, ConfigError> {
        self.read_files(Errors::default())
    }

    fn invalid_if_any(&self, errors: Errors) -> Result<(), ConfigError> {
        if errors.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: self.origin.clone(),
                errors: errors.0,
            })
        }
    }

    /// The load step after the parse's `errors`, reported with its own.
    fn read_files(mut self, mut errors: Errors) -> Result<Config, ConfigError> {
        let c = &mut self.config;
        if let Some(web) = &mut c.exporter.web {
            sections::read_web_config(web, &mut errors);
        }
        if let Some(ca) = c
            .notify
            .email
            .as_mut()
            .and_then(|e| e.ca_certificates.as_mut())
        {
            detector_notify::read_ca_file(ca, &mut errors);
        }
        scenarios::read_datasets(&mut c.scenarios, &self.places.scenarios, &mut errors);
        targets::check_datasets(&c.targets, &self.places.targets, &c.scenarios, &mut errors);
        self.invalid_if_any(errors)?;
        Ok(self.config.sharded(self.pinned))
    }
}

/// Names become metric labels and file names: keep them plain.
pub(crate) fn check_name(fields: &Fields, name: &str, errors: &mut Errors) {
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

/// An http(s) URL without credentials; `hint` says where the secret goes.
pub(crate) fn check_url(
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

pub(crate) fn key_source(
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

pub(crate) fn endpoint(fields: &mut Fields, errors: &mut Errors) -> Option<Endpoint> {
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

/// The TOML of `text`, or where its syntax is wrong.
fn toml_table(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Syntax {
            origin: origin.to_owned(),
            message: e.to_string().trim().to_owned(),
        })
}

/// A replay's verdict settings: the detector's, and the names of the
/// scenarios judged by their answers (drift canaries).
pub type VerdictSettings = (
    verdict_policy::VerdictPolicy,
    std::collections::HashSet<String>,
);

/// The whole file: each section read by its own module, then the checks
/// across sections (unique names, at least one target and scenario).
fn build(table: &toml::Table, errors: &mut Errors) -> (Config, Places) {
    let mut root = Fields::new(table, "");
    let exporter = sections::exporter(&mut root, errors);
    let store = sections::store(&mut root, errors);
    let scheduler = sections::scheduler(&mut root, errors);
    let telemetry = sections::telemetry(&mut root, errors);
    let verdict_policy = detector_notify::verdict_policy(&mut root, errors);
    let notify = detector_notify::notify(&mut root, errors);
    let cluster = cluster::cluster(&mut root, errors);

    let mut places = Places::default();
    let mut scenarios = Vec::new();
    let mut unbuilt = Vec::new();
    for mut f in root.tables("scenarios", errors) {
        let written = scenarios::scenario(&mut f, errors);
        let built = written.scenarios.len();
        places
            .scenarios
            .extend(std::iter::repeat_n(f.path().to_owned(), built));
        scenarios.extend(written.scenarios);
        unbuilt.extend(written.unbuilt);
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
        if let Some(t) = targets::target(&mut f, &scenarios, &unbuilt, errors) {
            if telemetry.nvml && t.name == targets::HOST_GPUS {
                errors.push(
                    f.path_of("name"),
                    format!(
                        "{:?} is this host's GPUs' target label while telemetry.nvml is on; rename the target, or set telemetry.nvml = false",
                        t.name
                    ),
                );
            }
            if targets.iter().any(|o: &TargetConfig| o.name == t.name) {
                errors.push(
                    f.path_of("name"),
                    format!("{:?} is used by more than one target", t.name),
                );
            }
            targets.push(t);
            places.targets.push(f.path().to_owned());
        }
        f.finish(errors);
    }
    if scenarios.is_empty() && !root.has("scenarios") {
        errors.push("scenarios", "at least one [[scenarios]] is required");
    }
    let slos = slos::slos(
        &mut root,
        &targets,
        &scenarios,
        &unbuilt,
        store.retention,
        errors,
    );
    root.finish(errors);
    let config = Config {
        exporter,
        store,
        scheduler,
        telemetry,
        verdict_policy,
        notify,
        cluster,
        targets,
        scenarios,
        slos,
    };
    (config, places)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_files;
