//! The baseline and verdict API (`/api/v1/baselines`, `/api/v1/verdicts`)
//! behind the admin bearer token, and `/report`, the before/after page
//! notifications link to.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;

use super::authorized;
use crate::daemon::Shared;
use crate::detect::verdict::PairVerdict;
use crate::report::upgrade;
use crate::store::StoreError;
use crate::store::baselines::PairKey;

fn store_failure(e: StoreError) -> Response {
    match e {
        StoreError::NotEnoughRuns { .. } | StoreError::NotFound(_) => {
            (StatusCode::CONFLICT, format!("{e}\n")).into_response()
        }
        e => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Reads need the token when one is configured; changes always need one.
fn guard(shared: &Shared, headers: &HeaderMap, write: bool) -> Result<(), Box<Response>> {
    if write && shared.config().exporter.admin_token.is_none() {
        return Err(Box::new(
            (
                StatusCode::FORBIDDEN,
                "changing baselines needs exporter.admin_token_env or admin_token_file\n",
            )
                .into_response(),
        ));
    }
    authorized(shared, headers)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Box<Response>> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Box::new(store_failure(e))),
        Err(e) => Err(Box::new(
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        )),
    }
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    target: Option<String>,
    scenario: Option<String>,
}

pub async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Err(r) = guard(&shared, &headers, false) {
        return *r;
    }
    let store = shared.store.clone();
    match blocking(move || store.baselines(q.target.as_deref(), q.scenario.as_deref())).await {
        Ok(b) => Json(b).into_response(),
        Err(r) => *r,
    }
}

#[derive(Debug, Deserialize)]
pub struct PinRequest {
    target: String,
    model: String,
    scenario: String,
    /// Required for pin.
    version: Option<String>,
    /// Rebuild from the newest N completed runs first.
    recent: Option<usize>,
}

impl PinRequest {
    fn key(&self) -> PairKey {
        PairKey {
            target: self.target.clone(),
            model: self.model.clone(),
            scenario: self.scenario.clone(),
        }
    }
}

pub async fn pin(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(req): Json<PinRequest>,
) -> Response {
    if let Err(r) = guard(&shared, &headers, true) {
        return *r;
    }
    let Some(version) = req.version.clone() else {
        return (StatusCode::BAD_REQUEST, "version is required\n").into_response();
    };
    let store = shared.store.clone();
    let key = req.key();
    match blocking(move || store.pin_baseline(&key, &version, req.recent, Utc::now())).await {
        Ok(b) => {
            tracing::info!(target = %b.target, scenario = %b.scenario, version = %b.build, "baseline pinned");
            Json(b).into_response()
        }
        Err(r) => *r,
    }
}

pub async fn unpin(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(req): Json<PinRequest>,
) -> Response {
    if let Err(r) = guard(&shared, &headers, true) {
        return *r;
    }
    let store = shared.store.clone();
    let key = req.key();
    match blocking(move || store.unpin_baseline(&key)).await {
        Ok(changed) => Json(serde_json::json!({ "unpinned": changed })).into_response(),
        Err(r) => *r,
    }
}

/// The newest verdict of every pair.
pub async fn verdicts(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = guard(&shared, &headers, false) {
        return *r;
    }
    let store = shared.store.clone();
    match blocking(move || store.latest_evaluations()).await {
        Ok(list) => {
            let parsed: Vec<PairVerdict> = list
                .iter()
                .filter_map(|e| serde_json::from_str(&e.detail).ok())
                .collect();
            Json(parsed).into_response()
        }
        Err(r) => *r,
    }
}

#[derive(Debug, Deserialize)]
pub struct ReportQuery {
    target: String,
    model: Option<String>,
    from: String,
    to: String,
    format: Option<String>,
}

pub async fn report(State(shared): State<Arc<Shared>>, Query(q): Query<ReportQuery>) -> Response {
    let store = shared.store.clone();
    let detection = shared.config().detection.clone();
    let built = tokio::task::spawn_blocking(move || {
        upgrade::build(
            &store,
            &detection,
            &q.target,
            q.model.as_deref(),
            &q.from,
            &q.to,
        )
        .map(|r| (r, q.format))
    })
    .await;
    match built {
        Ok(Ok((r, format))) if format.as_deref() == Some("markdown") => {
            upgrade::markdown(&r).into_response()
        }
        Ok(Ok((r, _))) => Html(upgrade::html(&r)).into_response(),
        Ok(Err(e)) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
