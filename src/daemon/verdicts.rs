//! The daemon's side of regression detection: files what each server says
//! it is (announcing version changes), judges a pair after each completed
//! run, feeds verdicts to `/metrics` and the notifier, restores all of it
//! after a restart, and says which scenarios an upgrade still needs runs of.

use std::sync::Arc;

use chrono::Utc;

use super::Shared;
use crate::config::{Config, TargetConfig};
use crate::detect::State;
use crate::detect::verdict::{self, PairVerdict};
use crate::run::ServerIdentity;
use crate::store::StoreError;
use crate::store::baselines::PairKey;
use crate::store::builds::VersionChange;

async fn blocking<T: Send + 'static>(
    shared: &Shared,
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Option<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            shared.metrics.store_error();
            tracing::error!("store: {e}");
            None
        }
        Err(e) => {
            shared.metrics.store_error();
            tracing::error!("store task: {e}");
            None
        }
    }
}

/// Files the server's identity; a new build is logged, exported and wakes
/// the target's worker for the upgrade rounds.
pub async fn observe_identity(
    shared: &Arc<Shared>,
    target: &str,
    model: &str,
    identity: &ServerIdentity,
) {
    let store = shared.store.clone();
    let (t, m, id) = (target.to_owned(), model.to_owned(), identity.clone());
    let Some(observed) = blocking(shared, move || {
        store.observe_identity(&t, &m, &id, Utc::now())
    })
    .await
    else {
        return;
    };
    if let Some(change) = observed.change {
        announce(shared, target, model, identity, &change);
    }
}

/// Logs a build change; an upgrade is also exported and wakes the target's
/// worker for the upgrade rounds.
pub fn announce(
    shared: &Shared,
    target: &str,
    model: &str,
    identity: &ServerIdentity,
    change: &VersionChange,
) {
    match &change.from_build {
        Some(from) => {
            tracing::warn!(
                target, model, from = ?from, to = ?change.to_build,
                version = ?identity.version, model_root = ?identity.model_root,
                system_fingerprint = ?identity.system_fingerprint,
                "server version changed"
            );
            shared.metrics.set_version_change(target, change.at);
            shared.upgrades.send_modify(|n| *n += 1);
        }
        None => tracing::info!(target, model, build = ?change.to_build, "server build first seen"),
    }
}

/// Judges one pair after a completed run of `build`.
pub async fn judge(shared: &Arc<Shared>, config: &Config, key: PairKey, build: String) {
    let store = shared.store.clone();
    let cfg = config.detection.clone();
    let Some(v) = blocking(shared, move || {
        verdict::evaluate_pair(&store, &cfg, &key, &build, Utc::now())
    })
    .await
    else {
        return;
    };
    let previous = shared.remember_verdict(&v);
    if previous != Some(v.state) {
        let slower: Vec<String> = v
            .slower()
            .iter()
            .map(|m| format!("{} {:+.1}%", m.metric, m.relative_change * 100.0))
            .collect();
        let (target, scenario, build) = (&v.target, &v.scenario, &v.build);
        let reason = &v.evaluation.reason;
        // A regression starting or ending is news; the rest is routine.
        if v.state == State::Regression || previous == Some(State::Regression) {
            tracing::warn!(
                %target, %scenario, %build, reference = ?v.reference_build,
                state = v.state.as_str(), slower = %slower.join(", "), %reason,
                "verdict changed"
            );
        } else {
            tracing::info!(
                %target, %scenario, %build, reference = ?v.reference_build,
                state = v.state.as_str(), %reason,
                "verdict changed"
            );
        }
    }
    shared.metrics.set_verdict(&v, true);
    shared.notifier.verdict(&v);
}

/// Puts version changes and the last verdicts back on `/metrics` and
/// tells the notifier which regressions were already announced.
pub fn restore(shared: &Shared) -> Result<(), StoreError> {
    let config = shared.config();
    for t in &config.targets {
        for model in shared.store.models_of(&t.name)? {
            let latest_upgrade = shared
                .store
                .version_changes(&t.name, &model)?
                .into_iter()
                .find(|c| c.from_build.is_some());
            if let Some(c) = latest_upgrade {
                shared.metrics.set_version_change(&t.name, c.at);
            }
        }
    }
    for stored in shared.store.latest_evaluations()? {
        if config.target(&stored.key.target).is_none() {
            continue;
        }
        match serde_json::from_str::<PairVerdict>(&stored.detail) {
            Ok(v) => {
                shared.remember_verdict(&v);
                shared.metrics.set_verdict(&v, false);
                shared.notifier.restore(&v);
            }
            Err(e) => tracing::warn!("a stored verdict is unreadable, skipped: {e}"),
        }
    }
    Ok(())
}

/// The next scenario an upgrade verdict still needs a run of, if any.
pub async fn pending_upgrade(
    shared: &Arc<Shared>,
    config: &Config,
    target: &TargetConfig,
) -> Option<String> {
    if !config.detection.upgrade_rounds {
        return None;
    }
    let store = shared.store.clone();
    let cfg = config.detection.clone();
    let (name, model, scenarios) = (
        target.name.clone(),
        shared.model_label(target),
        target.scenarios.clone(),
    );
    blocking(shared, move || {
        verdict::pending_upgrade_runs(&store, &cfg, &name, &model, &scenarios)
    })
    .await?
    .into_iter()
    .next()
}
