//! The daemon's own health beside its probes: its build, configuration
//! loads, store failures, connections the exporter could not accept, the
//! password checks its logins cost, and whether the store's file is still
//! where it was opened. Each counted failure is also logged, in one call.

use super::MetricsError;
use super::page::{Counters, Gauges, Page};

pub struct HealthMetrics {
    reload_ok: Gauges,
    reload_ts: Gauges,
    store_errors_total: Counters,
    accept_errors_total: Counters,
    password_checks_total: Counters,
    store_file_missing: Gauges,
}

impl HealthMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        page.gauges(
            "sentinel_build_info",
            "Build of this vllm-sentinel; value 1.",
            &["version"],
        )?
        .set(&[env!("CARGO_PKG_VERSION")], 1.0);
        let m = HealthMetrics {
            reload_ok: page.gauges(
                "sentinel_config_last_reload_successful",
                "1 if the last configuration load or reload succeeded.",
                &[],
            )?,
            reload_ts: page.gauges(
                "sentinel_config_last_reload_success_timestamp_seconds",
                "When the configuration was last loaded successfully.",
                &[],
            )?,
            store_errors_total: page.counters(
                "sentinel_store_errors_total",
                "Store operations that failed (the run stays on /metrics).",
                &[],
            )?,
            accept_errors_total: page.counters(
                "sentinel_exporter_accept_errors_total",
                "Connections to the exporter that could not be accepted (out of file descriptors, most often).",
                &[],
            )?,
            password_checks_total: page.counters(
                "sentinel_exporter_password_checks_total",
                "Password checks (bcrypt) run for basic-auth logins to the exporter; a verified password is remembered and costs none after.",
                &[],
            )?,
            store_file_missing: page.gauges(
                "sentinel_store_file_missing",
                "Whether the store's file was deleted or replaced while the daemon runs (1): what it stores now is lost at the next restart.",
                &[],
            )?,
        };
        m.reload_ok.set(&[], 1.0);
        m.reload_ts.set(&[], 0.0);
        m.store_errors_total.declare(&[]);
        m.accept_errors_total.declare(&[]);
        m.password_checks_total.declare(&[]);
        m.store_file_missing.set(&[], 0.0);
        Ok(m)
    }

    /// A configuration load or reload and how it went, counted and logged.
    pub fn config_loaded(
        &self,
        result: Result<(), &dyn std::fmt::Display>,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        match result {
            Ok(()) => {
                self.reload_ok.set(&[], 1.0);
                self.reload_ts.set(&[], now.timestamp() as f64);
            }
            Err(e) => {
                self.reload_ok.set(&[], 0.0);
                tracing::error!(error = %e, "configuration reload failed, keeping the running one");
            }
        }
    }

    /// A failed store call, counted and logged with the store's file (a
    /// "database is locked" names none).
    pub fn store_error(&self, file: &std::path::Path, error: &dyn std::fmt::Display) {
        self.store_errors_total.inc(&[]);
        tracing::error!(file = %file.display(), error = %error, "store");
    }

    pub fn accept_error(&self, error: &dyn std::fmt::Display) {
        self.accept_errors_total.inc(&[]);
        tracing::warn!(error = %error, "exporter cannot accept a connection");
    }

    pub fn password_checked(&self) {
        self.password_checks_total.inc(&[]);
    }

    /// The store's file is gone: a store failure, the gauge set, and a
    /// loud line in the log.
    pub fn store_file_missing(&self, reason: &dyn std::fmt::Display) {
        self.store_errors_total.inc(&[]);
        self.store_file_missing.set(&[], 1.0);
        tracing::error!(
            reason = %reason,
            "the store's file is gone; runs stored from now on are lost at the \
             next restart; restart the daemon to open a new store (or restore the file)"
        );
    }

    pub fn store_file_back(&self) {
        self.store_file_missing.set(&[], 0.0);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// The log lines written while it is the default subscriber.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_store_failure_is_counted_and_logged_with_the_file() {
        let page = crate::metrics::page::Page::default();
        let health = super::HealthMetrics::new(&page).unwrap();
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let locked = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        let error = crate::store::StoreError::Sql(locked);
        tracing::subscriber::with_default(subscriber, || {
            health.store_error(std::path::Path::new("/var/lib/s/store.db"), &error);
        });
        let logged = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(
            logged.contains("file=/var/lib/s/store.db") && logged.contains("database is locked"),
            "{logged}"
        );
        assert!(page.encode().contains("sentinel_store_errors_total 1"));
    }
}
