//! The detection table read back as numbers for the bars: each row's
//! false regressions, its catches by chance, and its cells, with the
//! trials and series its preamble says they rest on. A table that is not
//! the table's form (another horizon, a short row) is refused, not read
//! askew.

use super::BarsError;
use crate::detection::cell::{self, Catches};
use crate::detection::harness::Detector;
use crate::detection::rules::EXTERNAL;
use crate::detection::table::TraceCells;

/// The columns before the changes' own, in the order the benchmark
/// writes them.
const LEADING_COLUMNS: [&str; 3] = [
    "detector",
    "false / 10k (evals)",
    "untouched: alarm within 3 / 10",
];

/// What the preamble says a cell is, for the table the bars read: within
/// 3, within 10 and the median delay, with no further field.
const CELL_FORM: &str = "caught within 3 evaluations / within 10 / median delay";

/// How often a row's untouched series alarm within 3 and within 10
/// evaluations of a run where a change could have come, and how many
/// series those shares rest on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chance {
    pub within_3: f64,
    pub within_10: f64,
    pub series: usize,
}

/// One detector's row on one trace.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub false_per_10k: f64,
    pub evaluations: usize,
    /// Trials behind each of its cells.
    pub trials: usize,
    pub chance: Chance,
    /// By change, in the table's column order.
    pub cells: Vec<Catches>,
}

/// What a table's cells rest on, as its preamble says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub in_process_trials: usize,
    /// Otava's and E-Divisive's, run outside the process.
    pub external_trials: usize,
    /// Evaluations of each untouched series.
    pub series_evaluations: usize,
}

/// One trace's rows.
pub struct TraceRows {
    pub trace: String,
    pub changes: Vec<String>,
    pub rows: Vec<Row>,
}

/// The number just before `marker` in `text`, and the text after it.
fn number_before<'a>(text: &'a str, marker: &str) -> Option<(usize, &'a str)> {
    let (before, after) = text.split_once(marker)?;
    let digits = before.rsplit(|c: char| !c.is_ascii_digit()).next()?;
    Some((digits.parse().ok()?, after))
}

/// The preamble's trials and series, if it is the table's: cells within
/// 3 and 10 evaluations.
pub fn measured(preamble: &str) -> Result<Measured, BarsError> {
    if !preamble.contains(CELL_FORM) {
        return Err(BarsError::Form(CELL_FORM));
    }
    let read = || {
        let (in_process_trials, after) =
            number_before(preamble, " trials per cell for the in-process detectors, ")?;
        let external_trials = after.split(' ').next()?.parse().ok()?;
        let (series_evaluations, _) = number_before(preamble, " evaluations), and how often")?;
        Some(Measured {
            in_process_trials,
            external_trials,
            series_evaluations,
        })
    };
    read().ok_or(BarsError::Trials)
}

impl TraceRows {
    pub fn read(table: &TraceCells, measured: Measured) -> Result<TraceRows, BarsError> {
        let leading = table.columns.get(..LEADING_COLUMNS.len());
        if leading != Some(&LEADING_COLUMNS.map(String::from)[..]) {
            return Err(BarsError::Columns {
                trace: table.trace.clone(),
                want: LEADING_COLUMNS.join(" | "),
            });
        }
        let changes: Vec<String> = table.columns[LEADING_COLUMNS.len()..].to_vec();
        let mut rows: Vec<Row> = Vec::new();
        for cells in &table.rows {
            let name = cells.first().cloned().unwrap_or_default();
            let bad = |cell: &str| BarsError::Cell {
                trace: table.trace.clone(),
                row: name.clone(),
                cell: cell.to_owned(),
            };
            if cells.len() != table.columns.len() {
                return Err(bad(&cells.join(" | ")));
            }
            if rows.iter().any(|r| r.name == name) {
                return Err(BarsError::Twice {
                    trace: table.trace.clone(),
                    row: name,
                });
            }
            let (false_per_10k, evaluations) =
                cell::read_false_regressions(&cells[1]).ok_or_else(|| bad(&cells[1]))?;
            let (within_3, within_10) =
                cell::read_untouched(&cells[2]).ok_or_else(|| bad(&cells[2]))?;
            let catches = cells[LEADING_COLUMNS.len()..]
                .iter()
                .map(|c| cell::read_catches(c).ok_or_else(|| bad(c)))
                .collect::<Result<Vec<_>, _>>()?;
            // The rows not of this process are the change-point detectors
            // run in Python, over their own, fewer trials; a row of neither
            // is no detector the benchmark runs.
            let in_process = Detector::ALL.iter().any(|d| d.name() == name);
            if !in_process && !EXTERNAL.iter().any(|(_, row)| *row == name) {
                return Err(BarsError::Unknown {
                    trace: table.trace.clone(),
                    row: name,
                });
            }
            rows.push(Row {
                trials: match in_process {
                    true => measured.in_process_trials,
                    false => measured.external_trials,
                },
                chance: Chance {
                    within_3,
                    within_10,
                    series: evaluations / measured.series_evaluations.max(1),
                },
                name,
                false_per_10k,
                evaluations,
                cells: catches,
            });
        }
        Ok(TraceRows {
            trace: table.trace.clone(),
            changes,
            rows,
        })
    }

    pub fn row(&self, detector: Detector) -> Result<&Row, BarsError> {
        self.rows
            .iter()
            .find(|r| r.name == detector.name())
            .ok_or_else(|| BarsError::Row {
                trace: self.trace.clone(),
                row: detector.name(),
            })
    }

    /// The field's rules: every row that is neither ours nor an oracle.
    pub fn field_rules(&self) -> impl Iterator<Item = &Row> {
        let ours_or_limit = [
            Detector::OursUpgrade,
            Detector::OursSameBuild,
            Detector::Oracle,
            Detector::OracleAfterWarmup,
            Detector::OracleQuiet,
            Detector::OracleAfterWarmupQuiet,
        ];
        self.rows
            .iter()
            .filter(move |r| !ours_or_limit.iter().any(|d| d.name() == r.name))
    }

    pub fn column(&self, change: &str) -> Option<usize> {
        self.changes.iter().position(|c| c == change)
    }
}
