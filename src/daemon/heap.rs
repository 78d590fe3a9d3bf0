//! Gives glibc's freed heap pages back to the kernel every few seconds.
//!
//! The daemon's own allocations go to jemalloc (the binary's allocator
//! module), which gives unused pages back after a second by itself;
//! glibc's malloc still serves SQLite and the C libraries, and keeps what
//! they free inside its arenas. `malloc_trim` hands every whole free page
//! back. In test binaries, where glibc serves everything, it does the
//! same for all of it.

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
