//! What a run's requests have shown so far, while it is in flight: which
//! requests wait for their first token, and since when, and when the last
//! first token came. The daemon reads it to tell a wedged engine (requests
//! accepted, no token) during a run, without waiting for the run to end.
//! Touched twice per request (sent, first token), never per chunk.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Outcome;

#[derive(Debug, Default)]
pub struct RunProgress {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    /// Requests sent that have had no first token yet, with when.
    waiting: Vec<(u64, Instant)>,
    last_token: Option<Instant>,
    first_sent: Option<Instant>,
    /// How each request that ended, ended.
    ended: Vec<Outcome>,
}

impl RunProgress {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request was sent; the ticket ends its wait on the first token, or
    /// when dropped (the request ended without one).
    pub fn sent(&self) -> Ticket<'_> {
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        let now = Instant::now();
        inner.first_sent.get_or_insert(now);
        inner.waiting.push((id, now));
        Ticket {
            progress: self,
            id: Some(id),
        }
    }

    /// How long the request waiting longest for its first token has
    /// waited, if any waits.
    pub fn longest_wait(&self) -> Option<Duration> {
        let inner = self.lock();
        inner.waiting.iter().map(|(_, at)| at.elapsed()).max()
    }

    /// How long the run has gone without a first token: since the latest
    /// one, or since its first request was sent when none came yet.
    pub fn silent_for(&self) -> Option<Duration> {
        let inner = self.lock();
        inner.last_token.or(inner.first_sent).map(|at| at.elapsed())
    }

    /// A request ended with `outcome`.
    pub fn ended(&self, outcome: Outcome) {
        self.lock().ended.push(outcome);
    }

    /// Every request sent so far, by how it ended; those still in flight
    /// (a run cut at its deadline or at shutdown) as `cut`.
    pub fn tally(&self, cut: Outcome) -> Vec<Outcome> {
        let inner = self.lock();
        let in_flight = (inner.next as usize).saturating_sub(inner.ended.len());
        let mut all = inner.ended.clone();
        all.extend(std::iter::repeat_n(cut, in_flight));
        all
    }

    /// When the latest first token came.
    pub fn last_token(&self) -> Option<Instant> {
        self.lock().last_token
    }

    fn end(&self, id: u64, token: bool) {
        let mut inner = self.lock();
        inner.waiting.retain(|(i, _)| *i != id);
        if token {
            inner.last_token = Some(Instant::now());
        }
    }
}

/// One request's wait for its first token.
pub struct Ticket<'a> {
    progress: &'a RunProgress,
    id: Option<u64>,
}

impl Ticket<'_> {
    /// The first token came.
    pub fn first_token(&mut self) {
        if let Some(id) = self.id.take() {
            self.progress.end(id, true);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.progress.end(id, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_end_with_the_first_token_or_the_request() {
        let p = RunProgress::default();
        assert_eq!(p.longest_wait(), None);
        assert_eq!(p.silent_for(), None);
        let mut a = p.sent();
        let b = p.sent();
        assert!(p.longest_wait().is_some());
        let before = p.silent_for().unwrap();
        a.first_token();
        assert!(p.last_token().is_some());
        assert!(p.silent_for().unwrap() <= before + Duration::from_secs(1));
        drop(b);
        assert_eq!(p.longest_wait(), None);
        p.ended(Outcome::Ok);
        assert_eq!(p.tally(Outcome::Timeout), [Outcome::Ok, Outcome::Timeout]);
        drop(a);
        assert_eq!(p.longest_wait(), None);
    }
}
