//! One scheduled run as the daemon keeps it: who and what was probed, the
//! run's summary, each request's sample, the server's identity and the load
//! it was under. Built from a probe result (or a failure), then stored,
//! exported and judged.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::stats::Distribution;
use crate::vocabulary::Outcome;

/// The percentiles kept per run and metric.
pub const RUN_PERCENTILES: [f64; 4] = [50.0, 90.0, 95.0, 99.0];

/// How a whole run ended: a request outcome when the run could not start
/// or was cut short, or one of the run-level reasons. Bounded: a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// Every request completed with outcome ok.
    Ok,
    /// The run finished but some requests failed.
    Partial,
    /// The server could not be asked for its model (outcome of that call).
    Failed(Outcome),
    /// The run exceeded its deadline and was aborted.
    Deadline,
    /// Aborted at shutdown after the grace period.
    Aborted,
    /// The server does not serve the configured model, or lists none.
    Model,
    /// The run could not be prepared from its configuration (an unreadable
    /// API key file, settings the probe rejects); no request was sent.
    Config,
    /// The engine generated no token for the heartbeat timeout during the
    /// run: an outage, kept out of baselines and verdicts.
    NotGenerating,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Partial => "partial",
            RunOutcome::Failed(o) => o.as_str(),
            RunOutcome::Deadline => "deadline",
            RunOutcome::Aborted => "aborted",
            RunOutcome::Model => "model",
            RunOutcome::Config => "config",
            RunOutcome::NotGenerating => "not_generating",
        }
    }

    pub fn parse(label: &str) -> Option<RunOutcome> {
        Some(match label {
            "ok" => RunOutcome::Ok,
            "partial" => RunOutcome::Partial,
            "deadline" => RunOutcome::Deadline,
            "aborted" => RunOutcome::Aborted,
            "model" => RunOutcome::Model,
            "config" => RunOutcome::Config,
            "not_generating" => RunOutcome::NotGenerating,
            other => RunOutcome::Failed(Outcome::parse(other)?),
        })
    }

    /// The target itself is down (see [`Outcome::blame`]): back off.
    pub fn target_down(self) -> bool {
        match self {
            RunOutcome::NotGenerating => true,
            RunOutcome::Failed(o) => o.blame().down(),
            _ => false,
        }
    }
}

/// In JSON a run outcome is its label, as on `/metrics` and in the store.
impl Serialize for RunOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RunOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let label = String::deserialize(deserializer)?;
        RunOutcome::parse(&label)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown run outcome {label:?}")))
    }
}

/// Mean, std and the kept percentiles of one latency metric, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: usize,
    pub mean: f64,
    pub std: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
}

impl LatencySummary {
    pub fn of(d: &Distribution) -> Self {
        let at = |p: f64| {
            d.percentiles
                .iter()
                .find(|(q, _)| *q == p)
                .map_or(0.0, |(_, v)| *v)
        };
        LatencySummary {
            count: d.count,
            mean: d.mean,
            std: d.std,
            p50: at(50.0),
            p90: at(90.0),
            p95: at(95.0),
            p99: at(99.0),
        }
    }

    /// `(stat label, value)` pairs as exported.
    pub fn stats(&self) -> [(&'static str, f64); 5] {
        [
            ("mean", self.mean),
            ("p50", self.p50),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
        ]
    }
}

/// What `vllm bench serve` would report for the run, kept compact.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunSummary {
    pub completed: usize,
    pub failed: usize,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    /// Share of requests meeting every SLO; `None` without SLOs.
    pub goodput_ratio: Option<f64>,
    pub ttft: LatencySummary,
    pub tpot: LatencySummary,
    pub itl: LatencySummary,
    pub e2el: LatencySummary,
    /// Time to the first answer token, when requests reasoned first.
    #[serde(default)]
    pub ttfo: Option<LatencySummary>,
    /// Reasoning tokens over the run, as the server counted them.
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// The prefix cache during the run, for scenarios that share prefixes.
    #[serde(default)]
    pub prefix_cache: Option<PrefixCacheUse>,
    /// TTFT and ITL by turn index, for multi-turn runs.
    #[serde(default)]
    pub turns: Vec<TurnSummary>,
    /// Requests per outcome label.
    pub outcomes: BTreeMap<String, u64>,
}

impl RunSummary {
    /// `(metric label, summary)` pairs as exported; TTFO only for runs
    /// whose requests reasoned.
    pub fn latencies(&self) -> impl Iterator<Item = (&'static str, &LatencySummary)> {
        [
            ("ttft", &self.ttft),
            ("tpot", &self.tpot),
            ("itl", &self.itl),
            ("e2el", &self.e2el),
        ]
        .into_iter()
        .chain(self.ttfo.as_ref().map(|t| ("ttfo", t)))
    }
}

/// One turn index's latencies in a multi-turn run (turn 1 first).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TurnSummary {
    pub turn: u32,
    pub ttft: LatencySummary,
    pub itl: LatencySummary,
}

/// One request as stored: enough to recompute any statistic later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRow {
    pub index: usize,
    pub outcome: Outcome,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub e2el_s: Option<f64>,
    pub itls_s: Vec<f64>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The endpoint (`host:port`) a gateway named as the one that served
    /// the request, when the target reads one (`endpoint_header`).
    #[serde(default)]
    pub served_by: Option<String>,
}

impl SampleRow {
    /// A request cut while in flight, ended as `outcome`: nothing of it
    /// was measured.
    pub fn cut(outcome: Outcome) -> Self {
        SampleRow {
            index: 0,
            outcome,
            ttft_s: None,
            tpot_s: None,
            e2el_s: None,
            itls_s: Vec::new(),
            prompt_tokens: 0,
            output_tokens: 0,
            served_by: None,
        }
    }
}

/// The server's load, read from its `/metrics` just before or after a run.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ServerLoad {
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    pub kv_cache_usage: Option<f64>,
    pub preemptions_total: Option<f64>,
    pub prefix_cache_hit_ratio: Option<f64>,
    /// The prefix cache's counters (tokens hit and looked up) since the
    /// server started.
    #[serde(default)]
    pub prefix_cache_hits: Option<f64>,
    #[serde(default)]
    pub prefix_cache_queries: Option<f64>,
    /// When the server's process started (`process_start_time_seconds`,
    /// Unix seconds): a new value is a restart, whose first runs are cold
    /// whatever the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_started_s: Option<f64>,
}

/// Prompt tokens the server's prefix cache looked up and found during a
/// run's measured requests.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PrefixCacheUse {
    pub hits: f64,
    pub queries: f64,
}

impl PrefixCacheUse {
    /// What the counters moved by between two readings; `None` when the
    /// server has no such counters or restarted in between.
    pub fn between(before: &ServerLoad, after: &ServerLoad) -> Option<PrefixCacheUse> {
        let hits = after.prefix_cache_hits? - before.prefix_cache_hits?;
        let queries = after.prefix_cache_queries? - before.prefix_cache_queries?;
        (hits >= 0.0 && queries >= 0.0).then_some(PrefixCacheUse { hits, queries })
    }
}

impl ServerLoad {
    /// Requests on the server besides nothing: running plus waiting.
    pub fn busy(&self) -> Option<f64> {
        match (self.running, self.waiting) {
            (None, None) => None,
            (r, w) => Some(r.unwrap_or(0.0) + w.unwrap_or(0.0)),
        }
    }
}

/// What the server says it is: an upgrade changes at least one of these.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerIdentity {
    pub version: Option<String>,
    pub model_root: Option<String>,
    pub system_fingerprint: Option<String>,
    pub max_model_len: Option<u64>,
    /// The container image the server runs, as its pod names it
    /// (`vllm/vllm-openai:v0.32.0`), when Kubernetes says.
    #[serde(default)]
    pub image: Option<String>,
    /// What the image is: its content digest (`sha256:...`) from
    /// Kubernetes, or what the target's `build_header` said. Two of one
    /// version are two builds.
    #[serde(default)]
    pub image_digest: Option<String>,
}

/// The version in a vLLM `system_fingerprint` (`vllm-0.32.0-a8ed1809`).
pub fn version_of_fingerprint(fingerprint: &str) -> Option<String> {
    let (version, hash) = fingerprint.strip_prefix("vllm-")?.rsplit_once('-')?;
    (!version.is_empty() && !hash.is_empty()).then(|| version.to_owned())
}

/// One run, complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Row id once stored.
    pub id: Option<i64>,
    pub target: String,
    pub scenario: String,
    pub model: String,
    pub started_at: DateTime<Utc>,
    pub duration_s: f64,
    pub outcome: RunOutcome,
    /// Why the run failed, for people; never used as a label.
    pub error: Option<String>,
    pub server: ServerIdentity,
    pub summary: RunSummary,
    pub load_before: Option<ServerLoad>,
    pub load_after: Option<ServerLoad>,
    /// The server build the store filed the run under (set once stored).
    #[serde(default)]
    pub build: Option<String>,
    /// The replica probed (`host:port`), empty for a probe through the
    /// target's `base_url`.
    #[serde(default)]
    pub replica: String,
    #[serde(skip)]
    pub samples: Vec<SampleRow>,
    /// A drift canary's greedy answers, one per prompt answered in full.
    #[serde(skip)]
    pub answers: Vec<crate::vocabulary::answers::Answer>,
    /// The run's fingerprints changed on nearly every request, so it was
    /// filed by its version alone (see `probe::fingerprints_churn`).
    #[serde(skip)]
    pub fingerprint_churn: bool,
}

impl RunRecord {
    pub fn success(&self) -> bool {
        self.outcome == RunOutcome::Ok
    }

    /// When the server the run started on last started: read just before
    /// the run, else just after it.
    pub fn server_started_s(&self) -> Option<f64> {
        [self.load_before, self.load_after]
            .iter()
            .flatten()
            .find_map(|l| l.server_started_s)
    }

    /// A run that never produced requests.
    pub fn failed(
        target: &str,
        scenario: &str,
        model: &str,
        started_at: DateTime<Utc>,
        duration_s: f64,
        outcome: RunOutcome,
        error: String,
    ) -> RunRecord {
        RunRecord {
            id: None,
            target: target.to_owned(),
            scenario: scenario.to_owned(),
            model: model.to_owned(),
            started_at,
            duration_s,
            outcome,
            error: Some(truncate(&error, 300)),
            server: ServerIdentity::default(),
            summary: RunSummary::default(),
            load_before: None,
            load_after: None,
            build: None,
            replica: String::new(),
            samples: Vec::new(),
            answers: Vec::new(),
            fingerprint_churn: false,
        }
    }
}

use crate::text::truncate;
