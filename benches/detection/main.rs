//! The detection table: `cargo bench --bench detection -- [--trials N]
//! [--null-series N] [--null-evaluations N] [--external N] [--history N]
//! [--horizon N] [--noise-scale F] [--out FILE] [--readme FILE]`, or
//! `-- --bars --readme FILE | --table FILE` for the bars alone. Every recorded trace in
//! `benches/traces/`, every injected change, every detector, on the very
//! same resampled series; the external change-point detectors (Apache
//! Otava, MongoDB's E-Divisive) run in the virtual environment that
//! `benches/detection/setup-venv.sh` makes, over fewer trials (they are
//! slow), said in the table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use vllm_sentinel::detection::harness::{self, AFTER, Alerts, Detector, Score, Series};
use vllm_sentinel::detection::rules::{self, EXTERNAL, WATCHED};
use vllm_sentinel::detection::trace::{Change, Trace};
use vllm_sentinel::detection::{bars, cell, table};
use vllm_sentinel::verdict::policy::VerdictPolicy;

struct Args {
    traces: PathBuf,
    trials: usize,
    null_series: usize,
    /// Evaluations of each untouched series (the table's 60; longer ones
    /// reach a young history's later verdicts).
    null_evaluations: usize,
    external_trials: usize,
    block: usize,
    /// Untouched runs each series starts with before the daemon's warm-up
    /// and baseline (a deployment that has watched the build a while).
    history: usize,
    /// Evaluations after a change each trial follows (the table's 10; a
    /// longer one also gives the delay by which half the trials are
    /// caught, where a detector needs more than 10).
    horizon: usize,
    seed: u64,
    out: Option<PathBuf>,
    /// A README whose table (between its markers) takes this run's rows,
    /// and whose bars are then read off that table anew.
    readme: Option<PathBuf>,
    /// Measure nothing: read the bars off `--readme`'s table as it is
    /// (and write them into it), or off `--table`'s (and print them).
    bars_only: bool,
    table: Option<PathBuf>,
    only: Option<String>,
    /// Detectors by short name (`ours,hud`); default: all.
    detectors: Option<Vec<String>>,
    /// The detector as before the correlation correction.
    independent: bool,
    /// `[detector]` settings to measure instead of the defaults, as in
    /// the configuration file (`--detector 'scan_min_runs = 3'`).
    detector: Vec<String>,
    /// Each trace's noise shrunk to this fraction on logarithms (1: as
    /// recorded): the detectors on a server that strays less.
    noise_scale: f64,
}

impl Args {
    /// Whether the detector with this short name is to run.
    fn wants(&self, key: &str) -> bool {
        self.detectors
            .as_ref()
            .is_none_or(|d| d.iter().any(|k| k == key))
    }
}

fn args() -> Args {
    let mut a = Args {
        traces: PathBuf::from("benches/traces"),
        trials: 200,
        null_series: 230,
        null_evaluations: harness::NULL_EVALUATIONS,
        external_trials: 20,
        block: 10,
        history: 0,
        horizon: AFTER,
        seed: 1,
        out: None,
        readme: None,
        bars_only: false,
        table: None,
        only: None,
        detectors: None,
        independent: false,
        detector: Vec::new(),
        noise_scale: 1.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut next = || it.next().unwrap_or_default();
        match flag.as_str() {
            "--traces" => a.traces = next().into(),
            "--trials" => a.trials = next().parse().expect("--trials N"),
            "--null-series" => a.null_series = next().parse().expect("--null-series N"),
            "--null-evaluations" => {
                a.null_evaluations = next().parse().expect("--null-evaluations N")
            }
            "--external" => a.external_trials = next().parse().expect("--external N"),
            "--block" => a.block = next().parse().expect("--block N"),
            "--history" => a.history = next().parse().expect("--history N"),
            "--horizon" => a.horizon = next().parse().expect("--horizon N"),
            "--seed" => a.seed = next().parse().expect("--seed N"),
            "--out" => a.out = Some(next().into()),
            "--readme" => a.readme = Some(next().into()),
            "--bars" => a.bars_only = true,
            "--table" => a.table = Some(next().into()),
            "--trace" => a.only = Some(next()),
            "--independent-runs" => a.independent = true,
            "--detector" => a.detector.push(next()),
            "--detectors" => a.detectors = Some(next().split(',').map(str::to_owned).collect()),
            "--noise-scale" => {
                a.noise_scale = next().parse().expect("--noise-scale F");
                assert!(
                    a.noise_scale > 0.0 && a.noise_scale.is_finite(),
                    "--noise-scale: a fraction above 0"
                );
            }
            "--bench" => {} // cargo bench passes it
            other => {
                eprintln!(
                    "{other}: not an option of the detection benchmark (see the top of benches/detection/main.rs)"
                );
                std::process::exit(2);
            }
        }
    }
    a
}

/// The external detectors' Python, if its virtual environment exists.
fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("DETECTION_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/vllm-sentinel-detection-venv")
        });
    let p = venv.join("bin/python");
    p.exists().then_some(p)
}

/// Alerts of an external detector on each series: every evaluation that
/// is scored (after the change, or every one of an untouched series), each
/// watched metric's history up to it, in one call of the script.
fn external(python: &Path, detector: &str, series: &[Series], dir: &Path) -> Vec<Alerts> {
    let mut requests = Vec::new();
    for (s, one) in series.iter().enumerate() {
        let from = one.change_at.unwrap_or(one.first_evaluation);
        for i in from..one.runs.len() {
            for m in WATCHED {
                let values: Vec<f64> = one.runs[..=i].iter().map(|r| rules::value(r, m)).collect();
                let start = values.len().saturating_sub(80);
                requests.push(serde_json::json!({
                    "id": format!("{s}:{i}:{m}"), "values": &values[start..]
                }));
            }
        }
    }
    let request = dir.join(format!("{detector}-request.json"));
    let answer = dir.join(format!("{detector}-answer.json"));
    std::fs::write(
        &request,
        serde_json::to_vec(&serde_json::json!({"detector": detector, "requests": requests}))
            .unwrap(),
    )
    .unwrap();
    let status = Command::new(python)
        .arg("benches/detection/changepoints.py")
        .arg(&request)
        .arg(&answer)
        .status()
        .expect("python runs");
    assert!(status.success(), "changepoints.py {detector} failed");
    let answers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&answer).unwrap()).unwrap();
    let mut out: Vec<Alerts> = series.iter().map(|s| vec![false; s.runs.len()]).collect();
    for a in answers["answers"].as_array().unwrap() {
        if a["regression"].as_bool() == Some(true) {
            let id = a["id"].as_str().unwrap();
            let mut parts = id.split(':');
            let s: usize = parts.next().unwrap().parse().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            out[s][i] = true;
        }
    }
    out
}

/// A trace file's name, NAME of `NAME.jsonl.gz`.
fn trace_name(path: &Path) -> &str {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".jsonl.gz"))
        .unwrap_or("trace")
}

/// A trace file, `NAME.jsonl.gz`.
fn read_trace(path: &Path) -> Trace {
    let name = trace_name(path);
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    Trace::parse(name, reader).unwrap_or_else(|e| panic!("{e}"))
}

fn main() {
    let args = args();
    if args.bars_only {
        match (&args.readme, &args.table) {
            (Some(readme), None) => write_bars(readme),
            (None, Some(table)) => print_bars(table),
            _ => {
                eprintln!(
                    "--bars: reads the bars off a README's table (--readme FILE, written into it) or a table's (--table FILE, printed)"
                );
                std::process::exit(2);
            }
        }
        return;
    }
    if args.readme.is_some()
        && (args.history != 0
            || args.horizon != AFTER
            || args.seed != 1
            || args.block != 10
            || args.null_evaluations != harness::NULL_EVALUATIONS
            || args.independent
            || args.noise_scale != 1.0
            || !args.detector.is_empty())
    {
        // The README's table is a fresh start with the shipped detector.
        eprintln!(
            "--readme: the README's table is measured at a fresh start (--history 0), \
             with --horizon {AFTER}, --null-evaluations {}, --seed 1, blocks of 10, \
             the noise as recorded and the shipped detector",
            harness::NULL_EVALUATIONS
        );
        std::process::exit(2);
    }
    if let Some(path) = &args.readme {
        // Refused before the run, not after: the README must be readable
        // and hold its markers.
        let checked = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                table::table_span(&text)
                    .and_then(|_| bars::bars_span(&text))
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = checked {
            eprintln!("{}: {e}", path.display());
            std::process::exit(2);
        }
    }
    if args.null_evaluations <= harness::NULL_UPGRADE_AFTER {
        // The no-op upgrade would fall past the series' end: the upgrade
        // row would score nothing and say 0.0.
        eprintln!(
            "--null-evaluations: {} leaves no evaluation after the no-op upgrade at the {}th; give more",
            args.null_evaluations,
            harness::NULL_UPGRADE_AFTER
        );
        std::process::exit(2);
    }
    let mut policy = detector_policy(&args.detector);
    policy.detector.correlation = policy.detector.correlation && !args.independent;
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&args.traces)
        .expect("benches/traces is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
        .collect();
    traces.sort();
    if let Some(only) = &args.only {
        // A name, not a path: `--trace idle` for `benches/traces/idle.jsonl.gz`.
        let names: Vec<String> = traces.iter().map(|p| trace_name(p).to_owned()).collect();
        if !names.contains(only) {
            eprintln!(
                "--trace {only}: no such trace in {}; one of {}",
                args.traces.display(),
                names.join(", ")
            );
            std::process::exit(2);
        }
    }
    if let Some(wanted) = &args.detectors {
        let known: Vec<&str> = Detector::ALL
            .iter()
            .map(|d| d.key())
            .chain(EXTERNAL.map(|(key, _)| key))
            .collect();
        if let Some(unknown) = wanted.iter().find(|k| !known.contains(&k.as_str())) {
            eprintln!("--detectors: {unknown} is none of {}", known.join(", "));
            std::process::exit(2);
        }
    }
    let python = python();
    let scratch = tempfile::tempdir().unwrap();
    let changes = harness::changes();
    let mut md = String::new();
    writeln!(
        md,
        "Each cell: caught within 3 evaluations / within {} / median delay (evaluations; 1 = the first changed run){}. \
         {} trials per cell for the in-process detectors, {} for Otava and E-Divisive; false regressions per 10,000 evaluations \
         of untouched series ({} series of {} evaluations), and how often those series alarm within 3 and {} evaluations of a run \
         where a trial's change could have come (of an upgrade's, at the no-op upgrade): the catches a detector makes by chance, \
         which its cells' must pass to have seen the change. Series are circular block bootstraps (blocks of {} runs) of each trace{}.\n",
        args.horizon,
        if args.horizon == AFTER { "" } else { " / the delay by which half of all trials were caught" },
        args.trials, args.external_trials, args.null_series, args.null_evaluations, args.horizon, args.block,
        if args.noise_scale == 1.0 {
            String::new()
        } else {
            format!(", its noise scaled to {} of the recorded on logarithms", args.noise_scale)
        }
    )
    .unwrap();
    for path in traces {
        let mut trace = read_trace(&path);
        if args.noise_scale != 1.0 {
            trace = trace.with_noise_scaled(args.noise_scale);
        }
        if args.only.as_ref().is_some_and(|o| *o != trace.name) {
            continue;
        }
        let mut noise = harness::trace_noise(&trace, args.horizon, policy.warmup_runs);
        let spans: Vec<String> = noise
            .at_change
            .iter()
            .map(|sd| {
                let at = |k: usize| sd.get(k - 1).copied().unwrap_or(f64::NAN);
                format!("{:.3}/{:.3}/{:.3}", at(1), at(3), at(AFTER))
            })
            .collect();
        eprintln!(
            "trace {}: {} runs, sd of the log difference over 1/3/{} runs {spans:?}",
            trace.name,
            trace.runs.len(),
            AFTER,
        );
        // Cell 0: untouched; then one per change.
        let mut cells: Vec<(Option<Change>, Vec<Series>)> = Vec::new();
        let mut rng = harness::rng_for(args.seed, &trace.name, 0);
        cells.push((
            None,
            (0..args.null_series)
                .map(|_| {
                    harness::null_series(
                        &trace,
                        args.block,
                        args.history,
                        args.null_evaluations,
                        &mut rng,
                    )
                })
                .collect(),
        ));
        for (c, change) in changes.iter().enumerate() {
            let mut rng = harness::rng_for(args.seed, &trace.name, c + 1);
            cells.push((
                Some(*change),
                (0..args.trials)
                    .map(|_| {
                        harness::changed_series(
                            &trace,
                            *change,
                            args.block,
                            args.history,
                            args.horizon,
                            &mut rng,
                        )
                    })
                    .collect(),
            ));
        }
        // The quiet oracles' levels, from this trace's untouched series.
        harness::calibrate(&mut noise, &cells[0].1);
        // Each quiet oracle's highest level, and the span it is at.
        let highest = |levels: &[f64]| {
            levels
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or((0, f64::NAN), |(at, z)| (at + 1, *z))
        };
        let ((span, z), (warm_span, warm_z)) =
            (highest(&noise.quiet_z.0), highest(&noise.quiet_z.1));
        eprintln!(
            "  the quiet oracles' highest z: {z:.2} at {span} runs, after warm-up {warm_z:.2} at {warm_span} (the plain oracles' {:.2} at every span)",
            rules::Oracle::one_in_10000_z()
        );
        let mut rows: Vec<(String, Vec<Score>)> = Vec::new();
        for detector in Detector::ALL.into_iter().filter(|d| args.wants(d.key())) {
            let started = std::time::Instant::now();
            let scores: Vec<Score> = cells
                .iter()
                .map(|(_, series)| {
                    let mut score = Score::with_horizon(args.horizon);
                    for s in series {
                        let alerts = harness::run_detector(detector, s, &policy, &noise);
                        score.add_scored_from(s, &alerts, harness::scored_from(detector, s));
                    }
                    score
                })
                .collect();
            eprintln!(
                "  {} in {:.1} s",
                detector.name(),
                started.elapsed().as_secs_f64()
            );
            rows.push((detector.name().to_owned(), scores));
        }
        if let Some(py) = python.as_ref().filter(|_| args.external_trials > 0) {
            for (detector, name) in EXTERNAL.into_iter().filter(|(key, _)| args.wants(key)) {
                let started = std::time::Instant::now();
                let scores: Vec<Score> = cells
                    .iter()
                    .map(|(change, series)| {
                        let keep = if change.is_some() {
                            args.external_trials
                        } else {
                            args.null_series.min(args.external_trials * 2)
                        };
                        let series = &series[..keep.min(series.len())];
                        let alerts = external(py, detector, series, scratch.path());
                        let mut score = Score::with_horizon(args.horizon);
                        for (s, a) in series.iter().zip(&alerts) {
                            score.add(s, a);
                        }
                        score
                    })
                    .collect();
                eprintln!("  {name} in {:.1} s", started.elapsed().as_secs_f64());
                rows.push((name.to_owned(), scores));
            }
        }
        writeln!(
            md,
            "\n#### Trace `{}` ({} runs)\n",
            trace.name,
            trace.runs.len()
        )
        .unwrap();
        let mut header = format!(
            "| detector | false / 10k (evals) | untouched: alarm within 3 / {} |",
            args.horizon
        );
        let mut rule = "|---|---|---|".to_owned();
        for change in &changes {
            write!(header, " {} |", change.label()).unwrap();
            rule.push_str("---|");
        }
        writeln!(md, "{header}\n{rule}").unwrap();
        for (name, scores) in &rows {
            let null = &scores[0];
            let mut line = format!(
                "| {name} | {} | {} |",
                cell::false_regressions(null),
                cell::untouched(null),
            );
            for score in &scores[1..] {
                write!(line, " {} |", cell::catches(score)).unwrap();
            }
            writeln!(md, "{line}").unwrap();
        }
    }
    print!("{md}");
    // The bars of this run's rows, where it ran every row they need.
    match bars::bars(&md) {
        Ok(b) => println!("\n{}", b.markdown),
        Err(e) => eprintln!("no bars for this run: {e}"),
    }
    if let Some(out) = &args.out {
        std::fs::write(out, &md).expect("the table is written");
    }
    if let Some(path) = &args.readme {
        let text = std::fs::read_to_string(path).expect("the README is readable");
        match table::update_readme(&text, &md) {
            Ok(updated) => {
                std::fs::write(path, updated).expect("the README is written");
                eprintln!("rows written into {}", path.display());
            }
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                std::process::exit(1);
            }
        }
        write_bars(path);
    }
}

/// The bars of the table in the file at `path` (the benchmark's `--out`).
fn print_bars(path: &Path) {
    let read = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|text| bars::bars(&text).map_err(|e| e.to_string()));
    match read {
        Ok(b) => println!("{}", b.markdown),
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

/// The README at `path` with its bars read anew off its table.
fn write_bars(path: &Path) {
    let written = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|text| bars::update_readme(&text).map_err(|e| e.to_string()))
        .and_then(|updated| std::fs::write(path, updated).map_err(|e| e.to_string()));
    match written {
        Ok(()) => eprintln!("bars written into {}", path.display()),
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

/// The verdict policy with `[detector]` settings as a configuration file
/// would give them (the defaults when none).
fn detector_policy(settings: &[String]) -> VerdictPolicy {
    if settings.is_empty() {
        return VerdictPolicy::default();
    }
    let text = format!(
        "[[targets]]\nname = \"t\"\nbase_url = \"http://127.0.0.1:1\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n[detector]\n{}\n",
        settings.join("\n")
    );
    match vllm_sentinel::config::Config::from_text(&text, "--detector") {
        Ok(config) => config.verdict_policy,
        Err(e) => panic!("--detector: {e}"),
    }
}
