//! `[[targets]]`: the servers probed, how to reach them, their request
//! time limits, and which scenarios run on each; whether a dataset's
//! prompts suit a target's endpoint is checked once the dataset is read.

use super::reader::{Errors, Fields};
use super::replicas::{ProbeMode, ReplicasConfig, replicas};
use super::scenarios::ScenarioConfig;
use super::{Schedule, check_name, check_url, endpoint, key_source, schedule};
use crate::client::{Endpoint, SecretSource, Timeouts};
use crate::limits;
use crate::vocabulary::matchers::LabelMatchers;

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
    /// Keeps the GPUs on the DCGM page that serve this target; `None`:
    /// every GPU on the page.
    pub dcgm_match: Option<LabelMatchers>,
    /// The scenarios probed on this target, in order.
    pub scenarios: Vec<String>,
    /// Overrides the scenarios' own schedules on this target.
    pub schedule: Option<Schedule>,
    /// The replicas behind `base_url`; `None`: the service alone.
    pub replicas: Option<ReplicasConfig>,
    pub heartbeat: super::heartbeat::HeartbeatConfig,
    /// Headers its requests carry (a gateway's routing, priority or
    /// tenancy headers); values never shown.
    pub headers: Vec<super::gateway::HeaderSetting>,
    /// The gateway in front of its servers, when there is one.
    pub gateway: Option<super::gateway::GatewayConfig>,
    /// A response header (lowercase) that a proxy or sidecar sets to name
    /// the build that answered, such as an image digest; part of each
    /// request's build.
    pub build_header: Option<String>,
}

impl TargetConfig {
    /// What this target's workers probe.
    pub fn probe_mode(&self) -> ProbeMode {
        self.replicas
            .as_ref()
            .map_or(ProbeMode::Service, |r| r.probe)
    }

    /// The headers its requests carry, read now (values from their
    /// variables and files); an error names the header, never a value.
    pub fn request_headers(&self) -> Result<crate::client::RequestHeaders, String> {
        super::gateway::load_headers(&self.headers)
    }

    /// What its requests read of a gateway's answers.
    pub fn gateway_rules(&self) -> crate::client::GatewayRules {
        super::gateway::rules(self.gateway.as_ref())
    }

    /// This target as one of its replicas is probed: its base URL, and its
    /// own `/metrics` when the target's load is read from the server
    /// itself (a `metrics_url` set elsewhere says nothing of one replica).
    pub fn at_replica(&self, replica_url: &str) -> TargetConfig {
        let own_metrics = format!("{}/metrics", self.base_url);
        TargetConfig {
            base_url: replica_url.to_owned(),
            metrics_url: (self.metrics_url.as_deref() == Some(own_metrics.as_str()))
                .then(|| format!("{replica_url}/metrics")),
            dcgm_url: None,
            dcgm_match: None,
            replicas: None,
            // A replica is asked directly: no gateway stands in between.
            gateway: None,
            ..self.clone()
        }
    }
}

const API_KEY_HINT: &str = "use api_key_env or api_key_file";

/// `unbuilt`: scenarios written but not built for errors of their own.
pub fn target(
    f: &mut Fields,
    scenarios: &[ScenarioConfig],
    unbuilt: &[String],
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
    let timeouts = timeouts(f, errors);
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
    let dcgm_match = f.string("dcgm_match", errors).and_then(|text| {
        LabelMatchers::parse(&text)
            .map_err(|e| errors.push(f.path_of("dcgm_match"), e.to_string()))
            .ok()
    });
    if dcgm_match.is_some() && dcgm_url.is_none() {
        errors.push(
            f.path_of("dcgm_match"),
            "needs dcgm_url, the page it selects GPUs from",
        );
    }
    let scenarios = selected_scenarios(f, scenarios, unbuilt, endpoint, errors);
    let schedule = schedule(f, errors);
    let replicas = replicas(f, errors);
    let heartbeat = super::heartbeat::heartbeat(f, errors);
    let headers = super::gateway::headers(f, api_key.is_some(), errors);
    let gateway = super::gateway::gateway(f, errors);
    let build_header = f
        .string("build_header", errors)
        .and_then(|h| check_header_name(f, &h, errors));
    Some(TargetConfig {
        name: name?,
        base_url: base_url?,
        model,
        api_key,
        endpoint,
        timeouts,
        metrics_url,
        dcgm_url,
        dcgm_match,
        scenarios,
        schedule,
        replicas,
        heartbeat,
        headers,
        gateway,
        build_header,
    })
}

/// The `target` label of this host's GPUs (NVML): no target may take it
/// while they are read, or its series would mix with theirs (and go with
/// them).
pub const HOST_GPUS: &str = "local";

/// An HTTP header name (RFC 9110 token characters), lowercased; the
/// headers whose value is not a build (credentials, cookies) are refused.
fn check_header_name(f: &Fields, name: &str, errors: &mut Errors) -> Option<String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > 64 || !name.bytes().all(token) {
        errors.push(
            f.path_of("build_header"),
            format!("{name:?} is not an HTTP header name (at most 64 letters, digits and -_.)"),
        );
        return None;
    }
    if [
        "authorization",
        "proxy-authorization",
        "set-cookie",
        "cookie",
    ]
    .contains(&lower.as_str())
    {
        errors.push(
            f.path_of("build_header"),
            format!("{name:?} carries credentials, not a build"),
        );
        return None;
    }
    Some(lower)
}

/// `[targets.timeouts]`, each bounded, defaults for those not set.
fn timeouts(f: &mut Fields, errors: &mut Errors) -> Timeouts {
    let mut timeouts = Timeouts::default();
    let Some(mut t) = f.table("timeouts", errors) else {
        return timeouts;
    };
    let max = limits::MAX_REQUEST_TIMEOUT;
    if let Some(d) = t.bounded_duration("connect", limits::MAX_CONNECT_TIMEOUT, errors) {
        timeouts.connect = d;
    }
    if let Some(d) = t.bounded_duration("first_token", max, errors) {
        timeouts.first_token = d;
    }
    if let Some(d) = t.bounded_duration("stall", max, errors) {
        timeouts.stall = d;
    }
    if let Some(d) = t.bounded_duration("request", max, errors) {
        timeouts.request = d;
    }
    t.finish(errors);
    timeouts
}

/// The scenarios the target names (all when it names none), expanded: a
/// scenario with several concurrency levels becomes `<name>-c<N>`, and
/// naming it as written selects them all. A name in `unbuilt` has its
/// own errors already: it is not reported again as unknown.
fn selected_scenarios(
    f: &mut Fields,
    scenarios: &[ScenarioConfig],
    unbuilt: &[String],
    endpoint: Endpoint,
    errors: &mut Errors,
) -> Vec<String> {
    let names = f
        .strings("scenarios", errors)
        .unwrap_or_else(|| scenarios.iter().map(|s| s.name.clone()).collect());
    let selects = |n: &String, s: &ScenarioConfig| &s.name == n || &s.written_name == n;
    for (i, n) in names.iter().enumerate() {
        if !scenarios.iter().any(|s| selects(n, s)) && !unbuilt.contains(n) {
            let known: Vec<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
            errors.push(
                format!("{}[{i}]", f.path_of("scenarios")),
                format!("no scenario named {n:?}; defined: {}", known.join(", ")),
            );
        }
    }
    let selected: Vec<&ScenarioConfig> = scenarios
        .iter()
        .filter(|s| names.iter().any(|n| selects(n, s)))
        .collect();
    // The requests a scenario sends must suit the endpoint it uses here
    // (said once per scenario as written, not per concurrency level); a
    // dataset's prompts are checked once it is read (`check_datasets`).
    let mut told: Vec<&str> = Vec::new();
    for s in &selected {
        let used = s.endpoint.unwrap_or(endpoint);
        if let Some(problem) = s.kind.endpoint_problem(None, used)
            && !told.contains(&s.written_name.as_str())
        {
            told.push(&s.written_name);
            errors.push(
                f.path_of("scenarios"),
                format!("{:?}: {problem}", s.written_name),
            );
        }
    }
    selected.into_iter().map(|s| s.name.clone()).collect()
}

/// The load step's part: the prompts of each dataset read suit the endpoint
/// each target sends them to (said once per scenario as written). `places`
/// are where each target is written, in order.
pub(super) fn check_datasets(
    targets: &[TargetConfig],
    places: &[String],
    scenarios: &[ScenarioConfig],
    errors: &mut Errors,
) {
    for (t, place) in targets.iter().zip(places) {
        let mut told: Vec<&str> = Vec::new();
        for s in scenarios.iter().filter(|s| t.scenarios.contains(&s.name)) {
            let used = s.endpoint.unwrap_or(t.endpoint);
            // The kind's own problem was said when the file was parsed.
            if s.kind.endpoint_problem(None, used).is_some() {
                continue;
            }
            let Some(dataset) = s.dataset.as_ref().and_then(|d| d.content()) else {
                continue;
            };
            if let Err(problem) = dataset.check_endpoint(used)
                && !told.contains(&s.written_name.as_str())
            {
                told.push(&s.written_name);
                errors.push(
                    format!("{place}.scenarios"),
                    format!("{:?}: {problem}", s.written_name),
                );
            }
        }
    }
}
