//! The baseline and verdict API (`/api/v1/baselines`, `/api/v1/verdicts`)
//! and `/report`, the before/after page notifications link to.
//!
//! One rule for the whole exporter: reading is open, as `/metrics` is (it
//! exports every verdict and baseline version anyway); changing anything
//! needs the admin bearer token, which is checked before the request body
//! is even looked at.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::{AppState, authorized};
use crate::report::upgrade;
use crate::store::baselines::PairKey;
use crate::store::{Store, StoreError};
use crate::verdict::pair::PairVerdict;

/// Changes need the admin token, and a configured one.
fn guard_write(app: &AppState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    if app.live.current().exporter.admin_token.is_none() {
        return Err(Box::new(
            (
                StatusCode::FORBIDDEN,
                "changing baselines needs exporter.admin_token_env or admin_token_file\n",
            )
                .into_response(),
        ));
    }
    authorized(&app.live, headers)
}

/// Runs `work` on the store off the async threads and answers with its
/// JSON, or with the error's status.
async fn answer<T: serde::Serialize + Send + 'static>(
    app: &AppState,
    work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Response {
    match app.store.call(work).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => super::store_failure(e),
    }
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    target: Option<String>,
    scenario: Option<String>,
}

pub async fn list(State(app): State<AppState>, Query(q): Query<ListQuery>) -> Response {
    answer(&app, move |store| {
        store.baselines(q.target.as_deref(), q.scenario.as_deref())
    })
    .await
}

/// One baseline with its runs (summaries, load, server identity).
pub async fn show(State(app): State<AppState>, Path(id): Path<i64>) -> Response {
    answer(&app, move |store| {
        let baseline = store
            .baseline_by_id(id)?
            .ok_or_else(|| StoreError::NotFound(format!("baseline {id}")))?;
        let runs = store.runs_by_id(&baseline.run_ids)?;
        Ok(serde_json::json!({ "baseline": baseline, "runs": runs }))
    })
    .await
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

/// The token first, then the body: an unauthorised caller learns nothing
/// about what a valid request looks like.
fn write_request(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<PinRequest, Box<Response>> {
    guard_write(app, headers)?;
    serde_json::from_slice(body).map_err(|e| {
        Box::new(
            (
                StatusCode::BAD_REQUEST,
                format!("the body is not a baseline request: {e}\n"),
            )
                .into_response(),
        )
    })
}

pub async fn pin(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let req = match write_request(&app, &headers, &body) {
        Ok(r) => r,
        Err(denied) => return *denied,
    };
    let Some(version) = req.version.clone() else {
        return (StatusCode::BAD_REQUEST, "version is required\n").into_response();
    };
    let now = app.clock.now();
    answer(&app, move |store| {
        let b = store.pin_baseline(&req.key(), &version, req.recent, now)?;
        tracing::info!(target = %b.target, scenario = %b.scenario, version = %b.build, "baseline pinned");
        Ok(b)
    })
    .await
}

pub async fn unpin(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let req = match write_request(&app, &headers, &body) {
        Ok(r) => r,
        Err(denied) => return *denied,
    };
    answer(&app, move |store| {
        let unpinned = store.unpin_baseline(&req.key())?;
        Ok(serde_json::json!({ "unpinned": unpinned }))
    })
    .await
}

/// The newest verdict of every pair.
pub async fn verdicts(State(app): State<AppState>) -> Response {
    answer(&app, |store| {
        Ok(store
            .latest_evaluations()?
            .iter()
            .filter_map(|e| serde_json::from_str::<PairVerdict>(&e.detail).ok())
            .collect::<Vec<_>>())
    })
    .await
}

#[derive(Debug, Deserialize)]
pub struct ReportQuery {
    target: String,
    model: Option<String>,
    /// Both default to the target's latest upgrade (or rollout).
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
}

pub async fn report(State(app): State<AppState>, Query(q): Query<ReportQuery>) -> Response {
    let markdown = match q.format.as_deref() {
        None | Some("html") => false,
        Some("markdown") => true,
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("format: {other:?} is neither \"html\" nor \"markdown\"\n"),
            )
                .into_response();
        }
    };
    let detection = app.live.current().verdict_policy.clone();
    let now = app.clock.now();
    // A report that cannot be built (unknown target or build) is the
    // caller's 404, not a store failure: it comes back inside.
    let built = app
        .store
        .call(move |store| {
            let (from, to) = match (q.from, q.to) {
                (Some(from), Some(to)) => (from, to),
                (from, to) => {
                    match upgrade::latest_upgrade(store, &q.target, q.model.as_deref())? {
                        Some((f, t)) => (from.unwrap_or(f), to.unwrap_or(t)),
                        None => {
                            return Ok(Err(upgrade::ReportError::NoUpgrade(q.target.clone())));
                        }
                    }
                }
            };
            Ok(upgrade::build(
                store,
                &detection,
                &q.target,
                q.model.as_deref(),
                &from,
                &to,
                now,
            ))
        })
        .await;
    match built {
        Ok(Ok(r)) if markdown => upgrade::markdown(&r).into_response(),
        Ok(Ok(r)) => Html(upgrade::html(&r)).into_response(),
        Ok(Err(e)) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(e) => super::store_failure(e),
    }
}
