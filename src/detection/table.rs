//! The detection table where the README keeps it: between two marker
//! lines, one table per trace and one row per detector. A fresh run's rows
//! replace the rows of the same detectors and keep the others, so a run of
//! some detectors (`--detectors ours`) refreshes just their rows.

/// The line before the table in the README.
pub const BEGIN: &str =
    "<!-- detection-table: begin (written by `scripts/detection-table --readme README.md`) -->";
/// The line after it.
pub const END: &str = "<!-- detection-table: end -->";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    #[error("no line `{0}` in the file")]
    Marker(&'static str),
    #[error("the table's end marker comes before its begin marker")]
    Order,
    /// Rows measured otherwise (trials, series) than the rows they would
    /// sit beside.
    #[error(
        "this run says \"{fresh}\" where the table says \"{kept}\": run every detector, or with the table's settings"
    )]
    Settings { fresh: String, kept: String },
    /// Rows with other columns than the rows they would sit beside.
    #[error(
        "this run's columns are \"{fresh}\" where the table's are \"{kept}\": run every detector"
    )]
    Columns { fresh: String, kept: String },
    /// Text after a trace's heading that is not its table: a rewrite
    /// would drop it.
    #[error("the table holds a line that is not a table's: \"{0}\"; move it outside the markers")]
    Stray(String),
}

/// One trace's table: its heading, its header and rule lines, its rows.
#[derive(Debug, Default)]
struct TraceTable {
    heading: String,
    header: Vec<String>,
    rows: Vec<String>,
}

/// What precedes the first trace (what a cell says), then each trace.
#[derive(Debug, Default)]
struct Table {
    preamble: Vec<String>,
    traces: Vec<TraceTable>,
}

/// The trace a heading names: `#### Trace `idle` (314 runs)` → `idle`.
fn trace_name(heading: &str) -> &str {
    heading.split('`').nth(1).unwrap_or(heading)
}

/// The detector a row is of: its first cell.
fn row_name(row: &str) -> &str {
    split_row(row).next().unwrap_or("")
}

/// A table line's cells, trimmed, without the outer bars.
fn split_row(line: &str) -> impl Iterator<Item = &str> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(str::trim)
}

fn is_heading(line: &str) -> bool {
    line.starts_with('#') && line.contains("Trace `")
}

fn parse(text: &str) -> Result<Table, TableError> {
    let mut table = Table::default();
    for line in text.lines() {
        if is_heading(line) {
            table.traces.push(TraceTable {
                heading: line.to_owned(),
                ..TraceTable::default()
            });
        } else if let Some(trace) = table.traces.last_mut() {
            if line.starts_with('|') {
                if trace.header.len() < 2 {
                    trace.header.push(line.to_owned());
                } else {
                    trace.rows.push(line.to_owned());
                }
            } else if !line.trim().is_empty() {
                return Err(TableError::Stray(line.to_owned()));
            }
        } else {
            table.preamble.push(line.to_owned());
        }
    }
    while table.preamble.last().is_some_and(|l| l.trim().is_empty()) {
        table.preamble.pop();
    }
    while table.preamble.first().is_some_and(|l| l.trim().is_empty()) {
        table.preamble.remove(0);
    }
    Ok(table)
}

fn render(table: &Table) -> String {
    let mut out = table.preamble.join("\n");
    for trace in &table.traces {
        out.push_str("\n\n");
        out.push_str(&trace.heading);
        out.push_str("\n\n");
        for line in trace.header.iter().chain(&trace.rows) {
            out.push_str(line);
            out.push('\n');
        }
        out.pop();
    }
    out.push('\n');
    out
}

/// One trace's table as cells: the trace's name, the header's cells
/// and each row's (the detector's name first).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceCells {
    pub trace: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// A table's cells: the text before its first trace, then each trace's.
pub fn cells(text: &str) -> Result<(String, Vec<TraceCells>), TableError> {
    let table = parse(text)?;
    let split = |line: &str| -> Vec<String> { split_row(line).map(str::to_owned).collect() };
    let traces = table
        .traces
        .iter()
        .map(|t| TraceCells {
            trace: trace_name(&t.heading).to_owned(),
            columns: t.header.first().map(|h| split(h)).unwrap_or_default(),
            rows: t.rows.iter().map(|r| split(r)).collect(),
        })
        .collect();
    Ok((table.preamble.join("\n"), traces))
}

/// `existing` with the rows of `fresh` in place of those of the same
/// detector on the same trace (a detector or trace new to it is added at
/// the end of its table, or of the tables). The headings' level stays
/// `existing`'s. What a cell says (the text before the first trace) is
/// `fresh`'s when it measured every row `existing` has; otherwise the
/// two must say the same (rows beside each other measured alike).
pub fn merge(existing: &str, fresh: &str) -> Result<String, TableError> {
    let mut table = parse(existing)?;
    let fresh = parse(fresh)?;
    let every_row_fresh = table.traces.iter().all(|old| {
        fresh
            .traces
            .iter()
            .find(|new| trace_name(&new.heading) == trace_name(&old.heading))
            .is_some_and(|new| {
                old.rows
                    .iter()
                    .all(|r| new.rows.iter().any(|n| row_name(n) == row_name(r)))
            })
    });
    if every_row_fresh {
        table.preamble = fresh.preamble;
    } else if fresh.preamble != table.preamble {
        return Err(TableError::Settings {
            fresh: fresh.preamble.join(" "),
            kept: table.preamble.join(" "),
        });
    }
    let level = table
        .traces
        .first()
        .map(|t| t.heading.chars().take_while(|c| *c == '#').count());
    for new in fresh.traces {
        let heading = match level {
            Some(level) => format!(
                "{} {}",
                "#".repeat(level),
                new.heading.trim_start_matches('#').trim()
            ),
            None => new.heading.clone(),
        };
        let at = table
            .traces
            .iter()
            .position(|old| trace_name(&old.heading) == trace_name(&new.heading));
        let old = match at {
            Some(at) => &mut table.traces[at],
            None => {
                table.traces.push(TraceTable::default());
                table.traces.last_mut().expect("just pushed")
            }
        };
        if !every_row_fresh && !old.header.is_empty() && old.header != new.header {
            return Err(TableError::Columns {
                fresh: new.header.first().cloned().unwrap_or_default(),
                kept: old.header.first().cloned().unwrap_or_default(),
            });
        }
        old.heading = heading;
        old.header = new.header;
        for row in new.rows {
            match old.rows.iter().position(|r| row_name(r) == row_name(&row)) {
                Some(i) => old.rows[i] = row,
                None => old.rows.push(row),
            }
        }
    }
    Ok(render(&table))
}

/// Where the table lies in `readme`: from the line after [`BEGIN`] to
/// the start of [`END`].
pub fn table_span(readme: &str) -> Result<std::ops::Range<usize>, TableError> {
    span_between(readme, BEGIN, END)
}

/// From the line after the line `begin` to the start of `end`.
pub fn span_between(
    text: &str,
    begin: &'static str,
    end: &'static str,
) -> Result<std::ops::Range<usize>, TableError> {
    let at = text
        .find(&format!("{begin}\n"))
        .ok_or(TableError::Marker(begin))?;
    let inside = at + begin.len() + 1;
    let to = text.find(end).ok_or(TableError::Marker(end))?;
    if to < inside {
        return Err(TableError::Order);
    }
    Ok(inside..to)
}

/// `readme` with the table between [`BEGIN`] and [`END`] merged with
/// `fresh` (see [`merge`]); the rest of the file unchanged.
pub fn update_readme(readme: &str, fresh: &str) -> Result<String, TableError> {
    let span = table_span(readme)?;
    let merged = merge(&readme[span.clone()], fresh)?;
    // Blank lines around the table, so the markers stay comments of
    // their own and the table renders as one.
    Ok(format!(
        "{}\n{merged}\n{}",
        &readme[..span.start],
        &readme[span.end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "| detector | false / 10k (evals) | TTFT +5% |\n|---|---|---|";

    fn table(preamble: &str, level: &str, traces: &[(&str, &[(&str, &str)])]) -> String {
        let mut out = format!("{preamble}\n");
        for (trace, rows) in traces {
            out.push_str(&format!(
                "\n{level} Trace `{trace}` (314 runs)\n\n{HEADER}\n"
            ));
            for (name, cells) in *rows {
                out.push_str(&format!("| {name} | {cells} |\n"));
            }
        }
        out
    }

    #[test]
    fn a_fresh_run_replaces_its_detectors_rows_and_keeps_the_others() {
        let existing = table(
            "60 trials per cell.",
            "#####",
            &[
                (
                    "bursty",
                    &[("ours", "0.0 (10) | 1%"), ("HUD", "9.0 (10) | 50%")],
                ),
                (
                    "idle",
                    &[("ours", "0.0 (10) | 2%"), ("HUD", "8.0 (10) | 40%")],
                ),
            ],
        );
        // Only our row measured again, on one trace, with a new detector.
        let fresh = table(
            "60 trials per cell.",
            "####",
            &[(
                "idle",
                &[("ours", "1.0 (20) | 7%"), ("oracle", "0.0 (20) | 9%")],
            )],
        );
        let merged = merge(&existing, &fresh).unwrap();
        assert_eq!(
            merged,
            table(
                "60 trials per cell.",
                "#####",
                &[
                    (
                        "bursty",
                        &[("ours", "0.0 (10) | 1%"), ("HUD", "9.0 (10) | 50%")]
                    ),
                    (
                        "idle",
                        &[
                            ("ours", "1.0 (20) | 7%"),
                            ("HUD", "8.0 (10) | 40%"),
                            ("oracle", "0.0 (20) | 9%")
                        ]
                    ),
                ],
            )
        );
        // Every row measured again: what a cell says is the fresh run's.
        let all = table(
            "30 trials per cell.",
            "####",
            &[
                (
                    "bursty",
                    &[("HUD", "1.0 (5) | 3%"), ("ours", "0.0 (5) | 4%")],
                ),
                ("idle", &[("ours", "0.0 (5) | 5%"), ("HUD", "2.0 (5) | 6%")]),
            ],
        );
        let merged = merge(&existing, &all).unwrap();
        assert!(
            merged.starts_with("30 trials per cell.\n\n##### Trace `bursty`"),
            "{merged}"
        );
        assert!(
            merged.contains("| ours | 0.0 (5) | 4% |\n| HUD | 1.0 (5) | 3% |"),
            "{merged}"
        );
        // Some rows measured otherwise than those they would sit beside.
        let fewer = fresh.replace("60 trials", "30 trials");
        assert_eq!(
            merge(&existing, &fewer),
            Err(TableError::Settings {
                fresh: "30 trials per cell.".into(),
                kept: "60 trials per cell.".into()
            })
        );
        // Some rows with other columns than those they would sit beside.
        let wider = fresh.replace(
            "| TTFT +5% |\n|---|---|---|",
            "| chance | TTFT +5% |\n|---|---|---|---|",
        );
        assert_eq!(
            merge(&existing, &wider),
            Err(TableError::Columns {
                fresh: "| detector | false / 10k (evals) | chance | TTFT +5% |".into(),
                kept: "| detector | false / 10k (evals) | TTFT +5% |".into()
            })
        );
        // Prose between the tables would be lost by a rewrite: refused.
        let with_note = existing.replace("\n##### Trace `idle`", "A note.\n\n##### Trace `idle`");
        assert_eq!(
            merge(&with_note, &fresh),
            Err(TableError::Stray("A note.".into()))
        );
        // Merging a table with itself changes nothing.
        assert_eq!(merge(&existing, &existing).unwrap(), existing);
    }

    /// The repository's README holds its table in the form the command
    /// writes: rewriting it with its own rows changes nothing.
    #[test]
    fn the_projects_readme_table_is_one_the_command_can_rewrite() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let span = table_span(&readme).unwrap();
        let own = parse(&readme[span.clone()]).unwrap();
        assert_eq!(own.traces.len(), 5, "{:?}", own.traces);
        assert!(own.traces.iter().all(|t| t.rows.len() == 11));
        assert_eq!(update_readme(&readme, &readme[span]).unwrap(), readme);
    }

    #[test]
    fn the_readme_is_rewritten_between_its_markers_only() {
        let old = table(
            "60 trials.",
            "#####",
            &[("idle", &[("ours", "0.0 (10) | 2%")])],
        );
        let readme = format!("# Title\n\nBefore.\n\n{BEGIN}\n{old}{END}\n\nAfter.\n");
        let fresh = table(
            "60 trials.",
            "####",
            &[("idle", &[("ours", "3.0 (10) | 9%")])],
        );
        let updated = update_readme(&readme, &fresh).unwrap();
        let want = table(
            "60 trials.",
            "#####",
            &[("idle", &[("ours", "3.0 (10) | 9%")])],
        );
        assert_eq!(
            updated,
            format!("# Title\n\nBefore.\n\n{BEGIN}\n\n{want}\n{END}\n\nAfter.\n")
        );
        // Idempotent: a second run with the same rows changes nothing.
        assert_eq!(update_readme(&updated, &fresh).unwrap(), updated);
        assert_eq!(
            update_readme("no table here", &fresh),
            Err(TableError::Marker(BEGIN))
        );
        assert_eq!(
            update_readme(&format!("{END}\n{BEGIN}\n"), &fresh),
            Err(TableError::Order)
        );
    }
}
