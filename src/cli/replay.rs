//! `vllm-sentinel export` and `replay`: a store's runs as JSON Lines, and
//! runs passed again through the daemon's verdict code.

use std::collections::HashSet;
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use vllm_sentinel::config::Config;
use vllm_sentinel::store::Store;
use vllm_sentinel::verdict::policy::VerdictPolicy;
use vllm_sentinel::verdict::replay::{ReplayLine, Replayed, Replayer, RunLine};

/// Runs read from the store per query: export streams, whatever the store's size.
const PAGE: usize = 500;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The store file to read.
    #[arg(long)]
    store: PathBuf,
    /// Write here (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Runs as JSON Lines, oldest first: `/api/v1/runs` objects or `export` lines.
    #[arg(long, conflicts_with = "store", required_unless_present = "store")]
    runs: Option<PathBuf>,
    /// Read the runs from a store file instead.
    #[arg(long)]
    store: Option<PathBuf>,
    /// Take `[detector]` (and which scenarios are drift canaries) from this
    /// configuration, or from a file of a `[detector]` section alone;
    /// default: the built-in detector settings.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// One JSON object per evaluation.
    Json,
    /// Aligned columns, for people.
    Table,
}

fn open_store(path: &std::path::Path) -> anyhow::Result<Store> {
    if !path.exists() {
        anyhow::bail!("store {} does not exist", path.display());
    }
    Ok(Store::open(path)?)
}

/// Calls `each` with every run of the store, in the order they were filed.
fn store_runs(
    store: &Store,
    mut each: impl FnMut(vllm_sentinel::vocabulary::records::RunRecord) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut after = 0;
    loop {
        let page = store.runs_filed_after(after, PAGE)?;
        let Some(last) = page.last().and_then(|r| r.id) else {
            return Ok(());
        };
        after = last;
        for run in page {
            each(run)?;
        }
    }
}

pub fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&args.store)?;
    let sink: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(
            std::fs::File::create(p).with_context(|| format!("cannot write {}", p.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(sink);
    store_runs(&store, |run| {
        let samples = run.samples.clone();
        serde_json::to_writer(&mut out, &RunLine { run, samples })?;
        out.write_all(b"\n")?;
        Ok(())
    })?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let (policy, drift) = match &args.config {
        Some(path) => Config::verdict_settings(path)?,
        None => (VerdictPolicy::default(), HashSet::new()),
    };
    let mut replayer = Replayer::new(policy, drift)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut header = args.format == Format::Table;
    let mut print = |verdicts: Vec<Replayed>| -> anyhow::Result<()> {
        for r in &verdicts {
            let line = ReplayLine::from(r);
            match args.format {
                Format::Json => {
                    serde_json::to_writer(&mut out, &line)?;
                    out.write_all(b"\n")?;
                }
                Format::Table => {
                    if std::mem::take(&mut header) {
                        writeln!(
                            out,
                            "{:>7}  {:<16} {:<20} {:<14} {:<14} {:<12} reason",
                            "run", "target", "scenario", "build", "against", "state"
                        )?;
                    }
                    writeln!(
                        out,
                        "{:>7}  {:<16} {:<20} {:<14} {:<14} {:<12} {}",
                        line.after_run.map(|i| i.to_string()).unwrap_or_default(),
                        line.target,
                        line.scenario,
                        line.build,
                        line.reference_build.as_deref().unwrap_or("-"),
                        line.state.as_str(),
                        line.reason
                    )?;
                }
            }
        }
        Ok(())
    };
    match (&args.runs, &args.store) {
        (Some(path), _) => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
                let line = line.with_context(|| format!("cannot read {}", path.display()))?;
                if line.trim().is_empty() {
                    continue;
                }
                let run: RunLine = serde_json::from_str(&line).with_context(|| {
                    format!("{} line {}: not a run object", path.display(), index + 1)
                })?;
                print(replayer.push(run.into_record())?)?;
            }
        }
        (None, Some(path)) => {
            let store = open_store(path)?;
            store_runs(&store, |run| print(replayer.push(run)?))?;
        }
        (None, None) => anyhow::bail!("give --runs FILE or --store FILE"),
    }
    print(replayer.flush()?)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
