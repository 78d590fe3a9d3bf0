//! A confirmed regression holds until `confirm_window` evaluations in a
//! row flag nothing.

use super::*;

#[test]
fn a_regression_holds_until_three_evaluations_in_a_row_flag_nothing() {
    let mut rng = StdRng::seed_from_u64(2);
    let cfg = DetectorSettings {
        decisive_q: 0.0,
        ..DetectorSettings::default()
    };
    let policy = policy(&cfg);
    let baseline = runs(&mut rng, 30, 1.0);
    let slower = evaluate(&baseline, &runs(&mut rng, 12, 1.3), &cfg);
    let within = evaluate(&baseline, &runs(&mut rng, 12, 1.0), &cfg);
    assert!(slower.flagged() && !within.flagged());
    let judge = |e: &Evaluation, earlier: &[bool], was_regression: bool| {
        policy.confirm(e, earlier, cfg.confirm_needed, was_regression)
    };

    // Flagged one evaluation in two: a regression from the second flag
    // on, held through the evaluations between.
    let mut flags = Vec::new();
    let mut was_regression = false;
    let mut states = Vec::new();
    for e in [&slower, &within, &slower, &within, &slower, &within] {
        let confirmed = judge(e, &flags, was_regression);
        was_regression = confirmed.state == State::Regression;
        flags.push(e.flagged());
        states.push(confirmed.state);
    }
    use State::{Confirming, Ok as Fine, Regression};
    assert_eq!(
        states,
        [
            Confirming, Fine, Regression, Regression, Regression, Regression
        ]
    );
    let held = judge(&within, &[true, false], true);
    assert!(
        held.reason.starts_with(
            "a regression until 3 evaluations in a row find nothing slower (1 of the 2 before this one did); this one: "
        ),
        "{}",
        held.reason
    );

    // Three in a row within the noise end it: the third.
    assert_eq!(judge(&within, &[true, false], true).state, Regression);
    assert_eq!(judge(&within, &[false, false], true).state, Fine);
    // Never held when it was no regression.
    assert_eq!(judge(&within, &[true, true], false).state, Fine);
    // An inconclusive evaluation (a load refused) holds it as one within
    // the noise does, and says so; it ends it as the third in a row, and
    // starts none.
    let mut inconclusive = within.clone();
    inconclusive.state = State::Inconclusive;
    inconclusive.reason = "the load differs".into();
    let held = judge(&inconclusive, &[true, false], true);
    assert_eq!(held.state, Regression);
    assert!(
        held.reason
            .ends_with("this one could not judge: the load differs"),
        "{}",
        held.reason
    );
    assert_eq!(
        judge(&inconclusive, &[false, false], true).state,
        State::Inconclusive
    );
    assert_eq!(
        judge(&inconclusive, &[true, true], false).state,
        State::Inconclusive
    );
}
