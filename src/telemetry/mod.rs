//! Watchers beside the probes: target health, server identity (`/version`,
//! `/v1/models`), vLLM's `/metrics` for load, and GPU counters from a DCGM
//! exporter or NVML. Each read is bounded by the scrape timeout.

pub mod dcgm;
pub mod exposition;
pub mod nvml;
pub mod vllm;

use std::time::Duration;

use reqwest::header::AUTHORIZATION;

use crate::client::server_api::{ServerApi, ServerError};
use crate::client::{ApiKey, auth_header};
use crate::config::TargetConfig;
use crate::metrics::GpuReading;
use crate::run::{ServerIdentity, ServerLoad};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{url}: {detail}")]
    Fetch { url: String, detail: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {source}")]
    Parse {
        url: String,
        source: exposition::ExpositionError,
    },
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// Reads telemetry for one target.
#[derive(Clone)]
pub struct TargetWatch {
    http: reqwest::Client,
    target: TargetConfig,
    key: Option<ApiKey>,
    timeout: Duration,
}

impl TargetWatch {
    pub fn new(target: TargetConfig, key: Option<ApiKey>, timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(target.timeouts.connect))
            .build()
            .unwrap_or_default();
        TargetWatch {
            http,
            target,
            key,
            timeout,
        }
    }

    async fn get_text(&self, url: &str, with_key: bool) -> Result<String, TelemetryError> {
        let mut request = self.http.get(url);
        if with_key && let Some(key) = &self.key {
            // Only to the target itself: a metrics URL on another host
            // never sees the key.
            if let Ok(value) = auth_header(key) {
                request = request.header(AUTHORIZATION, value);
            }
        }
        let response = request.send().await.map_err(|e| TelemetryError::Fetch {
            url: url.to_owned(),
            detail: crate::client::error_chain(&e),
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(TelemetryError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
            });
        }
        response.text().await.map_err(|e| TelemetryError::Fetch {
            url: url.to_owned(),
            detail: crate::client::error_chain(&e),
        })
    }

    /// The server's load from its `/metrics`; `None` when not configured.
    pub async fn load(&self) -> Option<Result<ServerLoad, TelemetryError>> {
        let url = self.target.metrics_url.as_deref()?;
        let same_host = url.starts_with(&self.target.base_url);
        Some(match self.get_text(url, same_host).await {
            Ok(text) => vllm::parse_load(&text).map_err(|source| TelemetryError::Parse {
                url: url.to_owned(),
                source,
            }),
            Err(e) => Err(e),
        })
    }

    /// GPU counters from the target's DCGM exporter; `None` when not configured.
    pub async fn gpus(&self) -> Option<Result<Vec<GpuReading>, TelemetryError>> {
        let url = self.target.dcgm_url.as_deref()?;
        Some(match self.get_text(url, false).await {
            Ok(text) => dcgm::parse(&text).map_err(|source| TelemetryError::Parse {
                url: url.to_owned(),
                source,
            }),
            Err(e) => Err(e),
        })
    }

    /// Up when `/health` answers 2xx; servers without `/health` (404) are
    /// judged by `/v1/models` instead.
    pub async fn health(&self) -> bool {
        let url = format!("{}/health", self.target.base_url);
        match self.get_text(&url, true).await {
            Ok(_) => true,
            Err(TelemetryError::Status { status: 404, .. }) => self.identity().await.is_ok(),
            Err(_) => false,
        }
    }

    /// What the server says it is, and the model probed.
    pub async fn identity(&self) -> Result<(String, ServerIdentity), TelemetryError> {
        let api = ServerApi::new(&self.target.base_url, self.key.as_ref(), self.timeout)?;
        let model = api.resolve_model(self.target.model.as_deref()).await?;
        let version = api.version().await.unwrap_or(None);
        Ok((
            model.id,
            ServerIdentity {
                version,
                model_root: model.root,
                system_fingerprint: None,
                max_model_len: model.max_model_len,
            },
        ))
    }
}
