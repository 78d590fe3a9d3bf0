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

    /// Forgets the models seen of a target no longer configured.
    pub fn forget_target(&self, target: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(target);
    }

    /// Stamps the model; returns the models of the target replaced by
    /// another and unseen for longer than the grace period (forgotten).
    fn forgotten(&self, target: &str, model: &str) -> Vec<String> {
        let grace = *self.grace.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let models = seen.entry(target.to_owned()).or_default();
        models.insert(model.to_owned(), now);
        let mut gone: Vec<String> = models
            .iter()
            .filter(|(m, at)| m.as_str() != model && now.duration_since(**at) > grace)
            .map(|(m, _)| m.clone())
            .collect();
        for m in &gone {
            models.remove(m);
        }
        // Bounded whatever the grace: a server that renames its model on
        // every run would otherwise keep a family's series per name for
        // the whole grace period, many times the target's series budget.
        while models.len() > MODELS_KEPT {
            let oldest = models
                .iter()
                .filter(|(m, _)| m.as_str() != model)
                .min_by_key(|(_, at)| **at)
                .map(|(m, _)| m.clone());
            let Some(oldest) = oldest else { break };
            models.remove(&oldest);
            gone.push(oldest);
        }
        gone
    }
}

/// Most models of one target whose series are kept at once (the one it
/// serves and those it replaced within the grace period).
const MODELS_KEPT: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_renamed_on_every_run_keeps_at_most_three_names() {
        let series = ModelSeries::new();
        series.set_grace(Duration::from_secs(3600));
        let mut forgotten = Vec::new();
        for i in 0..10 {
            forgotten.extend(series.forgotten("t", &format!("m{i}")));
            // Each name seen at its own instant.
            std::thread::sleep(Duration::from_millis(1));
        }
        // Within the grace period, yet only the three newest are kept.
        let kept: Vec<String> = {
            let seen = series.seen.lock().unwrap();
            let mut kept: Vec<String> = seen["t"].keys().cloned().collect();
            kept.sort();
            kept
        };
        assert_eq!(kept, ["m7", "m8", "m9"]);
        assert_eq!(
            forgotten,
            (0..7).map(|i| format!("m{i}")).collect::<Vec<_>>()
        );
        // Another target's models are its own.
        assert!(series.forgotten("u", "m0").is_empty());
    }
}
