//! `serve`, `check-config` and `demo`: the daemon from a config file, its
//! validation, and the daemon against a built-in simulated vLLM.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use vllm_sentinel::config::Config;
use vllm_sentinel::daemon::{self, DaemonHandle};
use vllm_sentinel::sim::{SimConfig, SimHandle};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The configuration file (TOML); see config/example.toml.
    #[arg(long, short)]
    config: PathBuf,
}

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    #[arg(long, short)]
    config: PathBuf,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where the exporter listens.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: String,
    /// The store file; default: a fresh one in the temporary directory.
    #[arg(long)]
    store: Option<PathBuf>,
}

pub fn check_config(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let c = Config::load(&args.config)?;
    let pairs: usize = c.targets.iter().map(|t| t.scenarios.len()).sum();
    println!(
        "{}: valid ({} targets, {} scenarios, {pairs} scheduled pairs)",
        args.config.display(),
        c.targets.len(),
        c.scenarios.len()
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Validate everything before binding any port.
    let config = Config::load(&args.config)?;
    let listener = TcpListener::bind(config.exporter.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (exporter.listen)",
                config.exporter.listen
            )
        })?;
    let handle = daemon::start(
        config,
        Some(args.config),
        listener,
        CancellationToken::new(),
    )
    .await?;
    run_until_signalled(handle).await
}

/// The demo's configuration: the same TOML path as a real one.
fn demo_config(sim_url: &str, listen: &str, store: &std::path::Path) -> String {
    format!(
        r#"
[exporter]
listen = "{listen}"

[store]
path = "{store}"

[scheduler]
schedule = "*/5 * * * * *"
backoff_initial = "5s"
backoff_max = "30s"
shutdown_grace = "5s"

[telemetry]
scrape_interval = "5s"

[[targets]]
name = "demo"
base_url = "{sim_url}"
dcgm_url = "{sim_url}/dcgm/metrics"

[[targets]]
name = "demo-chat"
base_url = "{sim_url}"
endpoint = "chat"
scenarios = ["interactive"]
schedule = "2-59/10 * * * * *"

[[scenarios]]
name = "interactive"
input_len = 128
output_len = 32
concurrency = 1
num_requests = 4
warmup = 0
[scenarios.slo]
ttft = "200ms"
tpot = "30ms"

[[scenarios]]
name = "batch"
input_len = 512
output_len = 64
concurrency = 8
num_requests = 16
warmup = 0
schedule = "*/10 * * * * *"
[scenarios.slo]
ttft = "500ms"
tpot = "50ms"
"#,
        store = store.display().to_string().replace('\\', "\\\\"),
    )
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 60.0,
            prefill_ms_per_token: 0.05,
            itl_ms: 12.0,
            jitter: 0.2,
            load_factor: 0.05,
            ..SimConfig::default()
        },
    )
    .await
    .context("cannot start the simulated vLLM")?;
    let store = args.store.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("vllm-sentinel-demo-{}.db", std::process::id()))
    });
    let text = demo_config(&sim.base_url(), &args.listen, &store);
    let config = Config::parse(&text, "the demo configuration")?;
    let listener = TcpListener::bind(config.exporter.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {}; pick another with --listen",
                args.listen
            )
        })?;
    let handle = daemon::start(config, None, listener, CancellationToken::new()).await?;
    let url = format!("http://{}", handle.addr);
    // A closed stdout (a pipe whose reader left) must not stop the daemon.
    let banner = format!(
        "vllm-sentinel demo: probing a simulated vLLM at {}\n  status page  {url}/\n  metrics      {url}/metrics   (first runs within 10 s)\n  runs (JSON)  {url}/api/v1/runs\n  store        {}\nGrafana: import dashboards/*.json (or provision dashboards/provisioning/) and point\nPrometheus at {} (see dashboards/README.md). Ctrl-C stops.\n",
        sim.base_url(),
        store.display(),
        handle.addr
    );
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(banner.as_bytes()).and_then(|_| out.flush());
    }
    let code = run_until_signalled(handle).await;
    sim.stop().await;
    code
}

/// Runs until SIGTERM or SIGINT (graceful drain); SIGHUP reloads.
async fn run_until_signalled(handle: DaemonHandle) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            // The same reload path as POST /-/reload; its outcome is
            // logged and exported there.
            _ = hup.recv() => { let _ = handle.reload().await; }
        }
    }
    tracing::info!("signal received; stopping");
    handle.shutdown();
    handle.wait().await?;
    Ok(ExitCode::SUCCESS)
}
