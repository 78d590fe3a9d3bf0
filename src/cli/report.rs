//! `vllm-sentinel report`: the before/after report between two server
//! versions of a target, from the store, as Markdown and HTML.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::baseline::{StoreArgs, emit};
use vllm_sentinel::report::upgrade;

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[arg(long)]
    target: String,
    #[arg(long)]
    model: Option<String>,
    /// The version before (a build label as `baseline list` shows it).
    #[arg(long)]
    from: String,
    /// The version after.
    #[arg(long)]
    to: String,
    /// Write the Markdown report here (default: standard output).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Also write the HTML report with inline SVG charts here.
    #[arg(long)]
    html: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let (store, detection) = args.store.open_to_read()?;
    let r = upgrade::build(
        &store,
        &detection,
        &args.target,
        args.model.as_deref(),
        &args.from,
        &args.to,
        vllm_sentinel::clock::Clock::System.now(),
    )?;
    let md = upgrade::markdown(&r);
    match &args.markdown {
        Some(p) => {
            std::fs::write(p, &md).with_context(|| format!("cannot write {}", p.display()))?
        }
        None => emit(&md),
    }
    if let Some(p) = &args.html {
        std::fs::write(p, upgrade::html(&r))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
