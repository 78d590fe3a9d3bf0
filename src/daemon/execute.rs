//! One scheduled run, start to finish: read the load, probe under a
//! deadline (aborted only after the shutdown grace period), read the load
//! again, then export and store the run.

use chrono::Utc;
use std::sync::Arc;

use super::Shared;
use super::watch::read_load;
use crate::client::ApiKey;
use crate::config::{Config, RunLength, ScenarioConfig, TargetConfig};
use crate::probe::{self, ProbeSpec};
use crate::run::{self, RUN_PERCENTILES, RunOutcome, RunRecord};
use crate::store::baselines::PairKey;
use crate::telemetry::TargetWatch;

/// The probe settings of one (target, scenario) run.
pub fn spec_for(
    target: &TargetConfig,
    scenario: &ScenarioConfig,
    key: Option<ApiKey>,
    run_id: String,
) -> ProbeSpec {
    let (num_requests, dispatch_window) = match scenario.length {
        RunLength::Requests(n) => (n as usize, None),
        RunLength::Duration {
            duration,
            max_requests,
        } => (max_requests as usize, Some(duration)),
    };
    ProbeSpec {
        base_url: target.base_url.clone(),
        model: target.model.clone(),
        endpoint: scenario.endpoint.unwrap_or(target.endpoint),
        api_key: key,
        timeouts: target.timeouts,
        input_len: scenario.input_len,
        output_len: scenario.output_len,
        range_ratio: scenario.range_ratio,
        num_requests,
        concurrency: Some(scenario.concurrency as usize),
        request_rate: None,
        burstiness: 1.0,
        warmup: scenario.warmup as usize,
        percentiles: RUN_PERCENTILES.to_vec(),
        slos: scenario.slos,
        // A fresh seed per run: new prompts every time, so no run is
        // flattered by the prefix cache left by the previous one.
        seed: rand::random(),
        run_id,
        ignore_eos: true,
        calibrate: true,
        dispatch_window,
    }
}

/// How a run ended, as the scheduler needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunEnd {
    pub outcome: RunOutcome,
    /// The longest `Retry-After` a 429 or 503 answer asked for: the target
    /// is left alone that long.
    pub retry_after: Option<std::time::Duration>,
}

/// Runs one scenario against one target and records the result.
pub async fn run_once(
    shared: &Arc<Shared>,
    config: &Arc<Config>,
    target: &TargetConfig,
    scenario: &ScenarioConfig,
) -> RunEnd {
    shared.set_running(&target.name, Some(&scenario.name));
    let started_at = Utc::now();
    let clock = std::time::Instant::now();
    let model_label = shared.model_label(target);
    let key = match target.api_key.as_ref().map(|s| s.load(false)).transpose() {
        Ok(k) => k.flatten(),
        Err(e) => {
            let record = RunRecord::failed(
                &target.name,
                &scenario.name,
                &model_label,
                started_at,
                0.0,
                RunOutcome::Config,
                format!("API key: {e}"),
            );
            return finish(shared, record, None).await;
        }
    };
    // A key the watch cannot use is reported by the probe itself.
    let watch = TargetWatch::new(
        shared.http.clone(),
        target.clone(),
        key.clone(),
        config.telemetry.scrape_timeout,
    )
    .ok();
    let load_before = match &watch {
        Some(w) => read_load(shared, &target.name, w).await,
        None => None,
    };
    let run_id = format!(
        "{}-{}-{}",
        target.name,
        scenario.name,
        started_at.timestamp_millis()
    );
    let spec_key = key.clone();
    let spec = spec_for(target, scenario, key, run_id);
    let mut retry_after = None;
    let grace = config.scheduler.shutdown_grace;
    let shutdown = shared.shutdown.clone();
    let aborted = async move {
        shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    let result = tokio::select! {
        r = tokio::time::timeout(scenario.deadline, probe::run(&spec, None)) => Some(r),
        _ = aborted => None,
    };
    let elapsed = clock.elapsed().as_secs_f64();
    let failed = |outcome, error: String| {
        RunRecord::failed(
            &target.name,
            &scenario.name,
            &model_label,
            started_at,
            elapsed,
            outcome,
            error,
        )
    };
    let mut record = match result {
        None => {
            shared.metrics.run_aborted(&target.name, "shutdown");
            failed(
                RunOutcome::Aborted,
                format!("aborted at shutdown after the {grace:?} grace period"),
            )
        }
        Some(Err(_)) => {
            shared.metrics.run_aborted(&target.name, "deadline");
            failed(
                RunOutcome::Deadline,
                format!("the run exceeded its deadline of {:?}", scenario.deadline),
            )
        }
        Some(Ok(Err(e))) => failed(run::outcome_of_error(&e), e.to_string()),
        Some(Ok(Ok(result))) => {
            retry_after = result.records.iter().filter_map(|r| r.retry_after).max();
            RunRecord::from_probe(
                &target.name,
                &scenario.name,
                started_at,
                &result,
                !scenario.slos.is_empty(),
            )
        }
    };
    // Whatever the server said, the key never reaches the store, a page or
    // a log, and no control character does either.
    record.error = record.error.take().map(|e| {
        let e = match &spec_key {
            Some(key) => key.scrub(&e),
            None => e,
        };
        crate::text::clean(&e, crate::text::MAX_MESSAGE_LEN)
    });
    record.load_before = load_before;
    if record.outcome != RunOutcome::Aborted
        && let Some(w) = &watch
    {
        record.load_after = read_load(shared, &target.name, w).await;
    }
    finish(shared, record, retry_after).await
}

/// Exports and stores a run; a store failure is counted and logged, and
/// the run stays on `/metrics`.
async fn finish(
    shared: &Arc<Shared>,
    record: RunRecord,
    retry_after: Option<std::time::Duration>,
) -> RunEnd {
    let outcome = record.outcome;
    let target = record.target.clone();
    match &record.error {
        // Server text is logged escaped (Debug), on one line whatever it holds.
        Some(e) if outcome != RunOutcome::Ok => tracing::warn!(
            target = %record.target, scenario = %record.scenario, outcome = outcome.as_str(),
            error = ?e, "run failed"
        ),
        _ => tracing::info!(
            target = %record.target, scenario = %record.scenario, outcome = outcome.as_str(),
            completed = record.summary.completed, failed = record.summary.failed,
            ttft_p50_ms = record.summary.ttft.p50 * 1e3, tpot_p50_ms = record.summary.tpot.p50 * 1e3,
            "run finished"
        ),
    }
    shared.metrics.record_run(&record, true);
    if record.summary.completed > 0 {
        shared.remember_model(&record.target, &record.model);
    }
    let judge = (record.outcome == RunOutcome::Ok).then(|| PairKey {
        target: record.target.clone(),
        model: record.model.clone(),
        scenario: record.scenario.clone(),
    });
    let identity = record.server.clone();
    let store = shared.store.clone();
    let stored = tokio::task::spawn_blocking(move || store.insert_run_filed(&record)).await;
    match stored {
        Ok(Ok((_, observed))) => {
            // Filing the run also files the server's identity: a build
            // change a run saw first is announced like one the watcher saw.
            if let (Some(change), Some(key)) = (&observed.change, &judge) {
                super::verdicts::announce(shared, &key.target, &key.model, &identity, change);
            }
            if let Some(key) = judge {
                super::verdicts::judge(shared, &shared.config(), key, observed.build).await;
            }
        }
        Ok(Err(e)) => {
            shared.metrics.store_error();
            tracing::error!("cannot store the run: {e}");
        }
        Err(e) => {
            shared.metrics.store_error();
            tracing::error!("cannot store the run: {e}");
        }
    }
    shared.set_running(&target, None);
    RunEnd {
        outcome,
        retry_after,
    }
}
