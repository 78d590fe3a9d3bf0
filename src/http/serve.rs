//! Serving the exporter's connections within the process's means: at most
//! `max_connections` at once (kept below the file-descriptor limit, so the
//! probes always have descriptors left), the oldest silent connection
//! closed when a newcomer finds them all taken, a client that does not
//! finish its request header within `header_timeout` dropped, a failed
//! `accept` counted and retried instead of ending the server, and open
//! connections drained within a deadline at shutdown.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

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

/// The exporter's connections that are between requests (or have not
/// sent one yet), oldest first. When every slot is taken, the oldest of
/// them is closed to make room for the newcomer, as nginx reuses idle
/// connections: a crowd of silent or half-sent requests costs the real
/// clients nothing, where before each waited out the header timeout of
/// those ahead of it. A connection with a request in flight is never
/// closed this way.
#[derive(Default)]
struct Idle {
    next_seq: u64,
    by_age: BTreeMap<u64, CancellationToken>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Idle {
    /// Closes the oldest idle connection; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        match self.by_age.pop_first() {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// One connection's entry in [`Idle`].
struct Place {
    idle: Arc<Mutex<Idle>>,
    evicted: CancellationToken,
    seq: Mutex<Option<u64>>,
}

impl Place {
    fn new(idle: Arc<Mutex<Idle>>) -> Arc<Place> {
        let place = Arc::new(Place {
            idle,
            evicted: CancellationToken::new(),
            seq: Mutex::new(None),
        });
        place.set_idle();
        place
    }

    fn set_idle(&self) {
        let mut seq = lock(&self.seq);
        let mut idle = lock(&self.idle);
        idle.next_seq += 1;
        let at = idle.next_seq;
        idle.by_age.insert(at, self.evicted.clone());
        *seq = Some(at);
    }

    fn set_busy(&self) {
        let mut seq = lock(&self.seq);
        if let Some(at) = seq.take() {
            lock(&self.idle).by_age.remove(&at);
        }
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
    tls: impl Fn() -> Option<TlsAcceptor> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let idle = Arc::new(Mutex::new(Idle::default()));
    let graceful = GracefulShutdown::new();
    loop {
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
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !lock(&idle).evict_oldest() {
                    tracing::debug!("every exporter connection has a request in flight");
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(s) => s,
                        Err(_) => break,
                    },
                    _ = shutdown.cancelled() => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let place = Place::new(idle.clone());
        let exchange = exchange(
            stream,
            tls(),
            app.clone(),
            place.clone(),
            limits.header_timeout,
            graceful.watcher(),
        );
        tokio::spawn(async move {
            tokio::select! {
                () = exchange => {}
                () = place.evicted.cancelled() => {}
            }
            place.set_busy();
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

/// One connection: the TLS handshake when the port speaks TLS (within
/// the header timeout; a client speaking plain HTTP fails it and is
/// closed), then HTTP/1 with the place marked busy while a request is in
/// flight.
async fn exchange(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    app: Router,
    place: Arc<Place>,
    header_timeout: Duration,
    watcher: Watcher,
) {
    match tls {
        None => serve_http(stream, app, place, header_timeout, watcher).await,
        Some(acceptor) => {
            match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_http(stream, app, place, header_timeout, watcher).await,
                Ok(Err(e)) => tracing::debug!(error = %e, "exporter TLS handshake failed"),
                Err(_) => tracing::debug!("exporter TLS handshake timed out"),
            }
        }
    }
}

async fn serve_http<I>(
    io: I,
    app: Router,
    place: Arc<Place>,
    header_timeout: Duration,
    watcher: Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = tower::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let (app, place) = (app.clone(), place.clone());
        async move {
            place.set_busy();
            let response = app.oneshot(request).await;
            place.set_idle();
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let _ = watcher.watch(connection).await;
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
