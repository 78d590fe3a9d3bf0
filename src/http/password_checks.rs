//! The bcrypt checks behind the exporter's basic auth, bounded for the
//! daemon's whole life (reloads included): at most [`MAX_CHECKS_AT_ONCE`]
//! run at once, each on a thread of its own that holds its turn until
//! bcrypt returns, so a client that hangs up mid-check frees nothing early
//! and a crowd of them cannot start more. A login that finds every turn
//! taken waits [`MAX_WAIT`] at most, then is told to come back; once the
//! daemon is stopping, no login waits for a turn or a check at all, so the
//! exporter's drain never waits on bcrypt.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// bcrypt checks running at once: a flood of wrong passwords costs two
/// cores' worth of work at most, not every core.
pub const MAX_CHECKS_AT_ONCE: usize = 2;

/// Longest a login waits for its turn before it is refused as busy.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Right,
    Wrong,
    /// Not checked: every turn stayed taken for [`MAX_WAIT`], no thread
    /// could be started, or the daemon is stopping.
    Unchecked,
}

/// The turns and the count of checks run.
pub struct PasswordChecks {
    turns: Arc<Semaphore>,
    max_wait: Duration,
    /// Called as each check starts (the daemon counts them on `/metrics`).
    on_check: Arc<dyn Fn() + Send + Sync>,
    /// The daemon's shutdown.
    stopping: CancellationToken,
}

impl PasswordChecks {
    pub fn new(
        stopping: CancellationToken,
        on_check: impl Fn() + Send + Sync + 'static,
    ) -> PasswordChecks {
        PasswordChecks::with_bounds(MAX_CHECKS_AT_ONCE, MAX_WAIT, stopping, on_check)
    }

    pub fn with_bounds(
        at_once: usize,
        max_wait: Duration,
        stopping: CancellationToken,
        on_check: impl Fn() + Send + Sync + 'static,
    ) -> PasswordChecks {
        PasswordChecks {
            turns: Arc::new(Semaphore::new(at_once.max(1))),
            max_wait,
            on_check: Arc::new(on_check),
            stopping,
        }
    }

    /// Checks `password` against the bcrypt `hash` once a turn is free.
    ///
    /// The check runs on a thread of its own rather than tokio's blocking
    /// pool: the runtime waits for that pool's tasks when it shuts down,
    /// and a daemon told to stop must not wait on a stranger's login.
    /// Dropping the returned future before the turn comes starts nothing;
    /// dropping it later leaves the check to finish with its turn held.
    pub async fn verify(&self, password: String, hash: String) -> Checked {
        let waited = tokio::select! {
            waited = tokio::time::timeout(self.max_wait, self.turns.clone().acquire_owned()) => waited,
            () = self.stopping.cancelled() => return Checked::Unchecked,
        };
        let Ok(Ok(turn)) = waited else {
            return Checked::Unchecked;
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let on_check = self.on_check.clone();
        let started = std::thread::Builder::new()
            .name("bcrypt-check".into())
            .spawn(move || {
                on_check();
                let right = bcrypt::verify(password, &hash).unwrap_or(false);
                drop(turn);
                let _ = answer.send(right);
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start a thread to check an exporter password");
            return Checked::Unchecked;
        }
        tokio::select! {
            answer = answered => match answer {
                Ok(true) => Checked::Right,
                _ => Checked::Wrong,
            },
            () = self.stopping.cancelled() => Checked::Unchecked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counted(at_once: usize, max_wait: Duration) -> (Arc<PasswordChecks>, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let checks =
            PasswordChecks::with_bounds(at_once, max_wait, CancellationToken::new(), move || {
                counter.fetch_add(1, Ordering::SeqCst);
            });
        (Arc::new(checks), runs)
    }

    #[tokio::test]
    async fn right_and_wrong_passwords() {
        let (checks, runs) = counted(2, Duration::from_secs(5));
        let hash = bcrypt::hash("secret", 4).unwrap();
        assert_eq!(
            checks.verify("secret".into(), hash.clone()).await,
            Checked::Right
        );
        assert_eq!(checks.verify("guess".into(), hash).await, Checked::Wrong);
        assert_eq!(
            checks.verify("x".into(), "not a hash".into()).await,
            Checked::Wrong
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// Logins dropped while they wait start no check; one dropped during
    /// its check keeps its turn until bcrypt returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_logins_start_nothing_and_free_no_turn_early() {
        let (checks, runs) = counted(1, Duration::from_secs(30));
        // Cost 12: a few hundred milliseconds, still running when looked at.
        let hash = bcrypt::hash("secret", 12).unwrap();
        let mut logins = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let (checks, hash) = (checks.clone(), hash.clone());
            logins.spawn(async move { checks.verify("guess".into(), hash).await });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        logins.abort_all();
        while logins.join_next().await.is_some() {}
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "only the first had its turn"
        );
        // The dropped login's check still holds the only turn: a login now
        // waits for it rather than running beside it.
        let busy = PasswordChecks {
            turns: checks.turns.clone(),
            max_wait: Duration::ZERO,
            on_check: checks.on_check.clone(),
            stopping: CancellationToken::new(),
        };
        assert_eq!(
            busy.verify("guess".into(), hash.clone()).await,
            Checked::Unchecked
        );
        assert_eq!(
            checks.verify("secret".into(), hash).await,
            Checked::Right,
            "the turn comes back when bcrypt returns"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    /// Once the daemon stops, no login waits: not for a turn, not for a
    /// check under way (which goes on, holding its turn, on its thread).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_ends_every_wait() {
        let stopping = CancellationToken::new();
        let checks = Arc::new(PasswordChecks::with_bounds(
            1,
            Duration::from_secs(60),
            stopping.clone(),
            || {},
        ));
        // Cost 14: about a second of a core, far longer than this test.
        let cheap = bcrypt::hash("secret", 4).unwrap();
        let slow = format!("$2b$14${}", &cheap[7..]);
        let logins: Vec<_> = (0..3)
            .map(|_| {
                let (checks, slow) = (checks.clone(), slow.clone());
                tokio::spawn(async move { checks.verify("guess".into(), slow).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        stopping.cancel();
        for login in logins {
            assert_eq!(login.await.unwrap(), Checked::Unchecked);
        }
        assert_eq!(
            Arc::strong_count(&checks.turns),
            2,
            "the check under way still holds its turn"
        );
    }
}
