//! The daemon's HTTP surface: `/metrics` for Prometheus, `/healthz` and
//! `/readyz`, a plain HTML status page at `/`, `GET /api/v1/runs`,
//! `POST /-/reload` (behind the admin token, or opened by
//! `enable_lifecycle`), and the baseline API and reports of [`baselines`],
//! each request bounded in time, body size and (for the pages and the
//! API) concurrency.

pub mod baselines;
pub mod login;
pub mod password_checks;
pub mod serve;
pub mod slos;
mod status_page;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::config::live::{LiveConfig, ReloadError, Reloaded};
use crate::metrics::Metrics;
use crate::state::TargetStates;
use crate::store::{AsyncStore, RunFilter, StoreError};
use login::Login;

/// What the handlers read (and the one thing they change: the
/// configuration, through its reload path).
#[derive(Clone)]
pub struct AppState {
    pub live: Arc<LiveConfig>,
    pub metrics: Arc<Metrics>,
    pub store: AsyncStore,
    pub board: Arc<TargetStates>,
    /// True once every worker is started, false again at shutdown.
    pub ready: Arc<AtomicBool>,
    /// The bcrypt checks of basic-auth logins, bounded across reloads.
    pub password_checks: Arc<password_checks::PasswordChecks>,
    pub clock: crate::clock::Clock,
}

/// What one request may cost the exporter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLimits {
    /// Requests to the pages and the API handled at once; more wait.
    /// `/metrics` and the health checks are outside this bound (routes
    /// added after the layer), so a crowd of API clients never holds up a
    /// scrape.
    pub max_requests: usize,
    /// A request not answered by then gets a 408.
    pub timeout: Duration,
}

/// Largest request body accepted (the baseline API's JSON is a few
/// hundred bytes).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

pub fn router(state: AppState, limits: RequestLimits) -> Router {
    // Liveness and readiness say nothing a stranger could use, and the
    // probes of Kubernetes or a load balancer carry no password: they stay
    // outside basic auth (TLS, when configured, still applies).
    let health = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready));
    Router::new()
        .route("/", get(status_page::render))
        .route("/api/v1/runs", get(runs))
        .route("/api/v1/targets", get(targets))
        .route("/api/v1/slos", get(slos::api))
        .route("/-/reload", post(reload))
        .route("/api/v1/baselines", get(baselines::list))
        .route("/api/v1/baselines/{id}", get(baselines::show))
        .route("/api/v1/baselines/pin", post(baselines::pin))
        .route("/api/v1/baselines/unpin", post(baselines::unpin))
        .route("/api/v1/verdicts", get(baselines::verdicts))
        .route("/report", get(baselines::report))
        .layer(GlobalConcurrencyLimitLayer::new(limits.max_requests.max(1)))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(state.clone(), basic_auth))
        .merge(health)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.timeout,
        ))
        .with_state(state)
}

/// The basic-auth users of the web configuration guard every route but
/// the health checks, as the same file guards node_exporter. A request
/// carrying the admin token passes too, so a write needs one credential,
/// not two in one header.
async fn basic_auth(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let (web, has_token) = {
        let exporter = &app.live.current().exporter;
        (
            exporter.web.as_ref().map(|w| w.get().clone()),
            exporter.admin_token.is_some(),
        )
    };
    let Some(web) = web.filter(|w| w.has_users()) else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let admin = has_token && authorized(&app.live, request.headers()).is_ok();
    if admin {
        return next.run(request).await;
    }
    match web.login(given, &app.password_checks).await {
        Login::Allowed => next.run(request).await,
        Login::Refused => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"vllm-sentinel\"")],
            "a valid user and password are required\n",
        )
            .into_response(),
        Login::Unchecked => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "the password cannot be checked now (too many logins at once, or the daemon \
is stopping); retry shortly\n",
        )
            .into_response(),
    }
}

async fn metrics(State(app): State<AppState>) -> Response {
    let parts = app.metrics.encode_parts();
    let body = axum::body::Body::from_stream(futures_util::stream::iter(
        parts.into_iter().map(Ok::<_, std::convert::Infallible>),
    ));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// What the daemon knows now of each target: up, build, fleet, rollout,
/// replicas, back-off, next runs.
async fn targets(State(app): State<AppState>) -> Response {
    axum::Json(app.board.targets()).into_response()
}

async fn ready(State(app): State<AppState>) -> Response {
    if app.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// True when no admin token is configured, or the request carries it.
/// Compared in constant time so the token cannot be guessed byte by byte.
pub fn authorized(live: &LiveConfig, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let Some(source) = live.current().exporter.admin_token.clone() else {
        return Ok(());
    };
    let expected = match source.load(false) {
        Ok(Some(k)) => k,
        _ => {
            return Err(Box::new(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the admin token is configured but cannot be read\n",
                )
                    .into_response(),
            ));
        }
    };
    // The scheme is case-insensitive (RFC 9110 11.1); the token is not.
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim_start());
    let expected = expected.expose();
    let same = given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(Box::new(
            (
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is required\n",
            )
                .into_response(),
        ))
    }
}

/// Reloading over HTTP is opened by an admin token (then required) or by
/// `enable_lifecycle`, as Prometheus needs `--web.enable-lifecycle`: an
/// exporter reachable by anyone must not be made to reread its files.
async fn reload(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let open = {
        let exporter = &app.live.current().exporter;
        exporter.admin_token.is_some() || exporter.enable_lifecycle
    };
    if !open {
        return (
            StatusCode::FORBIDDEN,
            "reloading over HTTP is off: configure [exporter] admin_token_env or \
admin_token_file, or set [exporter] enable_lifecycle = true; SIGHUP reloads regardless\n",
        )
            .into_response();
    }
    if let Err(denied) = authorized(&app.live, &headers) {
        return *denied;
    }
    let live = app.live.clone();
    match tokio::task::spawn_blocking(move || live.reload()).await {
        Ok(Ok(Reloaded::Applied)) => (StatusCode::OK, "reloaded\n").into_response(),
        Ok(Ok(Reloaded::NoFile)) => (
            StatusCode::OK,
            "no configuration file to reload; nothing changed\n",
        )
            .into_response(),
        Ok(Err(e @ ReloadError::Fixed { .. })) => {
            (StatusCode::CONFLICT, format!("{e}\n")).into_response()
        }
        Ok(Err(e)) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct RunsQuery {
    target: Option<String>,
    scenario: Option<String>,
    version: Option<String>,
    limit: Option<usize>,
    /// The `next` of the previous page.
    cursor: Option<String>,
}

/// Most runs one page of `/api/v1/runs` holds (each carries its summary):
/// fifty clients asking at once must not cost the exporter its memory.
pub const MAX_RUNS_PAGE: usize = 200;

/// A page cursor: the last run's start (microseconds) and id.
fn parse_cursor(text: &str) -> Option<(chrono::DateTime<chrono::Utc>, i64)> {
    let (micros, id) = text.split_once('-')?;
    let at = chrono::DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    Some((at, id.parse().ok()?))
}

/// A page of runs, newest first, with the cursor of the next page when
/// there may be more. Read and encoded off the async threads, so the
/// exporter's other answers (`/metrics` above all) never wait on it.
async fn runs(State(app): State<AppState>, Query(q): Query<RunsQuery>) -> Response {
    let before = match q.cursor.as_deref().map(parse_cursor) {
        Some(None) => {
            return (
                StatusCode::BAD_REQUEST,
                "cursor: not a cursor from a previous page\n",
            )
                .into_response();
        }
        Some(c) => c,
        None => None,
    };
    let limit = match q.limit {
        None => 100,
        Some(n @ 1..=MAX_RUNS_PAGE) => n,
        Some(n) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("limit: {n} is outside 1..={MAX_RUNS_PAGE}; page with `next`\n"),
            )
                .into_response();
        }
    };
    let filter = RunFilter {
        target: q.target,
        scenario: q.scenario,
        server_version: q.version,
        since: None,
        before,
        limit,
    };
    let encoded = app
        .store
        .call(move |store| {
            let runs = store.runs(&filter)?;
            let next = (runs.len() == limit)
                .then(|| runs.last())
                .flatten()
                .and_then(|r| Some(format!("{}-{}", r.started_at.timestamp_micros(), r.id?)));
            Ok::<_, StoreError>(
                serde_json::to_vec(&serde_json::json!({ "runs": runs, "next": next }))
                    .unwrap_or_default(),
            )
        })
        .await;
    match encoded {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => store_failure(e),
    }
}

/// A store call's failure as an answer: a conflict or an absence is the
/// caller's; a store closed by the daemon stopping is 503, to retry.
fn store_failure(e: StoreError) -> Response {
    match e {
        StoreError::NotEnoughRuns { .. } | StoreError::Refused(_) => {
            (StatusCode::CONFLICT, format!("{e}\n")).into_response()
        }
        StoreError::NotFound(_) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        StoreError::Closed => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        e => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
