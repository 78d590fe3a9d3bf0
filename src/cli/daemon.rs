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
        "{}: valid ({} targets, {} scenarios, {pairs} scheduled pairs, {} objectives)",
        args.config.display(),
        c.targets.len(),
        c.scenarios.len(),
        c.slos.len()
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
    // Signals are caught from before the port answers: a supervisor that
    // sees it listening and stops it gets a drain, not a kill.
    let signals = Signals::catch()?;
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
        vllm_sentinel::clock::Clock::System,
    )
    .await?;
    run_until_signalled(handle, signals).await
}

/// SIGTERM, SIGINT and SIGHUP, caught from creation on.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn catch() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Runs until SIGTERM or SIGINT (graceful drain); SIGHUP reloads.
pub async fn run_until_signalled(
    handle: DaemonHandle,
    mut signals: Signals,
) -> anyhow::Result<ExitCode> {
    loop {
        tokio::select! {
            _ = signals.term.recv() => break,
            _ = signals.int.recv() => break,
            // The same reload path as POST /-/reload; its outcome is
            // logged and exported there.
            _ = signals.hup.recv() => { let _ = handle.reload().await; }
        }
    }
    tracing::info!("signal received; stopping");
    handle.shutdown();
    handle.wait().await?;
    Ok(ExitCode::SUCCESS)
}
