//! Series of models a target no longer serves. A target that switches
//! models (or a server that answers with a new model name on every call)
//! would otherwise leave every family's series of each old name on
//! `/metrics` for good; here each (target, model) is stamped when a run or
//! the watcher sees it, and a model that the target has since replaced
//! loses its series once it has been unseen for the grace period. A model
//! that is merely silent (its target down) keeps them: staleness alerts
//! need them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};

use super::Metrics;

/// Removes the series with exactly these labels from one family.
pub type Remover = Box<dyn Fn(&HashMap<&str, &str>) + Send + Sync>;

/// A remover for `family` when it has a `model` label.
pub fn by_model<T: MetricVecBuilder + 'static>(family: &MetricVec<T>) -> Option<(String, Remover)> {
    let desc = family.desc()[0];
    if !desc.variable_labels.iter().any(|l| l == "model") {
        return None;
    }
    let family = family.clone();
    Some((
        desc.fq_name.clone(),
        Box::new(move |labels| {
            let _ = family.remove(labels);
        }),
    ))
}

/// When each (target, model) was last seen.
pub struct ModelSeries {
    removers: HashMap<String, Remover>,
    seen: Mutex<HashMap<String, HashMap<String, Instant>>>,
    grace: Mutex<Duration>,
}

/// The default grace period: long enough for any schedule to run again.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

impl ModelSeries {
    pub fn new(removers: impl IntoIterator<Item = (String, Remover)>) -> Self {
        ModelSeries {
            removers: removers.into_iter().collect(),
            seen: Mutex::default(),
            grace: Mutex::new(DEFAULT_GRACE),
        }
    }

    /// Stamps the model; returns the models of the target replaced by
    /// another and unseen for longer than the grace period (forgotten).
    fn note(&self, target: &str, model: &str) -> Vec<String> {
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

impl Metrics {
    /// A remover for every family with a `model` label.
    pub(super) fn model_removers(&self) -> Vec<(String, Remover)> {
        let histograms = [&self.ttft, &self.tpot, &self.itl, &self.e2el];
        let gauges = [
            &self.run_latency,
            &self.run_output_tps,
            &self.run_rps,
            &self.run_goodput,
            &self.run_success,
            &self.run_last_ts,
            &self.run_duration,
            &self.run_input_tokens,
            &self.server_info,
        ];
        let mut all: Vec<(String, Remover)> = histograms.into_iter().filter_map(by_model).collect();
        all.extend(gauges.into_iter().filter_map(by_model));
        all.extend(by_model(&self.requests_total));
        all.extend(self.alerting.model_removers());
        all
    }

    /// How long a replaced model's series stay (`exporter.stale_series_after`).
    pub fn set_stale_series_grace(&self, grace: Duration) {
        *self
            .model_series
            .grace
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = grace;
    }

    /// Notes that `target` serves `model` now, and removes the series of
    /// the models it replaced longer than the grace period ago.
    pub fn note_model(&self, target: &str, model: &str) {
        let gone = self.model_series.note(target, model);
        if gone.is_empty() {
            return;
        }
        let _changed = self.change();
        let families = self.registry.gather();
        let mut removed = 0;
        for family in &families {
            let Some(remove) = self.model_series.removers.get(family.name()) else {
                continue;
            };
            for metric in family.get_metric() {
                let labels: HashMap<&str, &str> = metric
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                if labels.get("target") == Some(&target)
                    && labels
                        .get("model")
                        .is_some_and(|m| gone.iter().any(|g| g == m))
                {
                    remove(&labels);
                    removed += 1;
                }
            }
        }
        tracing::info!(target, models = ?gone, series = removed, "removed the series of models the target no longer serves");
    }
}
