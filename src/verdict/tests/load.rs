//! The detector and server load: runs measured under other loads than
//! the baseline's are refused, or compared at the baseline's load when the
//! history shows how load matters.

use super::*;

#[test]
fn a_slowdown_measured_under_far_more_load_is_inconclusive() {
    let mut rng = StdRng::seed_from_u64(3);
    let cfg = DetectorSettings::default();
    let baseline: Vec<RunPoint> = (0..30).map(|_| run(&mut rng, 1.0, 2.0)).collect();
    let busy: Vec<RunPoint> = (0..12)
        .map(|i| run(&mut rng, 1.3, 40.0 + i as f64))
        .collect();
    let e = evaluate(&baseline, &busy, &cfg);
    assert_eq!(e.state, State::Inconclusive, "{}", e.reason);
    assert!(e.reason.contains("server load differs"), "{}", e.reason);
    assert_eq!(confirm(&e, &[true, true, true], &cfg), State::Inconclusive);
    // The same slowdown at the same load is judged.
    let calm: Vec<RunPoint> = (0..12).map(|_| run(&mut rng, 1.3, 2.0)).collect();
    assert_ne!(evaluate(&baseline, &calm, &cfg).state, State::Inconclusive);
}

#[test]
fn with_a_history_that_shows_how_load_matters_runs_under_more_load_are_judged_at_the_baselines() {
    // TTFT rises 10% per running+waiting request; the history saw loads
    // 0 to 8, the baseline ran at 1.
    let mut rng = StdRng::seed_from_u64(5);
    let at = |rng: &mut StdRng, load: f64, slower: f64| run(rng, slower * 1.1_f64.powf(load), load);
    let history: Vec<RunPoint> = (0..200)
        .map(|i| at(&mut rng, (i % 9) as f64, 1.0))
        .collect();
    let baseline: Vec<RunPoint> = (0..30).map(|_| at(&mut rng, 1.0, 1.0)).collect();
    let busy = |rng: &mut StdRng, load: f64, slower: f64| -> Vec<RunPoint> {
        (0..12).map(|_| at(rng, load, slower)).collect()
    };
    let cfg = DetectorSettings::default();
    let refusing = DetectorSettings {
        load_covariate: false,
        ..cfg.clone()
    };

    // Unchanged, at load 6 (TTFT x1.77): refused without the covariate,
    // within the noise with it, saying at what load it was compared.
    let unchanged = busy(&mut rng, 6.0, 1.0);
    let e = evaluate_with_noise(&baseline, &unchanged, &history, &refusing);
    assert_eq!(e.state, State::Inconclusive, "{}", e.reason);
    let e = evaluate_with_noise(&baseline, &unchanged, &history, &cfg);
    assert_eq!(e.state, State::Ok, "{}", e.reason);
    assert!(!e.flagged(), "{}", e.reason);
    assert!(
        e.reason.contains(
            "compared at the baseline's server load, 1.0 running+waiting; the candidate ran at 6.0"
        ),
        "{}",
        e.reason
    );
    let ttft = e.metric("ttft_p50").unwrap();
    assert!(ttft.relative_change.abs() < 0.1, "{ttft:?}");

    // A real +40% at load 6 is a regression of about +40%, not +148%.
    let e = evaluate_with_noise(&baseline, &busy(&mut rng, 6.0, 1.4), &history, &cfg);
    assert!(
        e.flagged() && e.reason.starts_with("slower: ttft_p50"),
        "{}",
        e.reason
    );
    let ttft = e.metric("ttft_p50").unwrap();
    assert!((0.25..0.6).contains(&ttft.relative_change), "{ttft:?}");
    // Far beyond the noise, but across loads it rests on the fitted rise
    // with load: never a regression at once. At the baseline's own load
    // the same slowdown is.
    assert!(ttft.p_adjusted <= cfg.decisive_q, "{ttft:?}");
    assert_eq!(e.decisive, None);
    assert_eq!(confirm(&e, &[false, false], &cfg), State::Confirming);
    let e = evaluate_with_noise(&baseline, &busy(&mut rng, 1.0, 1.4), &history, &cfg);
    assert!(e.decisive.is_some(), "{e:?}");
    assert_eq!(confirm(&e, &[false, false], &cfg), State::Regression);

    // Beyond the loads the history covers nothing is extrapolated.
    let e = evaluate_with_noise(&baseline, &busy(&mut rng, 20.0, 1.0), &history, &cfg);
    assert_eq!(e.state, State::Inconclusive, "{}", e.reason);
    assert!(e.reason.contains("server load differs"), "{}", e.reason);

    // Runs without a load are left out, not taken as run at the
    // baseline's: half the candidate's, unchanged at load 6.
    let mut half_unknown = busy(&mut rng, 6.0, 1.0);
    for run in half_unknown.iter_mut().step_by(2) {
        run.load = None;
    }
    let e = evaluate_with_noise(&baseline, &half_unknown, &history, &cfg);
    assert!(!e.flagged(), "{}", e.reason);

    // A metric the history cannot give a slope (it never had TTFT) is
    // compared as measured, so the load check stands for the evaluation.
    let without_ttft: Vec<RunPoint> = history
        .iter()
        .map(|r| RunPoint {
            values: r
                .values
                .iter()
                .filter(|(m, _)| !m.starts_with("ttft"))
                .cloned()
                .collect(),
            load: r.load,
        })
        .collect();
    let e = evaluate_with_noise(&baseline, &busy(&mut rng, 6.0, 1.0), &without_ttft, &cfg);
    assert_eq!(e.state, State::Inconclusive, "{}", e.reason);
    assert!(e.reason.contains("server load differs"), "{}", e.reason);
}

#[test]
fn a_few_runs_all_beyond_a_short_baselines_loads_are_refused() {
    let mut rng = StdRng::seed_from_u64(9);
    // An upgrade's few runs against a short baseline.
    let cfg = DetectorSettings {
        min_candidate_runs: 2,
        min_baseline_runs: 12,
        ..DetectorSettings::default()
    };
    // 12 baseline runs at loads 5.0-6.1, 2 candidate runs 30% slower at
    // 16: no KS test can tell 2 runs from 12 at 0.01 (best p = 1/91).
    let baseline: Vec<RunPoint> = (0..12)
        .map(|i| run(&mut rng, 1.0, 5.0 + 0.1 * i as f64))
        .collect();
    let busy: Vec<RunPoint> = (0..2).map(|_| run(&mut rng, 1.3, 16.0)).collect();
    let e = evaluate(&baseline, &busy, &cfg);
    assert_eq!(e.state, State::Inconclusive, "{}", e.reason);
    assert!(
        e.reason
            .contains("all 2 candidate runs outside the baseline's 5.0-6.1"),
        "{}",
        e.reason
    );
    // Under less load than any baseline run: refused the same way.
    let idle: Vec<RunPoint> = (0..2).map(|_| run(&mut rng, 1.3, 1.0)).collect();
    let e = evaluate(&baseline, &idle, &cfg);
    assert!(e.reason.contains("server load differs"), "{}", e.reason);
    // One of them within the baseline's loads widened by
    // `load_min_difference` (1): not refused by that rule, and too few
    // for KS, so judged.
    let mixed = vec![run(&mut rng, 1.3, 6.9), run(&mut rng, 1.3, 16.0)];
    let e = evaluate(&baseline, &mixed, &cfg);
    assert_eq!(e.state, State::Ok, "{}", e.reason);
}

#[test]
fn a_phase_against_the_other_is_compared_at_the_baselines_load_as_its_phases_are() {
    // TTFT rises 10% per running+waiting request (queueing), TPOT does
    // not; the baseline ran at load 6, the candidate at load 1, with TPOT
    // 6% slower. As measured, TPOT over TTFT is 1.06 / 0.62 of the
    // baseline's, +71%, which would name a phase 6% slower 71% slower
    // against the other (and flag it where TPOT's own 6% is within its
    // noise); put at the baseline's load as its phases are, +6%.
    let mut rng = StdRng::seed_from_u64(21);
    let at = |rng: &mut StdRng, load: f64, tpot: f64| {
        let mut point = run(rng, 1.1_f64.powf(load), load);
        for (metric, value) in point.values.iter_mut() {
            if metric.starts_with("tpot") {
                *value *= tpot;
            }
        }
        phases::add_ratios(&mut point);
        point
    };
    let history: Vec<RunPoint> = (0..200)
        .map(|i| at(&mut rng, (i % 9) as f64, 1.0))
        .collect();
    let baseline: Vec<RunPoint> = (0..30).map(|_| at(&mut rng, 6.0, 1.0)).collect();
    let candidate: Vec<RunPoint> = (0..12).map(|_| at(&mut rng, 1.0, 1.06)).collect();
    let cfg = DetectorSettings::default();
    let e = evaluate_with_noise(&baseline, &candidate, &history, &cfg);
    let ratio = e.metric("tpot_p50_over_ttft").unwrap();
    assert!(ratio.at_load.is_some(), "{ratio:?}");
    assert!(ratio.at_load.unwrap().per_request < 0.0, "{ratio:?}");
    let tpot = e.metric("tpot_p50").unwrap();
    assert!(
        (ratio.relative_change - tpot.relative_change).abs() < 0.04,
        "{ratio:?} against {tpot:?}"
    );
    // A real +60% on TPOT at load 1 is still flagged by its ratio, at
    // about its own size.
    let slower: Vec<RunPoint> = (0..12).map(|_| at(&mut rng, 1.0, 1.6)).collect();
    let e = evaluate_with_noise(&baseline, &slower, &history, &cfg);
    let ratio = e.metric("tpot_p50_over_ttft").unwrap();
    assert!(ratio.flagged, "{ratio:?}");
    assert!((0.35..0.9).contains(&ratio.relative_change), "{ratio:?}");
}
