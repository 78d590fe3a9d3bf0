//! `[targets.heartbeat]`: the tiny generation request that tells, between
//! runs, whether a target (and each replica) still generates.

use std::time::Duration;

use super::reader::{Errors, Fields};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeartbeatConfig {
    pub enabled: bool,
    /// Between two heartbeats (or the evidence of a run's requests).
    pub interval: Duration,
    /// No first token within this long: the target is not generating.
    pub timeout: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            enabled: true,
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(20),
        }
    }
}

/// Shortest heartbeat interval and timeout: a heartbeat is a probe, and
/// below a second it would load the server it watches.
const MIN: Duration = Duration::from_secs(1);
/// Longest: past this, "within two minutes" cannot hold.
const MAX: Duration = Duration::from_secs(3600);

pub fn heartbeat(f: &mut Fields, errors: &mut Errors) -> HeartbeatConfig {
    let mut c = HeartbeatConfig::default();
    let Some(mut h) = f.table("heartbeat", errors) else {
        return c;
    };
    if let Some(b) = h.boolean("enabled", errors) {
        c.enabled = b;
    }
    for (key, slot) in [("interval", &mut c.interval), ("timeout", &mut c.timeout)] {
        if let Some(d) = h.bounded_duration(key, MAX, errors) {
            if d < MIN {
                errors.push(
                    h.path_of(key),
                    format!("{d:?} is too short: at least {MIN:?}"),
                );
            } else {
                *slot = d;
            }
        }
    }
    h.finish(errors);
    c
}
