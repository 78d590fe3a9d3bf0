//! The `probe` command's "cannot start" errors: one clear line on stderr,
//! exit code 1, no panic, no backtrace, no secret.

use std::process::Output;

use crate::common;

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
    let url = format!("http://127.0.0.1:{}", common::free_port());
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
    let dir = common::temp_dir("key");
    let key_file = dir.join("key");
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

/// Each cause once: the library's errors carry their cause in the message
/// and do not chain it again.
#[tokio::test]
async fn a_cause_is_printed_once() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["check-config", "--config", "/nonexistent/sentinel.toml"])
        .output()
        .await
        .unwrap();
    let line = one_error_line(&out);
    assert!(
        line.contains("cannot read /nonexistent/sentinel.toml"),
        "{line}"
    );
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "{line}"
    );
}

/// `--log-format json`: every line on stderr is one JSON object, the
/// daemon's events carry their fields, and a fatal error is JSON too.
#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    use tokio::io::AsyncBufReadExt;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args([
            "--log-format",
            "json",
            "check-config",
            "--config",
            "/nonexistent/x.toml",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let event: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
    assert_eq!(event["level"], "ERROR");
    let message = event["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot read /nonexistent/x.toml"),
        "{message}"
    );

    // The demo's store goes to the temporary directory: this test's own.
    let dir = common::temp_dir("json-logs-demo");
    let mut demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["--log-format", "json", "demo", "--listen", "127.0.0.1:0"])
        .env("TMPDIR", dir.as_os_str())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The daemon's log is its standard output.
    let mut lines = tokio::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    let finished = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let mut seen = 0;
        while let Some(line) = lines.next_line().await.unwrap() {
            // The demo's banner (its addresses) is plain text; every log
            // event is one JSON object.
            if !line.starts_with('{') {
                assert!(
                    !line.contains("\"level\""),
                    "a log event not on its own line: {line}"
                );
                continue;
            }
            seen += 1;
            let event: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            assert!(!line.contains('\u{1b}'), "no colour codes: {line}");
            if event["fields"]["message"] == "run finished" {
                return (seen, event);
            }
        }
        panic!("the demo ended before a run finished");
    })
    .await
    .expect("a run finishes within a minute");
    let (seen, event) = finished;
    assert!(seen >= 2);
    assert_eq!(event["fields"]["outcome"], "ok", "{event}");
    assert!(event["fields"]["ttft_p50_ms"].is_number(), "{event}");
    demo.kill().await.unwrap();
}
