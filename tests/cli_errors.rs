//! The `probe` command's "cannot start" errors: one clear line on stderr,
//! exit code 1, no panic, no backtrace, no secret.

use std::process::Output;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use vllm_sentinel::sim::{SimConfig, SimHandle};

async fn probe(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"));
    c.arg("probe")
        .args(args)
        .args(["--num-requests", "2", "--concurrency", "1"]);
    c.env_remove("OPENAI_API_KEY");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().await.expect("running the binary")
}

fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.to_lowercase().contains("backtrace"),
        "{stderr}"
    );
    lines[0].to_owned()
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn unreachable_url() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let line = one_error_line(&probe(&["--base-url", &url], &[]).await);
    assert!(
        line.contains("cannot reach") && line.contains(&url),
        "{line}"
    );
}

#[tokio::test]
async fn rejected_api_key_is_named_but_never_shown() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            api_key: Some("the-right-key".into()),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let out = probe(
        &[
            "--base-url",
            &sim.base_url(),
            "--api-key-env",
            "SENTINEL_TEST_KEY",
        ],
        &[("SENTINEL_TEST_KEY", "wrong-key-value-123")],
    )
    .await;
    let line = one_error_line(&out);
    assert!(
        line.contains("HTTP 401") && line.contains("API key"),
        "{line}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("wrong-key-value-123"));
    assert!(!line.contains("wrong-key-value-123"));
    // The right key from a file works.
    let key_file = std::env::temp_dir().join(format!("sentinel-key-{}", std::process::id()));
    std::fs::write(&key_file, "the-right-key\n").unwrap();
    let out = probe(
        &[
            "--base-url",
            &sim.base_url(),
            "--api-key-file",
            key_file.to_str().unwrap(),
            "--output-len",
            "2",
        ],
        &[],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Successful requests:                     2")
    );
}

#[tokio::test]
async fn wrong_model_lists_the_served_ones() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let line = one_error_line(
        &probe(
            &["--base-url", &sim.base_url(), "--model", "llama-9000"],
            &[],
        )
        .await,
    );
    assert!(
        line.contains("\"llama-9000\"") && line.contains("it serves: sim-model"),
        "{line}"
    );
}

#[tokio::test]
async fn not_an_openai_server() {
    let url =
        serve(Router::new().fallback(|| async { (StatusCode::NOT_FOUND, "<html>nginx</html>") }))
            .await;
    let line = one_error_line(&probe(&["--base-url", &url], &[]).await);
    assert!(line.contains("not an OpenAI-compatible server"), "{line}");

    let url =
        serve(Router::new().route("/v1/models", get(|| async { "<html>welcome</html>" }))).await;
    let line = one_error_line(&probe(&["--base-url", &url], &[]).await);
    assert!(line.contains("did not return a model list"), "{line}");
}

#[tokio::test]
async fn bad_flags_name_the_flag() {
    let line = one_error_line(&probe(&["--goodput", "ttft:fast"], &[]).await);
    assert!(line.contains("--goodput"), "{line}");
    let line = one_error_line(&probe(&["--metric-percentiles", "50,200"], &[]).await);
    assert!(line.contains("--metric-percentiles"), "{line}");
}
