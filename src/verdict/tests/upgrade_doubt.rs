//! How far beyond the noise an upgrade's first runs must be to be a
//! regression at once (`upgrade_decisive_q`), against any other run's
//! `decisive_q`.

use super::*;

#[test]
fn an_upgrades_first_runs_are_beyond_doubt_at_their_own_level() {
    let p = VerdictPolicy::default();
    let window = p.candidate_window;
    // In an upgrade's first candidate window, told the old build's
    // history or none; anywhere else, within one build and long after
    // an upgrade, `decisive_q`.
    for judged in [
        Judged::UpgradeSettled,
        Judged::UpgradeYoung,
        Judged::UpgradeUntold,
    ] {
        for runs_since_warmup in [1, p.upgrade_min_candidate_runs, window] {
            let level = p.detector_for(judged, runs_since_warmup).decisive_q;
            assert_eq!(
                level, p.upgrade_decisive_q,
                "{judged:?} {runs_since_warmup}"
            );
        }
        let late = p.detector_for(judged, window + 1).decisive_q;
        assert_eq!(late, p.detector.decisive_q, "{judged:?}");
    }
    for judged in [Judged::UpgradeOwn, Judged::WithinBuild] {
        for runs_since_warmup in [2, window, window + 1] {
            let level = p.detector_for(judged, runs_since_warmup).decisive_q;
            assert_eq!(level, p.detector.decisive_q, "{judged:?}");
        }
    }
    // The rest is the comparison's own: an upgrade's minimum of runs.
    let at = p.detector_for(Judged::UpgradeYoung, 2);
    assert_eq!(at.min_candidate_runs, p.upgrade_min_candidate_runs);

    // An upgrade's first 2 runs 40% slower on runs that stray 5%, told a
    // young history: beyond the noise, short of `decisive_q`.
    let mut rng = StdRng::seed_from_u64(9);
    let baseline = runs(&mut rng, 30, 1.0);
    let history = runs(&mut rng, 60, 1.0);
    let slow = runs(&mut rng, 2, 1.4);
    // Its most significant flagged alerting metric: the level at which
    // it is beyond doubt.
    let any_level = DetectorSettings {
        decisive_q: p.detector.fdr_q,
        ..at.clone()
    };
    let strongest = evaluate_with_noise(&baseline, &slow, &history, &any_level)
        .decisive
        .expect("flagged beyond the noise");
    assert!(strongest > p.detector.decisive_q, "{strongest}");
    let with_level = |level: f64| VerdictPolicy {
        upgrade_decisive_q: level,
        ..p.clone()
    };
    // At or above its p-value: a regression at once, saying why.
    let at_once =
        with_level(strongest).replay(&baseline, &slow, &history, Judged::UpgradeYoung, slow.len());
    assert_eq!(at_once.state, State::Regression, "{}", at_once.reason);
    assert!(
        at_once
            .reason
            .starts_with("slower far beyond the runs' noise"),
        "{}",
        at_once.reason
    );
    // Below it, or off: the first evaluation waits for its confirmation.
    for level in [strongest / 2.0, 0.0] {
        let waits =
            with_level(level).replay(&baseline, &slow, &history, Judged::UpgradeYoung, slow.len());
        assert_eq!(waits.state, State::Confirming, "{level}: {}", waits.reason);
    }
    // The same runs long after the upgrade, its first candidate window
    // past: `decisive_q` again, whatever the upgrade's level.
    let mut long_after = runs(&mut rng, window, 1.0);
    long_after.extend(slow.iter().cloned());
    let late = with_level(p.detector.fdr_q).replay(
        &baseline,
        &long_after,
        &history,
        Judged::UpgradeSettled,
        long_after.len(),
    );
    assert_eq!(late.state, State::Confirming, "{}", late.reason);
    // Told how far past the warm-up they were, not read off the
    // candidate's length: the same 2 runs as the whole candidate of a
    // build 40 runs past its warm-up wait too.
    let counted =
        with_level(p.detector.fdr_q).replay(&baseline, &slow, &history, Judged::UpgradeYoung, 40);
    assert_eq!(counted.state, State::Confirming, "{}", counted.reason);
}

/// An upgrade's first run after its warm-up is judged alone only for a
/// slowdown beyond doubt at `upgrade_first_run_q`: far slower, a
/// regression at once; merely slower, or with the level off, too few
/// runs, as before; within one build never.
#[test]
fn an_upgrades_first_run_alone_is_a_regression_only_beyond_doubt() {
    let mut rng = StdRng::seed_from_u64(11);
    let baseline = runs(&mut rng, 30, 1.0);
    let history = runs(&mut rng, 60, 1.0);
    let policy = |level: f64| VerdictPolicy {
        upgrade_first_run_q: level,
        ..VerdictPolicy::default()
    };
    let first = |p: &VerdictPolicy, factor: f64, judged: Judged| {
        let slow = runs(&mut StdRng::seed_from_u64(3), 1, factor);
        p.replay(&baseline, &slow, &history, judged, 1)
    };
    let on = policy(1e-9);
    let doubled = first(&on, 2.0, Judged::UpgradeYoung);
    assert_eq!(doubled.state, State::Regression, "{}", doubled.reason);
    assert!(
        doubled
            .reason
            .starts_with("slower far beyond the runs' noise"),
        "{}",
        doubled.reason
    );
    // 15% slower on runs that stray 5%: beyond the noise for more runs,
    // not beyond doubt on one.
    let mild = first(&on, 1.15, Judged::UpgradeYoung);
    assert_eq!(mild.state, State::Inconclusive, "{}", mild.reason);
    assert!(mild.reason.contains("too few runs"), "{}", mild.reason);
    for (p, judged) in [
        (policy(0.0), Judged::UpgradeYoung),
        (on.clone(), Judged::WithinBuild),
        (on.clone(), Judged::UpgradeOwn),
    ] {
        let waits = first(&p, 2.0, judged);
        assert_eq!(
            waits.state,
            State::Inconclusive,
            "{judged:?}: {}",
            waits.reason
        );
    }
    // The level is handed on through the upgrade's first window (only a
    // candidate shorter than `upgrade_min_candidate_runs` asks it), not
    // past it.
    assert_eq!(on.detector_for(Judged::UpgradeYoung, 2).first_run_q, 1e-9);
    assert_eq!(on.detector_for(Judged::UpgradeYoung, 13).first_run_q, 0.0);
}
