//! Series of models a target no longer serves. A target that switches
//! models (or a server that answers with a new model name on every call)
//! would otherwise leave every family's series of each old name on
//! `/metrics` for good; here each (target, model) is stamped when a run or
//! the watcher sees it, and a model that the target has since replaced
//! loses its series once it has been unseen for the grace period. A model
//! that is merely silent (its target down) keeps them: staleness alerts
//! need them. Components add their families with a `model` label here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::family::Family;
use super::page::Handle;

/// The default grace period (`[exporter] stale_series_after`).
pub use crate::config::sections::DEFAULT_STALE_SERIES_AFTER as DEFAULT_GRACE;

/// When each (target, model) was last seen, and how to remove a model's
/// series from each family that has them.
pub struct ModelSeries {
    families: Mutex<Vec<Arc<Family>>>,
    seen: Mutex<HashMap<String, HashMap<String, Instant>>>,
    grace: Mutex<Duration>,
}

impl Default for ModelSeries {
    fn default() -> Self {
        ModelSeries::new()
    }
}

impl ModelSeries {
    pub fn new() -> Self {
        ModelSeries {
            families: Mutex::default(),
            seen: Mutex::default(),
            grace: Mutex::new(DEFAULT_GRACE),
        }
    }

    /// Adds the handle's family to those cleaned, when it has a `model`
    /// label. Removals go through the family, so the page knows which
    /// family to print again.
    pub fn add<K>(&self, handle: &Handle<K>) {
        if handle.family().has_label("model") {
            self.families
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(handle.family().clone());
        }
    }

    /// How long a replaced model's series stay (`exporter.stale_series_after`).
    pub fn set_grace(&self, grace: Duration) {
        *self.grace.lock().unwrap_or_else(|p| p.into_inner()) = grace;
    }

    /// Notes that `target` serves `model` now, and removes the series of
    /// the models it replaced longer than the grace period ago.
    pub fn note(&self, target: &str, model: &str) {
        let gone = self.forgotten(target, model);
        if gone.is_empty() {
            return;
        }
        let removed = self.remove_where(target, |labels| {
            labels
                .get("model")
                .is_some_and(|m| gone.iter().any(|g| g == m))
        });
        tracing::info!(target, models = ?gone, series = removed, "removed the series of models the target no longer serves");
    }

    /// Removes the target's series, in the families added here, whose
    /// labels `gone` says no longer describe anything; returns how many.
    pub fn remove_where(&self, target: &str, gone: impl Fn(&HashMap<&str, &str>) -> bool) -> usize {
        let families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        families
            .iter()
            .map(|f| f.remove_of_target(target, &gone))
            .sum()
    }

    /// Stamps the model; returns the models of the target replaced by
    /// another and unseen for longer than the grace period (forgotten).
    fn forgotten(&self, target: &str, model: &str) -> Vec<String> {
        let grace = *self.grace.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let models = seen.entry(target.to_owned()).or_default();
        models.insert(model.to_owned(), now);
        let gone: Vec<String> = models
            .iter()
            .filter(|(m, at)| m.as_str() != model && now.duration_since(**at) > grace)
            .map(|(m, _)| m.clone())
            .collect();
        for m in &gone {
            models.remove(m);
        }
        gone
    }
}
