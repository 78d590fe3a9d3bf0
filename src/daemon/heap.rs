//! Gives the heap's freed pages back to the kernel every few seconds.
//!
//! A wave of runs (a connection and its buffers per request) and each
//! `/metrics` encoding (the page text) briefly take about three times the
//! daemon's steady heap: heaptrack at 100 targets x 6 scenarios saw a 34 MB
//! peak over 11.5 MB live. glibc's malloc keeps freed chunks inside its
//! arenas, so resident memory stayed at the peak between waves (44 MiB
//! anonymous). `malloc_trim` hands every whole free page back.
//! mimalloc, tried instead, held more (70 MiB anonymous at 100 x 6,
//! 25 MiB at 10 x 6).

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Often enough that a wave's buffers are gone before the next scrape
/// (Prometheus' usual 15 s); each trim costs well under a millisecond.
const TRIM_INTERVAL: Duration = Duration::from_secs(5);

pub fn spawn_trim(shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TRIM_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            let started = Instant::now();
            let released = trim();
            tracing::trace!(released, took = ?started.elapsed(), "heap trimmed");
        }
    })
}

/// Whether any memory was released.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks;
    // it takes no pointers from us.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other allocators return memory on their own terms.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}
