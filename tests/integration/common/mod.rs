//! Helpers shared by the integration tests: child processes that die with
//! the test, free ports, and scratch directories removed with the test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::telemetry::exposition::Exposition;

/// A child process killed (and reaped) when the test ends, pass or fail.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port nothing listens on right now (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh, empty directory for one test (`sentinel-NAME-XXXXXX` in the
/// system's temporary directory), removed with everything in it when this
/// is dropped, also when the test fails: hold it for the test's life.
pub struct TempDir(tempfile::TempDir);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// A fresh, empty directory for one test, removed when the test ends.
pub fn temp_dir(name: &str) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("sentinel-{name}-"))
        .tempdir()
        .unwrap();
    TempDir(dir)
}

/// Waits until something accepts connections on `port` (20 s at most).
pub async fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "{what} did not start on {port}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the test SMTP server speaks: plain, STARTTLS required, or implicit
/// TLS, with a certificate and key in PEM files.
pub enum SmtpTls<'a> {
    Plain,
    StartTls { cert: &'a Path, key: &'a Path },
    Implicit { cert: &'a Path, key: &'a Path },
}

/// A real SMTP server (Debian's `python3-aiosmtpd`) writing what it
/// receives into `maildir`.
pub async fn start_smtp(maildir: &Path, tls: SmtpTls<'_>) -> (Killed, u16) {
    let port = free_port();
    let mut command = Command::new("/usr/bin/python3");
    command
        .args(["-m", "aiosmtpd", "-n", "-l"])
        .arg(format!("127.0.0.1:{port}"));
    match tls {
        SmtpTls::Plain => {}
        SmtpTls::StartTls { cert, key } => {
            command.arg("--tlscert").arg(cert).arg("--tlskey").arg(key);
        }
        SmtpTls::Implicit { cert, key } => {
            command
                .arg("--smtpscert")
                .arg(cert)
                .arg("--smtpskey")
                .arg(key);
        }
    }
    let child = command
        .args(["-c", "aiosmtpd.handlers.Mailbox"])
        .arg(maildir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3-aiosmtpd is not installed (.ci/run installs it)");
    let child = Killed(child);
    wait_for_port(port, "aiosmtpd").await;
    (child, port)
}

pub mod dns;
pub mod hostile;
pub mod kube_api;
pub mod nginx;
pub mod pki;
pub mod prom;
pub mod real_vllm;
pub mod replayed;
pub mod skip;
pub mod wedge;

pub use skip::{have, tool};

/// Runs the binary with `args` under resource limits (address space and
/// open files), sampling its peak resident memory while it runs. Returns
/// the output and the peak in KiB. A regression that allocates without
/// bound then fails on the limit instead of taking the machine with it.
pub async fn run_limited(
    args: &[&str],
    address_space: u64,
    open_files: Option<u64>,
) -> (std::process::Output, u64) {
    use nix::sys::resource::{Resource, setrlimit};
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"));
    command
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            setrlimit(Resource::RLIMIT_AS, address_space, address_space)?;
            if let Some(n) = open_files {
                setrlimit(Resource::RLIMIT_NOFILE, n, n)?;
            }
            Ok(())
        });
    }
    let child = command.spawn().expect("running the binary");
    let pid = child.id().unwrap_or(0);
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        while let Some(kib) = hostile::peak_rss_kib(pid) {
            peak = peak.max(kib);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        peak
    });
    let output = child.wait_with_output().await.unwrap();
    let peak = sampler.await.unwrap();
    (output, peak)
}

/// The daemon in-process on port 0 with the configuration `text`; with
/// `file`, the text is written there first so reloads read it.
pub async fn start_daemon(text: &str, file: Option<&Path>) -> vllm_sentinel::daemon::DaemonHandle {
    // `SENTINEL_TEST_LOG=1` logs the daemon's INFO lines; any other value
    // is a filter of its own (`vllm_sentinel=debug,kube=debug`).
    if let Some(filter) = std::env::var_os("SENTINEL_TEST_LOG") {
        let filter = match filter.to_str() {
            Some("1") | None => "vllm_sentinel=info".to_owned(),
            Some(other) => other.to_owned(),
        };
        let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
    }
    let config =
        vllm_sentinel::config::Config::from_text(text, "test").unwrap_or_else(|e| panic!("{e}"));
    if let Some(path) = file {
        std::fs::write(path, text).unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    vllm_sentinel::daemon::start(
        config,
        file.map(Path::to_path_buf),
        listener,
        tokio_util::sync::CancellationToken::new(),
        // Real servers and real Prometheus: real time.
        vllm_sentinel::clock::Clock::System,
    )
    .await
    .unwrap()
}

/// The body of a GET of `path` on the daemon's HTTP port.
pub async fn get_text(handle: &DaemonHandle, path: &str) -> String {
    reqwest::get(format!("http://{}{path}", handle.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Good and total events of each objective named, read in one answer of
/// `/api/v1/slos`; the answer too, for messages.
pub async fn slo_counts<const N: usize>(
    handle: &DaemonHandle,
    names: [&str; N],
) -> ([(u64, u64); N], serde_json::Value) {
    let slos = get_json(handle, "/api/v1/slos")
        .await
        .expect("/api/v1/slos");
    let counted = names.map(|name| {
        let slo = slos["slos"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["name"] == name))
            .unwrap_or_else(|| panic!("{name} in {slos}"));
        (
            slo["good"].as_u64().unwrap(),
            slo["total"].as_u64().unwrap(),
        )
    });
    (counted, slos)
}

/// A GET of `path` on the daemon's HTTP port as JSON; `None` while it does
/// not answer with JSON (for polling with [`until`]).
pub async fn get_json(handle: &DaemonHandle, path: &str) -> Option<serde_json::Value> {
    reqwest::get(format!("http://{}{path}", handle.addr))
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// The daemon's `/metrics`, parsed.
pub async fn metrics(handle: &DaemonHandle) -> Exposition {
    let text = get_text(handle, "/metrics").await;
    Exposition::parse(&text).unwrap()
}

/// The first series of `name` with all of `labels`.
pub fn value(page: &Exposition, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.scalars(&[name])
        .into_iter()
        .find(|s| labels.iter().all(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
}

/// Waits until the daemon has ended `runs` more runs (any target, any
/// outcome): a check that nothing happens over some rounds waits for the
/// rounds themselves, not for a guess of how long they take.
pub async fn after_runs(handle: &DaemonHandle, runs: u64) {
    let ended = async || {
        let page = metrics(handle).await;
        vllm_sentinel::telemetry::exposition::total(&page.scalars(&["sentinel_runs_total"]))
            .unwrap_or(0.0) as u64
    };
    let start = ended().await;
    until(Duration::from_secs(120), "more runs", async || {
        (ended().await >= start + runs).then_some(())
    })
    .await;
}

/// The distinct values of `label` over the run series
/// (`sentinel_run_last_timestamp_seconds`), sorted.
pub fn run_label_values(page: &Exposition, label: &str) -> Vec<String> {
    let mut values: Vec<String> = page
        .scalars(&["sentinel_run_last_timestamp_seconds"])
        .iter()
        .filter_map(|s| s.label(label).map(str::to_owned))
        .collect();
    values.sort();
    values.dedup();
    values
}

/// Polls `check` every 250 ms until it gives a value; fails after `limit`.
pub async fn until<T>(limit: Duration, what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    until_every(limit, Duration::from_millis(250), what, check).await
}

/// [`until`], polling every `every`: for a moment that passes quickly
/// (a run and its gap take about half a second on the simulator).
pub async fn until_every<T>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

/// Polls `fetch` every 250 ms until it gives `expected`; fails after
/// `limit`, saying what it gave last.
pub async fn until_equal<T: PartialEq + std::fmt::Debug>(
    limit: Duration,
    what: &str,
    expected: &T,
    mut fetch: impl AsyncFnMut() -> T,
) {
    let deadline = Instant::now() + limit;
    loop {
        let got = fetch().await;
        if &got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {got:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn output_of(mut command: Command) -> (bool, String) {
    let out = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// What a webhook receiver was sent, in order.
pub type Received = std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>;

/// A webhook receiver on port 0 keeping every JSON body posted to
/// `/hook`; returns its URL.
pub async fn start_webhook() -> (String, Received) {
    use axum::Json;
    use axum::extract::State;
    let received: Received = Default::default();
    let app = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(
                |State(r): State<Received>, Json(body): Json<serde_json::Value>| async move {
                    r.lock().unwrap().push(body);
                    "ok"
                },
            ),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), received)
}
