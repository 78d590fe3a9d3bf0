//! Serving the exporter's connections within the process's means: at most
//! `max_connections` at once (kept below the file-descriptor limit, so the
//! probes always have descriptors left), a client that does not finish
//! its request header within `header_timeout` is dropped, a failed
//! `accept` is counted and retried instead of ending the server, and
//! shutdown drains open connections within a deadline.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Limits of the exporter's connections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// How long open connections may finish their answers at shutdown.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The soft limit on open file descriptors of this process.
pub fn descriptor_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// The connection limit for a descriptor limit: a quarter of it (the rest
/// is for probes, scrapes, the store and notifications), between 8 and
/// `wanted`.
pub fn connection_limit(descriptors: Option<u64>, wanted: usize) -> usize {
    match descriptors {
        Some(d) => (usize::try_from(d / 4).unwrap_or(usize::MAX)).clamp(8, wanted.max(8)),
        None => wanted,
    }
}

/// Serves `app` on `listener` until `shutdown`; `on_accept_error` counts
/// each failed accept (out of descriptors, most often).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
    on_accept_error: impl Fn(&std::io::Error) + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    loop {
        // A slot first: past the limit, connections wait in the kernel's
        // backlog instead of costing descriptors.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    on_accept_error(&e);
                    // Retrying at once would spin while descriptors are out.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN_DEADLINE) => {
            tracing::warn!("exporter connections still open after {DRAIN_DEADLINE:?}; closing them");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_stays_well_below_the_descriptors() {
        assert_eq!(connection_limit(Some(1024), 512), 256);
        assert_eq!(connection_limit(Some(1_048_576), 512), 512);
        assert_eq!(connection_limit(Some(20), 512), 8);
        assert_eq!(connection_limit(None, 512), 512);
    }
}
