//! `demo`: the daemon against a built-in simulated fleet, with no
//! configuration: two vLLM replicas behind a round-robin balancer (the
//! stand-in for a Kubernetes Service), probed through the balancer and one
//! by one. After `--rollout-after` one replica rolls to a slower build,
//! `--rollout-gap` later the other: the rollout, the canary regression and
//! the upgrade verdict follow, with detector settings scaled for a demo.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::daemon::{Signals, run_until_signalled};
use vllm_sentinel::config::Config;
use vllm_sentinel::daemon;
use vllm_sentinel::sim::proxy::ProxyHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where the exporter listens.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: String,
    /// The store file; default: a fresh one in the temporary directory.
    #[arg(long)]
    store: Option<PathBuf>,
    /// When the first replica rolls to the slower build.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    rollout_after: Duration,
    /// How long after the first the second replica follows.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    rollout_gap: Duration,
    /// When the second replica's engine wedges (its API server still
    /// answers, nothing is generated).
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    wedge_after: Duration,
    /// How long the wedge lasts.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    wedge_for: Duration,
    /// Write the Prometheus rules of the demo's objectives to this file
    /// (for a Prometheus scraping the demo, as `rules` writes them).
    #[arg(long)]
    rules: Option<PathBuf>,
}

const OLD_BUILD: &str = "0.10.0";
const NEW_BUILD: &str = "0.11.0";
/// The new build's time to first token, against the old build's 60 ms.
const NEW_TTFT_MS: f64 = 90.0;

fn replica(version: &str) -> SimConfig {
    SimConfig {
        ttft_ms: 60.0,
        prefill_ms_per_token: 0.05,
        itl_ms: 12.0,
        jitter: 0.2,
        load_factor: 0.05,
        version: version.into(),
        ..SimConfig::default()
    }
}

/// The demo's configuration: the same TOML path as a real one.
fn demo_config(
    service: &str,
    replicas: [&str; 2],
    listen: &str,
    store: &std::path::Path,
) -> String {
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

# Scaled for a demo: a build's baseline is 12 runs, a verdict needs 8
# candidate runs and 2 slow evaluations of the last 3.
[detector]
baseline_runs = 12
min_baseline_runs = 12
warmup_runs = 1
candidate_window = 8
min_candidate_runs = 8
confirm_needed = 2
confirm_window = 3
canary_window = 5
min_canary_requests = 20

# The balancer names the replica that served each request, as a gateway
# or nginx's $upstream_addr would: requests through it are attributed.
[[targets]]
name = "demo"
base_url = "{service}"
dcgm_url = "{a}/dcgm/metrics"
[targets.replicas]
static = ["{a}", "{b}"]
probe = "both"
max_parallel = 1
[targets.gateway]
endpoint_header = "x-upstream"

[[targets]]
name = "demo-chat"
base_url = "{service}"
endpoint = "chat"
scenarios = ["interactive"]
schedule = "2-59/5 * * * * *"
[targets.gateway]
endpoint_header = "x-upstream"

# Objectives: the wedge burns both budgets, the slower build the first.
[[slos]]
name = "interactive-ttft"
scenarios = ["interactive"]
sli = "ttft"
threshold = "200ms"
objective = 99
window = "1d"

[[slos]]
name = "demo-success"
targets = ["demo"]
sli = "success"
objective = 99.5
window = "30d"

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
        a = replicas[0],
        b = replicas[1],
        store = store.display().to_string().replace('\\', "\\\\"),
    )
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let first = SimHandle::start("127.0.0.1:0", replica(OLD_BUILD))
        .await
        .context("cannot start the simulated vLLM")?;
    let second = SimHandle::start("127.0.0.1:0", replica(OLD_BUILD))
        .await
        .context("cannot start the simulated vLLM")?;
    let service = ProxyHandle::start("127.0.0.1:0", vec![first.base_url(), second.base_url()])
        .await
        .context("cannot start the demo's load balancer")?;
    let store = args.store.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("vllm-sentinel-demo-{}.db", std::process::id()))
    });
    let text = demo_config(
        &service.base_url(),
        [&first.base_url(), &second.base_url()],
        &args.listen,
        &store,
    );
    let config = Config::from_text(&text, "the demo configuration")?;
    if let Some(path) = &args.rules {
        let rules = vllm_sentinel::slo::rules::rules_file(&config.slos, "the demo configuration");
        std::fs::write(path, rules).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let signals = Signals::catch()?;
    let listener = TcpListener::bind(config.exporter.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {}; pick another with --listen",
                args.listen
            )
        })?;
    let handle = daemon::start(
        config,
        None,
        listener,
        CancellationToken::new(),
        vllm_sentinel::clock::Clock::System,
    )
    .await?;
    let url = format!("http://{}", handle.addr);
    let banner = banner(&args, &url, &service, [&first, &second], &store);
    {
        // A closed stdout (a pipe whose reader left) must not stop the daemon.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(banner.as_bytes()).and_then(|_| out.flush());
    }
    let states = [first.state.clone(), second.state.clone()];
    let (after, gap) = (args.rollout_after, args.rollout_gap);
    let rollout = tokio::spawn(async move {
        for (i, (state, wait)) in states.iter().zip([after, gap]).enumerate() {
            tokio::time::sleep(wait).await;
            let patch = serde_json::json!({"version": NEW_BUILD, "ttft_ms": NEW_TTFT_MS});
            if state.update(patch).is_ok() {
                tracing::warn!(
                    replica = i + 1,
                    build = NEW_BUILD,
                    "demo: replica {} now runs the slower build {NEW_BUILD} (time to first token 60 -> 90 ms)",
                    i + 1
                );
            }
        }
    });
    let wedged = second.state.clone();
    let (wedge_after, wedge_for) = (args.wedge_after, args.wedge_for);
    let wedge = tokio::spawn(async move {
        tokio::time::sleep(wedge_after).await;
        wedged.set_wedged(true);
        tracing::warn!(
            replica = 2,
            "demo: replica 2's engine is wedged: /health answers, no token is generated"
        );
        tokio::time::sleep(wedge_for).await;
        wedged.set_wedged(false);
        tracing::warn!(replica = 2, "demo: replica 2's engine generates again");
    });
    let code = run_until_signalled(handle, signals).await;
    rollout.abort();
    wedge.abort();
    drop(service);
    first.stop().await;
    second.stop().await;
    code
}

/// What the newcomer sees first: where to look, and what will happen when.
fn banner(
    args: &DemoArgs,
    url: &str,
    service: &ProxyHandle,
    replicas: [&SimHandle; 2],
    store: &std::path::Path,
) -> String {
    let at = |d: Duration| humantime::format_duration(d).to_string();
    let second_at = args.rollout_after + args.rollout_gap;
    let (a, b) = (replicas[0].base_url(), replicas[1].base_url());
    let lines = [
        format!(
            "vllm-sentinel demo: a simulated fleet of two vLLM replicas ({OLD_BUILD}) at {a} and {b},"
        ),
        format!(
            "behind a round-robin balancer at {} (the Service), probed through it and one by one.",
            service.base_url()
        ),
        format!("  status page  {url}/"),
        format!("  metrics      {url}/metrics   (first runs within 10 s)"),
        format!("  verdicts     {url}/api/v1/verdicts"),
        format!("  objectives   {url}/api/v1/slos   (rules: vllm-sentinel demo --rules FILE)"),
        format!("  report       {url}/report?target=demo"),
        format!("  store        {}", store.display()),
        "What happens:".into(),
        format!(
            "  now          baselines of {OLD_BUILD} form (12 runs per scenario, about a minute)"
        ),
        format!(
            "  after {:<7}replica 1 rolls to {NEW_BUILD}, 50% slower to first token: a rollout starts,",
            at(args.rollout_after)
        ),
        "               and within about half a minute the canary verdict (the new build against"
            .into(),
        "               the old one, measured at the same time) turns to regression on the status"
            .into(),
        "               page, in sentinel_regression_state and in the log".into(),
        format!(
            "  after {:<7}replica 2 follows: the rollout finishes and the upgrade verdict compares",
            at(second_at)
        ),
        format!(
            "               {NEW_BUILD} with {OLD_BUILD}'s baseline (regression); /report shows before and after"
        ),
        format!(
            "  after {:<7}replica 2's engine wedges for {}: /health still answers, nothing is generated;",
            at(args.wedge_after),
            at(args.wedge_for)
        ),
        "               its heartbeat gets no token in 20 s: \"not generating\" on the status page,".into(),
        "               sentinel_target_generating 0 (alert SentinelEngineNotGenerating), then recovery"
            .into(),
        "Grafana: import dashboards/*.json (or provision dashboards/provisioning/) and point"
            .into(),
        format!(
            "Prometheus at {} (see dashboards/README.md). Ctrl-C stops.",
            url.trim_start_matches("http://")
        ),
    ];
    lines.join("\n") + "\n"
}
