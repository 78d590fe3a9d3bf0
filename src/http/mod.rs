//! The daemon's HTTP surface: `/metrics` for Prometheus, `/healthz` and
//! `/readyz`, a plain HTML status page at `/`, `GET /api/v1/runs`,
//! `POST /-/reload` (behind the admin token when one is configured), and
//! the baseline API and reports of [`baselines`].

pub mod baselines;
pub mod serve;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::config::live::{LiveConfig, ReloadError, Reloaded};
use crate::metrics::Metrics;
use crate::status::StatusBoard;
use crate::store::{AsyncStore, RunFilter};

/// What the handlers read (and the one thing they change: the
/// configuration, through its reload path).
#[derive(Clone)]
pub struct AppState {
    pub live: Arc<LiveConfig>,
    pub metrics: Arc<Metrics>,
    pub store: AsyncStore,
    pub board: Arc<StatusBoard>,
    /// True once every worker is started, false again at shutdown.
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/api/v1/runs", get(runs))
        .route("/-/reload", post(reload))
        .route("/api/v1/baselines", get(baselines::list))
        .route("/api/v1/baselines/{id}", get(baselines::show))
        .route("/api/v1/baselines/pin", post(baselines::pin))
        .route("/api/v1/baselines/unpin", post(baselines::unpin))
        .route("/api/v1/verdicts", get(baselines::verdicts))
        .route("/report", get(baselines::report))
        .with_state(state)
}

async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
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

async fn reload(State(app): State<AppState>, headers: HeaderMap) -> Response {
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
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_RUNS_PAGE);
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
            Ok::<_, crate::store::StoreError>(
                serde_json::to_vec(&serde_json::json!({ "runs": runs, "next": next }))
                    .unwrap_or_default(),
            )
        })
        .await;
    match encoded {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(v: f64) -> String {
    format!("{:.1}", v * 1e3)
}

async fn status_page(State(app): State<AppState>) -> Html<String> {
    let config = app.live.current();
    let status = app.board.targets();
    let latest = app
        .store
        .call_or_none(|store| store.latest_runs())
        .await
        .unwrap_or_default();
    let mut page = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>vllm-sentinel</title>\
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}\
td:first-child,td:nth-child(2){text-align:left}.bad{color:#b00}.warn{color:#a60}.ok{color:#070}</style></head><body>\
<h1>vllm-sentinel</h1><p><a href=\"/metrics\">Metrics</a> · <a href=\"/api/v1/runs\">Runs (JSON)</a></p>",
    );
    page.push_str("<h2>Targets</h2><table><tr><th>target</th><th>state</th><th>version</th><th>model</th><th>running</th><th>backed off until</th></tr>");
    for t in &config.targets {
        let s = status.get(&t.name).cloned().unwrap_or_default();
        let state = match s.up {
            Some(true) => "<span class=\"ok\">up</span>",
            Some(false) => "<span class=\"bad\">down</span>",
            None => "unknown",
        };
        let version = s
            .identity
            .as_ref()
            .and_then(|i| i.version.clone())
            .unwrap_or_default();
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{state}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.name),
            escape(&version),
            escape(s.model.as_deref().unwrap_or("")),
            escape(s.running.as_deref().unwrap_or("")),
            s.backoff_until.map(|u| u.to_rfc3339()).unwrap_or_default(),
        );
    }
    page.push_str("</table><h2>Last run per scenario</h2><table><tr><th>target</th><th>scenario</th><th>started</th><th>outcome</th>\
<th>ok / failed</th><th>TTFT p50 ms</th><th>TTFT p99 ms</th><th>TPOT p50 ms</th><th>TPOT p99 ms</th><th>ITL p99 ms</th>\
<th>output tok/s</th><th>next run</th></tr>");
    for t in &config.targets {
        let s = status.get(&t.name).cloned().unwrap_or_default();
        for scenario in &t.scenarios {
            let run = latest
                .iter()
                .find(|r| r.target == t.name && &r.scenario == scenario);
            let next = s
                .next_due
                .get(scenario)
                .map(|d| d.to_rfc3339())
                .unwrap_or_default();
            match run {
                Some(r) => {
                    let class = if r.success() { "ok" } else { "bad" };
                    let _ = write!(
                        page,
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{next}</td></tr>",
                        escape(&t.name),
                        escape(scenario),
                        r.started_at.format("%Y-%m-%d %H:%M:%S UTC"),
                        r.outcome.as_str(),
                        r.summary.completed,
                        r.summary.failed,
                        ms(r.summary.ttft.p50),
                        ms(r.summary.ttft.p99),
                        ms(r.summary.tpot.p50),
                        ms(r.summary.tpot.p99),
                        ms(r.summary.itl.p99),
                        r.summary.output_throughput,
                    );
                    if let Some(e) = &r.error
                        && !r.success()
                    {
                        let _ = write!(
                            page,
                            "<tr><td></td><td colspan=\"11\" class=\"bad\" style=\"text-align:left\">{}</td></tr>",
                            escape(e)
                        );
                    }
                }
                None => {
                    let _ = write!(
                        page,
                        "<tr><td>{}</td><td>{}</td><td colspan=\"9\">no run yet</td><td>{next}</td></tr>",
                        escape(&t.name),
                        escape(scenario)
                    );
                }
            }
        }
    }
    page.push_str("</table><h2>Verdicts</h2><table><tr><th>target</th><th>scenario</th><th>version</th><th>compared with</th>\
<th>state</th><th>candidate / baseline runs</th><th>why</th><th>report</th></tr>");
    for v in app.board.verdicts() {
        let class = match v.state {
            crate::detect::State::Regression => "bad",
            crate::detect::State::Ok => "ok",
            crate::detect::State::Confirming => "warn",
            crate::detect::State::Inconclusive => "",
        };
        let report = v
            .reference_build
            .as_deref()
            .filter(|r| *r != v.build)
            .map(|from| {
                let mut url = reqwest::Url::parse("http://x/report").expect("literal URL");
                url.query_pairs_mut()
                    .append_pair("target", &v.target)
                    .append_pair("from", from)
                    .append_pair("to", &v.build);
                format!(
                    "<a href=\"/report?{}\">{} to {}</a>",
                    escape(url.query().unwrap_or_default()),
                    escape(from),
                    escape(&v.build)
                )
            })
            .unwrap_or_default();
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{} / {}</td><td style=\"text-align:left\">{}</td><td>{report}</td></tr>",
            escape(&v.target),
            escape(&v.scenario),
            escape(&v.build),
            escape(v.reference_build.as_deref().unwrap_or("")),
            v.state.as_str(),
            v.candidate_runs,
            v.baseline_runs,
            escape(&v.reason),
        );
    }
    page.push_str("</table></body></html>");
    Html(page)
}
