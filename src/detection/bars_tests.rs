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
fn fishers_test_says_when_one_row_catches_more() {
    assert!((ahead_p(5.0 / 60.0, 60, 0.0, 60) - 0.028_657).abs() < 1e-5);
    assert!(ahead_p(0.22, 60, 0.08, 60) <= AHEAD_P); // 13 against 5
    assert!(ahead_p(0.03, 60, 0.0, 60) > AHEAD_P); // 2 against none
    assert_eq!(ahead_p(0.0, 60, 0.0, 60), 1.0);
    // The table's shares are rounded: 2% of 60 is one trial.
    assert_eq!(ahead_p(0.02, 60, 0.0, 60), ahead_p(1.0 / 60.0, 60, 0.0, 60));
}

#[test]
fn a_step_bar_is_met_missed_or_beyond_the_limit() {
    let c = |within_3, within_10, delay| Catches {
        within_3,
        within_10,
        median_delay: delay,
    };
    let trials = (60, 60);
    let met = step_bar(
        0.95,
        c(0.97, 1.0, Some(2.0)),
        c(1.0, 1.0, Some(1.0)),
        trials,
    );
    assert_eq!(met.0, Outcome::Met);
    // The limit reaches the bar, so a verdict below it misses it.
    let missed = step_bar(0.95, c(0.5, 1.0, Some(3.0)), c(1.0, 1.0, Some(1.0)), trials);
    assert_eq!(missed.0, Outcome::NotMet);
    // The limit catches under half within 10: no delay to compare.
    let beyond = step_bar(
        0.95,
        c(0.0, 0.02, Some(9.0)),
        c(0.0, 0.2, Some(6.0)),
        trials,
    );
    assert_eq!(beyond.0, Outcome::BeyondTheLimit, "{}", beyond.1);
    assert!(beyond.1.contains("no delay"), "{}", beyond.1);
    // Within 1.5x the limit's delay, catching as many within 10.
    let limit = c(0.2, 0.8, Some(4.0));
    assert_eq!(
        step_bar(0.9, c(0.0, 0.8, Some(6.0)), limit, trials).0,
        Outcome::Met
    );
    assert_eq!(
        step_bar(0.9, c(0.0, 0.8, Some(7.0)), limit, trials).0,
        Outcome::NotMet
    );
    // As soon, but catching far fewer: not within the fallback.
    assert_eq!(
        step_bar(0.9, c(0.0, 0.3, Some(5.0)), limit, trials).0,
        Outcome::NotMet
    );
}

#[test]
fn a_field_rule_ahead_counts_only_beyond_its_chance_and_within_the_limit() {
    let row = ["0% / 0% / -", "0% / 0% / -", "0% / 10% / 8"];
    // HUD catches +50% within 10 where the limit does too: not met.
    let limit = ["0% / 0% / -", "0% / 0% / -", "60% / 100% / 3"];
    let rule = ["0% / 0% / -", "0% / 0% / -", "90% / 100% / 2"];
    let b = bars(&table("idle", &row, &limit, &rule, "30% / 40%")).unwrap();
    assert_eq!(b.against_the_field.not_met, 2, "{}", b.markdown);
    assert!(
        b.markdown
            .contains("both +50% within 10 100% against 10% (the limit 100%)"),
        "{}",
        b.markdown
    );
    // Where the limit catches none, HUD's catches are bought with its
    // false alarms: beyond the limit, for both verdicts.
    let blind = ["0% / 0% / -", "0% / 0% / -", "0% / 0% / -"];
    let b = bars(&table("idle", &row, &blind, &rule, "30% / 40%")).unwrap();
    assert_eq!(b.against_the_field.beyond_the_limit, 2, "{}", b.markdown);
    // A rule that alarms near 95% of untouched runs sees nothing at
    // 100%: level with ours.
    let b = bars(&table("idle", &row, &limit, &rule, "92% / 95%")).unwrap();
    assert_eq!(b.against_the_field.not_met, 0, "{}", b.markdown);
    // Its false regressions are the other axis, met here by ours.
    assert_eq!(b.against_the_field.met, 4, "{}", b.markdown);
    assert_eq!(b.false_regressions.met, 2);
    // The step bar: 95% on `idle`, and beyond a limit that misses it.
    assert_eq!(b.step.beyond_the_limit, 4, "{}", b.markdown);
    assert!(
        b.markdown
            .contains("TTFT +10% within 3 evaluations in 95% of trials")
    );
    assert_eq!(step_target("waves"), 0.90);
}

#[test]
fn false_regressions_need_none_in_10000_evaluations() {
    let row = |false_cell: &str| Row {
        name: "ours".into(),
        false_per_10k: parse_false(false_cell).unwrap().0,
        evaluations: parse_false(false_cell).unwrap().1,
        trials: 60,
        chance: (0.0, 0.0),
        untouched_series: 230,
        cells: Vec::new(),
    };
    let limit = row("0.7 (13800)");
    assert_eq!(false_bar(&row("0.0 (13800)"), &limit).0, Outcome::Met);
    let few = false_bar(&row("0.0 (960)"), &limit);
    assert_eq!(few.0, Outcome::NotMet);
    assert!(few.1.contains("fewer than 10,000"), "{}", few.1);
    assert_eq!(false_bar(&row("0.7 (13800)"), &limit).0, Outcome::NotMet);
}

#[test]
fn a_table_that_does_not_say_what_it_rests_on_is_refused() {
    let row = ["0% / 0% / -"; 3];
    let text = table("idle", &row, &row, &row, "0% / 0%").replace("60 trials per cell", "many");
    assert_eq!(bars(&text).unwrap_err(), BarsError::Trials);
    let text = table("idle", &row, &row, &row, "0% / 0%").replace("0.0 (10350)", "none");
    assert!(matches!(bars(&text), Err(BarsError::Cell { .. })));
    let text = table("idle", &row, &row, &row, "0% / 0%")
        .replace(Detector::OracleAfterWarmup.name(), "another");
    assert!(matches!(bars(&text), Err(BarsError::Row { .. })));
}

/// The README's bars are the ones its table gives: a table refreshed
/// without its bars, or bars edited by hand, fail here.
#[test]
fn the_projects_readme_bars_are_those_its_table_gives() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    assert_eq!(update_readme(&readme).unwrap(), readme);
}
