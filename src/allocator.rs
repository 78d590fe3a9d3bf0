//! The process' memory allocator: jemalloc, with one arena, giving pages
//! unused for a second back to the kernel.
//!
//! A wave of runs (a connection and its buffers per request) briefly takes
//! about three times the daemon's steady heap, and what it frees lies
//! between long-lived series. Measured at 100 targets x 6 scenarios
//! (benches/scale.sh, anonymous memory after a minute of runs, two
//! instances side by side): glibc's malloc, trimmed every 5 s, kept
//! 33-37 MiB; jemalloc as it comes 38 MiB; with one arena and a 5-10 s
//! decay 34-37 MiB; with these options 28.5 MiB (25.7 MiB alone).
//!
//! The price is paid in the self-test at concurrency 256 (`selftest`,
//! medians of five runs): pages given back and touched again fault inside
//! measurements, and the p99 client timing error went from 0.10 to
//! 0.65 ms (TTFT) and 0.44 to 1.4 ms (ITL). Where memory matters less than
//! that fraction of a millisecond, `_RJEM_MALLOC_CONF=dirty_decay_ms:10000`
//! (jemalloc's default decay) in the environment brings the error back to
//! glibc's (0.10 and 0.31 ms) for about 10 MiB more at 100 x 6.

/// One arena and no thread caches: the daemon's threads mostly wait, and
/// arenas per CPU and a cache per thread multiply what is kept (thread
/// caches: 1.2 MiB more at 10 x 6). Purged pages go straight back to the kernel
/// (`muzzy_decay_ms:0`: lazily freed pages would still count as resident).
/// Decay runs on jemalloc's background thread, not inside whatever
/// allocation comes next, where it cost milliseconds.
const OPTIONS: &[u8] =
    b"narenas:1,tcache:false,dirty_decay_ms:1000,muzzy_decay_ms:0,background_thread:true\0";

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// jemalloc reads this C string (`const char *malloc_conf`) once, when it
// starts; it is static, NUL-terminated and never written.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &OPTIONS[0];
