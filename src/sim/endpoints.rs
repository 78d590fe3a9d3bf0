//! The simulator's routes and its small endpoints: models, version, server
//! info, tokenize, its `/metrics` and DCGM pages, and the admin config and
//! stats (the completions stream is `stream`'s, the restart `process`'s).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::{SimServerKind, SimState, process, stream};

/// The routes of the simulated server.
pub fn router(state: Arc<SimState>) -> Router {
    Router::new()
        .route("/v1/completions", post(stream::completions))
        .route("/v1/chat/completions", post(stream::chat_completions))
        .route("/v1/models", get(models))
        .route("/version", get(version))
        .route("/get_server_info", get(server_info))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/tokenize", post(tokenize))
        .route("/metrics", get(render_metrics))
        .route("/dcgm/metrics", get(dcgm_metrics))
        .route("/admin/config", get(get_config).post(post_config))
        .route("/admin/stats", get(get_stats))
        .route("/admin/restart", post(process::restart))
        .with_state(state)
}

/// A DCGM exporter page for the simulated host's two GPUs, so the demo's
/// GPU panels have data; utilization follows the requests in flight.
async fn dcgm_metrics(State(state): State<Arc<SimState>>) -> String {
    const PAGE: &str = include_str!("../../tests/fixtures/dcgm-exporter-h100.txt");
    let busy = (state.metrics.running.get().max(0) as u64).min(100);
    let mut out = String::with_capacity(PAGE.len());
    for line in PAGE.lines() {
        if line.starts_with("DCGM_FI_DEV_GPU_UTIL{")
            && let Some((series, _)) = line.rsplit_once(' ')
        {
            out.push_str(&format!("{series} {}\n", (busy * 10).min(100)));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

async fn models(State(sim): State<Arc<SimState>>, headers: HeaderMap) -> Response {
    let config = sim.config();
    if !sim.authorized(&headers, &config) {
        return stream::error_response(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": config.model,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": config.model_root,
            "parent": null,
            "max_model_len": config.max_model_len,
        }]
    }))
    .into_response()
}

/// vLLM's `/version`; SGLang has none.
async fn version(State(sim): State<Arc<SimState>>) -> Response {
    let config = sim.config();
    match config.server_kind {
        SimServerKind::Vllm => {
            let version = config.version_reported.unwrap_or(config.version);
            axum::Json(serde_json::json!({"version": version})).into_response()
        }
        SimServerKind::Sglang => StatusCode::NOT_FOUND.into_response(),
    }
}

/// SGLang's `/get_server_info`: its arguments and its version; vLLM has none.
async fn server_info(State(sim): State<Arc<SimState>>) -> Response {
    let config = sim.config();
    match config.server_kind {
        SimServerKind::Sglang => axum::Json(serde_json::json!({
            "model_path": config.model_root,
            "served_model_name": config.model,
            "max_running_requests": config.max_num_seqs,
            "context_length": config.max_model_len,
            "version": config.version,
        }))
        .into_response(),
        SimServerKind::Vllm => StatusCode::NOT_FOUND.into_response(),
    }
}

#[derive(Deserialize)]
struct TokenizeRequest {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<stream::ChatMessage>>,
}

async fn tokenize(
    State(sim): State<Arc<SimState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let config = sim.config();
    if !sim.authorized(&headers, &config) {
        return stream::error_response(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    let Ok(request) = serde_json::from_slice::<TokenizeRequest>(&body) else {
        return stream::error_response(StatusCode::BAD_REQUEST, "invalid tokenize request");
    };
    let count = match (&request.prompt, &request.messages) {
        (Some(p), _) => stream::prompt_tokens(p),
        (None, Some(m)) => stream::chat_prompt_tokens(m),
        (None, None) => {
            return stream::error_response(StatusCode::BAD_REQUEST, "prompt or messages required");
        }
    };
    let tokens: Vec<u32> = (0..count).map(|i| i % 400).collect();
    axum::Json(serde_json::json!({"count": count, "max_model_len": config.max_model_len, "tokens": tokens}))
        .into_response()
}

async fn render_metrics(State(sim): State<Arc<SimState>>) -> Response {
    let running = sim.metrics.running.get() as f64;
    sim.metrics
        .kv_cache_usage
        .set((running / sim.max_num_seqs as f64).min(1.0));
    sim.metrics.update_hit_rate();
    sim.metrics.process_start.set(sim.process.started_s());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        sim.metrics.render(),
    )
        .into_response()
}

async fn get_config(State(sim): State<Arc<SimState>>) -> Response {
    axum::Json(sim.config()).into_response()
}

async fn post_config(State(sim): State<Arc<SimState>>, body: axum::body::Bytes) -> Response {
    let patch: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")).into_response(),
    };
    match sim.update(patch) {
        Ok(config) => axum::Json(config).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

async fn get_stats(State(sim): State<Arc<SimState>>) -> Response {
    axum::Json(sim.stats()).into_response()
}
