//! `vllm-sentinel selftest`: this client's own capacity and timing error
//! against the built-in simulator.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use vllm_sentinel::selftest::{self, SelftestPlan};

#[derive(Args, Debug)]
pub struct SelftestArgs {
    /// Requests per capacity level.
    #[arg(long, default_value_t = 30_000)]
    requests: usize,
    /// Requests in the timing-error run.
    #[arg(long, default_value_t = 2048)]
    timing_requests: usize,
    /// Let the simulator and the client share every core at normal
    /// priority (by default the simulator gets a core of its own at
    /// real-time priority, and the timing runs' client the other cores,
    /// where the system allows).
    #[arg(long)]
    no_isolation: bool,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub async fn run(args: SelftestArgs) -> anyhow::Result<ExitCode> {
    let plan = SelftestPlan {
        capacity_requests: args.requests,
        timing_requests: args.timing_requests,
        isolate: !args.no_isolation,
        ..SelftestPlan::default()
    };
    let report = selftest::run(&plan).await?;
    print!("{}", selftest::render(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
