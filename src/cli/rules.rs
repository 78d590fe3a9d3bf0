//! `rules`: the Prometheus recording and burn-rate alerting rules of a
//! configuration's objectives, as a rules file or a `PrometheusRule`, and
//! their `promtool test rules` unit tests.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use vllm_sentinel::config::Config;
use vllm_sentinel::slo::{rule_tests, rules};

#[derive(Args, Debug)]
pub struct RulesArgs {
    /// The configuration file (TOML) whose [[slos]] the rules are for.
    #[arg(long, short, env = "SENTINEL_CONFIG")]
    config: PathBuf,
    /// Write the rules to this file instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Write a prometheus-operator PrometheusRule instead of a rules file.
    #[arg(long)]
    prometheus_rule: bool,
    /// The PrometheusRule's name.
    #[arg(long, default_value = "vllm-sentinel-slos")]
    name: String,
    /// Also write `promtool test rules` unit tests of the rules to this
    /// file (with --output, as a plain rules file).
    #[arg(long)]
    tests: Option<PathBuf>,
}

pub fn run(args: RulesArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read {}", args.config.display()))?;
    // The text alone: the rules need no file the configuration names.
    let config = Config::parse(&text, &args.config.display().to_string())?;
    if config.slos.is_empty() {
        bail!(
            "{} has no [[slos]]: no objective to write rules for",
            args.config.display()
        );
    }
    let origin = args.config.file_name().map_or_else(
        || args.config.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let body = if args.prometheus_rule {
        rules::prometheus_rule(&config.slos, &origin, &args.name)
    } else {
        rules::rules_file(&config.slos, &origin)
    };
    match (&args.output, &args.tests) {
        (_, Some(_)) if args.prometheus_rule => {
            bail!("--tests needs a plain rules file: promtool does not read a PrometheusRule")
        }
        (None, Some(_)) => bail!("--tests needs --output: the tests name the rules file"),
        (None, None) => print!("{body}"),
        (Some(output), tests) => {
            write(output, &body)?;
            if let Some(tests) = tests {
                let named = rules_path_from(tests, output);
                write(tests, &rule_tests::test_file(&config.slos, &named))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The rules file as the tests file names it: promtool reads it relative
/// to the tests file's folder, so its name alone when they share one,
/// else its absolute path.
fn rules_path_from(tests: &Path, rules: &Path) -> String {
    let folder = |p: &Path| {
        let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
        parent.unwrap_or(Path::new(".")).canonicalize().ok()
    };
    match (folder(tests), folder(rules), rules.file_name()) {
        (Some(a), Some(b), Some(name)) if a == b => name.to_string_lossy().into_owned(),
        (_, Some(dir), Some(name)) => dir.join(name).display().to_string(),
        _ => rules.display().to_string(),
    }
}
