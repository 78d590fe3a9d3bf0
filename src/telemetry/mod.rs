//! Watchers beside the probes: target health, server identity (kind and
//! version, `/v1/models`), the server's `/metrics` for load (vLLM or
//! SGLang), and GPU counters from a DCGM exporter or NVML. Each read is
//! bounded by the scrape timeout.

pub mod dcgm;
pub mod exposition;
pub mod load;
pub mod nvml;

use std::time::Duration;

use reqwest::header::AUTHORIZATION;

use crate::client::http::{auth_header, read_capped};
use crate::client::server_api::{ServerApi, ServerError, ServerKind};
use crate::client::{RequestHeaders, Secret};
use crate::config::TargetConfig;
use crate::limits::MAX_TELEMETRY_PAGE;
use crate::vocabulary::gpu::GpuReading;
use crate::vocabulary::records::{ServerIdentity, ServerLoad};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{url}: {detail}")]
    Fetch { url: String, detail: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {cause}")]
    Parse {
        url: String,
        cause: exposition::PageError,
    },
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// What the server says it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Identified {
    /// The model probed.
    pub model: String,
    pub kind: ServerKind,
    pub identity: ServerIdentity,
}

/// Whether two URLs share scheme, host and port: a key goes only to the
/// origin it belongs to, never to a URL that merely starts the same.
fn same_origin(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin() == b.origin(),
        _ => false,
    }
}

/// One page, bounded in time and size; `key` is sent as a bearer token,
/// with `headers` (the target's own, for its own origin).
async fn get_page(
    http: &reqwest::Client,
    url: &str,
    key: Option<&Secret>,
    headers: Option<&RequestHeaders>,
    timeout: Duration,
) -> Result<String, TelemetryError> {
    let mut request = http.get(url).timeout(timeout);
    if let Some(value) = key.and_then(|k| auth_header(k).ok()) {
        request = request.header(AUTHORIZATION, value);
    }
    if let Some(headers) = headers {
        request = headers.apply(request);
    }
    let response = request.send().await.map_err(|e| TelemetryError::Fetch {
        url: url.to_owned(),
        detail: crate::client::http::error_chain(&e),
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(TelemetryError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
        });
    }
    // A page larger than any real one is a failing source, not memory.
    read_capped(response, MAX_TELEMETRY_PAGE)
        .await
        .map(|body| String::from_utf8_lossy(&body).into_owned())
        .map_err(|e| TelemetryError::Fetch {
            url: url.to_owned(),
            detail: e.to_string(),
        })
}

/// The load on the `/metrics` page at `url` of the server at `base_url`,
/// `model`'s series when it has several; the key goes only to the server's
/// own origin.
pub async fn read_load(
    http: &reqwest::Client,
    url: &str,
    base_url: &str,
    key: Option<&Secret>,
    timeout: Duration,
    model: Option<&str>,
) -> Result<ServerLoad, TelemetryError> {
    let key = key.filter(|_| same_origin(url, base_url));
    let text = get_page(http, url, key, None, timeout).await?;
    load::parse_load(&text, model).map_err(|cause| TelemetryError::Parse {
        url: url.to_owned(),
        cause,
    })
}

/// Reads telemetry for one target.
#[derive(Clone)]
pub struct TargetWatch {
    http: reqwest::Client,
    api: ServerApi,
    target: TargetConfig,
    key: Option<Secret>,
    /// The target's request headers, sent where its key goes.
    headers: RequestHeaders,
    timeout: Duration,
}

impl TargetWatch {
    /// On a shared HTTP client; `timeout` bounds every read.
    pub fn new(
        http: reqwest::Client,
        target: TargetConfig,
        key: Option<Secret>,
        timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        // Headers that cannot be read now are read again at the next
        // watch; the run that needs them says why.
        let headers = target.request_headers().unwrap_or_default();
        let api = ServerApi::with_client(http.clone(), &target.base_url, key.as_ref(), timeout)?
            .with_headers(headers.clone());
        Ok(TargetWatch {
            http,
            api,
            target,
            key,
            headers,
            timeout,
        })
    }

    async fn get_text(&self, url: &str, with_key: bool) -> Result<String, TelemetryError> {
        let key = self.key.as_ref().filter(|_| with_key);
        let headers = Some(&self.headers).filter(|_| with_key);
        get_page(&self.http, url, key, headers, self.timeout).await
    }

    /// The server's load from its `/metrics`, counting `model`'s series
    /// when the page has several models; `None` when not configured.
    pub async fn load(&self, model: Option<&str>) -> Option<Result<ServerLoad, TelemetryError>> {
        let url = self.target.metrics_url.as_deref()?;
        let with_key = same_origin(url, &self.target.base_url);
        Some(match self.get_text(url, with_key).await {
            Ok(text) => load::parse_load(&text, model).map_err(|cause| TelemetryError::Parse {
                url: url.to_owned(),
                cause,
            }),
            Err(e) => Err(e),
        })
    }

    /// GPU counters from the target's DCGM exporter, only the GPUs its
    /// `dcgm_match` selects; `None` when not configured.
    pub async fn gpus(&self) -> Option<Result<Vec<GpuReading>, TelemetryError>> {
        let url = self.target.dcgm_url.as_deref()?;
        Some(match self.get_text(url, false).await {
            Ok(text) => dcgm::parse(&text, self.target.dcgm_match.as_ref()).map_err(|cause| {
                TelemetryError::Parse {
                    url: url.to_owned(),
                    cause,
                }
            }),
            Err(e) => Err(e),
        })
    }

    /// The telemetry sources configured for the target: `server` (its
    /// `/metrics`) and `dcgm`.
    pub fn sources(&self) -> Vec<&'static str> {
        let server = self.target.metrics_url.as_ref().map(|_| "server");
        let dcgm = self.target.dcgm_url.as_ref().map(|_| "dcgm");
        server.into_iter().chain(dcgm).collect()
    }

    /// Whether `/health` answers 2xx; `None` for servers without one (404),
    /// which are judged by whether `/v1/models` answers instead.
    pub async fn health(&self) -> Option<bool> {
        let url = format!("{}/health", self.target.base_url);
        match self.get_text(&url, true).await {
            Ok(_) => Some(true),
            Err(TelemetryError::Status { status: 404, .. }) => None,
            Err(_) => Some(false),
        }
    }

    /// What the server says it is, and the model probed.
    pub async fn identity(&self) -> Result<Identified, TelemetryError> {
        let model = self.api.resolve_model(self.target.model.as_deref()).await?;
        let (kind, version) = self
            .api
            .kind_and_version()
            .await
            .unwrap_or((ServerKind::Openai, None));
        Ok(Identified {
            model: model.id,
            kind,
            identity: ServerIdentity {
                version,
                model_root: model.root,
                system_fingerprint: None,
                max_model_len: model.max_model_len,
                ..ServerIdentity::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_goes_only_to_its_own_origin() {
        use super::same_origin;
        assert!(same_origin("http://h:1860/metrics", "http://h:1860"));
        assert!(same_origin("http://h/metrics", "http://h:80"));
        assert!(!same_origin("http://h:18602/metrics", "http://h:1860"));
        assert!(!same_origin("https://h:1860/metrics", "http://h:1860"));
        assert!(!same_origin("http://h.evil:1860/metrics", "http://h:1860"));
    }
}
