//! The `probe` command against hostile servers and hostile numbers: each
//! case ends in one clear error line or a bounded outcome, never a panic,
//! an abort or unbounded memory. Children run under an address-space limit
//! so a regression fails here instead of exhausting the machine.

use crate::common;

use common::hostile::{HostileServer, Mode};
use common::run_limited;

/// Address space a probe child may use: far above what a probe needs
/// (runtime threads reserve some), far below what the old failures took.
const ADDRESS_SPACE: u64 = 3 << 30;
/// Peak resident memory a short probe stays within, KiB.
const PEAK_RSS_KIB: u64 = 150 * 1024;

fn stderr_line(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("memory allocation"),
        "{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    lines[0].to_owned()
}

#[tokio::test]
async fn nonsense_token_counts_are_a_clear_error_in_bounded_memory() {
    let server = HostileServer::start(Mode::Normal).await;
    for count in ["0", "1", "4294967295", "-5", "\"abc\"", "1e30"] {
        server.set(Mode::TokenizeCount(count.into()));
        let (out, peak) = run_limited(
            &[
                "probe",
                "--base-url",
                &server.url,
                "--input-len",
                "128",
                "--num-requests",
                "2",
                "--concurrency",
                "1",
            ],
            ADDRESS_SPACE,
            None,
        )
        .await;
        let line = stderr_line(&out);
        assert_eq!(out.status.code(), Some(1), "count {count}: {line}");
        assert!(
            line.contains("/tokenize gives token counts that make no sense")
                && line.contains("--no-calibrate"),
            "count {count}: {line}"
        );
        assert!(peak < PEAK_RSS_KIB, "count {count}: peak {peak} KiB");
        println!("count {count}: peak resident {peak} KiB; {line}");
    }
}

#[tokio::test]
async fn numbers_out_of_range_are_refused_before_anything_runs() {
    let server = HostileServer::start(Mode::Normal).await;
    let cases: &[(&[&str], &str)] = &[
        (
            &["--request-timeout", "1e19"],
            "--request-timeout: 1e19 is more than the 86400 seconds allowed",
        ),
        (
            &["--request-rate", "1e-300"],
            "the request rate 1e-300 is out of range",
        ),
        (
            &["--burstiness", "inf"],
            "the burstiness inf is out of range",
        ),
        (
            &["--warmup", "100000000"],
            "the warm-up count 100000000 is out of range",
        ),
        (
            &["--num-requests", "1000000000"],
            "the number of requests 1000000000 is out of range",
        ),
        (
            &["--input-len", "1000000000"],
            "the input length 1000000000 is out of range",
        ),
        (
            &["--input-len", "1048576", "--num-requests", "200"],
            "more than the 16777216 one run may hold",
        ),
        (&["--concurrency", "0"], "the concurrency 0 is out of range"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["probe", "--base-url", &server.url];
        args.extend_from_slice(flags);
        let (out, peak) = run_limited(&args, ADDRESS_SPACE, None).await;
        let line = stderr_line(&out);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {line}");
        assert!(line.contains(expected), "{flags:?}: {line}");
        assert!(peak < PEAK_RSS_KIB, "{flags:?}: peak {peak} KiB");
    }
}

#[tokio::test]
async fn lengths_past_the_models_context_name_max_model_len() {
    let server = HostileServer::start(Mode::Normal).await;
    *server.state.max_model_len.lock().unwrap() = Some(128);
    let (out, _) = run_limited(
        &[
            "probe",
            "--base-url",
            &server.url,
            "--input-len",
            "100",
            "--output-len",
            "64",
        ],
        ADDRESS_SPACE,
        None,
    )
    .await;
    let line = stderr_line(&out);
    assert!(
        line.contains("exceed the model's max_model_len of 128 (from /v1/models)"),
        "{line}"
    );
}

#[tokio::test]
async fn credentials_in_the_url_are_refused_without_showing_them() {
    let (out, _) = run_limited(
        &["probe", "--base-url", "http://user:hunter2pw@127.0.0.1:9"],
        ADDRESS_SPACE,
        None,
    )
    .await;
    let line = stderr_line(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        line.contains("--base-url must not carry credentials"),
        "{line}"
    );
    assert!(
        !line.contains("hunter2pw") && !line.contains("user"),
        "{line}"
    );
}

#[tokio::test]
async fn a_base_url_ending_in_v1_says_so() {
    let server = HostileServer::start(Mode::Normal).await;
    let url = format!("{}/v1", server.url);
    let (out, _) = run_limited(&["probe", "--base-url", &url], ADDRESS_SPACE, None).await;
    let line = stderr_line(&out);
    assert!(
        line.contains("ends in /v1") && line.contains("drop the /v1"),
        "{line}"
    );
}

#[tokio::test]
async fn an_unknown_model_among_two_hundred_thousand_is_one_short_line() {
    let server = HostileServer::start(Mode::ManyModels(200_000)).await;
    let (out, peak) = run_limited(
        &["probe", "--base-url", &server.url, "--model", "nope"],
        ADDRESS_SPACE,
        None,
    )
    .await;
    let line = stderr_line(&out);
    assert!(line.len() < 1000, "{} bytes: {}", line.len(), &line[..200]);
    assert!(
        line.contains("model \"nope\" is not served") && line.contains("and 199990 more"),
        "{line}"
    );
    println!(
        "200k models: {} bytes, peak resident {peak} KiB",
        line.len()
    );
}

#[tokio::test]
async fn a_run_out_of_descriptors_blames_us_not_the_target() {
    let sim = vllm_sentinel::sim::SimHandle::start(
        "127.0.0.1:0",
        vllm_sentinel::sim::SimConfig::default(),
    )
    .await
    .unwrap();
    let dir = common::temp_dir("local-outcome");
    let json = dir.join("result.json");
    // 40 descriptors: enough to start and ask for the model, not for 64
    // connections at once.
    let (out, _) = run_limited(
        &[
            "probe",
            "--base-url",
            &sim.base_url(),
            "--concurrency",
            "64",
            "--num-requests",
            "64",
            "--output-len",
            "32",
            "--no-calibrate",
            "--result-json",
            json.to_str().unwrap(),
        ],
        ADDRESS_SPACE,
        Some(40),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let written = std::fs::read(&json).unwrap_or_else(|e| {
        panic!(
            "no result JSON ({e}); exit {:?}; stderr: {stderr}",
            out.status
        )
    });
    let result: serde_json::Value = serde_json::from_slice(&written).unwrap();
    let outcomes: Vec<&str> = result["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.as_str())
        .collect();
    let local = outcomes.iter().filter(|o| **o == "local").count();
    assert!(
        local > 0,
        "some requests ran out of descriptors: {outcomes:?}"
    );
    assert!(
        !outcomes.contains(&"connect"),
        "none is blamed on the target: {outcomes:?}"
    );
    println!(
        "descriptor limit 40, concurrency 64: {local} local, {} ok",
        outcomes.len() - local
    );
}

#[tokio::test]
async fn check_config_refuses_durations_that_overflow() {
    let dir = common::temp_dir("overflow-config");
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "[[targets]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9\"\n[targets.timeouts]\nrequest = \"200000000000000d\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 4194304\noutput_len = 8\nnum_requests = 200\n",
    )
    .unwrap();
    let (out, _) = run_limited(
        &["check-config", "--config", path.to_str().unwrap()],
        ADDRESS_SPACE,
        None,
    )
    .await;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "targets[0].timeouts.request: \"200000000000000d\" is longer than the 3650 days"
        ),
        "{text}"
    );
    assert!(
        text.contains("scenarios[0].input_len: 4194304 is out of range"),
        "{text}"
    );
}

#[tokio::test]
async fn check_config_refuses_a_dataset_that_is_a_device_or_a_fifo_at_once() {
    let dir = common::temp_dir("dataset-kinds");
    let zero = dir.join("prompts.jsonl");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = dir.join("pipe.jsonl");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for (dataset, kind) in [
        (&zero, "a character device"),
        (&fifo, "a FIFO (named pipe)"),
    ] {
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            format!(
                "[[targets]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9\"\nscenarios = [\"mine\"]\n\
[[scenarios]]\nname = \"mine\"\ndataset_path = \"{}\"\n",
                dataset.display()
            ),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let (out, peak) = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            run_limited(
                &["check-config", "--config", path.to_str().unwrap()],
                ADDRESS_SPACE,
                None,
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("check-config hangs on {kind}"));
        let took = started.elapsed();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        let expected = format!(
            "scenarios[0].dataset_path: cannot read {}: {kind}, not a regular file",
            dataset.display()
        );
        assert!(text.contains(&expected), "{text}");
        // The scenario's own error, and no second one about naming it.
        assert!(text.contains("has 1 problem(s)"), "{text}");
        assert!(peak < PEAK_RSS_KIB, "{kind}: peak {peak} KiB");
        println!(
            "{kind}: refused in {:.0} ms, peak resident {peak} KiB: {expected}",
            took.as_secs_f64() * 1000.0
        );
    }
}
