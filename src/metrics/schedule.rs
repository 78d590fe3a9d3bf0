//! The schedule: runs skipped, delayed, aborted or added by upgrade
//! rounds, each target's back-off, and each pair's period and SLOs
//! (exported so alert rules need no hard-coded numbers).

use super::MetricsError;
use super::page::{Counters, Gauges, Histograms, Page};
use crate::stats::bench::Slos;

pub struct ScheduleMetrics {
    skipped_total: Counters,
    delayed_total: Counters,
    aborted_total: Counters,
    upgrade_runs_total: Counters,
    /// One family for the daemon, not per pair: the scheduler's lag is the
    /// process's, and a per-pair histogram would cost the series budget.
    start_delay: Histograms,
    backoff: Gauges,
    interval: Gauges,
    slo: Gauges,
}

impl ScheduleMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        Ok(ScheduleMetrics {
            skipped_total: page.counters(
                "sentinel_scheduler_skipped_runs_total",
                "Scheduled runs not started: the target was busy with another probe, or backed off.",
                &["target", "scenario", "reason"],
            )?,
            delayed_total: page.counters(
                "sentinel_scheduler_delayed_runs_total",
                "Runs started more than a second late because another probe held the target.",
                &["target", "scenario"],
            )?,
            aborted_total: page.counters(
                "sentinel_probes_aborted_total",
                "Runs aborted at shutdown after the grace period, or at their deadline.",
                &["target", "reason"],
            )?,
            upgrade_runs_total: page.counters(
                "sentinel_upgrade_runs_total",
                "Runs started at once after a version change (upgrade rounds), beyond the schedule.",
                &["target", "scenario"],
            )?,
            start_delay: page.histograms(
                "sentinel_scheduler_start_delay_seconds",
                "How long after its planned time (tick plus jitter) a scheduled run started, \
                 waiting for the target's previous run included.",
                &[],
                vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 15.0, 60.0],
            )?,
            backoff: page.gauges(
                "sentinel_target_backoff_seconds",
                "Current back-off of a target found down; 0 when healthy.",
                &["target"],
            )?,
            interval: page.gauges(
                "sentinel_schedule_interval_seconds",
                "Time between two scheduled runs of the pair.",
                &["target", "scenario"],
            )?,
            slo: page.gauges(
                "sentinel_scenario_slo_seconds",
                "The scenario's configured SLO per metric.",
                &["target", "scenario", "metric"],
            )?,
        })
    }

    pub fn declare_target(&self, target: &str) {
        for reason in ["shutdown", "deadline"] {
            self.aborted_total.declare(&[target, reason]);
        }
        self.backoff.set(&[target], 0.0);
    }

    /// The pair's counters at 0, its schedule period and SLOs.
    pub fn declare_pair(&self, target: &str, scenario: &str, interval_s: Option<f64>, slos: &Slos) {
        for reason in ["busy", "backoff"] {
            self.skipped_total.declare(&[target, scenario, reason]);
        }
        self.delayed_total.declare(&[target, scenario]);
        if let Some(i) = interval_s {
            self.interval.set(&[target, scenario], i);
        }
        for (metric, value) in [
            ("ttft", slos.ttft_s),
            ("tpot", slos.tpot_s),
            ("e2el", slos.e2el_s),
        ] {
            if let Some(v) = value {
                self.slo.set(&[target, scenario, metric], v);
            }
        }
    }

    pub fn run_skipped(&self, target: &str, scenario: &str, reason: &'static str) {
        self.skipped_total.inc(&[target, scenario, reason]);
    }

    /// A scheduled run started `seconds` after its planned time; more
    /// than a second late counts as delayed.
    pub fn run_started(&self, target: &str, scenario: &str, seconds: f64) {
        self.start_delay.observe_all(&[], [seconds.max(0.0)]);
        if seconds > 1.0 {
            self.delayed_total.inc(&[target, scenario]);
        }
    }

    pub fn run_aborted(&self, target: &str, reason: &'static str) {
        self.aborted_total.inc(&[target, reason]);
    }

    pub fn upgrade_run(&self, target: &str, scenario: &str) {
        self.upgrade_runs_total.inc(&[target, scenario]);
    }

    pub fn set_backoff(&self, target: &str, seconds: f64) {
        self.backoff.set(&[target], seconds);
    }

    /// Forgets back-offs, periods and SLOs before a reload declares them again.
    pub fn reset(&self) {
        self.backoff.reset();
        self.interval.reset();
        self.slo.reset();
    }
}
