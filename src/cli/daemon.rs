//! `serve` and `check-config`: the daemon from a config file, and its
//! validation; the signal handling `demo` shares.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use vllm_sentinel::config::Config;
use vllm_sentinel::config::cluster::Shard;
use vllm_sentinel::daemon::{self, DaemonHandle};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The configuration file (TOML); see config/example.toml.
    #[arg(long, short, env = "SENTINEL_CONFIG")]
    config: PathBuf,
    /// Probe only this instance's share of the targets: instance i of N,
    /// counted from 0 (a StatefulSet's ordinal); overrides `[cluster] shard`.
    #[arg(long, env = "SENTINEL_SHARD", value_name = "i/N")]
    shard: Option<Shard>,
}

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    #[arg(long, short, env = "SENTINEL_CONFIG")]
    config: PathBuf,
    /// Also list the targets instance i of N would probe.
    #[arg(long, env = "SENTINEL_SHARD", value_name = "i/N")]
    shard: Option<Shard>,
}

pub fn check_config(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let c = Config::load_shard(&args.config, args.shard)?;
    let pairs: usize = c.targets.iter().map(|t| t.scenarios.len()).sum();
    println!(
        "{}: valid ({} targets, {} scenarios, {pairs} scheduled pairs)",
        args.config.display(),
        c.targets.len(),
        c.scenarios.len()
    );
    if let Some(shard) = c.cluster.shard {
        let names: Vec<&str> = c.targets.iter().map(|t| t.name.as_str()).collect();
        println!(
            "shard {shard}: {} ({} targets left to the other instances)",
            if names.is_empty() {
                "no targets".to_owned()
            } else {
                names.join(", ")
            },
            c.cluster.others
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Validate everything before binding any port.
    let config = Config::load_shard(&args.config, args.shard)?;
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

/// Runs until SIGTERM or SIGINT (graceful drain); SIGHUP reloads.
pub async fn run_until_signalled(handle: DaemonHandle) -> anyhow::Result<ExitCode> {
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
