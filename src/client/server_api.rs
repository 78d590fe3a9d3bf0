//! The non-streaming endpoints a probe consults before it runs:
//! `/v1/models` (model detection), `/version`, `/tokenize` (exact prompt
//! lengths). Errors here are the user-facing "cannot start" errors, so each
//! says in one line what was asked, of whom, and what came back.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::{Deserialize, Serialize};

use super::http::{BodyError, auth_header, error_chain, join_url, read_capped};
use super::{ClientError, Endpoint, Secret};
use crate::vocabulary::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// Our own resources ran out (file descriptors, socket buffers): the
    /// server is not to blame.
    #[error("cannot send to {url}, our own resources ran out: {detail}")]
    Local { url: String, detail: String },
    #[error("{url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error(
        "{url} refused the credentials (HTTP {status}); set the API key with --api-key-env or --api-key-file"
    )]
    Unauthorized { url: String, status: u16 },
    #[error("{url} is not an OpenAI-compatible server: {detail}")]
    NotOpenAi { url: String, detail: String },
    #[error("model {requested:?} is not served by {base}; it serves: {}", shown_list(.available))]
    UnknownModel {
        requested: String,
        base: String,
        available: Vec<String>,
    },
    #[error(
        "{url} gives token counts that make no sense ({detail}); prompt lengths cannot be calibrated (probe --no-calibrate skips calibration)"
    )]
    Tokenize { url: String, detail: String },
    #[error("{url} lists no models")]
    NoModels { url: String },
    #[error("{url} {}", super::http::redirect_refused(.to))]
    Redirected { url: String, to: String },
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
    },
}

impl ServerError {
    /// The request outcome this failure is counted as, a run's or a
    /// heartbeat's alike; `None` when it is not one (the server answered,
    /// but not with the model or token counts a probe needs).
    pub fn outcome(&self) -> Option<Outcome> {
        Some(match self {
            ServerError::Unreachable { .. } | ServerError::Client(_) => Outcome::Connect,
            ServerError::Timeout { .. } => Outcome::Timeout,
            ServerError::Local { .. } => Outcome::Local,
            ServerError::Unauthorized { .. } => Outcome::Http4xx,
            ServerError::NotOpenAi { .. } | ServerError::Redirected { .. } => Outcome::StreamError,
            ServerError::Http { status, .. } => Outcome::from_status(*status),
            ServerError::UnknownModel { .. }
            | ServerError::NoModels { .. }
            | ServerError::Tokenize { .. } => return None,
        })
    }
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub id: String,
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub max_model_len: Option<u64>,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelInfo>,
}

/// Which server software answers, as far as it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    Vllm,
    Sglang,
    /// Any other OpenAI-compatible server.
    #[default]
    Openai,
}

impl ServerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerKind::Vllm => "vllm",
            ServerKind::Sglang => "sglang",
            ServerKind::Openai => "openai",
        }
    }
}

#[derive(Deserialize)]
struct VersionReply {
    version: String,
}

/// Most model names an error lists; a server may list hundreds of thousands.
const MODELS_SHOWN: usize = 10;

fn shown_list(available: &[String]) -> String {
    let mut shown: Vec<&str> = available
        .iter()
        .take(MODELS_SHOWN)
        .map(String::as_str)
        .collect();
    let more;
    if available.len() > MODELS_SHOWN {
        more = format!("and {} more", available.len() - MODELS_SHOWN);
        shown.push(&more);
    }
    shown.join(", ")
}

/// Largest `/v1/models` body read (a list of a hundred thousand models
/// fits); a larger one is not a model list we can use.
const MODELS_BODY_LIMIT: usize = 32 << 20;
/// Largest `/version` or `/tokenize` reply read.
const SMALL_BODY_LIMIT: usize = 64 << 10;
/// The most of a server-info answer read.
const SERVER_INFO_LIMIT: usize = 1 << 20;

/// Client for the server's metadata endpoints.
#[derive(Debug, Clone)]
pub struct ServerApi {
    http: reqwest::Client,
    base_url: String,
    auth: Option<HeaderValue>,
    /// Kept to scrub it from anything the server echoes back.
    key: Option<Secret>,
    /// A gateway's headers, sent with every call (and scrubbed likewise).
    headers: crate::client::RequestHeaders,
    timeout: Duration,
}

impl ServerApi {
    pub fn new(
        base_url: &str,
        api_key: Option<&Secret>,
        timeout: Duration,
    ) -> Result<Self, ServerError> {
        let http = crate::client::http::client_builder()
            .connect_timeout(timeout)
            .build()
            .map_err(|e| ClientError::Build(error_chain(&e)))?;
        ServerApi::with_client(http, base_url, api_key, timeout)
    }

    /// The same on an existing HTTP client (and its connection pool), as
    /// the daemon's watchers share one; `timeout` bounds every call.
    pub fn with_client(
        http: reqwest::Client,
        base_url: &str,
        api_key: Option<&Secret>,
        timeout: Duration,
    ) -> Result<Self, ServerError> {
        join_url(base_url, "/")?;
        // A key that cannot be a header is an error here too, not a request
        // sent with an empty Authorization header.
        let auth = api_key.map(auth_header).transpose()?;
        Ok(ServerApi {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            auth,
            key: api_key.cloned(),
            headers: crate::client::RequestHeaders::default(),
            timeout,
        })
    }

    /// The same, every call carrying `headers` (a gateway's).
    pub fn with_headers(mut self, headers: crate::client::RequestHeaders) -> Self {
        self.headers = headers;
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::Response, ServerError> {
        let request = request.timeout(self.timeout);
        let request = match &self.auth {
            Some(a) => request.header(AUTHORIZATION, a.clone()),
            None => request,
        };
        let request = self.headers.apply(request);
        request.send().await.map_err(|e| {
            if e.is_timeout() {
                ServerError::Timeout {
                    url: url.to_owned(),
                    timeout: self.timeout,
                }
            } else if super::http::is_local(&e) {
                ServerError::Local {
                    url: url.to_owned(),
                    detail: error_chain(&e),
                }
            } else {
                ServerError::Unreachable {
                    url: url.to_owned(),
                    detail: error_chain(&e),
                }
            }
        })
    }

    /// `GET /v1/models`.
    pub async fn models(&self) -> Result<Vec<ModelInfo>, ServerError> {
        let url = join_url(&self.base_url, "/v1/models")?;
        let shown = url.to_string();
        let response = self.call(self.http.get(url), &shown).await?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ServerError::Unauthorized {
                url: shown,
                status: status.as_u16(),
            });
        }
        if let Some(to) = super::http::redirect_target(&response) {
            return Err(ServerError::Redirected { url: shown, to });
        }
        if status == StatusCode::NOT_FOUND {
            let hint = if self.base_url.ends_with("/v1") {
                "; the base URL ends in /v1, which the probe adds itself: drop the /v1"
            } else {
                ""
            };
            return Err(ServerError::NotOpenAi {
                url: self.base_url.clone(),
                detail: format!("GET /v1/models answered 404{hint}"),
            });
        }
        let body = read_limited(response, MODELS_BODY_LIMIT, &shown).await?;
        if !status.is_success() {
            return Err(ServerError::Http {
                url: shown,
                status: status.as_u16(),
                body: self.snippet(&body),
            });
        }
        let list: ModelList =
            serde_json::from_slice(&body).map_err(|e| ServerError::NotOpenAi {
                url: self.base_url.clone(),
                detail: format!(
                    "GET /v1/models did not return a model list ({e}): {}",
                    self.snippet(&body)
                ),
            })?;
        // Model ids become labels, log fields and page text.
        Ok(list
            .data
            .into_iter()
            .map(|m| ModelInfo {
                id: crate::text::clean_identifier(&m.id, crate::text::MAX_ID_LEN),
                root: m
                    .root
                    .map(|r| crate::text::clean_identifier(&r, crate::text::MAX_ID_LEN)),
                max_model_len: m.max_model_len,
            })
            .collect())
    }

    /// Picks the model to probe: the one asked for if the server has it,
    /// otherwise (when none was asked for) the first one listed.
    pub async fn resolve_model(&self, requested: Option<&str>) -> Result<ModelInfo, ServerError> {
        let models = self.models().await?;
        match requested {
            Some(name) => models
                .iter()
                .find(|m| m.id == name)
                .cloned()
                .ok_or_else(|| ServerError::UnknownModel {
                    requested: name.to_owned(),
                    base: self.base_url.clone(),
                    available: models.iter().map(|m| m.id.clone()).collect(),
                }),
            None => models
                .into_iter()
                .next()
                .ok_or_else(|| ServerError::NoModels {
                    url: format!("{}/v1/models", self.base_url),
                }),
        }
    }

    /// What kind of server this is and its version: vLLM answers
    /// `/version` (asked first: one request for the usual server), SGLang
    /// has none and answers `/get_server_info` (`/server_info` in newer
    /// releases); anything else is some OpenAI-compatible server. Only a
    /// server that cannot be reached at all is an error.
    pub async fn kind_and_version(&self) -> Result<(ServerKind, Option<String>), ServerError> {
        for (path, kind) in [
            ("/version", ServerKind::Vllm),
            ("/get_server_info", ServerKind::Sglang),
            ("/server_info", ServerKind::Sglang),
        ] {
            if let Some(version) = self.version_at(path).await? {
                return Ok((kind, Some(version)));
            }
        }
        Ok((ServerKind::Openai, None))
    }

    /// The server's version; `None` when it does not say.
    pub async fn version(&self) -> Result<Option<String>, ServerError> {
        Ok(self.kind_and_version().await?.1)
    }

    /// The `version` field of the JSON object at `path`; `None` when the
    /// server has no such endpoint or its answer has no version.
    async fn version_at(&self, path: &str) -> Result<Option<String>, ServerError> {
        let url = join_url(&self.base_url, path)?;
        let shown = url.to_string();
        let response = self.call(self.http.get(url), &shown).await?;
        if !response.status().is_success() {
            return Ok(None);
        }
        // SGLang's server info lists all its arguments: larger than most.
        let Ok(body) = read_limited(response, SERVER_INFO_LIMIT, &shown).await else {
            return Ok(None);
        };
        Ok(serde_json::from_slice::<VersionReply>(&body)
            .ok()
            .map(|v| crate::text::clean_identifier(&v.version, crate::text::MAX_ID_LEN))
            .filter(|v| !v.is_empty()))
    }

    /// Token count of a prompt as the server's tokenizer sees it for the
    /// given endpoint (chat applies the chat template). `None` when the
    /// server has no `/tokenize` (not vLLM).
    pub async fn count_tokens(
        &self,
        model: &str,
        endpoint: Endpoint,
        prompt: &str,
    ) -> Result<Option<u32>, ServerError> {
        let url = join_url(&self.base_url, "/tokenize")?;
        let shown = url.to_string();
        let body = match endpoint {
            Endpoint::Completions => serde_json::json!({"model": model, "prompt": prompt}),
            Endpoint::Chat => serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "add_generation_prompt": true,
            }),
        };
        let response = self.call(self.http.post(url).json(&body), &shown).await?;
        let status = response.status();
        if matches!(status.as_u16(), 404 | 405 | 501) {
            return Ok(None);
        }
        let body = read_limited(response, SMALL_BODY_LIMIT, &shown).await?;
        if !status.is_success() {
            return Err(ServerError::Http {
                url: shown,
                status: status.as_u16(),
                body: self.snippet(&body),
            });
        }
        // A reply without `count` is some other server's /tokenize: no
        // calibration. A `count` that is not a token count is a server
        // that would mislead it: say so.
        let Ok(reply) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return Ok(None);
        };
        let Some(count) = reply.get("count") else {
            return Ok(None);
        };
        match count.as_u64().and_then(|c| u32::try_from(c).ok()) {
            Some(c) => Ok(Some(c)),
            None => Err(ServerError::Tokenize {
                url: shown,
                detail: format!(
                    "\"count\": {} is not a token count",
                    crate::text::clean(&count.to_string(), 40)
                ),
            }),
        }
    }

    /// The start of a body for an error message, on one line, with the key
    /// scrubbed.
    fn snippet(&self, body: &[u8]) -> String {
        let text =
            crate::text::truncate(&String::from_utf8_lossy(&body[..body.len().min(640)]), 160);
        let text = match &self.key {
            Some(key) => key.scrub(&text),
            None => text,
        };
        crate::text::clean(&self.headers.scrub(&text), 160)
    }
}

/// Reads at most `limit` bytes of a body; a longer one is an error, not a
/// reason to hold it all in memory.
async fn read_limited(
    response: reqwest::Response,
    limit: usize,
    url: &str,
) -> Result<Vec<u8>, ServerError> {
    read_capped(response, limit).await.map_err(|e| match e {
        BodyError::TooLong { .. } => ServerError::NotOpenAi {
            url: url.to_owned(),
            detail: e.to_string(),
        },
        BodyError::Broken(detail) => ServerError::Unreachable {
            url: url.to_owned(),
            detail,
        },
    })
}
