//! Series of models a target no longer serves. A target that switches
//! models (or a server that answers with a new model name on every call)
//! would otherwise leave every family's series of each old name on
//! `/metrics` for good; here each (target, model) is stamped when a run or
//! the watcher sees it, and a model that the target has since replaced
//! loses its series once it has been unseen for the grace period. A model
//! that is merely silent (its target down) keeps them: staleness alerts
//! need them. Components add their families with a `model` label here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};

use super::page::{Handle, Page};

/// Removes the series with exactly these labels from one family.
type Remover = Box<dyn Fn(&HashMap<&str, &str>) + Send + Sync>;

/// The default grace period: long enough for any schedule to run again.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// When each (target, model) was last seen, and how to remove a model's
/// series from each family that has them.
pub struct ModelSeries {
    page: Page,
    removers: Mutex<HashMap<String, Remover>>,
    seen: Mutex<HashMap<String, HashMap<String, Instant>>>,
    grace: Mutex<Duration>,
}

impl ModelSeries {
    pub fn new(page: Page) -> Self {
        ModelSeries {
            page,
            removers: Mutex::default(),
            seen: Mutex::default(),
            grace: Mutex::new(DEFAULT_GRACE),
        }
    }

    /// Adds the handle's family to those cleaned, when it has a `model`
    /// label. Removals go through the handle, so the page knows which
    /// family to encode again.
    pub fn add<T: MetricVecBuilder + 'static>(&self, handle: &Handle<MetricVec<T>>) {
        let desc = handle.family().desc()[0];
        if !desc.variable_labels.iter().any(|l| l == "model") {
            return;
        }
        let name = desc.fq_name.clone();
        let handle = handle.clone();
        let remover: Remover = Box::new(move |labels| handle.remove_labels(labels));
        self.removers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, remover);
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
        let removers = self.removers.lock().unwrap_or_else(|p| p.into_inner());
        let mut removed = 0;
        for family in &self.page.registry().gather() {
            let Some(remove) = removers.get(family.name()) else {
                continue;
            };
            for metric in family.get_metric() {
                let labels: HashMap<&str, &str> = metric
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                if labels.get("target") == Some(&target) && gone(&labels) {
                    remove(&labels);
                    removed += 1;
                }
            }
        }
        removed
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
