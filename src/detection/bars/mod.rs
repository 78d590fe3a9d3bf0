//! The detection bars read off the detection table: on each trace, whether
//! our two verdicts meet each bar (no false regression in 10,000
//! evaluations; +10% steps caught within 3 evaluations; at least as good
//! as each field rule on both axes), and where they do not, whether any
//! detector could: the oracle, told the change and the noise, is the
//! limit, so a bar the oracle misses is beyond what the runs allow.

mod read;

use std::fmt::Write as _;

use read::{Row, TraceRows};

use super::harness::Detector;
use super::table::{self, TableError};
use crate::stats::fisher;

/// The line before the bars in the README.
pub const BEGIN: &str =
    "<!-- detection-bars: begin (written by `scripts/detection-table --readme README.md`) -->";
/// The line after them.
pub const END: &str = "<!-- detection-bars: end -->";

/// One row catches more than another in a cell when Fisher's exact test,
/// one-sided, gives at most this: with 60 trials a cell, 5 catches
/// against none, or 13 against 5. Uncorrected for the 28 cells a pair of
/// rows is compared in, so it errs toward finding a field rule ahead.
pub const AHEAD_P: f64 = 0.05;

/// The false-alarm bar: none in this many evaluations.
const FALSE_BAR_EVALUATIONS: usize = 10_000;

/// The changes the step bar is about.
const STEP_CELLS: [&str; 2] = ["TTFT +10%", "TPOT +10%"];

/// The step bar's fallback where the limit misses it too: within this
/// many times the limit's delay.
const DELAY_FACTOR: f64 = 1.5;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BarsError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("the table's cells are not \"{0}\": the bars read only the table's own form")]
    Form(&'static str),
    #[error(
        "the table does not say what its cells rest on: \"N trials per cell for the in-process detectors, M for ...\" and \"(S series of K evaluations)\""
    )]
    Trials,
    #[error("trace `{trace}`: the columns do not begin \"{want}\"")]
    Columns { trace: String, want: String },
    #[error("trace `{trace}`: no row \"{row}\", which the bars need")]
    Row { trace: String, row: &'static str },
    #[error("trace `{trace}`: row \"{row}\" is no detector the benchmark runs")]
    Unknown { trace: String, row: String },
    #[error("trace `{trace}`: row \"{row}\" twice")]
    Twice { trace: String, row: String },
    #[error("trace `{trace}`, row \"{row}\": cannot read \"{cell}\"")]
    Cell {
        trace: String,
        row: String,
        cell: String,
    },
}

/// Whether the row catching `share_a` of `trials_a` catches more than
/// the one catching `share_b` of `trials_b` (see [`AHEAD_P`]); the
/// table's shares are whole percents, which give back the counts of 60
/// or fewer trials exactly.
pub fn ahead(share_a: f64, trials_a: usize, share_b: f64, trials_b: usize) -> bool {
    let count = |share: f64, trials: usize| (share * trials as f64).round() as u64;
    let p = fisher::more_in_first(
        count(share_a, trials_a),
        trials_a as u64,
        count(share_b, trials_b),
        trials_b as u64,
    );
    p <= AHEAD_P
}

/// Our two verdicts, each with its limit: an upgrade's is the oracle that
/// leaves out the new build's warm-up runs as the verdict does. The
/// limit is the oracle at no false regression where the table has it (the
/// first bar asks for none, and the plain oracle, at one in 10,000, raises
/// some), else the plain oracle.
const OURS: [(Detector, [Detector; 2]); 2] = [
    (
        Detector::OursUpgrade,
        [
            Detector::OracleAfterWarmupQuiet,
            Detector::OracleAfterWarmup,
        ],
    ),
    (
        Detector::OursSameBuild,
        [Detector::OracleQuiet, Detector::Oracle],
    ),
];

/// How one bar came out for one of our rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Met,
    /// Not met, and not by the limit either: no detector can with these runs.
    BeyondTheLimit,
    NotMet,
}

impl Outcome {
    /// How a bar's line names it, before what it rests on.
    fn word(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::BeyondTheLimit => "beyond the limit",
            Outcome::NotMet => "not met",
        }
    }
}

/// Counts of outcomes over every trace and verdict.
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

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "met {}, beyond the limit {}, not met {}",
            self.met, self.beyond_the_limit, self.not_met
        )
    }
}

/// The bars of a table: its markdown, and each bar's outcomes counted.
#[derive(Debug, Default)]
pub struct Bars {
    pub markdown: String,
    pub false_regressions: Tally,
    pub step: Tally,
    /// Against each field rule: no more false regressions than it.
    pub fewer_false_than_the_field: Tally,
    /// Against each field rule: catching no fewer.
    pub catches_against_the_field: Tally,
}

/// A bar's outcome for one verdict, and what it rests on (the outcome's
/// word is put before it when the bars are written).
type Judged = (Outcome, String);

fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// 13800 → "13,800".
fn with_thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
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
    match trace {
        "idle" | "quiet" => 0.95,
        _ => 0.90,
    }
}

/// No false regression in 10,000 evaluations of untouched series.
fn false_bar(ours: &Row, limit: &Row) -> Judged {
    let rate = format!(
        "{:.1} per 10,000 in {} (the limit {:.1})",
        ours.false_per_10k,
        with_thousands(ours.evaluations),
        limit.false_per_10k
    );
    if ours.false_per_10k > 0.0 {
        (Outcome::NotMet, rate)
    } else if ours.evaluations < FALSE_BAR_EVALUATIONS {
        (Outcome::NotMet, format!("{rate}, fewer than 10,000"))
    } else {
        (Outcome::Met, rate)
    }
}

/// A step caught within 3 evaluations in the trace's share of trials, or,
/// where the limit cannot, within 1.5x the limit's delay.
fn step_bar(target: f64, ours: &Row, limit: &Row, column: usize) -> Judged {
    let (our_cell, limit_cell) = (ours.cells[column], limit.cells[column]);
    let within_3 = format!(
        "{} within 3 (the limit {})",
        pct(our_cell.within_3),
        pct(limit_cell.within_3)
    );
    if our_cell.within_3 >= target {
        return (Outcome::Met, within_3);
    }
    if limit_cell.within_3 >= target {
        return (Outcome::NotMet, within_3);
    }
    // The noise puts the bar beyond the limit; the fallback is the
    // limit's delay, and a median of the few trials it caught says
    // nothing of when the others would be.
    if limit_cell.within_10 < 0.5 {
        return (
            Outcome::BeyondTheLimit,
            format!(
                "{within_3}; the limit catches {} within 10, under half: no delay of its to be within 1.5x of",
                pct(limit_cell.within_10)
            ),
        );
    }
    let catches_fewer = ahead(
        limit_cell.within_10,
        limit.trials,
        our_cell.within_10,
        ours.trials,
    );
    let delays = match (our_cell.median_delay, limit_cell.median_delay) {
        (Some(d), Some(l)) => Some((d, l)),
        _ => None,
    };
    let delays_text = match delays {
        Some((d, l)) => format!("median delay {d} against the limit's {l}"),
        None => "no median delay".to_owned(),
    };
    let soon_enough = delays.is_some_and(|(d, l)| d <= DELAY_FACTOR * l);
    if soon_enough && !catches_fewer {
        (
            Outcome::Met,
            format!("within 1.5x the limit's delay: {within_3}, {delays_text}"),
        )
    } else {
        (
            Outcome::NotMet,
            format!(
                "{within_3}; {} within 10 against the limit's {}, {delays_text}",
                pct(our_cell.within_10),
                pct(limit_cell.within_10)
            ),
        )
    }
}

/// No more false regressions than a field rule.
fn fewer_false_bar(ours: &Row, rule: &Row) -> Judged {
    let outcome = match ours.false_per_10k <= rule.false_per_10k {
        true => Outcome::Met,
        false => Outcome::NotMet,
    };
    let rates = format!(
        "{:.1} against {:.1} per 10,000",
        ours.false_per_10k, rule.false_per_10k
    );
    (outcome, rates)
}

/// Where a field rule catches more than ours, beyond what it catches by
/// chance; and whether it catches more than the limit too while alarming
/// more than the limit: then only its false alarms give those catches.
fn catches_bar(t: &TraceRows, ours: &Row, limit: &Row, rule: &Row) -> Judged {
    let mut ahead_within_the_limit = Vec::new();
    let mut beyond = 0;
    let mut compared = 0;
    for (column, change) in t.changes.iter().enumerate() {
        let (our_cell, limit_cell, rule_cell) =
            (ours.cells[column], limit.cells[column], rule.cells[column]);
        let horizons = [
            (
                3,
                our_cell.within_3,
                limit_cell.within_3,
                rule_cell.within_3,
                rule.chance.within_3,
            ),
            (
                10,
                our_cell.within_10,
                limit_cell.within_10,
                rule_cell.within_10,
                rule.chance.within_10,
            ),
        ];
        for (horizon, our_share, limit_share, rule_share, by_chance) in horizons {
            compared += 1;
            // A catch no more often than its alarms near a change that
            // never came is no sight of the change.
            if !ahead(rule_share, rule.trials, our_share, ours.trials)
                || !ahead(rule_share, rule.trials, by_chance, rule.chance.series)
            {
                continue;
            }
            if ahead(rule_share, rule.trials, limit_share, limit.trials)
                && rule.false_per_10k > limit.false_per_10k
            {
                beyond += 1;
            } else {
                ahead_within_the_limit.push(format!(
                    "{change} within {horizon} {} against {} (the limit {})",
                    pct(rule_share),
                    pct(our_share),
                    pct(limit_share)
                ));
            }
        }
    }
    if !ahead_within_the_limit.is_empty() {
        (
            Outcome::NotMet,
            format!(
                "ahead of ours within the limit in {}: {}; beyond it in {beyond} of {compared}",
                ahead_within_the_limit.len(),
                ahead_within_the_limit.join("; ")
            ),
        )
    } else if beyond > 0 {
        (
            Outcome::BeyondTheLimit,
            format!("ahead of ours in {beyond} of {compared}, each beyond the limit too"),
        )
    } else {
        (Outcome::Met, format!("ahead of ours in none of {compared}"))
    }
}

/// The bars of a detection table (the text between the README's table
/// markers, or the benchmark's `--out` file).
pub fn bars(table_text: &str) -> Result<Bars, BarsError> {
    let (preamble, traces) = table::cells(table_text)?;
    let measured = read::measured(&preamble)?;
    let mut bars = Bars::default();
    let mut md = String::new();
    for cells in &traces {
        let t = TraceRows::read(cells, measured)?;
        let target = step_target(&t.trace);
        // One line a bar; its texts by verdict, in OURS's order.
        let mut lines: Vec<(String, [String; 2])> = Vec::new();
        // Each text is named by its outcome, so the two cannot disagree.
        let mut put = |bar: String, verdict: usize, tally: &mut Tally, (outcome, text): Judged| {
            tally.add(outcome);
            let text = format!("{}: {text}", outcome.word());
            match lines.iter_mut().find(|(b, _)| *b == bar) {
                Some((_, texts)) => texts[verdict] = text,
                None => {
                    let mut texts = [String::new(), String::new()];
                    texts[verdict] = text;
                    lines.push((bar, texts));
                }
            }
        };
        for (verdict, (ours, [quiet_limit, limit])) in OURS.into_iter().enumerate() {
            let limit = t.row(quiet_limit).or_else(|_| t.row(limit))?;
            let ours = t.row(ours)?;
            put(
                "no false regression in 10,000 evaluations".into(),
                verdict,
                &mut bars.false_regressions,
                false_bar(ours, limit),
            );
            for change in STEP_CELLS {
                let Some(column) = t.column(change) else {
                    continue;
                };
                put(
                    format!("{change} within 3 evaluations in {} of trials", pct(target)),
                    verdict,
                    &mut bars.step,
                    step_bar(target, ours, limit, column),
                );
            }
            for rule in t.field_rules() {
                put(
                    format!("against {}: false regressions", rule.name),
                    verdict,
                    &mut bars.fewer_false_than_the_field,
                    fewer_false_bar(ours, rule),
                );
                put(
                    format!("against {}: catches", rule.name),
                    verdict,
                    &mut bars.catches_against_the_field,
                    catches_bar(&t, ours, limit, rule),
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
        for (bar, [upgrade, same_build]) in &lines {
            writeln!(md, "| {bar} | {upgrade} | {same_build} |").unwrap();
        }
    }
    bars.markdown = format!(
        "Read off the table above (`src/detection/bars/`). The limit of our upgrade verdict is \
the oracle after warm-up, of our same-build verdict the oracle, each at no false regression \
where the table has that row (else at one in 10,000): a bar the limit misses is beyond what \
any detector that raises no false regression can do with the same runs. The step bar's fallback, where the limit \
misses it: within {DELAY_FACTOR}x the limit's median delay, catching no fewer within 10; where the \
limit catches under half within 10, the median of its few catches is no delay to compare with, \
and the bar stays beyond the limit. A field rule catches more than ours in a cell when Fisher's \
exact test, one-sided, gives p <= {AHEAD_P} against ours ({} trials a cell, {} for Otava and \
E-Divisive) and against what the rule catches by chance (its untouched column, on its untouched \
series); 28 such tests a rule and verdict per trace, uncorrected, so the test errs toward the \
field. Catching more than the limit too, with more false regressions than the limit, the rule \
has those catches from its false alarms: beyond the limit; otherwise not met.\n\n\
Over {} traces and both verdicts: no false regression in 10,000: {}; +10% within 3: {}; \
against each field rule, no more false regressions: {}; catching no fewer: {}.\n{md}",
        measured.in_process_trials,
        measured.external_trials,
        traces.len(),
        bars.false_regressions,
        bars.step,
        bars.fewer_false_than_the_field,
        bars.catches_against_the_field,
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
mod tests;
