//! The daemon's own health beside its probes: connections the exporter
//! could not accept, and whether the store's file is still where it was
//! opened.

use prometheus::{IntCounter, IntGauge, Registry};

use super::{Metrics, MetricsError};

pub struct ExporterMetrics {
    accept_errors_total: IntCounter,
    store_file_missing: IntGauge,
}

impl ExporterMetrics {
    pub fn new(registry: &Registry) -> Result<Self, MetricsError> {
        let accept_errors_total = IntCounter::new(
            "sentinel_exporter_accept_errors_total",
            "Connections to the exporter that could not be accepted (out of file descriptors, most often).",
        )?;
        registry.register(Box::new(accept_errors_total.clone()))?;
        let store_file_missing = IntGauge::new(
            "sentinel_store_file_missing",
            "Whether the store's file was deleted or replaced while the daemon runs (1): what it stores now is lost at the next restart.",
        )?;
        registry.register(Box::new(store_file_missing.clone()))?;
        Ok(ExporterMetrics {
            accept_errors_total,
            store_file_missing,
        })
    }
}

impl Metrics {
    pub fn accept_error(&self) {
        let _changed = self.change();
        self.exporter.accept_errors_total.inc();
    }

    pub fn set_store_file_missing(&self, missing: bool) {
        let _changed = self.change();
        self.exporter.store_file_missing.set(i64::from(missing));
    }
}
