//! One scheduled run as the daemon keeps it: who and what was probed, the
//! run's summary, each request's sample, the server's identity and the load
//! it was under. Built from a probe result (or a failure), then stored,
//! exported and judged.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::client::Outcome;
use crate::client::server_api::ServerError;
use crate::probe::{ProbeError, ProbeResult};
use crate::stats::Distribution;

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

    /// The target itself could not be reached: back off.
    pub fn target_down(self) -> bool {
        matches!(
            self,
            RunOutcome::NotGenerating
                | RunOutcome::Failed(
                    Outcome::Connect
                        | Outcome::Timeout
                        | Outcome::NoFirstToken
                        | Outcome::Stalled
                        | Outcome::Http5xx
                )
        )
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
    fn of(d: &Distribution) -> Self {
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
}

/// The version in a vLLM `system_fingerprint` (`vllm-0.32.0-a8ed1809`).
pub fn version_of_fingerprint(fingerprint: &str) -> Option<String> {
    let (version, hash) = fingerprint.strip_prefix("vllm-")?.rsplit_once('-')?;
    (!version.is_empty() && !hash.is_empty()).then(|| version.to_owned())
}

/// The version every fingerprint of a run names, when they agree on one.
fn common_fingerprint_version(records: &[crate::client::RequestRecord]) -> Option<String> {
    let mut versions = records
        .iter()
        .filter_map(|r| r.system_fingerprint.as_deref())
        .map(version_of_fingerprint);
    let first = versions.next()??;
    versions
        .all(|v| v.as_deref() == Some(first.as_str()))
        .then_some(first)
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
    pub answers: Vec<crate::detect::drift::Answer>,
    /// The run's fingerprints changed on nearly every request, so it was
    /// filed by its version alone (see `probe::fingerprints_churn`).
    #[serde(skip)]
    pub fingerprint_churn: bool,
}

impl RunRecord {
    pub fn success(&self) -> bool {
        self.outcome == RunOutcome::Ok
    }

    /// A finished run from the probe's result.
    pub fn from_probe(
        target: &str,
        scenario: &str,
        started_at: DateTime<Utc>,
        result: &ProbeResult,
        slos_given: bool,
    ) -> RunRecord {
        let m = &result.metrics;
        let mut outcomes = BTreeMap::new();
        for r in &result.records {
            *outcomes.entry(r.outcome.as_str().to_owned()).or_insert(0) += 1;
        }
        let goodput_ratio = m
            .good_requests
            .filter(|_| slos_given && !result.records.is_empty())
            .map(|good| good as f64 / result.records.len() as f64);
        let samples = result
            .records
            .iter()
            .map(|r| {
                let sample = r.to_sample(result.started);
                SampleRow {
                    index: r.index,
                    outcome: r.outcome,
                    ttft_s: r.ttft().map(|d| d.as_secs_f64()),
                    tpot_s: sample.tpot_s(),
                    e2el_s: r.e2el().map(|d| d.as_secs_f64()),
                    itls_s: sample.itls_s,
                    prompt_tokens: sample.prompt_tokens,
                    output_tokens: sample.output_tokens,
                }
            })
            .collect();
        // A fingerprint new on nearly every request names no build: the
        // run is filed by its version alone (the common version of its
        // fingerprints, else `/version`).
        let churn = result.fingerprint_churn();
        let fingerprint = result
            .records
            .iter()
            .find_map(|r| r.system_fingerprint.clone())
            .filter(|_| !churn);
        let churned_version = churn
            .then(|| common_fingerprint_version(&result.records))
            .flatten();
        RunRecord {
            id: None,
            target: target.to_owned(),
            scenario: scenario.to_owned(),
            model: result.model.id.clone(),
            started_at,
            duration_s: m.duration_s,
            outcome: run_outcome(m.completed, m.failed, &result.records),
            error: result
                .records
                .iter()
                .find_map(|r| r.error.clone())
                .map(|e| truncate(&e, 300)),
            server: ServerIdentity {
                // Through a load balancer `/version` may come from another
                // replica than the requests: the fingerprint names the build
                // that served them.
                version: fingerprint
                    .as_deref()
                    .and_then(version_of_fingerprint)
                    .or(churned_version)
                    .or_else(|| result.server_version.clone()),
                model_root: result.model.root.clone(),
                system_fingerprint: fingerprint,
                max_model_len: result.model.max_model_len,
            },
            summary: RunSummary {
                completed: m.completed,
                failed: m.failed,
                total_input_tokens: m.total_input_tokens,
                total_output_tokens: m.total_output_tokens,
                request_throughput: m.request_throughput,
                output_throughput: m.output_throughput,
                total_token_throughput: m.total_token_throughput,
                goodput_ratio,
                ttft: LatencySummary::of(&m.ttft),
                tpot: LatencySummary::of(&m.tpot),
                itl: LatencySummary::of(&m.itl),
                e2el: LatencySummary::of(&m.e2el),
                ttfo: m.ttfo.as_ref().map(LatencySummary::of),
                reasoning_tokens: m.total_reasoning_tokens,
                prefix_cache: result.prefix_cache,
                turns: m
                    .turns
                    .iter()
                    .map(|t| TurnSummary {
                        turn: t.turn,
                        ttft: LatencySummary::of(&t.ttft),
                        itl: LatencySummary::of(&t.itl),
                    })
                    .collect(),
                outcomes,
            },
            load_before: None,
            load_after: None,
            build: None,
            replica: String::new(),
            samples,
            answers: answers_of(&result.records),
            fingerprint_churn: churn,
        }
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

/// The greedy answers of the requests that kept their tokens (a drift
/// canary's) and completed.
fn answers_of(records: &[crate::client::RequestRecord]) -> Vec<crate::detect::drift::Answer> {
    records
        .iter()
        .filter(|r| r.outcome.is_ok())
        .filter_map(|r| {
            let output = r.output.as_ref().filter(|o| !o.tokens.is_empty())?;
            Some(crate::detect::drift::Answer {
                prompt: r.index,
                tokens: output.tokens.iter().map(|(t, _)| t.clone()).collect(),
                logprobs: output.tokens.iter().map(|(_, l)| *l).collect(),
            })
        })
        .collect()
}

/// Ok when every request completed, partial when some did, and failed with
/// the most common request outcome when none did (a run where every request
/// was refused is not "partial").
fn run_outcome(
    completed: usize,
    failed: usize,
    records: &[crate::client::RequestRecord],
) -> RunOutcome {
    if completed > 0 {
        return if failed == 0 {
            RunOutcome::Ok
        } else {
            RunOutcome::Partial
        };
    }
    let mut counts: BTreeMap<Outcome, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.outcome.is_ok()) {
        *counts.entry(r.outcome).or_default() += 1;
    }
    // Ties go to the outcome listed first in the closed set.
    let dominant = counts
        .into_iter()
        .max_by_key(|(o, n)| (*n, std::cmp::Reverse(*o)))
        .map_or(Outcome::StreamError, |(o, _)| o);
    RunOutcome::Failed(dominant)
}

/// The run outcome of a probe that could not run at all.
pub fn outcome_of_error(e: &ProbeError) -> RunOutcome {
    match e {
        ProbeError::Server(s) => match s {
            ServerError::Unreachable { .. } | ServerError::Client(_) => {
                RunOutcome::Failed(Outcome::Connect)
            }
            ServerError::Timeout { .. } => RunOutcome::Failed(Outcome::Timeout),
            ServerError::Unauthorized { .. } => RunOutcome::Failed(Outcome::Http4xx),
            ServerError::NotOpenAi { .. } => RunOutcome::Failed(Outcome::StreamError),
            ServerError::UnknownModel { .. } | ServerError::NoModels { .. } => RunOutcome::Model,
            ServerError::Tokenize { .. } => RunOutcome::Config,
            ServerError::Http { status, .. } => RunOutcome::Failed(Outcome::from_status(*status)),
        },
        ProbeError::Client(_) => RunOutcome::Failed(Outcome::Connect),
        ProbeError::Invalid(_) => RunOutcome::Config,
    }
}

use crate::text::truncate;
