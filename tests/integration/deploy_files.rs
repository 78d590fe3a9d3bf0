//! What the deployment files and the image rely on: hadolint accepts the
//! Dockerfile, `systemd-analyze verify` accepts the unit, and the binary
//! behaves as the image expects: configuration from `SENTINEL_CONFIG`, an
//! unwritable store path is one clear error, the daemon's log goes to
//! standard output, and SIGTERM drains and exits 0.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn hadolint_accepts_the_dockerfile() {
    let Some(hadolint) = common::tool("hadolint") else {
        return;
    };
    let mut command = Command::new(hadolint);
    command.arg(root().join("Dockerfile"));
    let (ok, text) = common::output_of(command);
    eprintln!("hadolint Dockerfile: {:?}", text.trim());
    assert!(ok && text.trim().is_empty(), "hadolint: {text}");
    // The build context holds only what the build copies.
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    for kept in ["!Cargo.toml", "!Cargo.lock", "!src/", "!deploy/container/"] {
        assert!(ignore.lines().any(|l| l == kept), "{kept}");
    }
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let Some(analyze) = common::tool("systemd-analyze") else {
        return;
    };
    // The unit names the installed binary; verify it against this build's.
    let unit = std::fs::read_to_string(root().join("deploy/systemd/vllm-sentinel.service"))
        .unwrap()
        .replace(
            "/usr/local/bin/vllm-sentinel",
            env!("CARGO_BIN_EXE_vllm-sentinel"),
        );
    for needed in [
        "DynamicUser=yes",
        "StateDirectory=vllm-sentinel",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "EnvironmentFile=",
    ] {
        assert!(unit.contains(needed), "the unit lacks {needed}");
    }
    let dir = common::temp_dir("systemd-unit");
    let path = dir.join("vllm-sentinel.service");
    std::fs::write(&path, unit).unwrap();
    let mut command = Command::new(analyze);
    command.arg("verify").arg(&path);
    let (ok, text) = common::output_of(command);
    eprintln!("systemd-analyze verify: {:?}", text.trim());
    assert!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify: {text}"
    );
}

fn write_config(dir: &Path, store: &Path, port: u16) -> PathBuf {
    let path = dir.join("sentinel.toml");
    std::fs::write(
        &path,
        format!(
            "[exporter]\nlisten = \"127.0.0.1:{port}\"\n[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[[targets]]\nname = \"t\"\nbase_url = \"http://127.0.0.1:9\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nschedule = \"0 0 0 1 1 *\"\n",
            store.display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn an_unwritable_store_is_one_clear_error() {
    let dir = common::temp_dir("unwritable-store");
    let config = write_config(
        &dir,
        Path::new("/proc/vllm-sentinel/store.db"),
        common::free_port(),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .arg("serve")
        .env("SENTINEL_CONFIG", &config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(!out.status.success());
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("/proc/vllm-sentinel/store.db"),
        "{stderr}"
    );
}

#[test]
fn configured_from_the_environment_it_logs_to_stdout_and_drains_on_sigterm() {
    let dir = common::temp_dir("container-contract");
    let port = common::free_port();
    let config = write_config(&dir, &dir.join("store.db"), port);
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .arg("serve")
        .env("SENTINEL_CONFIG", &config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the daemon never listened"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let sent = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let stopping = Instant::now();
    let status = loop {
        if let Some(status) = daemon.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopping.elapsed() < Duration::from_secs(20),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = daemon.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "exit {status:?}: {stdout}{stderr}");
    assert!(
        stdout.contains("INFO"),
        "the log is on standard output: {stdout:?}"
    );
    assert!(stderr.trim().is_empty(), "nothing on stderr: {stderr:?}");
}
