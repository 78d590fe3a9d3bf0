//! The daemon-wide sections `[exporter]`, `[store]`, `[scheduler]` and
//! `[telemetry]`: their settings, defaults, and readers; the exporter's
//! `web_config` file is read in the load step, not by the reader.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::reader::{Errors, Fields};
use super::{FileRef, Schedule, key_source, schedule};
use crate::client::SecretSource;
use crate::config::web::WebSecurity;
use crate::vocabulary::histograms::HistogramResolution;

/// How long a series of runs that stopped stays on `/metrics`: long
/// enough for any schedule to run again.
pub const DEFAULT_STALE_SERIES_AFTER: Duration = Duration::from_secs(3600);

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
    /// `POST /-/reload` without an admin token (as Prometheus'
    /// `--web.enable-lifecycle`); with a token the token is what opens it.
    pub enable_lifecycle: bool,
    /// Most requests the exporter handles at once; more wait their turn.
    pub max_requests: usize,
    /// A request not answered by then gets a 408.
    pub request_timeout: Duration,
    /// TLS and basic auth for the exporter's port, read from the
    /// exporter-toolkit file `web_config` names (in the load step).
    pub web: Option<FileRef<Arc<WebSecurity>>>,
    /// Which per-request histograms are kept, and how finely.
    pub histograms: HistogramResolution,
}

/// Defaults of the `[exporter]` section.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_REQUESTS: usize = 64;
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest header or request timeout accepted.
const MAX_EXPORTER_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for ExporterConfig {
    fn default() -> Self {
        ExporterConfig {
            listen: DEFAULT_LISTEN.parse().expect("literal address"),
            admin_token: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            stale_series_after: DEFAULT_STALE_SERIES_AFTER,
            enable_lifecycle: false,
            max_requests: DEFAULT_MAX_REQUESTS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            web: None,
            histograms: HistogramResolution::default(),
        }
    }
}

pub fn exporter(root: &mut Fields, errors: &mut Errors) -> ExporterConfig {
    let mut c = ExporterConfig::default();
    let Some(mut f) = root.table("exporter", errors) else {
        return c;
    };
    if let Some(text) = f.string("listen", errors) {
        match text.parse() {
            Ok(a) => c.listen = a,
            Err(_) => errors.push(
                f.path_of("listen"),
                format!("{text:?} is not an address like {DEFAULT_LISTEN}"),
            ),
        }
    }
    c.admin_token = key_source(&mut f, "admin_token_env", "admin_token_file", errors);
    if let Some(n) = f.integer("max_connections", 1, 1_000_000, errors) {
        c.max_connections = n as usize;
    }
    if let Some(d) = f.bounded_duration("header_timeout", MAX_EXPORTER_TIMEOUT, errors) {
        c.header_timeout = d;
    }
    if let Some(d) = f.positive_duration("stale_series_after", errors) {
        c.stale_series_after = d;
    }
    if let Some(on) = f.boolean("enable_lifecycle", errors) {
        c.enable_lifecycle = on;
    }
    if let Some(n) = f.integer("max_requests", 1, 100_000, errors) {
        c.max_requests = n as usize;
    }
    if let Some(d) = f.bounded_duration("request_timeout", MAX_EXPORTER_TIMEOUT, errors) {
        c.request_timeout = d;
    }
    if let Some(r) = f.parsed("histograms", errors) {
        c.histograms = r;
    }
    c.web = f
        .string("web_config", errors)
        .map(|path| FileRef::named(f.path_of("web_config"), path));
    f.finish(errors);
    c
}

/// The load step's part: reads and checks the web configuration file and
/// the PEM files it names.
pub(super) fn read_web_config(web: &mut FileRef<Arc<WebSecurity>>, errors: &mut Errors) {
    web.fill(errors, |path| {
        WebSecurity::load(path)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    });
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
    /// Runs older than this are deleted.
    pub retention: Duration,
}

/// Defaults of the `[store]` section.
pub const DEFAULT_STORE_PATH: &str = "vllm-sentinel.db";
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(90 * 86_400);

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: PathBuf::from(DEFAULT_STORE_PATH),
            retention: DEFAULT_RETENTION,
        }
    }
}

pub fn store(root: &mut Fields, errors: &mut Errors) -> StoreConfig {
    let mut c = StoreConfig::default();
    let Some(mut f) = root.table("store", errors) else {
        return c;
    };
    if let Some(p) = f.string("path", errors) {
        if p.is_empty() {
            errors.push(f.path_of("path"), "must not be empty");
        }
        c.path = PathBuf::from(p);
    }
    if let Some(r) = f.positive_duration("retention", errors) {
        c.retention = r;
    }
    f.finish(errors);
    c
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
    /// A target's runs, a new build's upgrade rounds included, stay within
    /// this many times its scheduled runs, whatever its servers say.
    pub max_rate_factor: f64,
}

/// Defaults of the `[scheduler]` section.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_secs(30);
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
pub const DEFAULT_SCHEDULE: &str = "*/10 * * * *";
pub const DEFAULT_SCHEDULE_JITTER: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_RATE_FACTOR: f64 = 2.0;

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            default_schedule: Schedule::parse(DEFAULT_SCHEDULE, DEFAULT_SCHEDULE_JITTER)
                .expect("literal cron"),
            max_rate_factor: DEFAULT_MAX_RATE_FACTOR,
        }
    }
}

pub fn scheduler(root: &mut Fields, errors: &mut Errors) -> SchedulerConfig {
    let mut c = SchedulerConfig::default();
    let Some(mut f) = root.table("scheduler", errors) else {
        return c;
    };
    if let Some(d) = f.positive_duration("backoff_initial", errors) {
        c.backoff_initial = d;
    }
    if let Some(d) = f.positive_duration("backoff_max", errors) {
        c.backoff_max = d;
    }
    if let Some(d) = f.duration("shutdown_grace", errors) {
        c.shutdown_grace = d;
    }
    if let Some(d) = schedule(&mut f, errors) {
        c.default_schedule = d;
    }
    if let Some(v) = f.number("max_rate_factor", 1.0, 100.0, errors) {
        c.max_rate_factor = v;
    }
    if c.backoff_max < c.backoff_initial {
        errors.push(
            f.path_of("backoff_max"),
            "must not be shorter than backoff_initial",
        );
    }
    f.finish(errors);
    c
}

#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// How often each target's `/metrics`, `/version` and GPU counters are read.
    pub scrape_interval: Duration,
    pub scrape_timeout: Duration,
    /// Read GPU counters from NVML on this host when a driver is present.
    pub nvml: bool,
}

/// Defaults of the `[telemetry]` section.
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            scrape_interval: DEFAULT_SCRAPE_INTERVAL,
            scrape_timeout: DEFAULT_SCRAPE_TIMEOUT,
            nvml: true,
        }
    }
}

pub fn telemetry(root: &mut Fields, errors: &mut Errors) -> TelemetryConfig {
    let mut c = TelemetryConfig::default();
    let Some(mut f) = root.table("telemetry", errors) else {
        return c;
    };
    if let Some(d) = f.positive_duration("scrape_interval", errors) {
        c.scrape_interval = d;
    }
    if let Some(d) = f.positive_duration("scrape_timeout", errors) {
        c.scrape_timeout = d;
    }
    if let Some(b) = f.boolean("nvml", errors) {
        c.nvml = b;
    }
    f.finish(errors);
    c
}
