//! `vllm-sentinel sim`: the simulated vLLM server on a port of your choice.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use vllm_sentinel::sim::{Fault, SimConfig, SimHandle, SimServerKind};

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8100")]
    listen: String,
    /// Served model name.
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Version reported by /version and in system_fingerprint.
    #[arg(long, default_value = "0.32.0")]
    server_version: String,
    /// Time to first token at no load, in ms.
    #[arg(long, default_value_t = 40.0)]
    ttft_ms: f64,
    /// Extra TTFT per prompt token, in ms.
    #[arg(long, default_value_t = 0.0)]
    prefill_ms_per_token: f64,
    /// Gap between output chunks at no load, in ms.
    #[arg(long, default_value_t = 8.0)]
    itl_ms: f64,
    /// Sigma of a log-normal multiplier on each latency (0 = exact).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Latency grows by this fraction per other running request.
    #[arg(long, default_value_t = 0.0)]
    load_factor: f64,
    /// Requests run at once; more wait in the queue.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Send every n-th token with empty text (partial UTF-8), 0 = never.
    #[arg(long, default_value_t = 0)]
    empty_text_every: u32,
    /// Stream this many reasoning deltas before the answer on the chat
    /// endpoint, as a reasoning model does (they count as output tokens).
    #[arg(long, default_value_t = 0)]
    reasoning_tokens: u32,
    /// Inject this fault.
    #[arg(long, value_enum)]
    fault: Option<Fault>,
    /// The fault hits every n-th request.
    #[arg(long, default_value_t = 1)]
    fault_every: u64,
    /// Require `Authorization: Bearer` with the key in this environment variable.
    #[arg(long)]
    api_key_env: Option<String>,
    /// Use the pre-0.9 vLLM metric name gpu_cache_usage_perc.
    #[arg(long)]
    legacy_metric_names: bool,
    /// Pass for this server: its metric names and identity endpoints.
    #[arg(long, value_enum, default_value = "vllm")]
    server_kind: SimServerKind,
    /// Wedge the engine this long after start: the API server answers,
    /// generation requests get no token (also `POST /admin/config
    /// {"wedged": true}`).
    #[arg(long, value_parser = humantime::parse_duration)]
    wedge_at: Option<std::time::Duration>,
    /// End the wedge this long after it began (default: never).
    #[arg(long, value_parser = humantime::parse_duration, requires = "wedge_at")]
    wedge_for: Option<std::time::Duration>,
}

pub async fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    let api_key = match &args.api_key_env {
        Some(name) => Some(
            std::env::var(name)
                .with_context(|| format!("environment variable {name} is not set"))?,
        ),
        None => None,
    };
    let config = SimConfig {
        model: args.model,
        version: args.server_version,
        ttft_ms: args.ttft_ms,
        prefill_ms_per_token: args.prefill_ms_per_token,
        itl_ms: args.itl_ms,
        jitter: args.jitter,
        load_factor: args.load_factor,
        max_num_seqs: args.max_num_seqs,
        empty_text_every: args.empty_text_every,
        reasoning_tokens: args.reasoning_tokens,
        fault: args.fault,
        fault_every: args.fault_every,
        api_key,
        legacy_metric_names: args.legacy_metric_names,
        server_kind: args.server_kind,
        ..SimConfig::default()
    };
    let sim = SimHandle::start(&args.listen, config)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!("simulated vLLM listening on {}", sim.base_url());
    println!(
        "change it at run time: curl -X POST {}/admin/config -d '{{\"ttft_ms\": 80}}'",
        sim.base_url()
    );
    if let Some(at) = args.wedge_at {
        let state = sim.state.clone();
        let (wedge_for, base) = (args.wedge_for, sim.base_url());
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            state.set_wedged(true);
            println!("{base}: engine wedged (generation requests get no token)");
            if let Some(d) = wedge_for {
                tokio::time::sleep(d).await;
                state.set_wedged(false);
                println!("{base}: wedge over");
            }
        });
    }
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    sim.stop().await;
    Ok(ExitCode::SUCCESS)
}
