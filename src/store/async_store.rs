//! The store as async code calls it: each call runs on the blocking pool
//! (SQLite blocks), a failed task comes back as the store's own error, and
//! every failure is reported once, to the handler the owner installed
//! (the daemon counts and logs it there).

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{Store, StoreError};

/// Calls on blocking threads at once. The store's one connection serves
/// one call at a time: more threads would only wait on it, each costing a
/// thread (and its allocator arena) for nothing when a hundred targets
/// file their runs together.
const THREADS: usize = 2;

/// Tries of a write that must not be lost, each waiting out SQLite's busy
/// timeout: about 35 s of another process holding the store.
pub const BUSY_TRIES: usize = 6;

/// Told about every failed call, once.
pub type ErrorHandler = Arc<dyn Fn(&StoreError) + Send + Sync>;

#[derive(Clone)]
pub struct AsyncStore {
    store: Store,
    on_error: ErrorHandler,
    threads: Arc<Semaphore>,
    /// Set when the owner stops: a refused write is not tried again.
    stopping: CancellationToken,
}

impl AsyncStore {
    pub fn new(store: Store, on_error: ErrorHandler) -> Self {
        AsyncStore {
            store,
            on_error,
            threads: Arc::new(Semaphore::new(THREADS)),
            stopping: CancellationToken::new(),
        }
    }

    /// From now on a write refused by another process holding the store
    /// is neither waited for nor tried again: a stopping daemon must end
    /// within its supervisor's grace (Kubernetes kills it 45 s after
    /// SIGTERM), and waits after a probe's own grace would outlast it.
    pub fn stop_waiting(&self) {
        // The wait first: tries woken by the cancel must not wait.
        self.store.stop_waiting_for_others();
        self.stopping.cancel();
    }

    /// Runs `work` on the store off the async threads.
    pub async fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.reported(self.call_unreported(work).await)
    }

    /// The same for a write that must not be lost (a run): one refused
    /// because another process held the store past SQLite's busy timeout
    /// (5 s) is tried again, up to [`BUSY_TRIES`] times in all, a second
    /// apart; only the last failure is reported. Between tries the
    /// connection is free for other calls. After
    /// [`AsyncStore::stop_waiting`], a try waiting for its turn is made
    /// at once and a refused one is the last.
    pub async fn call_until_free<T: Send + 'static>(
        &self,
        work: impl Fn(&Store) -> Result<T, StoreError> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        let work = Arc::new(work);
        let mut tries = 1;
        loop {
            let this_try = work.clone();
            match self.call_unreported(move |s| this_try(s)).await {
                Err(e) if e.is_busy() && tries < BUSY_TRIES && !self.stopping.is_cancelled() => {
                    tries += 1;
                    tracing::warn!(error = %e, "another process holds the store; writing again in 1 s");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = self.stopping.cancelled() => {}
                    }
                }
                result => return self.reported(result),
            }
        }
    }

    async fn call_unreported<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.threads.clone().acquire_owned().await {
            Ok(permit) => {
                self.on_thread(move |s| {
                    let _permit = permit;
                    work(s)
                })
                .await
            }
            Err(_closed) => Err(StoreError::Closed),
        }
    }

    /// `work` on a blocking thread; a panic comes back as the store's own
    /// error.
    async fn on_thread<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))
    }

    /// `result`, its failure told to the handler.
    fn reported<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result {
            (self.on_error)(e);
        }
        result
    }

    /// The same, for callers that have nothing to do with a failure but
    /// carry on (it has been reported).
    pub async fn call_or_none<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Option<T> {
        self.call(work).await.ok()
    }

    /// Waits for the calls in flight, runs `last` (the final checkpoint)
    /// as the last call, and refuses every call after it: a request that
    /// outlived the daemon's drain writes nothing after its checkpoint, or
    /// after the next daemon has taken the store.
    pub async fn close<T: Send + 'static>(
        &self,
        last: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let all = self.threads.acquire_many(THREADS as u32).await;
        // Closed before `last` runs: calls waiting now are refused rather
        // than served after it.
        self.threads.close();
        let Ok(_all) = all else {
            return Err(StoreError::Closed);
        };
        self.reported(self.on_thread(last).await)
    }

    /// The store itself, for synchronous work at start-up.
    pub fn blocking(&self) -> &Store {
        &self.store
    }

    /// Reports a failure of synchronous work on [`AsyncStore::blocking`].
    pub fn report(&self, e: &StoreError) {
        (self.on_error)(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn failures_and_panicked_tasks_are_reported_once_as_store_errors() {
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let store = AsyncStore::new(
            Store::in_memory().unwrap(),
            Arc::new(move |_| {
                s.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(store.call(|s| s.count_runs()).await.unwrap(), 0);
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        let e = store
            .call(|_| -> Result<(), StoreError> { Err(StoreError::NotFound("x".into())) })
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::NotFound(_)));
        let e = store
            .call(|_| -> Result<(), StoreError> { panic!("boom") })
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Task(_)), "{e}");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn closing_waits_for_the_calls_in_flight_and_refuses_later_ones() {
        use std::sync::Mutex;
        let order = Arc::new(Mutex::new(Vec::new()));
        let reported = Arc::new(Mutex::new(Vec::new()));
        let r = reported.clone();
        let store = AsyncStore::new(
            Store::in_memory().unwrap(),
            Arc::new(move |e: &StoreError| r.lock().unwrap().push(e.to_string())),
        );
        let (o, s) = (order.clone(), store.clone());
        let in_flight = tokio::spawn(async move {
            s.call(move |_| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                o.lock().unwrap().push("in flight");
                Ok(())
            })
            .await
        });
        // The call has its thread before the store is closed.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let o = order.clone();
        let closed = store
            .close(move |s| {
                o.lock().unwrap().push("last");
                s.count_runs()
            })
            .await;
        assert_eq!(closed.unwrap(), 0);
        in_flight.await.unwrap().unwrap();
        assert_eq!(*order.lock().unwrap(), ["in flight", "last"]);
        let after = store.call(|s| s.count_runs()).await;
        assert!(matches!(after, Err(StoreError::Closed)), "{after:?}");
        assert!(matches!(
            store.close(|s| s.count_runs()).await,
            Err(StoreError::Closed)
        ));
        // A last call that fails is reported, as any call's failure is; a
        // refusal is no failure of the store.
        let other = AsyncStore::new(Store::in_memory().unwrap(), {
            let r = reported.clone();
            Arc::new(move |e: &StoreError| r.lock().unwrap().push(e.to_string()))
        });
        let failed = other
            .close(|_| -> Result<(), StoreError> { Err(StoreError::Task("checkpoint".into())) })
            .await;
        assert!(failed.is_err());
        let reported = reported.lock().unwrap().clone();
        assert_eq!(
            reported.last().map(String::as_str),
            Some("store task failed: checkpoint")
        );
        assert!(!StoreError::Closed.is_failure());
    }

    /// A stopping daemon's write refused by another process holding the
    /// store is not tried again (it would be, 6 times over about 35 s),
    /// nor waited for (SQLite's busy timeout goes from 5 s to none):
    /// tried once, the refusal reported.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_is_not_tried_again_once_stopping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let reported = Arc::new(AtomicUsize::new(0));
        let r = reported.clone();
        let store = AsyncStore::new(
            Store::open(&path).unwrap(),
            Arc::new(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let busy_timeout_ms = || -> i64 {
            let conn = store.blocking().lock();
            conn.query_row("PRAGMA busy_timeout", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(busy_timeout_ms(), 5000);
        store.stop_waiting();
        assert_eq!(busy_timeout_ms(), 0);
        let tries = Arc::new(AtomicUsize::new(0));
        let t = tries.clone();
        let refused = store
            .call_until_free(move |s| {
                t.fetch_add(1, Ordering::SeqCst);
                s.prune(chrono::Utc::now(), std::time::Duration::from_secs(3600))
            })
            .await
            .unwrap_err();
        assert!(refused.is_busy(), "{refused}");
        assert_eq!(tries.load(Ordering::SeqCst), 1);
        assert_eq!(reported.load(Ordering::SeqCst), 1);
        holder.execute_batch("COMMIT").unwrap();
    }
}
