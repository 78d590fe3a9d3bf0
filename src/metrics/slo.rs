//! The objectives' counters: every event an objective counts and those
//! that were good, labelled by the objective alone (two series per
//! objective, whatever it covers), so the generated rules compute its SLI,
//! budget and burn rates over any window from exact counts.

use std::sync::Mutex;

use super::MetricsError;
use super::page::{Counters, Page};

pub struct SloMetrics {
    requests: Counters,
    good: Counters,
    /// The objectives declared, to drop those a reload removed.
    declared: Mutex<Vec<String>>,
}

impl SloMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        Ok(SloMetrics {
            requests: page.counters(
                "sentinel_slo_requests_total",
                "Events an objective counts: probe requests it covers (a run that could not send one is one), or heartbeats for a liveness objective.",
                &["slo"],
            )?,
            good: page.counters(
                "sentinel_slo_good_requests_total",
                "Events an objective counts that met its SLI (succeeded within the exact threshold; or a heartbeat finding the target generating).",
                &["slo"],
            )?,
            declared: Mutex::new(Vec::new()),
        })
    }

    /// Makes `names` the objectives on the page: each at 0 until it
    /// counts, those no longer configured removed, the others kept.
    pub fn declare(&self, names: &[&str]) {
        let mut declared = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        for gone in declared.iter().filter(|d| !names.contains(&d.as_str())) {
            self.requests.remove(&[gone]);
            self.good.remove(&[gone]);
        }
        for name in names {
            self.requests.declare(&[name]);
            self.good.declare(&[name]);
        }
        *declared = names.iter().map(|n| n.to_string()).collect();
    }

    /// Counts `total` events of `slo`, `good` of them good.
    pub fn count(&self, slo: &str, good: u64, total: u64) {
        if total == 0 {
            return;
        }
        self.requests.inc_by(&[slo], total);
        self.good.inc_by(&[slo], good);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_are_declared_counted_and_dropped_with_their_configuration() {
        let page = Page::default();
        let m = SloMetrics::new(&page).unwrap();
        m.declare(&["a", "b"]);
        m.count("a", 7, 10);
        m.count("a", 0, 0);
        let text = page.encode();
        assert!(
            text.contains("sentinel_slo_requests_total{slo=\"a\"} 10"),
            "{text}"
        );
        assert!(
            text.contains("sentinel_slo_good_requests_total{slo=\"a\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("sentinel_slo_requests_total{slo=\"b\"} 0"),
            "{text}"
        );
        m.declare(&["a"]);
        let text = page.encode();
        assert!(!text.contains("slo=\"b\""), "{text}");
        assert!(
            text.contains("sentinel_slo_requests_total{slo=\"a\"} 10"),
            "kept: {text}"
        );
    }
}
