//! Telemetry as real servers and exporters serve it, through the daemon's
//! own binary: every real page of `../shared/fixtures/realworld/` as a
//! target's telemetry (served by a page server on 127.0.0.1), with the
//! daemon's `/metrics` accepted by `promtool check metrics`; a SGLang
//! server (the simulator passing for one) probed and read; a page with
//! none of the families read counted as a failure; and a source that fails
//! then recovers said once each way in the log and on the status page.

use crate::common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use common::{until, value};
use vllm_sentinel::sim::{SimConfig, SimHandle, SimServerKind};
use vllm_sentinel::telemetry::exposition::Exposition;

/// Pages by name; a name without a page answers 503.
type Pages = Arc<Mutex<HashMap<String, String>>>;

/// Set when a request to the page server carried an `Authorization`
/// header: a target's key must never leave the target's own origin.
static KEY_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn serve_page(
    State(pages): State<Pages>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    if headers.contains_key(axum::http::header::AUTHORIZATION) {
        KEY_SEEN.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    match pages.lock().unwrap().get(&name) {
        Some(text) => text.clone().into_response(),
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

async fn start_page_server(pages: Pages) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/p/{name}", axum::routing::get(serve_page))
        .with_state(pages);
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/p")
}

/// The real pages, by file name; empty (the real pages skipped, said)
/// when the folder is absent.
fn real_pages() -> HashMap<String, String> {
    let Some(dir) = common::skip::realworld() else {
        eprintln!("the SGLang and failure checks still run");
        return HashMap::new();
    };
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.ends_with(".prom").then(|| {
                (
                    name.clone(),
                    std::fs::read_to_string(dir.join(&name)).unwrap(),
                )
            })
        })
        .collect()
}

const VLLM_PAGE: &str = "vllm:num_requests_running{model_name=\"m\"} 3\n\
vllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n";

/// One target per telemetry case, each with its own page.
fn targets(vllm: &str, sglang: &str, pages: &str, have_real: bool) -> String {
    let mut t = String::new();
    let mut target = |name: &str, base: &str, extra: &str| {
        t.push_str(&format!(
            "[[targets]]\nname = \"{name}\"\nbase_url = \"{base}\"\n{extra}\n"
        ));
    };
    target(
        "sglang",
        sglang,
        "schedule = \"*/2 * * * * *\"\nscenarios = [\"tiny\"]",
    );
    target(
        "flaky",
        vllm,
        &format!("metrics_url = \"{pages}/flaky\"\napi_key_env = \"SENTINEL_TEST_KEY\""),
    );
    target("huge", vllm, &format!("metrics_url = \"{pages}/huge\""));
    if have_real {
        let dcgm = |file: &str| format!("server_metrics = false\ndcgm_url = \"{pages}/{file}\"");
        target("a100", vllm, &dcgm("dcgm_a100-mig_nvidia-docs.prom"));
        target("l4", vllm, &dcgm("dcgm_l4_kops-aws.prom"));
        target(
            "h100",
            vllm,
            &format!(
                "{}\ndcgm_match = '{{pod=~\"vllm-.*\"}}'",
                dcgm("dcgm_h100x8_aicr-eks-dynamo-vllm-pod.prom")
            ),
        );
        let server = |file: &str| format!("metrics_url = \"{pages}/{file}\"");
        target(
            "v0",
            vllm,
            &server("vllm_v0-engine_qwen2.5-coder-1.5b_aibrix-docs.prom"),
        );
        target(
            "sglangpage",
            vllm,
            &server("sglang_v0.4-era_llama3.1-8b_production-metrics-doc.prom"),
        );
        target("wrongpage", vllm, &server("dcgm_l4_kops-aws.prom"));
    }
    t
}

fn count(page: &Exposition, name: &str, target: &str) -> usize {
    page.scalars(&[name])
        .iter()
        .filter(|s| s.label("target") == Some(target))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn real_pages_sglang_and_failing_sources_through_the_daemon() {
    let vllm = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let sglang_config = SimConfig {
        server_kind: SimServerKind::Sglang,
        version: "0.5.2".into(),
        ..SimConfig::default()
    };
    let sglang = SimHandle::start("127.0.0.1:0", sglang_config)
        .await
        .unwrap();
    let real = real_pages();
    let have_real = !real.is_empty();
    let mut real = real;
    // Larger than any real page: refused, not held in memory.
    real.insert(
        "huge".into(),
        "vllm:num_requests_running{model_name=\"m\"} 1\n".repeat(200_000),
    );
    let pages: Pages = Arc::new(Mutex::new(real));
    let pages_url = start_page_server(pages.clone()).await;

    let dir = common::temp_dir("telemetry-sources");
    let port = common::free_port();
    let config = dir.join("sentinel.toml");
    let text = format!(
        "[exporter]\nlisten = \"127.0.0.1:{port}\"\n[store]\npath = \"{}\"\n\
[scheduler]\nschedule = \"0 0 0 1 1 *\"\n[telemetry]\nscrape_interval = \"1s\"\nnvml = false\n\
[[scenarios]]\nname = \"tiny\"\ninput_len = 8\noutput_len = 4\nconcurrency = 1\nnum_requests = 2\nwarmup = 0\n{}",
        dir.join("store.db").display(),
        targets(&vllm.base_url(), &sglang.base_url(), &pages_url, have_real),
    );
    std::fs::write(&config, text).unwrap();
    let log_path = dir.join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .env("SENTINEL_TEST_KEY", "sk-test-key-of-the-flaky-target")
        .env("NO_COLOR", "1")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let scrape = async || -> Option<(String, Exposition)> {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let page = Exposition::parse(&text).ok()?;
        Some((text, page))
    };

    // The SGLang server: its kind and version, a run filed under its
    // version, its load from SGLang's names.
    let (_, page) = until(Duration::from_secs(60), "a SGLang run", async || {
        let (text, page) = scrape().await?;
        let run = value(
            &page,
            "sentinel_run_last_success_timestamp_seconds",
            &[("target", "sglang"), ("build", "0.5.2")],
        );
        run.map(|_| (text, page))
    })
    .await;
    let info = [
        ("target", "sglang"),
        ("kind", "sglang"),
        ("version", "0.5.2"),
    ];
    assert_eq!(value(&page, "sentinel_server_info", &info), Some(1.0));
    let up = |page: &Exposition, target: &str, source: &str| {
        value(
            page,
            "sentinel_telemetry_up",
            &[("target", target), ("source", source)],
        )
    };
    assert_eq!(up(&page, "sglang", "server"), Some(1.0));
    let running = [("target", "sglang")];
    assert!(value(&page, "sentinel_server_requests_running", &running).is_some());
    assert!(value(&page, "sentinel_server_kv_cache_usage_ratio", &running).is_some());
    let vllm_info = value(&page, "sentinel_server_info", &[("kind", "vllm")]);
    assert_eq!(vllm_info, Some(1.0), "the vLLM simulator is known as vLLM");

    // The flaky source has failed from the start; now it reads.
    assert_eq!(up(&page, "flaky", "server"), Some(0.0));
    let status = reqwest::get(&base).await.unwrap().text().await.unwrap();
    assert!(status.contains("/p/flaky: HTTP 503"), "{status}");
    pages
        .lock()
        .unwrap()
        .insert("flaky".into(), VLLM_PAGE.into());
    let (text, page) = until(Duration::from_secs(20), "flaky to read", async || {
        let (text, page) = scrape().await?;
        (up(&page, "flaky", "server") == Some(1.0)).then_some((text, page))
    })
    .await;
    let flaky_running = value(
        &page,
        "sentinel_server_requests_running",
        &[("target", "flaky")],
    );
    assert_eq!(flaky_running, Some(3.0));

    if have_real {
        check_real_pages(&page);
        let status = reqwest::get(&base).await.unwrap().text().await.unwrap();
        assert!(
            status.contains("none of the families read here is on the page"),
            "the status page says why the DCGM page is no server page: {status}"
        );
    }
    promtool_accepts(&text);
    assert_eq!(up(&page, "huge", "server"), Some(0.0));
    let status = reqwest::get(&base).await.unwrap().text().await.unwrap();
    assert!(
        status.contains("the answer is longer than 8 MiB"),
        "{status}"
    );

    // Failing again, then back: one warning and one recovery each time,
    // however many reads failed in between.
    pages.lock().unwrap().remove("flaky");
    until(Duration::from_secs(20), "flaky to fail", async || {
        let (_, page) = scrape().await?;
        (up(&page, "flaky", "server") == Some(0.0)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    pages
        .lock()
        .unwrap()
        .insert("flaky".into(), VLLM_PAGE.into());
    until(Duration::from_secs(20), "flaky to read again", async || {
        let (_, page) = scrape().await?;
        (up(&page, "flaky", "server") == Some(1.0)).then_some(())
    })
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(
        !KEY_SEEN.load(std::sync::atomic::Ordering::SeqCst),
        "the key went to a metrics_url on another port"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("sk-test-key"), "the key reached the log");
    let lines = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what) && l.contains("flaky"))
            .count()
    };
    assert_eq!(
        lines("telemetry source failing"),
        2,
        "once at start, once after it broke again:\n{log}"
    );
    assert_eq!(lines("telemetry source reads again"), 2, "{log}");
    let warn = log
        .lines()
        .find(|l| l.contains("telemetry source failing") && l.contains("flaky"))
        .unwrap();
    assert!(warn.contains("WARN") && warn.contains("HTTP 503"), "{warn}");
}

/// A series by name and labels, and its value.
type Expected = (&'static str, &'static [(&'static str, &'static str)], f64);

/// The real pages' readings on `/metrics`.
fn check_real_pages(page: &Exposition) {
    for (target, source) in [
        ("a100", "dcgm"),
        ("l4", "dcgm"),
        ("h100", "dcgm"),
        ("v0", "server"),
        ("sglangpage", "server"),
    ] {
        let labels = [("target", target), ("source", source)];
        assert_eq!(
            value(page, "sentinel_telemetry_up", &labels),
            Some(1.0),
            "{target}"
        );
    }
    let wrong = [("target", "wrongpage"), ("source", "server")];
    assert_eq!(value(page, "sentinel_telemetry_up", &wrong), Some(0.0));
    // A100: the GPU and its MIG instance, each with the engine ratio.
    assert_eq!(
        count(page, "sentinel_gpu_graphics_engine_active_ratio", "a100"),
        2
    );
    assert_eq!(count(page, "sentinel_gpu_last_xid", "a100"), 2);
    assert_eq!(count(page, "sentinel_gpu_power_watts", "l4"), 1);
    assert_eq!(count(page, "sentinel_gpu_tensor_active_ratio", "l4"), 1);
    // The node's eight GPUs, of which dcgm_match keeps the vLLM pod's.
    assert_eq!(count(page, "sentinel_gpu_power_watts", "h100"), 1);
    let expected: [Expected; 6] = [
        (
            "sentinel_gpu_graphics_engine_active_ratio",
            &[("target", "a100"), ("mig", "1g.5gb/13")],
            0.995687,
        ),
        (
            "sentinel_gpu_power_watts",
            &[("target", "h100"), ("gpu", "0")],
            113.611,
        ),
        (
            "sentinel_server_requests_running",
            &[("target", "sglangpage")],
            162.0,
        ),
        (
            "sentinel_server_requests_waiting",
            &[("target", "sglangpage")],
            2826.0,
        ),
        (
            "sentinel_server_kv_cache_usage_ratio",
            &[("target", "sglangpage")],
            0.28,
        ),
        (
            "sentinel_server_kv_cache_usage_ratio",
            &[("target", "v0")],
            0.0,
        ),
    ];
    for (name, labels, v) in expected {
        assert_eq!(value(page, name, labels), Some(v), "{name} {labels:?}");
    }
}

/// `promtool check metrics` reads the page without a complaint.
fn promtool_accepts(text: &str) {
    if !common::have(&["promtool"]) {
        return;
    }
    let out = common::prom::check_metrics(text);
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
