//! A small round-robin reverse proxy in front of simulated replicas: the
//! demo's stand-in for a Kubernetes Service. Each request goes to the next
//! upstream in turn; the answer streams back chunk by chunk, so SSE timing
//! is preserved, with a header naming the upstream that served it (as
//! nginx's `$upstream_addr` or a gateway's destination endpoint).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

/// The response header naming the upstream (`host:port`) that served.
pub const UPSTREAM_HEADER: &str = "x-upstream";

/// Requests larger than this are refused: the demo's prompts are small.
const MAX_BODY_BYTES: usize = 16 << 20;

struct Upstreams {
    urls: Vec<String>,
    next: AtomicUsize,
    http: reqwest::Client,
}

/// A proxy running in the background of the current runtime.
pub struct ProxyHandle {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl ProxyHandle {
    /// Binds `addr` (port 0 for any) and forwards to `upstreams` (base
    /// URLs) in turn.
    pub async fn start(addr: &str, upstreams: Vec<String>) -> std::io::Result<ProxyHandle> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let http = crate::client::http::client_builder()
            .no_proxy()
            .build()
            .map_err(std::io::Error::other)?;
        let state = Arc::new(Upstreams {
            urls: upstreams,
            next: AtomicUsize::new(0),
            http,
        });
        let app = axum::Router::new().fallback(forward).with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ProxyHandle { addr, task })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Headers that belong to one connection, not to the request.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn forward(State(up): State<Arc<Upstreams>>, request: Request) -> Response {
    if up.urls.is_empty() {
        return (StatusCode::BAD_GATEWAY, "no upstream\n").into_response();
    }
    let i = up.next.fetch_add(1, Ordering::Relaxed) % up.urls.len();
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request too large\n").into_response();
    };
    let mut outgoing = up
        .http
        .request(parts.method, format!("{}{path}", up.urls[i]))
        .body(body);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    match outgoing.send().await {
        Ok(answer) => {
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                if !hop_by_hop(name) {
                    response = response.header(name, value);
                }
            }
            let upstream = up.urls[i]
                .split_once("://")
                .map_or(up.urls[i].as_str(), |(_, a)| a);
            response = response.header(UPSTREAM_HEADER, upstream);
            response
                .body(Body::from_stream(answer.bytes_stream()))
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
        }
        Err(_) => (StatusCode::BAD_GATEWAY, "upstream unreachable\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimConfig, SimHandle};

    #[tokio::test]
    async fn requests_alternate_between_the_upstreams() {
        let a = SimHandle::start(
            "127.0.0.1:0",
            SimConfig {
                version: "1.0.0".into(),
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let b = SimHandle::start(
            "127.0.0.1:0",
            SimConfig {
                version: "2.0.0".into(),
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let proxy = ProxyHandle::start("127.0.0.1:0", vec![a.base_url(), b.base_url()])
            .await
            .unwrap();
        let mut seen = Vec::new();
        let mut served = Vec::new();
        for _ in 0..4 {
            let answer = reqwest::get(format!("{}/version", proxy.base_url()))
                .await
                .unwrap();
            served.push(
                answer.headers()[UPSTREAM_HEADER]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
            let v: serde_json::Value = answer.json().await.unwrap();
            seen.push(v["version"].as_str().unwrap().to_owned());
        }
        assert_eq!(seen, ["1.0.0", "2.0.0", "1.0.0", "2.0.0"]);
        let (a, b) = (a.addr.to_string(), b.addr.to_string());
        assert_eq!(served, [a.clone(), b.clone(), a.clone(), b]);
    }
}
