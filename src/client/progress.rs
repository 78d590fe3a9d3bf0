//! What a run's requests have shown so far, while it is in flight: which
//! requests wait for their first token, and since when, and when the last
//! first token came. The daemon reads it to tell a wedged engine (requests
//! accepted, no token) during a run, without waiting for the run to end.
//! Touched twice per request (sent, first token), never per chunk.

use std::sync::Mutex;
use std::time::{Duration, Instant};

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
        inner.waiting.push((id, Instant::now()));
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
        let mut a = p.sent();
        let b = p.sent();
        assert!(p.longest_wait().is_some());
        a.first_token();
        assert!(p.last_token().is_some());
        drop(b);
        assert_eq!(p.longest_wait(), None);
        drop(a);
        assert_eq!(p.longest_wait(), None);
    }
}
