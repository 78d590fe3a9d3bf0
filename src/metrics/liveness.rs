//! Whether each target (and replica) generates: the liveness state fed by
//! heartbeats and by runs' requests in flight, the heartbeats counted by
//! outcome, the last heartbeat's TTFT and the time of the last token.
//! `replica` is empty for the target's service, as on run series.

use super::MetricsError;
use super::page::{Counters, Gauges, Page};
use crate::client::Outcome;
use crate::verdict::liveness::{Generating, LiveState};

/// The heartbeat outcomes every target and replica shows from the start.
const DECLARED: [Outcome; 3] = [Outcome::Ok, Outcome::NoFirstToken, Outcome::Connect];

pub struct LivenessMetrics {
    generating: Gauges,
    answering: Gauges,
    heartbeats: Counters,
    heartbeat_ttft: Gauges,
    last_token: Gauges,
}

impl LivenessMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        let per = &["target", "replica"];
        Ok(LivenessMetrics {
            generating: page.gauges(
                "sentinel_target_generating",
                "1 while the target (or replica) generates: its last heartbeat, or a request of a run in flight, got a token within the heartbeat timeout; 0 when it did not (see sentinel_target_answering).",
                per,
            )?,
            answering: page.gauges(
                "sentinel_target_answering",
                "1 while the target (or replica) answers HTTP; with sentinel_target_generating 0, the engine is wedged behind a live API server.",
                per,
            )?,
            heartbeats: page.counters(
                "sentinel_heartbeats_total",
                "Heartbeats (a one-token generation request) by how they ended.",
                &["target", "replica", "outcome"],
            )?,
            heartbeat_ttft: page.gauges(
                "sentinel_heartbeat_ttft_seconds",
                "Time to first token of the last heartbeat that got one.",
                per,
            )?,
            last_token: page.gauges(
                "sentinel_target_last_token_timestamp_seconds",
                "When the target (or replica) last generated a token for a heartbeat or a run.",
                per,
            )?,
        })
    }

    /// Creates the heartbeat counters of a target or replica at 0.
    pub fn declare(&self, target: &str, replica: &str) {
        for o in DECLARED {
            self.heartbeats.declare(&[target, replica, o.as_str()]);
        }
    }

    pub fn heartbeat(&self, target: &str, replica: &str, outcome: Outcome) {
        self.heartbeats.inc(&[target, replica, outcome.as_str()]);
    }

    /// The state as it is now.
    pub fn set_state(&self, target: &str, replica: &str, state: &LiveState) {
        let labels = [target, replica];
        if let Some(s) = state.state {
            let generating = s == Generating::Generating;
            self.generating
                .set(&labels, if generating { 1.0 } else { 0.0 });
            self.answering
                .set(&labels, if s == Generating::Down { 0.0 } else { 1.0 });
        }
        if let Some(t) = state.heartbeat_ttft_s {
            self.heartbeat_ttft.set(&labels, t);
        }
        if let Some(at) = state.last_token_at {
            self.last_token
                .set(&labels, at.timestamp_millis() as f64 / 1000.0);
        }
    }

    /// A replica gone from the list loses its series.
    pub fn remove_replica(&self, target: &str, replica: &str) {
        let gone = |labels: &std::collections::HashMap<&str, &str>| {
            labels.get("replica") == Some(&replica)
        };
        for family in [
            self.generating.family(),
            self.answering.family(),
            self.heartbeats.family(),
            self.heartbeat_ttft.family(),
            self.last_token.family(),
        ] {
            family.remove_of_target(target, &gone);
        }
    }
}
