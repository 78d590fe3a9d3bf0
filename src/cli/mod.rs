//! The subcommands and their flags.

mod baseline;
mod daemon;
mod demo;
mod probe;
mod replay;
mod report;
mod rules;
mod selftest;
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "vllm-sentinel",
    version,
    about = "Synthetic probes for vLLM servers: TTFT, TPOT, ITL and E2EL exactly as `vllm bench serve` defines them",
    long_about = "Synthetic probes for vLLM servers.\n\nMetric names follow vLLM's meaning: TTFT is the time to the first \
streamed message with a choice (even with empty text); TPOT is (E2EL - TTFT) / (output tokens - 1); ITL is each gap \
between successive choice-bearing messages, pooled across requests (guidellm and aiperf call vLLM's TPOT \"ITL\"; \
llmperf's ITL includes TTFT); E2EL is the time to the last choice-bearing message."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text (colours only on a terminal) or as one JSON
    /// object per line, for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The daemon against a built-in simulated fleet (two vLLM replicas behind a
    /// round-robin balancer, one slower build rolled out after two minutes): no config.
    Demo(demo::DemoArgs),
    /// The daemon: probes every configured target on schedule and exports /metrics.
    Serve(daemon::ServeArgs),
    /// Validate a configuration file; prints every problem with its field path.
    CheckConfig(daemon::CheckConfigArgs),
    /// One probe run from the command line, reported like `vllm bench serve`.
    Probe(probe::ProbeArgs),
    /// The simulated vLLM server alone, for trials and tests.
    Sim(sim::SimArgs),
    /// Measure this client's own capacity and timing error against the built-in simulator.
    Selftest(selftest::SelftestArgs),
    /// List, inspect, pin and unpin the baselines verdicts compare with.
    Baseline(baseline::BaselineArgs),
    /// Before/after report between two server versions of a target (Markdown, HTML).
    Report(report::ReportArgs),
    /// A store's runs as JSON Lines (with their requests), oldest first, for `replay`.
    Export(replay::ExportArgs),
    /// Pass recorded runs through the daemon's verdict code again: one verdict per evaluation.
    Replay(replay::ReplayArgs),
    /// Prometheus recording and burn-rate alert rules for the configuration's
    /// objectives ([[slos]]), as a rules file or a PrometheusRule, with promtool tests.
    Rules(rules::RulesArgs),
}

impl Cli {
    /// Whether this command is the daemon, whose log is its only output
    /// and goes to standard output, where container runtimes collect it.
    pub fn is_daemon(&self) -> bool {
        matches!(self.command, Command::Demo(_) | Command::Serve(_))
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::demo(args).await,
        Command::Serve(args) => daemon::serve(args).await,
        Command::CheckConfig(args) => daemon::check_config(args),
        Command::Probe(args) => probe::run(args).await,
        Command::Sim(args) => sim::run(args).await,
        Command::Selftest(args) => selftest::run(args).await,
        Command::Baseline(args) => baseline::baseline(args),
        Command::Report(args) => report::run(args),
        Command::Export(args) => replay::export(args),
        Command::Replay(args) => replay::replay(args),
        Command::Rules(args) => rules::run(args),
    }
}
