//! The real vLLM server of `../shared/real-vllm`, started and stopped by
//! the tests that need one of their own.

use std::process::Command;
use std::time::Duration;

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
