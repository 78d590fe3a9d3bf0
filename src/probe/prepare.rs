//! What a run sends: the dataset's prompts or random calibrated ones (the
//! drift canary's fixed prompts in order), each conversation's turns
//! numbered, and the run's shared prefix in front of each request's first
//! message.

use super::{ProbeError, ProbeSpec};
use crate::client::PreparedRequest;
use crate::client::server_api::ServerApi;
use crate::workload::dataset::Dataset;
use crate::workload::kinds::{DRIFT_PROMPTS, ScenarioKind};
use crate::workload::prompts::{self, PromptPlan};

pub struct Prepared {
    pub measured: Vec<PreparedRequest>,
    pub warmup: Vec<PreparedRequest>,
    pub calibrated: bool,
}

/// The run's requests. The warm-up's prompts and prefix are other ones,
/// so it warms nothing the run measures.
pub async fn prepare(
    spec: &ProbeSpec,
    calibrator: Option<(&ServerApi, &str)>,
) -> Result<Prepared, ProbeError> {
    if spec.kind == ScenarioKind::Drift {
        // Each prompt once, in order: request `i` always asks prompt `i`.
        let builtin;
        let dataset = match &spec.dataset {
            Some(d) => d.as_ref(),
            None => {
                builtin = Dataset::of_prompts("the drift canary's prompts", &DRIFT_PROMPTS);
                &builtin
            }
        };
        let count = spec.num_requests.clamp(1, dataset.entries.len());
        return Ok(Prepared {
            measured: dataset.requests(count, None, &spec.run_id, 0, spec.output_len),
            warmup: Vec::new(),
            calibrated: false,
        });
    }
    let prefix_len = spec.shared_prefix_len;
    // A conversation has a user message of its own per turn.
    let turns = match spec.kind {
        ScenarioKind::MultiTurn => spec.turns.max(1),
        _ => 1,
    };
    let count = spec.num_requests * turns as usize;
    let mut prepared = match &spec.dataset {
        Some(dataset) => Prepared {
            measured: dataset.requests(
                count,
                Some(spec.seed),
                &spec.run_id,
                spec.warmup,
                spec.output_len,
            ),
            warmup: dataset.requests(
                spec.warmup,
                Some(spec.seed.wrapping_add(1)),
                &spec.run_id,
                0,
                spec.output_len,
            ),
            calibrated: false,
        },
        None => {
            let plan = |count: usize, first_index: usize, seed: u64| PromptPlan {
                run_id: spec.run_id.clone(),
                seed,
                count,
                // The prefix's tokens are part of the input length.
                input_len: spec.input_len - prefix_len,
                output_len: spec.output_len,
                range_ratio: spec.range_ratio,
                first_index,
            };
            let measured =
                prompts::build(&plan(count, spec.warmup, spec.seed), calibrator, 4).await?;
            let warmup = match spec.warmup {
                0 => Vec::new(),
                n => {
                    let seed = spec.seed.wrapping_add(1);
                    prompts::build(&plan(n, 0, seed), calibrator, 4)
                        .await?
                        .requests
                }
            };
            Prepared {
                measured: measured.requests,
                warmup,
                calibrated: measured.calibrated,
            }
        }
    };
    if spec.kind == ScenarioKind::MultiTurn {
        for (i, request) in prepared.measured.iter_mut().enumerate() {
            request.turn = Some(1 + (i % turns as usize) as u32);
        }
    }
    if prefix_len > 0 {
        for (requests, seed) in [
            (&mut prepared.measured, spec.seed),
            (&mut prepared.warmup, spec.seed.wrapping_add(1)),
        ] {
            let prefix = prompts::shared_prefix(calibrator, seed, prefix_len).await?;
            prompts::put_prefix(requests, &prefix);
        }
    }
    Ok(prepared)
}

/// The requests of a multi-turn run as conversations: each starts at a
/// first turn.
pub fn in_conversations(requests: Vec<PreparedRequest>) -> Vec<Vec<PreparedRequest>> {
    let mut conversations: Vec<Vec<PreparedRequest>> = Vec::new();
    for request in requests {
        match conversations.last_mut() {
            Some(last) if request.turn.is_some_and(|t| t > 1) => last.push(request),
            _ => conversations.push(vec![request]),
        }
    }
    conversations
}
