//! The simulated server process: when it started and how many generation
//! requests it has served since, so that a restart (`POST /admin/restart`,
//! same configuration) shows as a real one does: a new
//! `process_start_time_seconds` on `/metrics`, and its first requests cold
//! ([`super::SimConfig::cold_requests`]).

use std::sync::Arc;
use std::sync::Mutex;

use axum::extract::State;

use super::{SimConfig, SimState};

/// The process's start and its requests since.
pub struct Process {
    started: Mutex<Started>,
}

struct Started {
    /// Unix seconds, as `process_start_time_seconds` gives them.
    unix_s: f64,
    served: u64,
}

fn now_s() -> f64 {
    let now = crate::clock::Clock::System.now();
    now.timestamp() as f64 + f64::from(now.timestamp_subsec_micros()) / 1e6
}

impl Default for Process {
    fn default() -> Self {
        Process {
            started: Mutex::new(Started {
                unix_s: now_s(),
                served: 0,
            }),
        }
    }
}

impl Process {
    fn lock(&self) -> std::sync::MutexGuard<'_, Started> {
        self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the process started, in Unix seconds.
    pub fn started_s(&self) -> f64 {
        self.lock().unix_s
    }

    /// Starts again: a start time later than the last (two restarts within
    /// a clock tick are still two), no request served yet.
    pub fn restart(&self) -> f64 {
        let mut started = self.lock();
        started.unix_s = now_s().max(started.unix_s + 0.001);
        started.served = 0;
        started.unix_s
    }

    /// Counts one generation request and returns how many times slower
    /// than configured it is served: `cold_factor` for the first
    /// `cold_requests` since the start, else 1.
    pub fn next_request(&self, config: &SimConfig) -> f64 {
        let mut started = self.lock();
        started.served += 1;
        match started.served <= config.cold_requests {
            true => config.cold_factor.max(0.0),
            false => 1.0,
        }
    }
}

/// `POST /admin/restart`: the process starts again with its configuration.
pub(super) async fn restart(State(sim): State<Arc<SimState>>) -> axum::Json<serde_json::Value> {
    let started = sim.process.restart();
    axum::Json(serde_json::json!({ "process_start_time_seconds": started }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_a_later_start_whose_first_requests_are_cold() {
        let process = Process::default();
        let config = SimConfig {
            cold_requests: 2,
            cold_factor: 3.0,
            ..SimConfig::default()
        };
        let factors: Vec<f64> = (0..3).map(|_| process.next_request(&config)).collect();
        assert_eq!(factors, [3.0, 3.0, 1.0]);
        let first = process.started_s();
        let second = process.restart();
        assert!(second > first, "{second} after {first}");
        assert!(process.restart() > second, "twice within a tick");
        assert_eq!(process.next_request(&config), 3.0, "cold again");
        let warm = SimConfig::default();
        assert_eq!(process.next_request(&warm), 1.0, "no cold start configured");
    }
}
