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
    Ok(Store::open_read_only(path)?)
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
    let Some(path) = &args.out else {
        let mut out = BufWriter::new(std::io::stdout().lock());
        write_runs(&store, &mut out)?;
        return finish_output(out.flush());
    };
    if same_file(path, &args.store) {
        anyhow::bail!(
            "--out {} is the store itself: writing it would destroy the store",
            path.display()
        );
    }
    // Written beside its destination and moved there whole: a failed
    // export leaves an earlier file as it was.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let cannot = || format!("cannot write {}", path.display());
    let file = tempfile::NamedTempFile::new_in(dir).with_context(cannot)?;
    let mut out = BufWriter::new(file);
    write_runs(&store, &mut out)?;
    let file = out
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(cannot)?;
    file.as_file().sync_all().with_context(cannot)?;
    file.persist(path)
        .map_err(|e| e.error)
        .with_context(cannot)?;
    Ok(ExitCode::SUCCESS)
}

/// Every run of the store, with its requests, one JSON line each.
fn write_runs(store: &Store, out: &mut impl Write) -> anyhow::Result<()> {
    store_runs(store, |run| {
        let samples = run.samples.clone();
        serde_json::to_writer(&mut *out, &RunLine { run, samples })?;
        out.write_all(b"\n")?;
        Ok(())
    })
}

/// Whether two paths name one file (the same device and inode).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Standard output closed by its reader (`| head`) is where the reader
/// wanted to stop, not an error.
fn finish_output(flushed: std::io::Result<()>) -> anyhow::Result<ExitCode> {
    match flushed {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Longest line of `replay --runs`: a run with its requests is a few
/// megabytes at most; a file without line ends is not read whole.
const MAX_LINE: usize = 64 << 20;

/// The next line of `reader` without its end, `None` at the end of the
/// file; a line longer than [`MAX_LINE`] is an error.
fn next_line<R: BufRead>(reader: &mut R, line: &mut Vec<u8>) -> std::io::Result<Option<()>> {
    line.clear();
    let read = std::io::Read::take(&mut *reader, MAX_LINE as u64 + 1).read_until(b'\n', line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > MAX_LINE {
        return Err(std::io::Error::other(format!(
            "longer than {} MiB without a line end",
            MAX_LINE >> 20
        )));
    }
    Ok(Some(()))
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let (policy, drift) = match &args.config {
        Some(path) => Config::verdict_settings(path)?,
        None => (VerdictPolicy::default(), HashSet::new()),
    };
    // The runs are filed again into a scratch store on disk, deleted at
    // the end: in memory, a year of runs would take gigabytes.
    let mut replayer = Replayer::with_store(Store::scratch()?, policy, drift);
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
            let mut reader = std::io::BufReader::new(file);
            let mut line = Vec::new();
            let mut number = 0;
            let mut latest_start = None;
            while next_line(&mut reader, &mut line)
                .with_context(|| format!("{} line {}", path.display(), number + 1))?
                .is_some()
            {
                number += 1;
                let at = || format!("{} line {number}", path.display());
                if line.trim_ascii().is_empty() {
                    continue;
                }
                let run: RunLine = serde_json::from_slice(&line)
                    .with_context(|| format!("{}: not a run object", at()))?;
                let run = run.into_record();
                if !(0.0..=MAX_RUN_SECONDS).contains(&run.duration_s) {
                    anyhow::bail!(
                        "{}: duration_s {} is not a run's length",
                        at(),
                        run.duration_s
                    );
                }
                // `/api/v1/runs` pages newest first: replayed so, every
                // verdict would be made up. Runs are filed as they end, so
                // one may start before the line above it, but not end
                // before a start already read.
                let ended =
                    chrono::Duration::try_milliseconds((run.duration_s * 1e3) as i64 + 1000)
                        .and_then(|d| run.started_at.checked_add_signed(d));
                if let (Some(latest), Some(ended)) = (latest_start, ended)
                    && ended < latest
                {
                    anyhow::bail!(
                        "{}: the run ended before a run above it started ({latest}); runs are replayed oldest first",
                        at()
                    );
                }
                latest_start = latest_start.max(Some(run.started_at));
                print(replayer.push(run)?)?;
            }
        }
        (None, Some(path)) => {
            let store = open_store(path)?;
            store_runs(&store, |run| print(replayer.push(run)?))?;
        }
        (None, None) => anyhow::bail!("give --runs FILE or --store FILE"),
    }
    print(replayer.flush()?)?;
    finish_output(out.flush())
}

/// Longest run a line may say it took (a scenario's deadline is at most a
/// day).
const MAX_RUN_SECONDS: f64 = 86_400.0 * 2.0;
