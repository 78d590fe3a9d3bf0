//! HTTP plumbing shared by every client of a server (the streaming probe,
//! the metadata and telemetry scrapers, webhooks): URLs, the reqwest
//! client, the sensitive auth header, errors on one line without the URL,
//! and the bounded reading of answers.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::header::HeaderValue;

use super::{ClientError, Secret, Timeouts};

/// The `Authorization` header for a key, marked sensitive so HTTP-level
/// logging never prints it.
pub fn auth_header(key: &Secret) -> Result<HeaderValue, ClientError> {
    let mut value = HeaderValue::from_str(&key.bearer()).map_err(|_| {
        ClientError::Build("the API key contains characters not allowed in a header".into())
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Joins a base URL and an absolute API path, keeping any path prefix of
/// the base (`http://gw/vllm` + `/v1/models`).
pub fn join_url(base: &str, path: &str) -> Result<reqwest::Url, ClientError> {
    let bad = |reason: String| ClientError::BadUrl {
        url: base.to_owned(),
        reason,
    };
    let parsed = reqwest::Url::parse(base).map_err(|e| bad(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https".into()));
    }
    let joined = format!("{}{}", base.trim_end_matches('/'), path);
    reqwest::Url::parse(&joined).map_err(|e| bad(e.to_string()))
}

/// One TLS configuration for every client the process builds. Each client
/// would otherwise load the platform's root certificates again (about 150
/// copied per client, and a probe builds two clients a run): megabytes and
/// a million allocations a few minutes at 100 targets. ALPN offers
/// HTTP/1.1 only: probes talk to a server as `vllm bench serve` does.
fn shared_tls() -> Option<tokio_rustls::rustls::ClientConfig> {
    use rustls_platform_verifier::BuilderVerifierExt;
    use tokio_rustls::rustls;
    static TLS: OnceLock<Option<rustls::ClientConfig>> = OnceLock::new();
    TLS.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_platform_verifier()
            .ok()?
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Some(config)
    })
    .clone()
}

/// A client builder on the shared TLS configuration (reqwest's own when
/// the platform's roots cannot be read, which then reports the problem)
/// that follows no redirect. A redirect is answered as it came: reqwest
/// would carry a gateway's secret headers (and a webhook's body) to
/// whatever origin a `307` names, and a probe that followed one would time
/// the detour, not the server.
pub fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    match shared_tls() {
        Some(tls) => builder.tls_backend_preconfigured(tls),
        None => {
            // reqwest's own configuration takes the process' default
            // provider, and the daemon's reqwest carries none: ring, as
            // everywhere else. Installed once; later calls are refused.
            let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
            builder
        }
    }
}

/// The HTTP client for one server: bounded connect, no Nagle delay (chunk
/// arrival times are what we measure), idle connections kept a minute.
pub fn build_http(timeouts: &Timeouts) -> Result<reqwest::Client, ClientError> {
    client_builder()
        .connect_timeout(timeouts.connect)
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| ClientError::Build(error_chain(&e)))
}

/// A reqwest error and its causes on one line, without the URL (which may
/// carry credentials).
pub fn error_chain(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = String::new();
    let stripped = e.to_string();
    text.push_str(stripped.split(" for url (").next().unwrap_or(&stripped));
    let mut source = e.source();
    while let Some(s) = source {
        // hyper and std repeat their cause inside their own message.
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Whether a failed request died of our own resources (descriptors,
/// memory for sockets) rather than the target's.
pub fn is_local(e: &reqwest::Error) -> bool {
    use std::error::Error as _;
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && let Some(code) = io.raw_os_error()
            && [
                nix::libc::EMFILE,
                nix::libc::ENFILE,
                nix::libc::ENOBUFS,
                nix::libc::ENOMEM,
            ]
            .contains(&code)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// Where a redirect points, for its error message: the origin only
/// (scheme, host, port), since the rest of a `Location` may carry a token;
/// `None` when the answer is not a redirect.
pub fn redirect_target(response: &reqwest::Response) -> Option<String> {
    if !response.status().is_redirection() {
        return None;
    }
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok());
    let origin = location
        .and_then(|l| response.url().join(l).ok())
        .map(|u| u.origin().ascii_serialization())
        .filter(|o| o != "null");
    Some(match origin {
        Some(origin) => crate::text::clean(&origin, crate::text::MAX_ID_LEN),
        None => "an address it does not name".into(),
    })
}

/// The sentence that says a redirect was not followed.
pub fn redirect_refused(to: &str) -> String {
    format!("redirects to {to}, which is not followed: point base_url at the address that answers")
}

/// Longest `Retry-After` honoured: a server asking for more is still
/// probed again within the hour.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// `Retry-After` of a 429 or 503 in seconds (the HTTP-date form is rare on
/// API servers and is ignored), capped.
/// The value of the response header naming the build (a digest, an image
/// name), kept only when it is short printable text: it becomes part of a
/// build, and a label.
pub fn build_tag(response: &reqwest::Response, name: &str) -> Option<String> {
    let value = response.headers().get(name)?.to_str().ok()?.trim();
    let printable = value.bytes().all(|b| b.is_ascii_graphic());
    (printable && !value.is_empty() && value.len() <= crate::text::MAX_ID_LEN)
        .then(|| value.to_owned())
}

pub fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && status != 503 {
        return None;
    }
    let seconds: u64 = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// Longest error body read from a failed response.
const ERROR_BODY_LIMIT: usize = 512;

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum BodyError {
    /// Longer than the limit: not read further, not held in memory.
    TooLong { limit: usize },
    /// The connection broke; the error on one line.
    Broken(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLong { limit } if *limit >= 1 << 20 => {
                write!(f, "the answer is longer than {} MiB", limit >> 20)
            }
            BodyError::TooLong { limit } => {
                write!(f, "the answer is longer than {} KiB", limit >> 10)
            }
            BodyError::Broken(detail) => f.write_str(detail),
        }
    }
}

/// A whole body of at most `limit` bytes, read chunk by chunk: a server
/// that sends more is refused, not a reason to grow without bound.
///
/// A declared length is refused before any byte is read when it is over
/// the limit, and otherwise allocated once. An undeclared one is copied
/// into blocks of bounded size, joined once at the end: a vector grown by
/// doubling holds up to one and a half times the limit while it moves,
/// and several reads of an endless body run at once (the telemetry's, a
/// run's and a heartbeat's); the pieces as they came would hold hyper's
/// read buffers and an entry each, however small (a body sent a byte per
/// chunk would cost tens of times its size).
pub async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let declared = response.content_length();
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLong { limit });
    }
    let first = declared.map_or(FIRST_BLOCK, |n| n as usize);
    let mut blocks = vec![Vec::with_capacity(first)];
    let mut read = 0;
    loop {
        match response.chunk().await {
            Ok(Some(mut piece)) => {
                read += piece.len();
                if read > limit {
                    return Err(BodyError::TooLong { limit });
                }
                while !piece.is_empty() {
                    let block = blocks.last_mut().expect("one block at least");
                    let room = block.capacity() - block.len();
                    if room == 0 {
                        // Blocks grow with the body, up to a bound.
                        let size = read.clamp(FIRST_BLOCK, LARGEST_BLOCK);
                        blocks.push(Vec::with_capacity(size));
                        continue;
                    }
                    block.extend_from_slice(&piece.split_to(room.min(piece.len())));
                }
            }
            Ok(None) => break,
            Err(e) => return Err(BodyError::Broken(error_chain(&e))),
        }
    }
    match <[Vec<u8>; 1]>::try_from(blocks) {
        Ok([body]) => Ok(body),
        Err(blocks) => Ok(blocks.concat()),
    }
}

/// The first block of a body whose length is not declared.
const FIRST_BLOCK: usize = 16 << 10;
/// The largest block a body is read into.
const LARGEST_BLOCK: usize = 1 << 20;

/// The message of an error answer (OpenAI `error.message`, `message` or
/// FastAPI `detail`, else the body's text), from a bounded prefix of the
/// body; empty when there is none. Not yet cleaned: the caller cleans the
/// whole error line once.
pub async fn error_message(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            _ => break,
        }
    }
    let cut = body.len() > ERROR_BODY_LIMIT;
    body.truncate(ERROR_BODY_LIMIT);
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if cut {
        // Marks the cut, where a secret's start is redacted.
        text.push('…');
    }
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("detail"))
                .and_then(|m| m.as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_join_keeps_prefix_and_rejects_bad_schemes() {
        assert_eq!(
            join_url("http://h:1/", "/v1/models").unwrap().as_str(),
            "http://h:1/v1/models"
        );
        assert_eq!(
            join_url("http://h:1/gw", "/v1/models").unwrap().as_str(),
            "http://h:1/gw/v1/models"
        );
        assert!(join_url("ftp://h", "/v1").is_err());
        assert!(join_url("not a url", "/v1").is_err());
    }

    #[test]
    fn auth_header_is_sensitive_and_rejects_unsendable_keys() {
        let header = auth_header(&Secret::new("sk-1")).unwrap();
        assert!(header.is_sensitive());
        assert_eq!(header.to_str().unwrap(), "Bearer sk-1");
        let err = auth_header(&Secret::new("bad\nkey"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not allowed in a header") && !err.contains("bad"),
            "{err}"
        );
        let api = super::super::server_api::ServerApi::new(
            "http://127.0.0.1:1",
            Some(&Secret::new("x\ny")),
            Duration::from_secs(1),
        );
        assert!(api.is_err(), "the metadata client refuses it too");
    }

    /// A server on 127.0.0.1 that answers `/chunked/N/P` with N bytes sent
    /// P at a time (no length declared), `/declared/N` with N bytes and
    /// their length, and `/promised/N` with a length of N declared and a
    /// body that never comes.
    async fn body_server() -> String {
        use axum::{Router, body::Body, extract::Path, http::header, routing::get};
        let chunked = |Path((n, piece)): Path<(usize, usize)>| async move {
            let pieces: Vec<Result<bytes::Bytes, std::io::Error>> = (0..n)
                .step_by(piece)
                .map(|at| Ok(bytes::Bytes::from(vec![b'x'; (n - at).min(piece)])))
                .collect();
            Body::from_stream(futures_util::stream::iter(pieces))
        };
        let declared = |Path(n): Path<usize>| async move { vec![b'x'; n] };
        let promised = |Path(n): Path<usize>| async move {
            let never = futures_util::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
            (
                [(header::CONTENT_LENGTH, n.to_string())],
                Body::from_stream(never),
            )
        };
        let app = Router::new()
            .route("/chunked/{n}/{piece}", get(chunked))
            .route("/declared/{n}", get(declared))
            .route("/promised/{n}", get(promised));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    #[tokio::test]
    async fn a_body_up_to_the_limit_is_read_whole_and_a_longer_one_refused() {
        let url = body_server().await;
        let limit = 40 * 1024 + 5;
        let read = async |path: &str| {
            let response = reqwest::get(format!("{url}{path}")).await.unwrap();
            read_capped(response, limit).await
        };
        // In one piece, in pieces across the blocks' edges, a byte at a
        // time, and declared.
        for kind in [
            "chunked/{}/1024",
            "chunked/{}/7",
            "chunked/{}/1",
            "declared/{}",
        ] {
            let whole = read(&format!("/{}", kind.replace("{}", &limit.to_string())))
                .await
                .unwrap();
            assert_eq!(whole.len(), limit, "{kind}");
            assert!(whole.iter().all(|&b| b == b'x'), "{kind}");
            let over = kind.replace("{}", &(limit + 1).to_string());
            let refused = read(&format!("/{over}")).await.unwrap_err();
            assert!(
                matches!(refused, BodyError::TooLong { limit: l } if l == limit),
                "{kind}: {refused}"
            );
        }
        assert!(read("/chunked/0/1").await.unwrap().is_empty());
        // A length over the limit is refused before a byte is waited for.
        let promised = format!("/promised/{}", limit + 1);
        let refused = tokio::time::timeout(Duration::from_secs(5), read(&promised))
            .await
            .expect("refused without waiting for the body");
        assert!(matches!(refused, Err(BodyError::TooLong { .. })));
    }
}
