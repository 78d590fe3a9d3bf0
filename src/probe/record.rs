//! A probe's result as the run record the store keeps and the metrics
//! export: one record per build that served the run, the run's outcome
//! named from its requests' (or from why it could not run).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::{ProbeError, ProbeResult};
use crate::client::server_api::ServerError;
use crate::client::{Outcome, RequestRecord};
use crate::text::truncate;
use crate::vocabulary::records::*;

impl RunRecord {
    /// A finished run from the probe's result; `row_of` gives each
    /// request's row (built by [`RequestRecord::sample_row`], or taken
    /// where it was kept as the request ended).
    pub fn from_probe(
        target: &str,
        scenario: &str,
        started_at: DateTime<Utc>,
        result: &ProbeResult,
        slos_given: bool,
        row_of: impl FnMut(&RequestRecord) -> SampleRow,
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
        let samples = result.records.iter().map(row_of).collect();
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
                // Every request of a part names the same build (see
                // `split_by_build`); the header names the image.
                image: None,
                image_digest: result.records.iter().find_map(|r| r.build_tag.clone()),
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
}

/// The version every fingerprint of a run names, when they agree on one.
fn common_fingerprint_version(records: &[RequestRecord]) -> Option<String> {
    let mut versions = records
        .iter()
        .filter_map(|r| r.system_fingerprint.as_deref())
        .map(version_of_fingerprint);
    let first = versions.next()??;
    versions
        .all(|v| v.as_deref() == Some(first.as_str()))
        .then_some(first)
}

/// The greedy answers of the requests that kept their tokens (a drift
/// canary's) and completed.
fn answers_of(records: &[RequestRecord]) -> Vec<crate::vocabulary::answers::Answer> {
    records
        .iter()
        .filter(|r| r.outcome.is_ok())
        .filter_map(|r| {
            let output = r.output.as_ref().filter(|o| !o.tokens.is_empty())?;
            Some(crate::vocabulary::answers::Answer {
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
fn run_outcome(completed: usize, failed: usize, records: &[RequestRecord]) -> RunOutcome {
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
        ProbeError::Server(s) => match (s.outcome(), s) {
            (Some(outcome), _) => RunOutcome::Failed(outcome),
            (None, ServerError::Tokenize { .. }) => RunOutcome::Config,
            (None, _) => RunOutcome::Model,
        },
        ProbeError::Client(_) => RunOutcome::Failed(Outcome::Connect),
        ProbeError::Invalid(_) => RunOutcome::Config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe that could not ask for the model because our own resources
    /// ran out is `local`, which backs no target off; one refused by the
    /// server's address is `connect`, which does.
    #[test]
    fn a_probe_stopped_by_our_own_resources_is_local_not_the_servers_fault() {
        let (url, detail) = ("http://10.0.0.5:8000/v1/models".to_owned(), "x".to_owned());
        let local = outcome_of_error(&ProbeError::Server(ServerError::Local {
            url: url.clone(),
            detail: detail.clone(),
        }));
        assert_eq!(local, RunOutcome::Failed(Outcome::Local));
        assert!(!local.target_down());
        let refused = outcome_of_error(&ProbeError::Server(ServerError::Unreachable {
            url,
            detail,
        }));
        assert!(refused.target_down());
    }
}
