//! The streaming client against servers that keep a connection busy
//! without answering, hold a finished answer open, echo a key where their
//! message is cut, or redirect elsewhere: each ends in the outcome that
//! says what happened, with no secret shown and none sent to another
//! origin.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::hostile::{HostileServer, Mode};
use vllm_sentinel::client::{Outcome, RequestHeaders, Secret, Timeouts};
use vllm_sentinel::probe::{self, ProbeSpec};

const KEY: &str = "sk-hostile-secret-0123456789";
const TENANT: &str = "tenant-token-secret-42";

fn spec(base_url: &str, num_requests: usize) -> ProbeSpec {
    ProbeSpec {
        base_url: base_url.to_owned(),
        input_len: 8,
        output_len: 4,
        num_requests,
        concurrency: Some(1),
        warmup: 0,
        calibrate: false,
        api_key: Some(Secret::new(KEY)),
        headers: RequestHeaders::new(&[("x-tenant-token".into(), Secret::new(TENANT))]).unwrap(),
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            first_token: Duration::from_secs(5),
            stall: Duration::from_millis(300),
            request: Duration::from_secs(20),
        },
        ..ProbeSpec::default()
    }
}

/// A server on 127.0.0.1 that counts the connections it is offered and
/// answers none of them: where a redirect would have led.
async fn elsewhere() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (url, accepted)
}

#[tokio::test]
async fn keep_alives_or_empty_events_after_a_token_are_a_stall_not_progress() {
    for mode in [Mode::KeepAlive, Mode::EmptyChoices] {
        let server = HostileServer::start(mode.clone()).await;
        let result = probe::run(&spec(&server.url, 3), None).await.unwrap();
        let first = &result.records[0];
        // Before the stall counted tokens, the bytes of a ping held the
        // request to its 20 s timeout, and every request after it too.
        assert_eq!(first.outcome, Outcome::Stalled, "{mode:?}: {first:?}");
        assert!(first.server_silent, "{mode:?}");
        let error = first.error.as_deref().unwrap();
        assert!(
            error.contains("stalled after 1 chunk: no token for 300ms"),
            "{mode:?}: {error}"
        );
        // A silent server ends the run: one request was sent, not three.
        assert_eq!(server.state.auth_seen.lock().unwrap().len(), 1, "{mode:?}");
    }
}

#[tokio::test]
async fn an_answer_held_open_after_done_is_a_whole_answer() {
    let server = HostileServer::start(Mode::DoneHeld).await;
    let result = probe::run(&spec(&server.url, 3), None).await.unwrap();
    let outcomes: Vec<Outcome> = result.records.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, vec![Outcome::Ok; 3]);
    assert_eq!(result.metrics.completed, 3);
    assert_eq!(result.metrics.total_output_tokens, 12);
}

#[tokio::test]
async fn a_key_echoed_where_the_message_is_cut_shows_none_of_it() {
    let server = HostileServer::start(Mode::EchoKeyAtCut).await;
    let result = probe::run(&spec(&server.url, 1), None).await.unwrap();
    let record = &result.records[0];
    assert_eq!(record.outcome, Outcome::Http4xx);
    let error = record.error.as_deref().unwrap();
    // The message was cut 12 bytes into the key: those bytes are redacted.
    assert!(error.ends_with("you sent: Bearer [redacted]…"), "{error}");
    assert!(!error.contains(&KEY[..5]), "{error}");
}

#[tokio::test]
async fn a_redirect_is_refused_and_nothing_reaches_the_other_origin() {
    let (other, accepted) = elsewhere().await;
    // A redirect of the completions: the request fails, saying where it
    // was sent and why it went no further.
    let server = HostileServer::start(Mode::Redirect(format!("{other}/steal?k=1"))).await;
    let result = probe::run(&spec(&server.url, 2), None).await.unwrap();
    for record in &result.records {
        assert_eq!(record.outcome, Outcome::StreamError);
        let error = record.error.as_deref().unwrap();
        assert!(
            error.starts_with("HTTP 307 Temporary Redirect: redirects to http://127.0.0.1:")
                && error.contains("which is not followed: point base_url at the address"),
            "{error}"
        );
        assert!(
            !error.contains("steal"),
            "only the origin is shown: {error}"
        );
    }
    // A redirect of the model list: the probe cannot start, and says why.
    server.set(Mode::RedirectModels(other.clone()));
    let Err(error) = probe::run(&spec(&server.url, 1), None).await else {
        panic!("a redirected model list is an error");
    };
    let error = error.to_string();
    assert!(
        error.contains(&format!(
            "/v1/models redirects to {other}, which is not followed"
        )),
        "{error}"
    );
    // The gateway's header and the key went to their own origin only.
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    let seen = server.state.headers_seen.lock().unwrap();
    assert!(seen.contains(&format!("x-tenant-token: {TENANT}")));
    assert!(seen.contains(&format!("authorization: Bearer {KEY}")));
}
