//! One worker's liveness: the evidence of its heartbeats and of its runs'
//! requests in flight goes through the state machine
//! ([`crate::verdict::liveness`]); each change of state is said once (a
//! wedge at WARN with what was seen, the recovery at INFO with how long
//! it lasted) and shown on `/metrics` and the status board.

use std::sync::{Arc, Mutex};

use crate::config::heartbeat::HeartbeatConfig;
use crate::metrics::Metrics;
use crate::state::TargetStates;
use crate::verdict::liveness::{Evidence, Generating, LiveState, Transition};

/// The liveness of a target's service (`replica` empty) or one replica.
pub struct Liveness {
    target: String,
    replica: String,
    state: Mutex<LiveState>,
    metrics: Arc<Metrics>,
    board: Arc<TargetStates>,
    clock: crate::clock::Clock,
}

impl Liveness {
    pub fn new(
        target: &str,
        replica: &str,
        metrics: Arc<Metrics>,
        board: Arc<TargetStates>,
        clock: crate::clock::Clock,
    ) -> Self {
        metrics.liveness.declare(target, replica);
        Liveness {
            target: target.to_owned(),
            replica: replica.to_owned(),
            state: Mutex::default(),
            metrics,
            board,
            clock,
        }
    }

    /// The state now; `None` before any evidence.
    pub fn state(&self) -> Option<Generating> {
        self.lock().state
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a service behind a fleet stays "not generating" after its
    /// last silent request: one heartbeat cycle (interval plus timeout) per
    /// replica, at least two, so that a beat reaches every replica.
    fn hold(&self, heartbeat: &HeartbeatConfig) -> std::time::Duration {
        if !self.replica.is_empty() {
            return std::time::Duration::ZERO;
        }
        match self.board.replica_count(&self.target) {
            0 => std::time::Duration::ZERO,
            n => (heartbeat.interval + heartbeat.timeout) * n.max(2) as u32,
        }
    }

    /// Takes what a heartbeat or a run's request showed now, under the
    /// target's `heartbeat` settings.
    pub fn note(&self, evidence: Evidence, heartbeat: &HeartbeatConfig) {
        let hold = self.hold(heartbeat);
        let (transition, state) = {
            let mut state = self.lock();
            let t = state.note_held(evidence, self.clock.now(), hold);
            (t, state.clone())
        };
        self.metrics
            .liveness
            .set_state(&self.target, &self.replica, &state);
        let replica = (!self.replica.is_empty()).then_some(self.replica.as_str());
        self.board.set_liveness(&self.target, replica, &state);
        if let Some(t) = transition {
            self.say(&t);
        }
    }

    /// One line per change of state.
    fn say(&self, t: &Transition) {
        let (target, replica) = (&self.target, &self.replica);
        let what = if replica.is_empty() {
            target.to_string()
        } else {
            format!("{target} replica {replica}")
        };
        match (&t.to, &t.evidence) {
            (Generating::NotGenerating, Evidence::NoToken { waited }) => tracing::warn!(
                %target, %replica, state = t.to.as_str(),
                "{what} answers but generated no token in {}: the engine is not generating{}",
                humantime::format_duration(round_s(*waited)),
                if replica.is_empty() {
                    attributed(&self.board.replicas_not_generating(target))
                } else {
                    String::new()
                }
            ),
            // The back-off that follows says it at WARN already.
            (Generating::Down, Evidence::Unreachable { why }) => tracing::info!(
                %target, %replica, state = t.to.as_str(), error = %why,
                "{what} does not answer"
            ),
            (Generating::Generating, _) if t.from.is_some() => {
                let outage = t
                    .outage
                    .map(|d| humantime::format_duration(round_s(d)).to_string());
                tracing::info!(
                    %target, %replica, state = t.to.as_str(), was = t.from.map(Generating::as_str),
                    outage = outage.as_deref().unwrap_or(""),
                    "{what} generates again"
                )
            }
            _ => tracing::debug!(%target, %replica, state = t.to.as_str(), "liveness"),
        }
    }
}

/// " (replicas not generating: a, b)" for a service, when it has some.
pub fn attributed(replicas: &[String]) -> String {
    if replicas.is_empty() {
        String::new()
    } else {
        format!(" (replicas not generating: {})", replicas.join(", "))
    }
}

fn round_s(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(d.as_secs_f64().round() as u64)
}

/// Runs `run`, watching its requests in flight through `progress`: a first
/// token is "generating"; a request waiting `timeout` or more for one while
/// no request of the run got a first token for as long is "not generating":
/// it is the evidence a failed heartbeat would be (the run's requests are
/// the heartbeat while it runs; the request itself is counted once, as the
/// run's) and the run is cut (`None`). One request queued behind
/// others that still get tokens is a slow server, not a wedged one.
pub async fn watch_run<T>(
    run: impl std::future::Future<Output = T>,
    progress: &crate::client::progress::RunProgress,
    liveness: &Liveness,
    heartbeat: &HeartbeatConfig,
) -> Option<T> {
    let timeout = heartbeat.timeout;
    tokio::pin!(run);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_token = None;
    loop {
        tokio::select! {
            out = &mut run => return Some(out),
            _ = tick.tick() => {
                let token = progress.last_token();
                if token.is_some() && token != last_token {
                    last_token = token;
                    liveness.note(Evidence::Token { ttft: None }, heartbeat);
                }
                let silent = progress.silent_for().is_some_and(|s| s >= timeout);
                if let Some(waited) = progress.longest_wait().filter(|w| silent && *w >= timeout) {
                    liveness.note(Evidence::NoToken { waited }, heartbeat);
                    return None;
                }
            }
        }
    }
}
