//! The detector told a build's history: slow spells, long memory and heavy
//! tails widen what a slower stretch must show before it is a regression.

use super::*;

#[test]
fn a_build_whose_history_holds_slow_spells_needs_more_than_a_spell_to_regress() {
    let mut rng = StdRng::seed_from_u64(11);
    let cfg = DetectorSettings::default();
    let baseline = runs(&mut rng, 30, 1.0);
    // Six runs 40% slower on TTFT: a step, or one more of the spells below.
    let candidate: Vec<RunPoint> = runs(&mut rng, 6, 1.0)
        .into_iter()
        .chain(runs(&mut rng, 6, 1.4))
        .collect();
    let steady = runs(&mut rng, 120, 1.0);
    let mut spelled = Vec::new();
    for _ in 0..6 {
        spelled.extend(runs(&mut rng, 14, 1.0));
        spelled.extend(runs(&mut rng, 6, 1.5));
    }
    let ttft = |e: &Evaluation| e.metric("ttft_p50").cloned().unwrap();
    let alone = evaluate(&baseline, &candidate, &cfg);
    let with_steady = evaluate_with_noise(&baseline, &candidate, &steady, &cfg);
    let with_spells = evaluate_with_noise(&baseline, &candidate, &spelled, &cfg);
    // A steady history changes nothing; a spelled one widens the interval
    // around the same change and keeps it from flagging.
    assert!(ttft(&alone).flagged && ttft(&with_steady).flagged);
    assert_eq!(ttft(&alone).runs, 6, "{:?}", ttft(&alone));
    assert!(ttft(&with_spells).ci_low < ttft(&alone).ci_low);
    assert!(!ttft(&with_spells).flagged, "{:?}", ttft(&with_spells));
    assert!(ttft(&with_spells).p_value > 100.0 * ttft(&alone).p_value);
}

#[test]
fn a_young_history_takes_long_stretches_to_stray_as_long_memory_runs_do() {
    let mut rng = StdRng::seed_from_u64(12);
    let independent = DetectorSettings::default();
    let long_memory = DetectorSettings {
        hurst: 0.75,
        ..DetectorSettings::default()
    };
    let baseline = runs(&mut rng, 30, 1.0);
    // 24 runs 12% slower on TTFT: a step, or as a long-memory machine's
    // stretch of 24 runs may stray (2.2 times as far as independent runs).
    let stretch = runs(&mut rng, 24, 1.12);
    let ttft = |cfg: &DetectorSettings, candidate: &[RunPoint]| {
        evaluate(&baseline, candidate, cfg)
            .metric("ttft_p50")
            .cloned()
            .unwrap()
    };
    let (told, assumed) = (ttft(&independent, &stretch), ttft(&long_memory, &stretch));
    assert!(told.flagged, "{told:?}");
    assert!(!assumed.flagged, "{assumed:?}");
    assert!(assumed.ci_low < told.ci_low && assumed.ci_high > told.ci_high);
    assert!((assumed.relative_change - told.relative_change).abs() < 1e-12);
    // Not flagged, and the verdict says why in one sentence.
    let reason = evaluate(&baseline, &stretch, &long_memory).reason;
    assert!(
        reason.starts_with("slower within the noise, not a regression: ttft_p50 +"),
        "{reason}"
    );
    // Unchanged runs: no regression (they may stray past the 5% threshold
    // on some metric, and are then "within the noise").
    let same = evaluate(&baseline, &runs(&mut rng, 24, 1.0), &long_memory);
    assert!(
        same.state == State::Ok && !same.flagged(),
        "{:?}: {}",
        same.state,
        same.reason
    );
    // A step no spell comes near is still flagged.
    let doubled = runs(&mut rng, 24, 2.0);
    assert!(ttft(&long_memory, &doubled).flagged);
    // Four runs stray less than 24 do: the assumption widens them less.
    // (Each whole candidate, no shorter spans, so both sides compare the
    // same runs.)
    let widening = |k: usize| {
        let candidate = runs(&mut StdRng::seed_from_u64(13), k, 1.0);
        let span = |cfg: &DetectorSettings| {
            let whole = DetectorSettings {
                scan_min_runs: 0,
                ..cfg.clone()
            };
            let m = ttft(&whole, &candidate);
            assert_eq!(m.runs, k);
            m.ci_high - m.ci_low
        };
        span(&long_memory) / span(&independent)
    };
    assert!(
        widening(4) < widening(24),
        "{} {}",
        widening(4),
        widening(24)
    );
}

/// The p-value of TTFT p50 in the evaluation of `candidate` against
/// `baseline`, told `history`.
fn ttft_p50_p_value(
    baseline: &[RunPoint],
    candidate: &[RunPoint],
    history: &[RunPoint],
    cfg: &DetectorSettings,
) -> f64 {
    evaluate_with_noise(baseline, candidate, history, cfg)
        .metric("ttft_p50")
        .map(|m| m.p_value)
        .expect("TTFT p50 is evaluated")
}

/// `heavy_tails` reaches the verdict: against a history whose rare slow
/// spells make its short stretches heavy-tailed, the same slower runs
/// are less surprising with it than without.
#[test]
fn a_history_with_rare_far_spells_makes_a_step_less_surprising_with_heavy_tails() {
    let mut rng = StdRng::seed_from_u64(11);
    let baseline = runs(&mut rng, 30, 1.0);
    let history: Vec<RunPoint> = (0..250)
        .map(|i| {
            let spell = (60..66).contains(&i) || (180..186).contains(&i);
            run(&mut rng, if spell { 2.0 } else { 1.0 }, 0.0)
        })
        .collect();
    let candidate = runs(&mut rng, 12, 1.6);
    let ttft_p = |heavy_tails: bool| {
        let cfg = DetectorSettings {
            heavy_tails,
            ..DetectorSettings::default()
        };
        ttft_p50_p_value(&baseline, &candidate, &history, &cfg)
    };
    let (gaussian, heavy) = (ttft_p(false), ttft_p(true));
    assert!(heavy > 3.0 * gaussian, "{gaussian:e} {heavy:e}");
}

/// A settled history that has not met a spell: the same slow stretch is
/// far less surprising with tails assumed as heavy as t with 6 degrees of
/// freedom, and a comparison's assumed tails are the heavier of its own
/// and the detector's.
#[test]
fn assumed_heavy_tails_make_a_spell_the_history_has_not_met_less_surprising() {
    let mut rng = StdRng::seed_from_u64(12);
    let baseline = runs(&mut rng, 30, 1.0);
    let history = runs(&mut rng, 250, 1.0);
    let candidate = runs(&mut rng, 10, 1.5);
    let ttft_p = |tail_df: f64| {
        let cfg = DetectorSettings {
            tail_df,
            ..DetectorSettings::default()
        };
        ttft_p50_p_value(&baseline, &candidate, &history, &cfg)
    };
    let (gaussian, heavy) = (ttft_p(f64::INFINITY), ttft_p(6.0));
    assert!(heavy > 100.0 * gaussian, "{gaussian:e} {heavy:e}");
    let settled = policy::Comparison {
        tail_df: 6.0,
        ..Default::default()
    };
    let with = |tail_df: f64| DetectorSettings {
        tail_df,
        ..DetectorSettings::default()
    };
    assert_eq!(settled.settings(&with(f64::INFINITY)).tail_df, 6.0);
    assert_eq!(settled.settings(&with(4.0)).tail_df, 4.0);
    let none = policy::Comparison::default();
    assert_eq!(none.settings(&with(f64::INFINITY)).tail_df, f64::INFINITY);
}
