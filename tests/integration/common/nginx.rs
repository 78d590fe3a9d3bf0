//! Debian's nginx as a round-robin load balancer in front of simulators,
//! for the fleet and liveness tests.

use std::process::{Child, Command, Stdio};

use super::{free_port, wait_for_port};

/// A running nginx, stopped when dropped with SIGTERM to its master,
/// which stops its worker first (SIGKILL would leave the worker running
/// after the test).
pub struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let pid = libc::pid_t::try_from(self.0.id()).unwrap_or(0);
        // SAFETY: kill(2) on our own child's pid, which `wait` has not
        // reaped yet, so it cannot be another process's.
        if pid <= 0 || unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// nginx in the foreground, round robin over `upstreams`, on a free port;
/// None, the test skipped, where nginx is not installed.
pub async fn start_nginx(dir: &std::path::Path, upstreams: &[String]) -> Option<(Nginx, String)> {
    start_nginx_with(dir, upstreams, "").await
}

/// The same, with `location` (nginx directives) added to the proxying
/// location, such as a header naming the upstream that served.
pub async fn start_nginx_with(
    dir: &std::path::Path,
    upstreams: &[String],
    location: &str,
) -> Option<(Nginx, String)> {
    let binary = super::tool("nginx")?;
    let port = free_port();
    let servers: String = upstreams
        .iter()
        .map(|u| format!("    server {u};\n"))
        .collect();
    let conf = format!(
        "daemon off;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
events {{ worker_connections 256; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
  fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
  upstream fleet {{\n{servers}  }}\n\
  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://fleet;\n\
      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n{location}    }}\n  }}\n}}\n",
        dir = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(binary)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let child = Nginx(child);
    wait_for_port(port, "nginx").await;
    Some((child, format!("http://127.0.0.1:{port}")))
}
