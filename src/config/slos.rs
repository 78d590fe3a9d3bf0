//! `[[slos]]`: service-level objectives measured by the probes: which
//! targets, scenarios and replicas one covers, what makes a request good
//! (its SLI), the objective over a window, and the multiwindow burn-rate
//! alerts its rules carry (the SRE workbook's by default).

use std::time::Duration;

use super::burn_alerts::alerts;
pub use super::burn_alerts::{BurnAlert, Severity, workbook_alerts};
use super::check_name;
use super::reader::{Errors, Fields};
use super::scenarios::ScenarioConfig;
use super::targets::TargetConfig;

/// The latency a latency SLI holds to its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyMetric {
    Ttft,
    Tpot,
    /// The 99th percentile of one request's own inter-token gaps.
    ItlP99,
    E2el,
}

impl LatencyMetric {
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyMetric::Ttft => "ttft",
            LatencyMetric::Tpot => "tpot",
            LatencyMetric::ItlP99 => "itl_p99",
            LatencyMetric::E2el => "e2el",
        }
    }
}

/// What makes one event good.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sli {
    /// A request that succeeded with its latency at most the threshold.
    Latency {
        metric: LatencyMetric,
        threshold: Duration,
    },
    /// A request that succeeded.
    Success,
    /// A heartbeat after which the target (or replica) generates.
    Liveness,
}

impl Sli {
    /// How a person reads it: `ttft <= 500ms`, `success`, `liveness`.
    pub fn describe(&self) -> String {
        match self {
            Sli::Latency { metric, threshold } => {
                format!("{} <= {}", metric.as_str(), prometheus_duration(*threshold))
            }
            Sli::Success => "success".to_owned(),
            Sli::Liveness => "liveness".to_owned(),
        }
    }

    /// Whether its events are heartbeats rather than probe requests.
    pub fn counts_heartbeats(&self) -> bool {
        matches!(self, Sli::Liveness)
    }
}

/// Which requests of the covered targets count, by where they went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaScope {
    /// Every request: through the service and to each replica.
    All,
    /// Requests through `base_url` (the service, or a gateway).
    Service,
    /// Requests sent to replicas directly.
    Replicas,
    /// Requests that reached these replicas (`host:port`): sent to one
    /// directly, or attributed to one by the gateway's response header.
    Named(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SloConfig {
    pub name: String,
    /// The targets covered; empty: every target.
    pub targets: Vec<String>,
    /// The scenarios covered (as run, concurrency levels expanded); empty:
    /// every scenario. Liveness objectives cover none.
    pub scenarios: Vec<String>,
    pub replicas: ReplicaScope,
    pub sli: Sli,
    /// The good share promised, as a ratio (99.5% is 0.995).
    pub objective: f64,
    pub window: Duration,
    pub alerts: Vec<BurnAlert>,
}

impl SloConfig {
    /// The bad share allowed: the error budget as a ratio.
    pub fn budget(&self) -> f64 {
        1.0 - self.objective
    }

    pub fn covers_target(&self, target: &str) -> bool {
        self.targets.is_empty() || self.targets.iter().any(|t| t == target)
    }

    pub fn covers_scenario(&self, scenario: &str) -> bool {
        self.scenarios.is_empty() || self.scenarios.iter().any(|s| s == scenario)
    }

    /// Whether a request counts by where it went: `probed` is the replica
    /// it was sent to (empty through the service) and `probed_address`
    /// its `host:port` when it is named otherwise (a pod), `served_by` the
    /// endpoint a gateway named for it. A listed replica is matched by
    /// name or by address.
    pub fn covers_replica(
        &self,
        probed: &str,
        probed_address: Option<&str>,
        served_by: Option<&str>,
    ) -> bool {
        match &self.replicas {
            ReplicaScope::All => true,
            ReplicaScope::Service => probed.is_empty(),
            ReplicaScope::Replicas => !probed.is_empty(),
            ReplicaScope::Named(names) => {
                let (reached, address) = if probed.is_empty() {
                    (served_by.unwrap_or(""), None)
                } else {
                    (probed, probed_address)
                };
                names
                    .iter()
                    .any(|n| n == reached || Some(n.as_str()) == address)
            }
        }
    }
}

/// A duration as Prometheus writes one (and as objectives are shown):
/// `30d`, `1h`, `5m`, `1m30s`, `500ms`.
pub fn prometheus_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

/// Shortest objective window: shorter ones measure noise.
const MIN_WINDOW: Duration = Duration::from_secs(60);
/// Shortest alert window: Prometheus needs two scrapes inside it.
pub(super) const MIN_ALERT_WINDOW: Duration = Duration::from_secs(1);
/// The longest latency threshold: the longest request a probe waits for.
const MAX_THRESHOLD: Duration = crate::limits::MAX_REQUEST_TIMEOUT;

const SLIS: &str = "ttft, tpot, itl_p99, e2el, success, liveness";

/// Reads every `[[slos]]` table, checked against the targets and
/// scenarios written and the store's retention (an objective's window
/// must be kept in the store). `unbuilt`: scenarios written but not built
/// for errors of their own.
pub fn slos(
    root: &mut Fields,
    targets: &[TargetConfig],
    scenarios: &[ScenarioConfig],
    unbuilt: &[String],
    retention: Duration,
    errors: &mut Errors,
) -> Vec<SloConfig> {
    let mut out: Vec<SloConfig> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for mut f in root.tables("slos", errors) {
        let written = Written {
            targets,
            scenarios,
            unbuilt,
            retention,
        };
        let (name, slo) = written.slo(&mut f, errors);
        // Said of every objective written, built or not: two tables of one
        // name would be one series.
        if let Some(name) = name {
            if names.contains(&name) {
                errors.push(
                    f.path_of("name"),
                    format!("{name:?} is used by more than one objective"),
                );
            }
            names.push(name);
        }
        out.extend(slo);
        f.finish(errors);
    }
    out
}

/// What an objective is checked against.
struct Written<'a> {
    targets: &'a [TargetConfig],
    scenarios: &'a [ScenarioConfig],
    unbuilt: &'a [String],
    retention: Duration,
}

impl Written<'_> {
    /// The objective's name as written, and the objective when it is
    /// valid.
    fn slo(&self, f: &mut Fields, errors: &mut Errors) -> (Option<String>, Option<SloConfig>) {
        let name = f.string("name", errors);
        let slo = self.build(f, name.clone(), errors);
        (name, slo)
    }

    fn build(
        &self,
        f: &mut Fields,
        name: Option<String>,
        errors: &mut Errors,
    ) -> Option<SloConfig> {
        match &name {
            Some(n) => check_name(f, n, errors),
            None => errors.push(f.path_of("name"), "is required"),
        }
        let sli = sli(f, errors);
        let targets = self.targets_of(f, errors);
        let scenarios = self.scenarios_of(f, sli, errors);
        let replicas = replica_scope(f, errors);
        let objective = objective(f, errors);
        let window = self.window(f, errors);
        let alerts = alerts(f, objective, window, errors);
        let (sli, objective, window) = (sli?, objective?, window?);
        let slo = SloConfig {
            name: name?,
            targets,
            scenarios,
            replicas,
            sli,
            objective,
            window,
            alerts: alerts?,
        };
        self.check_coverage(f, &slo, errors);
        Some(slo)
    }

    fn targets_of(&self, f: &mut Fields, errors: &mut Errors) -> Vec<String> {
        let names = f.strings("targets", errors).unwrap_or_default();
        for (i, n) in names.iter().enumerate() {
            if !self.targets.iter().any(|t| &t.name == n) {
                let known: Vec<&str> = self.targets.iter().map(|t| t.name.as_str()).collect();
                errors.push(
                    format!("{}[{i}]", f.path_of("targets")),
                    format!("no target named {n:?}; defined: {}", known.join(", ")),
                );
            }
        }
        names
    }

    /// The scenarios named, expanded as a target's are: the name as
    /// written selects every concurrency level.
    fn scenarios_of(&self, f: &mut Fields, sli: Option<Sli>, errors: &mut Errors) -> Vec<String> {
        let Some(names) = f.strings("scenarios", errors) else {
            return Vec::new();
        };
        if sli.is_some_and(|s| s.counts_heartbeats()) {
            errors.push(
                f.path_of("scenarios"),
                "a liveness objective counts heartbeats, which belong to no scenario",
            );
            return Vec::new();
        }
        let selects = |n: &String, s: &ScenarioConfig| &s.name == n || &s.written_name == n;
        for (i, n) in names.iter().enumerate() {
            if !self.scenarios.iter().any(|s| selects(n, s)) && !self.unbuilt.contains(n) {
                let known: Vec<&str> = self.scenarios.iter().map(|s| s.name.as_str()).collect();
                errors.push(
                    format!("{}[{i}]", f.path_of("scenarios")),
                    format!("no scenario named {n:?}; defined: {}", known.join(", ")),
                );
            }
        }
        self.scenarios
            .iter()
            .filter(|s| names.iter().any(|n| selects(n, s)))
            .map(|s| s.name.clone())
            .collect()
    }

    fn window(&self, f: &mut Fields, errors: &mut Errors) -> Option<Duration> {
        let Some(window) = f.positive_duration("window", errors) else {
            if !f.has("window") {
                errors.push(f.path_of("window"), "is required, e.g. \"30d\"");
            }
            return None;
        };
        if window < MIN_WINDOW {
            errors.push(
                f.path_of("window"),
                format!(
                    "{} is too short: at least {}",
                    prometheus_duration(window),
                    prometheus_duration(MIN_WINDOW)
                ),
            );
            return None;
        }
        if window > self.retention {
            errors.push(
                f.path_of("window"),
                format!(
                    "{} is longer than store.retention ({}): the store would no longer hold the window's requests",
                    prometheus_duration(window),
                    prometheus_duration(self.retention)
                ),
            );
            return None;
        }
        Some(window)
    }

    /// An objective that covers nothing measures nothing: said rather than
    /// left at 100% forever.
    fn check_coverage(&self, f: &Fields, slo: &SloConfig, errors: &mut Errors) {
        let covered = self.targets.iter().filter(|t| slo.covers_target(&t.name));
        let covers_anything = match slo.sli {
            Sli::Liveness => covered.clone().any(|t| t.heartbeat.enabled),
            _ => covered
                .clone()
                .any(|t| t.scenarios.iter().any(|s| slo.covers_scenario(s))),
        };
        let probes_replicas = covered.clone().any(|t| t.probe_mode().replicas());
        if !covers_anything && !self.targets.is_empty() {
            let why = match slo.sli {
                Sli::Liveness => "no target it covers has its heartbeat enabled",
                _ => "no target it covers probes any scenario it covers",
            };
            errors.push(f.path(), format!("covers nothing: {why}"));
        } else if slo.replicas == ReplicaScope::Replicas && !probes_replicas {
            errors.push(
                f.path_of("replicas"),
                "\"replicas\": no target it covers probes its replicas ([targets.replicas] probe)",
            );
        }
    }
}

fn sli(f: &mut Fields, errors: &mut Errors) -> Option<Sli> {
    let written = f.string("sli", errors);
    let threshold = f.bounded_duration("threshold", MAX_THRESHOLD, errors);
    let metric = match written.as_deref() {
        None => {
            errors.push(f.path_of("sli"), format!("is required: one of {SLIS}"));
            return None;
        }
        Some("ttft") => LatencyMetric::Ttft,
        Some("tpot") => LatencyMetric::Tpot,
        Some("itl_p99") => LatencyMetric::ItlP99,
        Some("e2el") => LatencyMetric::E2el,
        Some(other @ ("success" | "liveness")) => {
            if f.has("threshold") {
                errors.push(
                    f.path_of("threshold"),
                    format!("only latency SLIs have a threshold, not {other:?}"),
                );
            }
            return Some(if other == "success" {
                Sli::Success
            } else {
                Sli::Liveness
            });
        }
        Some(other) => {
            errors.push(
                f.path_of("sli"),
                format!("{other:?} is not an SLI; one of {SLIS}"),
            );
            return None;
        }
    };
    match threshold {
        Some(threshold) => Some(Sli::Latency { metric, threshold }),
        None => {
            if !f.has("threshold") {
                errors.push(
                    f.path_of("threshold"),
                    format!("is required for a {} SLI, e.g. \"500ms\"", metric.as_str()),
                );
            }
            None
        }
    }
}

/// The objective as written (a percentage) as a ratio.
fn objective(f: &mut Fields, errors: &mut Errors) -> Option<f64> {
    if !f.has("objective") {
        errors.push(f.path_of("objective"), "is required, e.g. 99.5 (percent)");
        return None;
    }
    let percent = f.number("objective", 0.0, 100.0, errors)?;
    // 100% leaves no budget to burn; 0% promises nothing.
    if percent <= 0.0 || percent >= 100.0 {
        errors.push(
            f.path_of("objective"),
            format!("{percent} must be above 0 and below 100 (percent)"),
        );
        return None;
    }
    Some(percent / 100.0)
}

fn replica_scope(f: &mut Fields, errors: &mut Errors) -> ReplicaScope {
    if f.is_array("replicas") {
        let names = f.strings("replicas", errors).unwrap_or_default();
        if names.is_empty() {
            errors.push(
                f.path_of("replicas"),
                "an empty list covers no request; leave it out to cover all",
            );
        }
        for (i, n) in names.iter().enumerate() {
            if n.is_empty() || n.len() > crate::text::MAX_ID_LEN {
                errors.push(
                    format!("{}[{i}]", f.path_of("replicas")),
                    "must be a replica's host:port",
                );
            }
        }
        return ReplicaScope::Named(names);
    }
    match f.string("replicas", errors).as_deref() {
        None | Some("all") => ReplicaScope::All,
        Some("service") => ReplicaScope::Service,
        Some("replicas") => ReplicaScope::Replicas,
        Some(other) => {
            errors.push(
                f.path_of("replicas"),
                format!(
                    "{other:?} must be \"all\", \"service\", \"replicas\" or a list of replicas (host:port)"
                ),
            );
            ReplicaScope::All
        }
    }
}

#[cfg(test)]
#[path = "slos_tests.rs"]
mod tests;
