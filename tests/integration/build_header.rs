//! Without Kubernetes: a proxy in front of each server names its image in
//! a response header, and the target's `build_header` folds it into each
//! request's build. Two simulators of one version and fingerprint behind
//! one round-robin proxy that says `x-image-digest` per upstream: the runs
//! split per digest into `0.32.0` and `0.32.0+2`, one build change, and
//! each build's digest is exported.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::kube_api::digest;
use common::{metrics, temp_dir, until, value};
use vllm_sentinel::sim::{SimConfig, SimHandle};

/// Upstreams and the digest each one's answers are labelled with.
type Upstreams = Arc<(Vec<(String, String)>, AtomicUsize)>;

/// A round-robin proxy on port 0 that streams each answer back with the
/// upstream's `x-image-digest` header; returns its base URL.
async fn start_proxy(upstreams: Vec<(String, String)>) -> String {
    async fn forward(State(up): State<Upstreams>, request: Request) -> Response {
        let (list, next) = &*up;
        let (base, digest) = &list[next.fetch_add(1, Ordering::Relaxed) % list.len()];
        let url = format!(
            "{base}{}",
            request.uri().path_and_query().map_or("/", |p| p.as_str())
        );
        let method = request.method().clone();
        let content_type = request.headers().get("content-type").cloned();
        let body = axum::body::to_bytes(request.into_body(), 1 << 20)
            .await
            .unwrap();
        let mut outgoing = reqwest::Client::new().request(method, url).body(body);
        if let Some(ct) = content_type {
            outgoing = outgoing.header("content-type", ct);
        }
        let answer = outgoing.send().await.unwrap();
        let mut response = Response::builder()
            .status(answer.status().as_u16())
            .header("x-image-digest", digest.as_str());
        if let Some(ct) = answer.headers().get("content-type") {
            response = response.header("content-type", ct);
        }
        response
            .body(Body::from_stream(answer.bytes_stream()))
            .unwrap()
    }
    let state: Upstreams = Arc::new((upstreams, AtomicUsize::new(0)));
    let app = axum::Router::new().fallback(forward).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_header_splits_one_version_into_its_images() {
    let dir = temp_dir("build-header");
    let config = SimConfig {
        ttft_ms: 10.0,
        itl_ms: 1.0,
        version: "0.32.0".into(),
        ..SimConfig::default()
    };
    let a = SimHandle::start("127.0.0.1:0", config.clone())
        .await
        .unwrap();
    let b = SimHandle::start("127.0.0.1:0", config).await.unwrap();
    let (old, new) = (digest(0xaa), digest(0xbb));
    let proxy = start_proxy(vec![
        (a.base_url(), old.clone()),
        (b.base_url(), new.clone()),
    ])
    .await;
    let text = format!(
        r#"
[scheduler]
schedule = "* * * * * *"
[store]
path = "{}"
[detector]
canary_window = 3
[[scenarios]]
name = "interactive"
input_len = 16
output_len = 4
concurrency = 2
num_requests = 8
warmup = 0
[[targets]]
name = "fleet"
base_url = "{proxy}"
build_header = "X-Image-Digest"
scenarios = ["interactive"]
"#,
        dir.join("store.db").display()
    );
    let handle = common::start_daemon(&text, None).await;
    let page = until(Duration::from_secs(60), "both images serving", async || {
        let page = metrics(&handle).await;
        (common::run_label_values(&page, "build") == ["0.32.0", "0.32.0+2"]).then_some(page)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let page_after = metrics(&handle).await;
    assert_eq!(
        value(
            &page_after,
            "sentinel_build_changes_total",
            &[("target", "fleet")]
        ),
        Some(1.0),
        "one change, not one per run"
    );
    let digests: Vec<String> = page
        .scalars(&["sentinel_build_image_info"])
        .iter()
        .filter_map(|s| s.label("digest").map(str::to_owned))
        .collect();
    assert!(
        digests.contains(&old) && digests.contains(&new),
        "{digests:?}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
