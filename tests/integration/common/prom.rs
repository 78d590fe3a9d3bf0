//! A real Prometheus (Debian's `prometheus`) and `promtool check metrics`
//! for the tests.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::Killed;

/// Prometheus with `config` (YAML) on a free port, its data and log in
/// `dir`.
pub fn start_prometheus(dir: &Path, config: &str) -> (Killed, u16) {
    let port = super::free_port();
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("`prometheus` is not installed: apt-get install prometheus (.ci/run does this)");
    (Killed(child), port)
}

/// `promtool check metrics` on `page`.
pub fn check_metrics(page: &str) -> Output {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("`promtool` is not installed: apt-get install prometheus (.ci/run does this)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}
