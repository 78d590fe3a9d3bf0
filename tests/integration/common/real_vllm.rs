//! The real vLLM server of `../shared/real-vllm`: named by URL for the tests
//! that probe a running one, started and stopped by those that need one of
//! their own. These tests run only when asked for (`--ignored`), so a
//! missing setting fails them rather than passing with nothing checked.

use std::process::Command;
use std::time::Duration;

/// A running server's base URL, from `var` (`SENTINEL_REAL_VLLM_URL`, or a
/// second server's).
pub fn url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("set {var} to the real vLLM server's base URL"))
}

/// The script that starts the server (`SENTINEL_REAL_VLLM_SERVE`): the
/// tests that start their own server need it.
pub fn script() -> String {
    std::env::var("SENTINEL_REAL_VLLM_SERVE")
        .expect("set SENTINEL_REAL_VLLM_SERVE to ../shared/real-vllm/serve.sh")
}

/// The port a test's own server listens on: `var` when set, else
/// `default` (each test its own, so two can run at once).
pub fn port(var: &str, default: u16) -> u16 {
    std::env::var(var)
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(default)
}

/// A started server's process group, stopped when dropped, also when the
/// test fails midway.
pub struct Served(pub i32);

impl Drop for Served {
    fn drop(&mut self) {
        stop(self.0);
    }
}

/// Starts the server with `serve.sh` (`script`) on `port`, with extra vLLM
/// flags; returns its process group.
pub fn serve(script: &str, port: u16, vllm_args: &str) -> i32 {
    let out = Command::new(script)
        .arg(port.to_string())
        .env("VLLM_ARGS", vllm_args)
        .output()
        .expect("the serve script runs");
    assert!(
        out.status.success(),
        "serve.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("serve.sh prints the PID")
}

/// Stops the server's whole process group.
pub fn stop(pgid: i32) {
    let _ = Command::new("kill")
        .arg("--")
        .arg(format!("-{pgid}"))
        .status();
    std::thread::sleep(Duration::from_secs(3));
}
