//! The heartbeat: a one-token streaming generation request, sent between
//! runs, that must get a token within its own timeout. It is what tells a
//! wedged engine (the API server answers `/health`, nothing is generated)
//! from a working one, whatever the probe schedule. A request that gets no
//! token is followed by a `/health` read: an answer there means "not
//! generating", none means "down".

use std::time::Duration;

use crate::client::record::PreparedRequest;
use crate::client::server_api::{ServerApi, ServerError};
use crate::client::{
    Capture, ClientConfig, Outcome, RequestHeaders, Secret, StreamingClient, Timeouts,
};
use crate::config::TargetConfig;
use crate::config::heartbeat::HeartbeatConfig;
use crate::verdict::liveness::Evidence;

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
    let evidence = match shows(record.outcome) {
        Shows::Nothing => None,
        Shows::Unreachable => Some(Evidence::Unreachable { why }),
        Shows::NoToken => Some(if answers(http, target, connect).await {
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

/// What a heartbeat that got no first token shows of the engine.
#[derive(Debug, PartialEq)]
enum Shows {
    Nothing,
    Unreachable,
    /// It gave no token; whether the server still answers decides
    /// between not generating and not answering.
    NoToken,
}

fn shows(outcome: Outcome) -> Shows {
    match outcome {
        // A key or model refused says nothing of the engine, nor does a
        // gateway shedding the request before any engine saw it, nor our
        // own resources running out (`local`: the target is not to blame,
        // as for a run).
        Outcome::Http4xx
        | Outcome::InvalidOutput
        | Outcome::Ok
        | Outcome::ShortOutput
        | Outcome::Shed
        | Outcome::Local => Shows::Nothing,
        Outcome::Connect => Shows::Unreachable,
        // Silence, a stream that broke, or a 5xx.
        Outcome::NoFirstToken
        | Outcome::Stalled
        | Outcome::Timeout
        | Outcome::StreamError
        | Outcome::Http5xx => Shows::NoToken,
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
    let unreachable =
        |outcome, why: String| HeartbeatEnd::answered(outcome, Some(Evidence::Unreachable { why }));
    let api = ServerApi::with_client(http.clone(), &target.base_url, key, timeout)
        .map_err(|_| HeartbeatEnd::answered(Outcome::Local, None))?
        .with_headers(headers.clone());
    match api.resolve_model(None).await {
        Ok(m) => Ok(m.id),
        Err(e @ (ServerError::Unreachable { .. } | ServerError::Client(_))) => {
            Err(unreachable(Outcome::Connect, e.to_string()))
        }
        Err(e @ ServerError::Timeout { .. }) => Err(unreachable(Outcome::Timeout, e.to_string())),
        // Our own resources: nothing of the engine.
        Err(ServerError::Local { .. }) => Err(HeartbeatEnd::answered(Outcome::Local, None)),
        Err(ServerError::Http { status, .. }) => {
            Err(HeartbeatEnd::answered(Outcome::from_status(status), None))
        }
        Err(_) => Err(HeartbeatEnd::answered(Outcome::Http4xx, None)),
    }
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

    /// Our own resources running out shows nothing of the engine: no
    /// liveness state, no back-off, no objective event.
    #[test]
    fn a_heartbeat_lost_to_our_own_resources_shows_nothing_of_the_engine() {
        assert_eq!(shows(Outcome::Local), Shows::Nothing);
        assert_eq!(shows(Outcome::Connect), Shows::Unreachable);
        assert_eq!(shows(Outcome::NoFirstToken), Shows::NoToken);
        assert_eq!(shows(Outcome::Http4xx), Shows::Nothing);
    }
}
