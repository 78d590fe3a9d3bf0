//! The heartbeat: a one-token streaming generation request, sent between
//! runs, that must get a token within its own timeout. It is what tells a
//! wedged engine (the API server answers `/health`, nothing is generated)
//! from a working one, whatever the probe schedule. A request that gets no
//! token is followed by a `/health` read: an answer there means "not
//! generating", none means "down".

use std::time::Duration;

use crate::client::record::PreparedRequest;
use crate::client::server_api::ServerApi;
use crate::client::{
    Capture, ClientConfig, Outcome, RequestHeaders, Secret, StreamingClient, Timeouts,
};
use crate::config::TargetConfig;
use crate::config::heartbeat::HeartbeatConfig;
use crate::verdict::liveness::Evidence;
use crate::vocabulary::outcome::Blame;

/// How a heartbeat ended: its request's outcome (counted), and what it
/// shows of the server's liveness (`None`: nothing, such as a refused key).
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatEnd {
    pub outcome: Outcome,
    pub evidence: Option<Evidence>,
    /// The server went silent (no first token, a stall): a wedge, whose
    /// recovery later heartbeats look for even while the target is backed
    /// off. A server that answered an error is backed off like its runs.
    pub silent: bool,
    /// The `Retry-After` of a 429 or 503 answer.
    pub retry_after: Option<Duration>,
}

impl HeartbeatEnd {
    /// An end that is not a silence and asks for no wait.
    fn answered(outcome: Outcome, evidence: Option<Evidence>) -> Self {
        HeartbeatEnd {
            outcome,
            evidence,
            silent: false,
            retry_after: None,
        }
    }
}

/// What a heartbeat prompt says: a few tokens on any tokenizer.
const PROMPT: &str = "Say hi.";

/// Sends one heartbeat to `target` (its service, or one replica as
/// `TargetConfig::at_replica` gives it). `model` as the worker knows it;
/// `None`: the first `/v1/models` lists.
pub async fn beat(
    http: &reqwest::Client,
    target: &TargetConfig,
    model: Option<&str>,
    key: Option<Secret>,
    headers: &RequestHeaders,
    config: &HeartbeatConfig,
    request_id: String,
) -> HeartbeatEnd {
    let connect = target.timeouts.connect;
    let model = match model {
        Some(m) => m.to_owned(),
        None => match find_model(
            http,
            target,
            key.as_ref(),
            headers,
            connect + config.timeout,
        )
        .await
        {
            Ok(m) => m,
            Err(end) => return end,
        },
    };
    let client = StreamingClient::new(ClientConfig {
        base_url: target.base_url.clone(),
        endpoint: target.endpoint,
        model,
        api_key: key,
        timeouts: Timeouts {
            connect,
            first_token: config.timeout,
            stall: config.timeout,
            request: config.timeout + Duration::from_secs(5),
        },
        // Any first token will do: no exact length to check.
        ignore_eos: false,
        min_tokens: false,
        capture: Capture::None,
        extra: None,
        check: None,
        progress: None,
        headers: headers.clone(),
        gateway: target.gateway_rules(),
        build_header: None,
    });
    let client = match client {
        Ok(c) => c,
        // Counted as `local` in sentinel_heartbeats_total, like a run's.
        Err(_) => return HeartbeatEnd::answered(Outcome::Local, None),
    };
    let request = PreparedRequest {
        index: 0,
        request_id,
        prompt: PROMPT.into(),
        messages: None,
        max_tokens: 1,
        turn: None,
    };
    let record = client.send(&request, None).await;
    if let Some(ttft) = record.ttft() {
        return HeartbeatEnd::answered(Outcome::Ok, Some(Evidence::Token { ttft: Some(ttft) }));
    }
    let why = record.error.clone().unwrap_or_default();
    // A key or model refused, a gateway shedding the request before any
    // engine saw it, our own resources running out: nothing of the
    // engine. Silence, a server error or a garbled stream: no token, and
    // whether the server still answers decides between not generating
    // and not answering.
    let evidence = match record.outcome.blame() {
        Blame::Nothing => None,
        Blame::Unreachable => Some(Evidence::Unreachable { why }),
        Blame::Silent | Blame::Garbled => Some(if answers(http, target, connect).await {
            Evidence::NoToken {
                waited: record
                    .end
                    .saturating_duration_since(record.start)
                    .max(Duration::from_millis(1)),
            }
        } else {
            Evidence::Unreachable { why }
        }),
    };
    HeartbeatEnd {
        outcome: record.outcome,
        evidence,
        silent: record.server_silent,
        retry_after: record.retry_after,
    }
}

/// The model to ask for, or how the heartbeat ended without one.
async fn find_model(
    http: &reqwest::Client,
    target: &TargetConfig,
    key: Option<&Secret>,
    headers: &RequestHeaders,
    timeout: Duration,
) -> Result<String, HeartbeatEnd> {
    let api = ServerApi::with_client(http.clone(), &target.base_url, key, timeout)
        .map_err(|_| HeartbeatEnd::answered(Outcome::Local, None))?
        .with_headers(headers.clone());
    api.resolve_model(None).await.map(|m| m.id).map_err(|e| {
        // A server without a model list to give refused the heartbeat.
        let outcome = e.outcome().unwrap_or(Outcome::Http4xx);
        // Not answering the model list (refused, or no answer in time) is
        // not answering; anything else it answered shows nothing of the
        // engine.
        let unreachable = matches!(outcome, Outcome::Connect | Outcome::Timeout);
        let evidence = unreachable.then(|| Evidence::Unreachable { why: e.to_string() });
        HeartbeatEnd::answered(outcome, evidence)
    })
}

/// Whether the server's `/health` answers without a server error: a
/// wedged engine's API server says 200 (a gateway without the route, 404
/// or 401: it is there too); a balancer with nothing behind it answers 502
/// or 503, and a server that knows its engine died 5xx: down, not wedged.
async fn answers(http: &reqwest::Client, target: &TargetConfig, timeout: Duration) -> bool {
    let url = format!("{}/health", target.base_url.trim_end_matches('/'));
    http.get(url)
        .timeout(timeout.max(Duration::from_secs(2)))
        .send()
        .await
        .is_ok_and(|r| !r.status().is_server_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model lookup's failures are counted as a run's are: an address
    /// that refuses is unreachable; a server answering what is not a model
    /// list is there (a garbled answer), and shows nothing of its engine.
    #[tokio::test]
    async fn a_failed_model_lookup_is_counted_as_a_runs_would_be() {
        use axum::{Router, routing::get};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new().route("/v1/models", get(|| async { "<html>hello</html>" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let lookup = async |base_url: &str| {
            let config = crate::config::Config::from_text(
                &format!(
                    "[[targets]]\nname = \"t\"\nbase_url = \"{base_url}\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\n"
                ),
                "the test configuration",
            )
            .unwrap();
            let target = config.target("t").unwrap().clone();
            let http = reqwest::Client::new();
            let timeout = Duration::from_secs(5);
            find_model(&http, &target, None, &RequestHeaders::default(), timeout)
                .await
                .unwrap_err()
        };
        let refused = lookup(&closed).await;
        assert_eq!(refused.outcome, Outcome::Connect);
        assert!(matches!(
            refused.evidence,
            Some(Evidence::Unreachable { .. })
        ));
        let garbled = lookup(&live).await;
        assert_eq!(garbled.outcome, Outcome::StreamError);
        assert!(garbled.evidence.is_none());
    }
}
