//! A worker's back-off: how long a target (or replica) found down, or
//! asking for a pause, is left alone, and where that shows (the schedule
//! gauge and the status board).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Backoff, Runs, Worker};
use crate::config::Config;
use crate::daemon::execute::RunEnd;

/// Whether a target is backed off after it was found down.
#[derive(Debug, Default)]
pub(super) struct DownState {
    pub(super) backoff: Option<Backoff>,
    pub(super) until: Option<DateTime<Utc>>,
    /// Until when the server asked to be left alone (`Retry-After`).
    pub(super) asked_until: Option<DateTime<Utc>>,
}

impl DownState {
    pub(super) fn backing_off(&self, now: DateTime<Utc>) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Whether a `Retry-After` still holds: it binds heartbeats too.
    pub(super) fn asked_to_wait(&self, now: DateTime<Utc>) -> bool {
        self.asked_until.is_some_and(|until| now < until)
    }
}

impl<R: Runs> Worker<R> {
    /// Grows the back-off after a run that found the target down, clears
    /// it after one that reached it. A server that asked for a pause
    /// (`Retry-After` on a 429 or 503) gets at least that long.
    pub(super) fn after(&self, config: &Config, down: &mut DownState, end: RunEnd) {
        let name = &self.name;
        let replica = self.replica_label();
        let now = self.clock.now();
        let outcome = end.outcome;
        if let Some(pause) = end.retry_after.filter(|p| !p.is_zero()) {
            let until = now + chrono::Duration::from_std(pause).unwrap_or_default();
            down.asked_until = Some(down.asked_until.map_or(until, |u| u.max(until)));
            if down.until.is_none_or(|u| u < until) {
                tracing::warn!(target = %name, replica, retry_after = ?pause, "the server asked for a pause (Retry-After); honouring it");
                down.until = Some(until);
                self.show_backoff(pause, down.until);
            }
            if !outcome.target_down() {
                return;
            }
        }
        if outcome.target_down() {
            let mut b = down.backoff.unwrap_or(Backoff {
                initial: config.scheduler.backoff_initial,
                max: config.scheduler.backoff_max,
                failures: 0,
            });
            b.failures += 1;
            let delay = b.delay();
            tracing::warn!(target = %name, replica, failures = b.failures, backoff = ?delay, "target down; backing off");
            let until = now + chrono::Duration::from_std(delay).unwrap_or_default();
            down.until = Some(down.until.map_or(until, |u| u.max(until)));
            self.show_backoff(delay, down.until);
            down.backoff = Some(b);
        } else if down.backoff.is_some() {
            tracing::info!(target = %name, replica, "target answers again; back-off cleared");
            *down = DownState::default();
            self.show_backoff(Duration::ZERO, None);
        }
    }

    /// The service's back-off is the target's (gauge and board); a
    /// replica's shows on its own line of the board.
    fn show_backoff(&self, delay: Duration, until: Option<DateTime<Utc>>) {
        match &self.replica {
            None => {
                self.metrics
                    .schedule
                    .set_backoff(&self.name, delay.as_secs_f64());
                self.board.set_backoff(&self.name, until);
            }
            Some(r) => self.board.set_replica_backoff(&self.name, &r.label, until),
        }
    }
}
