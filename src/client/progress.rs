//! What a run's requests have shown so far, while it is in flight: which
//! requests wait for their first token, and since when, and when the last
//! first token came. The daemon reads it to tell a wedged engine (requests
//! accepted, no token) during a run, without waiting for the run to end,
//! and what a run cut short sent (its measured requests, each as it ended).
//! Touched three times per request (sent, first token, ended), never per
//! chunk.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Outcome;
use super::record::RequestRecord;
use crate::vocabulary::records::SampleRow;

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
    /// Each measured request that ended, by its index, as the run's
    /// record keeps it.
    ended: BTreeMap<usize, SampleRow>,
    /// The number of the first measured request, once they start: what
    /// was sent before (the warm-up) is not the run's to count, and while
    /// it is under way nothing is.
    measured_from: Option<u64>,
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

    /// The measured requests start: those sent so far (the warm-up, all
    /// ended) are not the run's. Until then nothing sent is (a run cut
    /// during its warm-up measured nothing).
    pub fn measuring(&self) {
        let mut inner = self.lock();
        inner.measured_from = Some(inner.next);
        inner.ended.clear();
    }

    /// A request ended; a measured one is kept as its run's record keeps
    /// it: a run cut short has nothing else to show for it, and one that
    /// ends takes it (see [`RunProgress::take_row`]).
    pub fn ended(&self, record: &RequestRecord) {
        let mut inner = self.lock();
        if inner.measured_from.is_some() {
            inner.ended.insert(record.index, record.sample_row());
        }
    }

    /// The row kept of measured request `index` as it ended, taken out:
    /// built once per request, not again for the run's record.
    pub fn take_row(&self, index: usize) -> Option<SampleRow> {
        self.lock().ended.remove(&index)
    }

    /// Every measured request sent so far: those that ended as they
    /// ended, with their latencies; those still in flight (a run cut at
    /// its deadline, at shutdown, or for not generating) as `cut`.
    pub fn tally(&self, cut: Outcome) -> Vec<SampleRow> {
        let inner = self.lock();
        let Some(first) = inner.measured_from else {
            return Vec::new();
        };
        let sent = inner.next.saturating_sub(first) as usize;
        let in_flight = sent.saturating_sub(inner.ended.len());
        let mut all: Vec<SampleRow> = inner.ended.values().cloned().collect();
        all.extend(std::iter::repeat_n(SampleRow::cut(cut), in_flight));
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
        drop(a);
        assert_eq!(p.longest_wait(), None);
    }

    /// A request that ended after 10 ms, its first token 4 ms in.
    fn ended_request(index: usize) -> RequestRecord {
        let request = crate::client::PreparedRequest {
            index,
            request_id: format!("sentinel-test-{index}"),
            prompt: String::new(),
            messages: None,
            max_tokens: 2,
            turn: None,
        };
        let t0 = Instant::now();
        let mut r = RequestRecord::new(&request, t0, t0);
        r.chunk_times = vec![
            t0 + Duration::from_millis(4),
            t0 + Duration::from_millis(10),
        ];
        r.end = t0 + Duration::from_millis(10);
        r
    }

    /// A cut run's tally: its measured requests only (not the warm-up's),
    /// those that ended with their latencies, those in flight as cut.
    #[test]
    fn a_tally_is_of_the_measured_requests_with_their_latencies() {
        let p = RunProgress::default();
        let warmup = p.sent();
        assert!(p.tally(Outcome::Timeout).is_empty(), "cut in its warm-up");
        drop(warmup);
        p.ended(&ended_request(0));
        assert!(p.tally(Outcome::Timeout).is_empty(), "cut after it");
        p.measuring();
        let (_done, _in_flight) = (p.sent(), p.sent());
        p.ended(&ended_request(1));
        let tally = p.tally(Outcome::Timeout);
        let outcomes: Vec<Outcome> = tally.iter().map(|s| s.outcome).collect();
        assert_eq!(outcomes, [Outcome::Ok, Outcome::Timeout]);
        let ttft = tally[0].ttft_s.unwrap();
        assert!((ttft - 0.004).abs() < 1e-9, "{ttft}");
        assert_eq!((tally[1].ttft_s, tally[1].e2el_s), (None, None));
        // A run that ends takes the row kept, once.
        let row = p.take_row(1).expect("kept as it ended");
        assert_eq!(row.ttft_s, tally[0].ttft_s);
        assert!(p.take_row(1).is_none() && p.take_row(0).is_none());
    }
}
