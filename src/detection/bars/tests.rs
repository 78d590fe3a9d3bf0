//! Tests of the bars read off a detection table.

use super::*;

const PREAMBLE: &str = "Each cell: caught within 3 evaluations / within 10 / median delay. \
60 trials per cell for the in-process detectors, 8 for Otava and E-Divisive; false regressions \
per 10,000 evaluations of untouched series (230 series of 60 evaluations), and how often those \
series alarm within 3 and 10 evaluations of a run.";

/// One trace's table with a field rule, `ours` and `limit` rows (the
/// same for both verdicts and both limits), and the columns named.
fn one_trace(trace: &str, columns: &[&str], rows: &[(&str, &str, &str, &[&str])]) -> String {
    let mut t = format!("{PREAMBLE}\n\n#### Trace `{trace}` (314 runs)\n\n");
    t += &format!(
        "| detector | false / 10k (evals) | untouched: alarm within 3 / 10 | {} |\n|{}\n",
        columns.join(" | "),
        "---|".repeat(columns.len() + 3)
    );
    for (name, false_cell, chance, cells) in rows {
        t += &format!(
            "| {name} | {false_cell} | {chance} | {} |\n",
            cells.join(" | ")
        );
    }
    t
}

fn table(trace: &str, ours: &[&str], limit: &[&str], rule: &[&str], rule_chance: &str) -> String {
    let columns = ["TTFT +10%", "TPOT +10%", "both +50%"];
    one_trace(
        trace,
        &columns,
        &[
            (Detector::OursUpgrade.name(), "0.0 (10350)", "0% / 0%", ours),
            (
                Detector::OursSameBuild.name(),
                "0.0 (13800)",
                "0% / 0%",
                ours,
            ),
            (Detector::Hud.name(), "1274.6 (13800)", rule_chance, rule),
            (Detector::Oracle.name(), "0.7 (13800)", "0% / 0%", limit),
            (
                Detector::OracleAfterWarmup.name(),
                "0.0 (13800)",
                "0% / 0%",
                limit,
            ),
        ],
    )
}

#[test]
fn a_row_is_ahead_when_fishers_test_says_so_on_the_tables_shares() {
    assert!(ahead(5.0 / 60.0, 60, 0.0, 60)); // p 0.029
    assert!(ahead(0.22, 60, 0.08, 60)); // 13 against 5: p 0.036
    assert!(!ahead(0.20, 60, 0.10, 60)); // 12 against 6: p 0.10
    assert!(!ahead(0.03, 60, 0.0, 60)); // 2 against none
    assert!(!ahead(0.0, 60, 0.0, 60));
    // The table's shares are whole percents: 2% of 60 is one trial.
    assert_eq!(ahead(0.02, 60, 0.0, 60), ahead(1.0 / 60.0, 60, 0.0, 60));
}

/// The bars of `table(...)` on `idle`, for rows whose cells are the same
/// for both verdicts.
fn idle_bars(ours: &[&str], limit: &[&str], rule: &[&str], rule_chance: &str) -> Bars {
    let text = table("idle", ours, limit, rule, rule_chance);
    bars(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_step_bar_is_met_missed_or_beyond_the_limit() {
    let quiet_rule = ["0% / 0% / -"; 3];
    let step = |ours: &str, limit: &str| {
        let b = idle_bars(
            &[ours, ours, "0% / 0% / -"],
            &[limit, limit, "0% / 0% / -"],
            &quiet_rule,
            "0% / 0%",
        );
        (b.step.clone(), b.markdown)
    };
    let tally = |met, beyond_the_limit, not_met| Tally {
        met,
        beyond_the_limit,
        not_met,
    };
    // Both changes, both verdicts: four outcomes each time.
    assert_eq!(step("97% / 100% / 2", "100% / 100% / 1").0, tally(4, 0, 0));
    // The limit reaches the bar, so a verdict below it misses it.
    assert_eq!(step("50% / 100% / 3", "100% / 100% / 1").0, tally(0, 0, 4));
    // The limit catches under half within 10: no delay to compare.
    let (beyond, text) = step("0% / 2% / 9", "0% / 20% / 6");
    assert_eq!(beyond, tally(0, 4, 0), "{text}");
    assert!(text.contains("under half: no delay of its"), "{text}");
    // Within 1.5x the limit's delay, catching as many within 10.
    assert_eq!(step("0% / 80% / 6", "20% / 80% / 4").0, tally(4, 0, 0));
    assert_eq!(step("0% / 80% / 7", "20% / 80% / 4").0, tally(0, 0, 4));
    // As soon, but catching far fewer: not within the fallback.
    assert_eq!(step("0% / 30% / 5", "20% / 80% / 4").0, tally(0, 0, 4));
    assert_eq!(step_target("idle"), 0.95);
    assert_eq!(step_target("waves"), 0.90);
}

#[test]
fn a_field_rule_ahead_counts_only_beyond_its_chance_and_within_the_limit() {
    let ours = ["0% / 0% / -", "0% / 0% / -", "0% / 10% / 8"];
    // HUD catches +50% within 10 where the limit does too: not met.
    let limit = ["0% / 0% / -", "0% / 0% / -", "60% / 100% / 3"];
    let rule = ["0% / 0% / -", "0% / 0% / -", "90% / 100% / 2"];
    let b = idle_bars(&ours, &limit, &rule, "30% / 40%");
    assert_eq!(b.catches_against_the_field.not_met, 2, "{}", b.markdown);
    assert!(
        b.markdown
            .contains("both +50% within 10 100% against 10% (the limit 100%)"),
        "{}",
        b.markdown
    );
    // Where the limit catches none, HUD's catches come from its false
    // alarms: beyond the limit, for both verdicts.
    let blind = ["0% / 0% / -"; 3];
    let b = idle_bars(&ours, &blind, &rule, "30% / 40%");
    assert_eq!(
        b.catches_against_the_field.beyond_the_limit, 2,
        "{}",
        b.markdown
    );
    // A rule that alarms near 95% of untouched runs sees nothing at
    // 100%: level with ours.
    let b = idle_bars(&ours, &limit, &rule, "92% / 95%");
    assert_eq!(b.catches_against_the_field.met, 2, "{}", b.markdown);
    // Its false regressions are the other axis, met here by ours.
    assert_eq!(b.fewer_false_than_the_field.met, 2, "{}", b.markdown);
    assert_eq!(b.false_regressions.met, 2);
    assert!(
        b.markdown
            .contains("TTFT +10% within 3 evaluations in 95% of trials")
    );
}

#[test]
fn a_rule_ahead_of_the_limit_without_more_false_alarms_is_not_met() {
    // A rule as quiet as the limit that catches more than it: the limit
    // is no excuse, and no false alarm bought those catches.
    let text = table(
        "idle",
        &["0% / 0% / -"; 3],
        &["0% / 0% / -"; 3],
        &["0% / 0% / -", "0% / 0% / -", "90% / 100% / 2"],
        "0% / 0%",
    )
    .replace("1274.6 (13800)", "0.0 (13800)");
    let b = bars(&text).unwrap();
    assert_eq!(b.catches_against_the_field.not_met, 2, "{}", b.markdown);
}

#[test]
fn false_regressions_need_none_in_10000_evaluations() {
    let row = |false_per_10k, evaluations| read::Row {
        name: "ours".into(),
        false_per_10k,
        evaluations,
        trials: 60,
        chance: read::Chance {
            within_3: 0.0,
            within_10: 0.0,
            series: 230,
        },
        cells: Vec::new(),
    };
    let limit = row(0.7, 13_800);
    assert_eq!(false_bar(&row(0.0, 13_800), &limit).0, Outcome::Met);
    let few = false_bar(&row(0.0, 960), &limit);
    assert_eq!(few.0, Outcome::NotMet);
    assert!(few.1.contains("fewer than 10,000"), "{}", few.1);
    assert_eq!(false_bar(&row(0.7, 13_800), &limit).0, Outcome::NotMet);
}

#[test]
fn a_table_not_of_the_tables_form_is_refused_not_read_askew() {
    let row = ["0% / 0% / -"; 3];
    let good = table("idle", &row, &row, &row, "0% / 0%");
    assert!(bars(&good).is_ok());
    let refused = |from: &str, to: &str| bars(&good.replace(from, to)).unwrap_err();
    assert_eq!(refused("60 trials per cell", "many"), BarsError::Trials);
    assert!(matches!(
        refused("0.0 (10350)", "none"),
        BarsError::Cell { .. }
    ));
    // A row the benchmark does not run (a name mistyped) is refused, not
    // read as an external rule's; one the bars need, missing, is named.
    assert!(matches!(
        refused(Detector::OracleAfterWarmup.name(), "another"),
        BarsError::Unknown { .. }
    ));
    let limit = format!("| {}", Detector::OracleAfterWarmup.name());
    let without: String = good
        .lines()
        .filter(|l| !l.starts_with(&limit))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(matches!(bars(&without), Err(BarsError::Row { .. })));
    let external = good.replace(Detector::Hud.name(), crate::detection::rules::EXTERNAL[0].1);
    assert!(bars(&external).is_ok());
    // Another horizon's table: its cells mean something else.
    assert!(matches!(
        refused("within 10 / median delay", "within 30 / median delay"),
        BarsError::Form(_)
    ));
    assert!(matches!(
        refused("0% / 0% / - |\n", "0% / 0% / - / 12 |\n"),
        BarsError::Cell { .. }
    ));
    // A short row, or one twice.
    let short = good.replacen(
        "| 0% / 0% / - | 0% / 0% / - | 0% / 0% / - |",
        "| 0% / 0% / - |",
        1,
    );
    assert!(
        matches!(bars(&short), Err(BarsError::Cell { .. })),
        "{short}"
    );
    let hud = good
        .lines()
        .find(|l| l.starts_with(&format!("| {}", Detector::Hud.name())))
        .unwrap();
    let twice = good.replace(hud, &format!("{hud}\n{hud}"));
    assert!(matches!(bars(&twice), Err(BarsError::Twice { .. })));
    assert!(matches!(
        refused("untouched: alarm", "chance"),
        BarsError::Columns { .. }
    ));
}

/// The README's bars are the ones its table gives: a table refreshed
/// without its bars, or bars edited by hand, fail here.
#[test]
fn the_projects_readme_bars_are_those_its_table_gives() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let span = bars_span(&readme).unwrap();
    let fresh = update_readme(&readme).unwrap();
    assert!(
        fresh == readme,
        "README.md's bars are not those its table gives: `cargo bench --bench detection -- --bars --readme README.md` writes them; they would be:\n{}",
        &fresh[span.start..]
    );
}

#[test]
fn the_oracle_at_no_false_regression_is_the_limit_where_the_table_has_it() {
    let ours = ["0% / 0% / -", "0% / 0% / -", "0% / 10% / 8"];
    let limit = ["0% / 0% / -", "0% / 0% / -", "60% / 100% / 3"];
    let rule = ["0% / 0% / -", "0% / 0% / -", "90% / 100% / 2"];
    let text = table("idle", &ours, &limit, &rule, "30% / 40%");
    assert_eq!(bars(&text).unwrap().catches_against_the_field.not_met, 2);
    // Held to no false regression, the oracle catches none of the step:
    // the rule's catches are then beyond the limit.
    let quiet = [Detector::OracleQuiet, Detector::OracleAfterWarmupQuiet]
        .map(|d| {
            format!(
                "| {} | 0.0 (13800) | 0% / 0% | 0% / 0% / - | 0% / 0% / - | 0% / 0% / - |",
                d.name()
            )
        })
        .join("\n");
    let b = bars(&format!("{text}{quiet}\n")).unwrap();
    assert_eq!(
        b.catches_against_the_field.beyond_the_limit, 2,
        "{}",
        b.markdown
    );
}
