//! The detection bars read off the detection table: on each trace, whether
//! our two verdicts meet each bar (no false regression in 10,000
//! evaluations; +10% steps caught within 3 evaluations; at least as good
//! as each field rule on both axes), and where they do not, whether any
//! detector could: the oracle, told the change and the noise, is the
//! limit, so a bar the oracle misses is beyond what the runs allow.

use std::fmt::Write as _;

use statrs::distribution::{DiscreteCDF, Hypergeometric};

use super::harness::Detector;
use super::table::{self, TableError};

/// The line before the bars in the README.
pub const BEGIN: &str =
    "<!-- detection-bars: begin (written by `scripts/detection-table --readme README.md`) -->";
/// The line after them.
pub const END: &str = "<!-- detection-bars: end -->";

/// A field rule counts as ahead of another row (or of the limit) in a
/// cell when Fisher's exact test, one-sided, gives at most this: with 60
/// trials a cell, 5 catches against none, or 13 against 5.
pub const AHEAD_P: f64 = 0.05;

/// The false-alarm bar: none in this many evaluations.
const FALSE_BAR_EVALUATIONS: usize = 10_000;

/// The step the detection bar is about, and its share of trials caught
/// within 3 evaluations: 95% on a trace with no load, 90% on a loaded one.
const STEP_CELLS: [&str; 2] = ["TTFT +10%", "TPOT +10%"];

/// The fallback where the oracle misses the step's bar: within this many
/// times the oracle's delay.
const DELAY_FACTOR: f64 = 1.5;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BarsError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error(
        "the table does not say what its cells rest on (\"N trials per cell for the in-process detectors, M for ...\" and \"of K evaluations), and how often\")"
    )]
    Trials,
    #[error("trace `{trace}`: no row \"{row}\", which the bars need")]
    Row { trace: String, row: &'static str },
    #[error("trace `{trace}`, row \"{row}\": cannot read \"{cell}\"")]
    Cell {
        trace: String,
        row: String,
        cell: String,
    },
}

/// One cell: the shares of trials caught within 3 and within 10
/// evaluations, and the median delay of those caught.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Catches {
    pub within_3: f64,
    pub within_10: f64,
    pub median_delay: Option<f64>,
}

/// One detector's row on one trace.
#[derive(Debug, Clone)]
struct Row {
    name: String,
    false_per_10k: f64,
    evaluations: usize,
    trials: usize,
    /// How often its untouched series alarm within 3 and within 10
    /// evaluations of where a change could have come, and how many
    /// series that rests on.
    chance: (f64, f64),
    untouched_series: usize,
    /// By change, in the table's column order.
    cells: Vec<Catches>,
}

/// The catches of `a` (of `trials_a`) against those of `b`: Fisher's
/// exact test, one-sided, that `a` catches more.
pub fn ahead_p(share_a: f64, trials_a: usize, share_b: f64, trials_b: usize) -> f64 {
    let count =
        |share: f64, trials: usize| ((share * trials as f64).round() as u64).min(trials as u64);
    let (a, b) = (count(share_a, trials_a), count(share_b, trials_b));
    if a == 0 {
        return 1.0;
    }
    let population = (trials_a + trials_b) as u64;
    match Hypergeometric::new(population, a + b, trials_a as u64) {
        Ok(h) => h.sf(a - 1),
        Err(_) => 1.0,
    }
}

fn share(text: &str) -> Option<f64> {
    text.trim()
        .strip_suffix('%')?
        .parse::<f64>()
        .ok()
        .map(|p| p / 100.0)
}

fn parse_catches(cell: &str) -> Option<Catches> {
    let mut parts = cell.split('/').map(str::trim);
    let within_3 = share(parts.next()?)?;
    let within_10 = share(parts.next()?)?;
    let delay = parts.next()?;
    let median_delay = if delay == "-" {
        None
    } else {
        Some(delay.parse().ok()?)
    };
    Some(Catches {
        within_3,
        within_10,
        median_delay,
    })
}

/// "0.0 (13800)" → (0.0, 13800).
fn parse_false(cell: &str) -> Option<(f64, usize)> {
    let (rate, rest) = cell.split_once(' ')?;
    let evaluations = rest
        .trim()
        .strip_prefix('(')?
        .strip_suffix(')')?
        .parse()
        .ok()?;
    Some((rate.parse().ok()?, evaluations))
}

/// What a table's cells rest on, as its preamble says.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Measured {
    /// Trials a cell: the in-process detectors', the external ones'.
    trials: (usize, usize),
    /// Evaluations of each untouched series.
    series_evaluations: usize,
}

/// The number just before `marker` in `text`, and the text after it.
fn number_before<'a>(text: &'a str, marker: &str) -> Option<(usize, &'a str)> {
    let (before, after) = text.split_once(marker)?;
    let n = before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((n, after))
}

fn measured(preamble: &str) -> Option<Measured> {
    let (own, after) = number_before(preamble, " trials per cell for the in-process detectors, ")?;
    let external = after.split(' ').next()?.parse().ok()?;
    let (series_evaluations, _) = number_before(preamble, " evaluations), and how often")?;
    Some(Measured {
        trials: (own, external),
        series_evaluations,
    })
}

/// "30% / 72%" → (0.30, 0.72).
fn parse_chance(cell: &str) -> Option<(f64, f64)> {
    let (within_3, within_10) = cell.split_once('/')?;
    Some((share(within_3)?, share(within_10)?))
}

/// One trace's rows, read from its table's cells.
struct TraceRows {
    trace: String,
    changes: Vec<String>,
    rows: Vec<Row>,
}

impl TraceRows {
    fn read(t: &table::TraceCells, m: Measured) -> Result<TraceRows, BarsError> {
        // Columns: detector, false / 10k, untouched chance, then changes.
        let changes: Vec<String> = t.columns.iter().skip(3).cloned().collect();
        let mut rows = Vec::new();
        for cells in &t.rows {
            let name = cells.first().cloned().unwrap_or_default();
            let bad = |cell: &str| BarsError::Cell {
                trace: t.trace.clone(),
                row: name.clone(),
                cell: cell.to_owned(),
            };
            let false_cell = cells.get(1).map(String::as_str).unwrap_or("");
            let (false_per_10k, evaluations) =
                parse_false(false_cell).ok_or_else(|| bad(false_cell))?;
            let chance_cell = cells.get(2).map(String::as_str).unwrap_or("");
            let chance = parse_chance(chance_cell).ok_or_else(|| bad(chance_cell))?;
            let catches = cells
                .iter()
                .skip(3)
                .map(|c| parse_catches(c).ok_or_else(|| bad(c)))
                .collect::<Result<Vec<_>, _>>()?;
            let in_process = Detector::ALL.iter().any(|d| d.name() == name);
            rows.push(Row {
                trials: if in_process { m.trials.0 } else { m.trials.1 },
                chance,
                untouched_series: evaluations / m.series_evaluations.max(1),
                name,
                false_per_10k,
                evaluations,
                cells: catches,
            });
        }
        Ok(TraceRows {
            trace: t.trace.clone(),
            changes,
            rows,
        })
    }

    fn row(&self, detector: Detector) -> Result<&Row, BarsError> {
        self.rows
            .iter()
            .find(|r| r.name == detector.name())
            .ok_or_else(|| BarsError::Row {
                trace: self.trace.clone(),
                row: detector.name(),
            })
    }

    /// The field's rules: every row that is neither ours nor an oracle.
    fn anchors(&self) -> impl Iterator<Item = &Row> {
        let ours_or_limit = [
            Detector::OursUpgrade,
            Detector::OursSameBuild,
            Detector::Oracle,
            Detector::OracleAfterWarmup,
        ];
        self.rows
            .iter()
            .filter(move |r| !ours_or_limit.iter().any(|d| d.name() == r.name))
    }

    fn column(&self, change: &str) -> Option<usize> {
        self.changes.iter().position(|c| c == change)
    }
}

/// Our two verdicts, each with its limit: an upgrade's is the oracle that
/// leaves out the new build's warm-up runs as the verdict does.
const OURS: [(Detector, Detector); 2] = [
    (Detector::OursUpgrade, Detector::OracleAfterWarmup),
    (Detector::OursSameBuild, Detector::Oracle),
];

/// How one bar came out for one of our rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Met,
    /// Not met, and not by the limit either: no detector can with these runs.
    BeyondTheLimit,
    NotMet,
}

/// Counts of outcomes over every trace, row and bar.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub met: usize,
    pub beyond_the_limit: usize,
    pub not_met: usize,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Met => self.met += 1,
            Outcome::BeyondTheLimit => self.beyond_the_limit += 1,
            Outcome::NotMet => self.not_met += 1,
        }
    }
}

/// The bars, per trace and verdict, with what each outcome rests on.
#[derive(Debug, Default)]
pub struct Bars {
    pub markdown: String,
    /// By bar: false regressions, the +10% step, both axes against the
    /// field's rules.
    pub false_regressions: Tally,
    pub step: Tally,
    pub against_the_field: Tally,
}

fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

fn evaluations(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The share of trials the step bar asks for on a trace: 95% with no
/// load (`idle`, and `quiet`, idle on a machine otherwise at rest), 90%
/// on the loaded ones.
pub fn step_target(trace: &str) -> f64 {
    if matches!(trace, "idle" | "quiet") {
        0.95
    } else {
        0.90
    }
}

/// No false regression in 10,000 evaluations of untouched series.
fn false_bar(ours: &Row, limit: &Row) -> (Outcome, String) {
    let said = format!(
        "{:.1} per 10,000 in {} (the limit {:.1})",
        ours.false_per_10k,
        evaluations(ours.evaluations),
        limit.false_per_10k
    );
    if ours.false_per_10k > 0.0 {
        (Outcome::NotMet, format!("not met: {said}"))
    } else if ours.evaluations < FALSE_BAR_EVALUATIONS {
        (
            Outcome::NotMet,
            format!("not shown: {said}, fewer than 10,000"),
        )
    } else {
        (Outcome::Met, format!("met: {said}"))
    }
}

/// A step caught within 3 evaluations in the trace's share of trials, or,
/// where the limit cannot, within 1.5x the limit's delay.
fn step_bar(
    target: f64,
    ours: Catches,
    limit: Catches,
    trials: (usize, usize),
) -> (Outcome, String) {
    let seen = format!(
        "{} within 3 (the limit {})",
        pct(ours.within_3),
        pct(limit.within_3)
    );
    if ours.within_3 >= target {
        return (Outcome::Met, format!("met: {seen}"));
    }
    if limit.within_3 >= target {
        return (Outcome::NotMet, format!("not met: {seen}"));
    }
    // The runs' noise puts the bar beyond the limit: the fallback is the
    // limit's delay, which exists where it catches half within 10.
    if limit.within_10 < 0.5 {
        return (
            Outcome::BeyondTheLimit,
            format!(
                "beyond the limit: {seen}; the limit catches {} within 10, so it has no delay to be within 1.5x of",
                pct(limit.within_10)
            ),
        );
    }
    let fewer = ahead_p(limit.within_10, trials.1, ours.within_10, trials.0) <= AHEAD_P;
    let delays = (ours.median_delay, limit.median_delay);
    let text = match delays {
        (Some(d), Some(l)) => format!("median delay {d} against the limit's {l}"),
        _ => "no delay".to_owned(),
    };
    let within = matches!(delays, (Some(d), Some(l)) if d <= DELAY_FACTOR * l);
    if within && !fewer {
        (
            Outcome::Met,
            format!("met within 1.5x the limit's delay: {seen}, {text}"),
        )
    } else {
        (
            Outcome::NotMet,
            format!(
                "not met: {seen}; {} within 10 against the limit's {}, {text}",
                pct(ours.within_10),
                pct(limit.within_10)
            ),
        )
    }
}

/// A horizon of the table's cells: its evaluations, how a cell's share
/// caught by then is read, and the field rule's share by chance.
type Horizon = (usize, fn(&Catches) -> f64, f64);

/// Where a field rule catches more than ours in a cell (by Fisher's
/// test), and whether it catches more than the limit too: then only a
/// false-alarm rate above the limit's gives those catches.
fn catches_bar(t: &TraceRows, ours: &Row, limit: &Row, anchor: &Row) -> (Outcome, String) {
    let mut within = Vec::new();
    let mut beyond = 0;
    let mut compared = 0;
    for (c, change) in t.changes.iter().enumerate() {
        let (Some(o), Some(l), Some(a)) =
            (ours.cells.get(c), limit.cells.get(c), anchor.cells.get(c))
        else {
            continue;
        };
        let horizons: [Horizon; 2] = [
            (3, |x| x.within_3, anchor.chance.0),
            (10, |x| x.within_10, anchor.chance.1),
        ];
        for (horizon, of, chance) in horizons {
            compared += 1;
            // Ahead of ours, and by more than its own alarms near a change
            // that never came: a catch at chance is no sight of the change.
            if ahead_p(of(a), anchor.trials, of(o), ours.trials) > AHEAD_P
                || ahead_p(of(a), anchor.trials, chance, anchor.untouched_series) > AHEAD_P
            {
                continue;
            }
            if ahead_p(of(a), anchor.trials, of(l), limit.trials) <= AHEAD_P {
                beyond += 1;
            } else {
                within.push(format!(
                    "{change} within {horizon} {} against {} (the limit {})",
                    pct(of(a)),
                    pct(of(o)),
                    pct(of(l))
                ));
            }
        }
    }
    let beyond_text = format!("{beyond} of {compared} beyond the limit");
    if !within.is_empty() {
        (
            Outcome::NotMet,
            format!(
                "not met: ahead of ours within the limit in {}: {}; {beyond_text}",
                within.len(),
                within.join("; ")
            ),
        )
    } else if beyond > 0 {
        (
            Outcome::BeyondTheLimit,
            format!(
                "beyond the limit: ahead of ours in {beyond} of {compared}, each beyond the limit too"
            ),
        )
    } else {
        (
            Outcome::Met,
            format!("met: ahead of ours in none of {compared}"),
        )
    }
}

/// The bars of a detection table (the text between the README's table
/// markers, or the benchmark's `--out` file).
pub fn bars(table_text: &str) -> Result<Bars, BarsError> {
    let (preamble, traces) = table::cells(table_text)?;
    let m = measured(&preamble).ok_or(BarsError::Trials)?;
    let (own, external) = m.trials;
    let mut bars = Bars::default();
    let mut md = String::new();
    for cells in &traces {
        let t = TraceRows::read(cells, m)?;
        let target = step_target(&t.trace);
        let mut lines: Vec<(String, Vec<String>)> = Vec::new();
        // One line a bar, one text a verdict, in OURS's order.
        let mut push = |bar: String, tally: &mut Tally, (outcome, text): (Outcome, String)| {
            tally.add(outcome);
            match lines.iter_mut().find(|(b, _)| *b == bar) {
                Some((_, texts)) => texts.push(text),
                None => lines.push((bar, vec![text])),
            }
        };
        for (verdict, limit) in OURS {
            let (ours, limit) = (t.row(verdict)?, t.row(limit)?);
            push(
                "no false regression in 10,000 evaluations".into(),
                &mut bars.false_regressions,
                false_bar(ours, limit),
            );
            for change in STEP_CELLS {
                let Some(c) = t.column(change) else { continue };
                push(
                    format!("{change} within 3 evaluations in {} of trials", pct(target)),
                    &mut bars.step,
                    step_bar(
                        target,
                        ours.cells[c],
                        limit.cells[c],
                        (ours.trials, limit.trials),
                    ),
                );
            }
            for anchor in t.anchors() {
                let fewer = if ours.false_per_10k <= anchor.false_per_10k {
                    Outcome::Met
                } else {
                    Outcome::NotMet
                };
                let said = format!(
                    "{}: {:.1} against {:.1} per 10,000",
                    if fewer == Outcome::Met {
                        "met"
                    } else {
                        "not met"
                    },
                    ours.false_per_10k,
                    anchor.false_per_10k
                );
                push(
                    format!("against {}: false regressions", anchor.name),
                    &mut bars.against_the_field,
                    (fewer, said),
                );
                push(
                    format!("against {}: catches", anchor.name),
                    &mut bars.against_the_field,
                    catches_bar(&t, ours, limit, anchor),
                );
            }
        }
        writeln!(md, "\n##### `{}`\n", t.trace).unwrap();
        writeln!(
            md,
            "| bar | {} | {} |\n|---|---|---|",
            OURS[0].0.name(),
            OURS[1].0.name()
        )
        .unwrap();
        for (bar, texts) in &lines {
            writeln!(md, "| {bar} | {} |", texts.join(" | ")).unwrap();
        }
    }
    let tally = |t: &Tally| {
        format!(
            "met {}, beyond the limit {}, not met {}",
            t.met, t.beyond_the_limit, t.not_met
        )
    };
    bars.markdown = format!(
        "Read off the table above by `scripts/detection-table` (`src/detection/bars.rs`). \
The limit of our upgrade verdict is the oracle after warm-up, of our same-build verdict \
the oracle; a bar the limit misses is beyond what any detector can do with the same runs. \
A field rule is ahead of a row in a cell when Fisher's exact test, one-sided, gives p <= {AHEAD_P} \
({own} trials a cell, {external} for Otava and E-Divisive); ahead of the limit too, it buys \
those catches with false alarms the first bar does not allow. The step bar's fallback, where \
the limit misses it: within {DELAY_FACTOR}x the limit's median delay, catching within 10 no \
fewer by that test; the limit has no delay where it catches under half within 10.\n\n\
Over {} traces and both verdicts: no false regression in 10,000: {}; +10% within 3: {}; \
both axes against each field rule (false regressions, catches): {}.\n{md}",
        traces.len(),
        tally(&bars.false_regressions),
        tally(&bars.step),
        tally(&bars.against_the_field),
    );
    Ok(bars)
}

/// Where the bars lie in `readme`: from the line after [`BEGIN`] to the
/// start of [`END`].
pub fn bars_span(readme: &str) -> Result<std::ops::Range<usize>, TableError> {
    table::span_between(readme, BEGIN, END)
}

/// `readme` with its bars (between [`BEGIN`] and [`END`]) read anew off
/// its table.
pub fn update_readme(readme: &str) -> Result<String, BarsError> {
    let fresh = bars(&readme[table::table_span(readme)?])?;
    let span = bars_span(readme)?;
    Ok(format!(
        "{}\n{}\n\n{}",
        &readme[..span.start],
        fresh.markdown.trim(),
        &readme[span.end..]
    ))
}

#[cfg(test)]
#[path = "bars_tests.rs"]
mod tests;
