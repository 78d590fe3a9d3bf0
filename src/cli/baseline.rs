//! `baseline list|show|pin|unpin`: read and change the store the daemon
//! writes (the daemon may keep running; SQLite's WAL lets both work on the
//! file at once).

use std::path::PathBuf;
use std::process::ExitCode;

use std::fmt::Write as _;

use anyhow::Context;
use clap::{Args, Subcommand};
use vllm_sentinel::clock::Clock;

use vllm_sentinel::config::Config;
use vllm_sentinel::store::Store;
use vllm_sentinel::store::baselines::{Baseline, PairKey};
use vllm_sentinel::verdict::policy::VerdictPolicy;

/// Where the store is: from the daemon's config, or given directly.
#[derive(Args, Debug)]
pub struct StoreArgs {
    /// The daemon's configuration file (its store.path and [detector] are used).
    #[arg(long, conflicts_with = "store")]
    config: Option<PathBuf>,
    /// The store file, when no configuration is given.
    #[arg(long)]
    store: Option<PathBuf>,
}

impl StoreArgs {
    /// The store, opened to read only (the file is left as it is), and the
    /// verdict policy to read it by.
    pub(super) fn open_to_read(&self) -> anyhow::Result<(Store, VerdictPolicy)> {
        let (path, detection) = self.located()?;
        Ok((Store::open_read_only(&path)?, detection))
    }

    /// The store, opened to change (a pin; migrated if older).
    fn open_to_change(&self) -> anyhow::Result<Store> {
        let (path, _) = self.located()?;
        Ok(Store::open(&path)?)
    }

    /// The store's file, which must exist, and the verdict policy.
    fn located(&self) -> anyhow::Result<(PathBuf, VerdictPolicy)> {
        let (path, detection) = match (&self.config, &self.store) {
            (Some(c), _) => {
                let config = Config::load(c)?;
                (config.store.path, config.verdict_policy)
            }
            (None, Some(p)) => (p.clone(), VerdictPolicy::default()),
            (None, None) => anyhow::bail!("give --config FILE or --store FILE"),
        };
        if !path.exists() {
            anyhow::bail!("store {} does not exist", path.display());
        }
        Ok((path, detection))
    }
}

#[derive(Args, Debug)]
pub struct BaselineArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    action: BaselineAction,
}

#[derive(Args, Debug)]
struct Selector {
    #[arg(long)]
    target: String,
    /// Defaults to the model the target was last probed with.
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    scenario: String,
}

#[derive(Subcommand, Debug)]
enum BaselineAction {
    /// Every baseline: key, version, runs, pinned or automatic.
    List {
        #[arg(long)]
        target: Option<String>,
        #[arg(long)]
        scenario: Option<String>,
    },
    /// One baseline's runs and their p50 latencies.
    Show {
        #[command(flatten)]
        pair: Selector,
        /// Defaults to the baseline the verdict uses.
        #[arg(long)]
        version: Option<String>,
    },
    /// Make a version's baseline the reference of every comparison of the pair.
    Pin {
        #[command(flatten)]
        pair: Selector,
        #[arg(long)]
        version: String,
        /// Rebuild the baseline from the version's newest N completed runs first (replace).
        #[arg(long)]
        recent: Option<usize>,
    },
    /// Drop the pin: comparisons go back to the previous version's baseline.
    Unpin {
        #[command(flatten)]
        pair: Selector,
    },
}

fn key(store: &Store, s: &Selector) -> anyhow::Result<PairKey> {
    let model = match &s.model {
        Some(m) => m.clone(),
        None => store
            .models_of(&s.target)?
            .into_iter()
            .next()
            .with_context(|| format!("target {:?} has no runs in this store", s.target))?,
    };
    Ok(PairKey {
        target: s.target.clone(),
        model,
        scenario: s.scenario.clone(),
    })
}

fn line(b: &Baseline) -> String {
    format!(
        "{:<16} {:<24} {:<20} {:<16} {:>4} runs  {:<11} {}",
        b.target,
        b.model,
        b.scenario,
        b.build,
        b.run_ids.len(),
        b.origin,
        b.pinned_at
            .map(|t| format!("pinned {}", t.format("%Y-%m-%d %H:%M UTC")))
            .unwrap_or_else(|| "automatic".into())
    )
}

/// Writes to standard output; a closed pipe (`| head`) is not an error.
pub(super) fn emit(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

pub fn baseline(args: BaselineArgs) -> anyhow::Result<ExitCode> {
    let change = matches!(
        args.action,
        BaselineAction::Pin { .. } | BaselineAction::Unpin { .. }
    );
    let store = match change {
        true => args.store.open_to_change()?,
        false => args.store.open_to_read()?.0,
    };
    let mut out = String::new();
    match args.action {
        BaselineAction::List { target, scenario } => {
            let all = store.baselines(target.as_deref(), scenario.as_deref())?;
            if all.is_empty() {
                let _ = writeln!(out, "no baselines yet");
            }
            for b in &all {
                let _ = writeln!(out, "{}", line(b));
            }
        }
        BaselineAction::Show { pair, version } => {
            let key = key(&store, &pair)?;
            let b = match version {
                Some(v) => store.baseline(&key, &v)?,
                None => {
                    let current = store.current_build(&key.target, &key.model)?;
                    match current {
                        Some(c) => vllm_sentinel::verdict::policy::reference(&store, &key, &c)?,
                        None => None,
                    }
                }
            }
            .with_context(|| {
                format!(
                    "no baseline for {}/{}/{}",
                    key.target, key.model, key.scenario
                )
            })?;
            let _ = writeln!(out, "{}", line(&b));
            let _ = writeln!(
                out,
                "\n{:<6} {:<20} {:>10} {:>10} {:>10} {:>10} {:>6}",
                "run", "started (UTC)", "TTFT p50", "TPOT p50", "ITL p50", "E2EL p50", "load"
            );
            for r in store.runs_by_id(&b.run_ids)? {
                let p = vllm_sentinel::verdict::policy::run_point(&r);
                let _ = writeln!(
                    out,
                    "{:<6} {:<20} {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>8.2}ms {:>6}",
                    r.id.unwrap_or_default(),
                    r.started_at.format("%Y-%m-%d %H:%M:%S"),
                    r.summary.ttft.p50 * 1e3,
                    r.summary.tpot.p50 * 1e3,
                    r.summary.itl.p50 * 1e3,
                    r.summary.e2el.p50 * 1e3,
                    p.load.map_or("n/a".into(), |l| format!("{l:.1}"))
                );
            }
        }
        BaselineAction::Pin {
            pair,
            version,
            recent,
        } => {
            let key = key(&store, &pair)?;
            let b = store.pin_baseline(&key, &version, recent, Clock::System.now())?;
            let _ = writeln!(out, "pinned: {}", line(&b));
        }
        BaselineAction::Unpin { pair } => {
            let key = key(&store, &pair)?;
            if store.unpin_baseline(&key)? {
                let _ = writeln!(
                    out,
                    "unpinned {}/{}/{}",
                    key.target, key.model, key.scenario
                );
            } else {
                let _ = writeln!(
                    out,
                    "{}/{}/{} had no pinned baseline",
                    key.target, key.model, key.scenario
                );
            }
        }
    }
    emit(&out);
    Ok(ExitCode::SUCCESS)
}
