//! The detector's statistics and verdicts on simulated runs: tests, flags,
//! confirmation, load, and false alarms and power on unchanged servers.

use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, LogNormal};

use super::policy::{Judged, VerdictPolicy};

/// The confirmation rule with these detector settings.
fn confirm(current: &Evaluation, earlier: &[bool], cfg: &DetectorSettings) -> State {
    policy(cfg)
        .confirm(current, earlier, cfg.confirm_needed, false)
        .state
}

fn policy(cfg: &DetectorSettings) -> VerdictPolicy {
    VerdictPolicy {
        detector: cfg.clone(),
        ..VerdictPolicy::default()
    }
}

#[test]
fn hodges_lehmann_matches_hand_computed_values() {
    // Differences c - b: {9,8,7, 10,9,8, 11,10,9} -> median 9.
    let (shift, low, high) = hodges_lehmann(&[1.0, 2.0, 3.0], &[10.0, 11.0, 12.0], 0.5);
    assert_eq!(shift, 9.0);
    assert!(low <= 9.0 && high >= 9.0 && low >= 7.0 && high <= 11.0);
}

#[test]
fn benjamini_hochberg_matches_hand_computed_values() {
    // p sorted: 0.01, 0.02, 0.03, 0.5 (n = 4): 0.04, 0.04, 0.04, 0.5.
    let adj = benjamini_hochberg(&[0.03, 0.5, 0.01, 0.02]);
    let want = [0.04, 0.5, 0.04, 0.04];
    for (a, w) in adj.iter().zip(want) {
        assert!((a - w).abs() < 1e-12, "{adj:?}");
    }
}

/// Noise of run-level statistics from one run to the next (log-normal
/// sigma). TTFT and E2EL statistics come from one value per request (8-50
/// per run): about 5% for medians, more for the tails. TPOT and ITL pool
/// one value per token (ITL thousands per run) and move less.
fn noise(metric: &str, stat: &str) -> f64 {
    let per_request = matches!(metric, "ttft" | "e2el");
    match (per_request, stat) {
        (true, "p50") => 0.05,
        (true, "p90") => 0.08,
        (true, _) => 0.15,
        (false, "p50") => 0.03,
        (false, "p90") => 0.04,
        (false, _) => 0.08,
    }
}

fn run(rng: &mut StdRng, ttft_factor: f64, load: f64) -> RunPoint {
    let base = [
        ("ttft", 0.120),
        ("tpot", 0.020),
        ("itl", 0.019),
        ("e2el", 1.4),
    ];
    let mut values = Vec::new();
    for (metric, level) in base {
        for stat in ["p50", "p90", "p99"] {
            let noise = LogNormal::new(0.0, noise(metric, stat))
                .unwrap()
                .sample(rng);
            let factor = if metric == "ttft" { ttft_factor } else { 1.0 };
            let scale = match stat {
                "p50" => 1.0,
                "p90" => 1.3,
                _ => 1.8,
            };
            values.push((format!("{metric}_{stat}"), level * scale * factor * noise));
        }
    }
    RunPoint {
        values,
        load: Some(load),
    }
}

fn runs(rng: &mut StdRng, n: usize, ttft_factor: f64) -> Vec<RunPoint> {
    (0..n).map(|_| run(rng, ttft_factor, 0.0)).collect()
}

#[test]
fn too_few_runs_is_inconclusive() {
    let mut rng = StdRng::seed_from_u64(1);
    let cfg = DetectorSettings::default();
    let e = evaluate(&runs(&mut rng, 30, 1.0), &runs(&mut rng, 3, 1.5), &cfg);
    assert_eq!(e.state, State::Inconclusive);
    assert!(e.reason.contains("too few runs"), "{}", e.reason);
    let e = evaluate(&runs(&mut rng, 29, 1.0), &runs(&mut rng, 12, 1.5), &cfg);
    assert_eq!(e.state, State::Inconclusive);
}

#[test]
fn a_clear_slowdown_is_flagged_with_its_size_and_an_improvement_is_not() {
    let mut rng = StdRng::seed_from_u64(2);
    // The confirmation itself: no slowdown is taken as beyond doubt.
    let cfg = DetectorSettings {
        decisive_q: 0.0,
        ..DetectorSettings::default()
    };
    let baseline = runs(&mut rng, 30, 1.0);
    let e = evaluate(&baseline, &runs(&mut rng, 12, 1.3), &cfg);
    assert!(e.flagged());
    let ttft = e.metric("ttft_p50").unwrap();
    assert!((0.2..0.4).contains(&ttft.relative_change), "{ttft:?}");
    assert!(ttft.ci_low > 0.0 && ttft.p_adjusted <= 0.001);
    let tpot = e.metric("tpot_p50").unwrap();
    assert!(!tpot.flagged);
    // Two flagged evaluations of the last three confirm it.
    assert_eq!(confirm(&e, &[true], &cfg), State::Regression);
    assert_eq!(confirm(&e, &[false, false], &cfg), State::Confirming);
    let waiting = policy(&cfg).confirm(&e, &[false, false], cfg.confirm_needed, false);
    assert!(
        waiting
            .reason
            .starts_with("slower, confirming: 1 of 2: ttft_p50 +"),
        "{}",
        waiting.reason
    );
    assert_eq!(confirm(&e, &[true, false], &cfg), State::Regression);
    assert_eq!(confirm(&e, &[true, false, false], &cfg), State::Confirming);

    let faster = evaluate(&baseline, &runs(&mut rng, 12, 0.7), &cfg);
    assert!(!faster.flagged());
    assert!(
        faster
            .metrics
            .iter()
            .any(|m| m.metric == "ttft_p50" && m.improvement)
    );
    assert_eq!(confirm(&faster, &[true, true, true], &cfg), State::Ok);
}

/// A slowdown beyond the noise waits for a second evaluation; one far
/// beyond it (`decisive_q`) is a regression at once, saying why.
#[test]
fn a_slowdown_far_beyond_the_noise_needs_no_confirmation() {
    let mut rng = StdRng::seed_from_u64(2);
    let cfg = DetectorSettings {
        decisive_q: 1e-9,
        ..DetectorSettings::default()
    };
    let (baseline, slow) = (runs(&mut rng, 30, 1.0), runs(&mut rng, 12, 1.6));
    let evaluation = evaluate(&baseline, &slow, &cfg);
    let ttft = |e: &Evaluation| e.metric("ttft_p50").unwrap().clone();
    // TTFT 60% slower over 12 runs that stray 5%: beyond any doubt.
    let p = ttft(&evaluation).p_adjusted;
    assert!(p <= cfg.decisive_q, "{p}");
    assert_eq!(evaluation.decisive, Some(p));
    let at_once = policy(&cfg).confirm(&evaluation, &[false, false], cfg.confirm_needed, false);
    assert_eq!(at_once.state, State::Regression);
    assert!(
        at_once
            .reason
            .starts_with("slower far beyond the runs' noise (p ")
            && at_once
                .reason
                .contains("beyond the runs' noise (p 8.0e-15)")
            && at_once.reason.contains(": ttft_p50 +56.4%"),
        "{}",
        at_once.reason
    );
    // Turned off, the same runs wait for a second evaluation.
    let off = DetectorSettings {
        decisive_q: 0.0,
        ..cfg.clone()
    };
    let waiting = evaluate(&baseline, &slow, &off);
    assert_eq!(waiting.decisive, None);
    assert_eq!(confirm(&waiting, &[false, false], &off), State::Confirming);
    // Beyond the noise (fdr_q) but not beyond doubt: it waits too.
    let stricter = DetectorSettings {
        decisive_q: p / 10.0,
        ..cfg.clone()
    };
    let waiting = evaluate(&baseline, &slow, &stricter);
    assert!(waiting.flagged() && waiting.decisive.is_none());
    assert_eq!(
        confirm(&waiting, &[false, false], &stricter),
        State::Confirming
    );
    assert_eq!(
        confirm(&waiting, &[true, false], &stricter),
        State::Regression
    );
    // A metric not alerting (p99) is never decisive.
    let mut p99_only: Vec<MetricResult> = evaluation.metrics.clone();
    for m in p99_only.iter_mut() {
        (m.flagged, m.p_adjusted) = (m.metric == "ttft_p99", 1e-12);
    }
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &slow, &cfg),
        None
    );
    p99_only[0].flagged = true;
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &slow, &cfg),
        Some(1e-12)
    );
    // Nor is a slowdown resting on runs measured beyond the loads the
    // baseline ran under (0 running+waiting): 3 newest runs at load 10.
    let mut busier_end = slow.clone();
    for run in busier_end.iter_mut().rev().take(3) {
        run.load = Some(10.0);
    }
    p99_only[0].runs = 3;
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &busier_end, &cfg),
        None
    );
    p99_only[0].runs = 8;
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &busier_end, &cfg),
        None
    );
    // Within the baseline's loads widened by `load_min_difference`: it is.
    for run in busier_end.iter_mut().rev().take(3) {
        run.load = Some(0.9);
    }
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &busier_end, &cfg),
        Some(1e-12)
    );
    busier_end[11].load = None;
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &busier_end, &cfg),
        None
    );
    // Beside a baseline whose loads were never read, no load is known to
    // be within them.
    let unread: Vec<RunPoint> = baseline
        .iter()
        .map(|run| RunPoint {
            load: None,
            ..run.clone()
        })
        .collect();
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&unread), &slow, &cfg),
        None
    );
    // A canary's two sides were measured in the same rounds: their load is
    // one, read or not.
    let same_rounds = DetectorSettings {
        load_min_difference: super::load_check::SAME_ROUNDS,
        ..cfg.clone()
    };
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&unread), &slow, &same_rounds),
        Some(1e-12)
    );
    // The span is the newest runs that have the metric: with the newest
    // run lacking TTFT p50, a span of 3 reaches back to the 4th newest.
    let mut lacking = slow.clone();
    lacking[11]
        .values
        .retain(|(metric, _)| metric != "ttft_p50");
    lacking[8].load = Some(10.0);
    p99_only[0].runs = 3;
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &lacking, &cfg),
        None
    );
    lacking[8].load = Some(0.0);
    assert_eq!(
        beyond_doubt(&p99_only, load_range(&baseline), &lacking, &cfg),
        Some(1e-12)
    );
}

/// The report's replay gives what the daemon gave run by run: confirming
/// while fewer than two windows flagged, then a regression.
#[test]
fn replaying_stored_runs_follows_the_daemon_rule() {
    let mut rng = StdRng::seed_from_u64(4);
    let cfg = DetectorSettings::default();
    let p = policy(&cfg);
    let baseline = runs(&mut rng, 30, 1.0);
    let slow = runs(&mut rng, 14, 1.3);
    // 2 runs (an upgrade's `upgrade_min_candidate_runs`): the first
    // window only, flagged once.
    let first = p.replay(&baseline, &slow[..2], &[], Judged::UpgradeYoung, 2);
    assert_eq!(first.state, State::Confirming, "{}", first.reason);
    assert!(
        first.reason.contains("confirming: 1 of 2"),
        "{}",
        first.reason
    );
    assert_eq!(
        p.replay(&baseline, &slow, &[], Judged::UpgradeYoung, slow.len())
            .state,
        State::Regression
    );
    assert_eq!(
        p.replay(&baseline, &slow[..1], &[], Judged::UpgradeYoung, 1)
            .state,
        State::Inconclusive
    );
    assert_eq!(
        p.replay(&baseline, &[], &[], Judged::UpgradeYoung, 0).state,
        State::Inconclusive
    );
    let same = runs(&mut rng, 14, 1.0);
    assert_eq!(
        p.replay(&baseline, &same, &[], Judged::UpgradeYoung, same.len())
            .state,
        State::Ok
    );
}

/// An upgrade told the old build's history that has shown the machine's
/// spells (half of `noise_runs` runs or more) is a regression at its first flagged
/// evaluation (`upgrade_confirm_needed`) once it has more than the 2 runs
/// it is first judged on (`upgrade_min_candidate_runs`), those 2 runs
/// being no more than a spike may hold, and until its `candidate_window`-th
/// run since warm-up; against a younger history it waits for
/// `confirm_needed` evaluations, within one build also for 4 runs.
#[test]
fn an_upgrade_against_a_settled_history_needs_one_evaluation() {
    let mut rng = StdRng::seed_from_u64(5);
    // The confirmation itself: no slowdown is taken as beyond doubt.
    let cfg = DetectorSettings {
        decisive_q: 0.0,
        ..DetectorSettings::default()
    };
    let p = VerdictPolicy {
        upgrade_decisive_q: 0.0,
        ..policy(&cfg)
    };
    let settled = p.noise_runs / 2;
    assert_eq!(
        p.confirm_needed(Judged::UpgradeSettled, 3),
        p.upgrade_confirm_needed
    );
    assert_eq!(
        p.confirm_needed(Judged::UpgradeSettled, 2),
        cfg.confirm_needed
    );
    assert_eq!(
        p.confirm_needed(Judged::UpgradeSettled, p.candidate_window),
        p.upgrade_confirm_needed
    );
    assert_eq!(
        p.confirm_needed(Judged::UpgradeSettled, p.candidate_window + 1),
        cfg.confirm_needed
    );
    for judged in [
        Judged::UpgradeYoung,
        Judged::UpgradeOwn,
        Judged::UpgradeUntold,
        Judged::WithinBuild,
    ] {
        assert_eq!(
            p.confirm_needed(judged, 3),
            cfg.confirm_needed,
            "{judged:?}"
        );
    }

    let baseline = runs(&mut rng, 30, 1.0);
    let history = runs(&mut rng, settled, 1.0);
    let slow = runs(&mut rng, 4, 1.5);
    let upgrade = p.replay(
        &baseline,
        &slow,
        &history,
        Judged::UpgradeSettled,
        slow.len(),
    );
    assert_eq!(upgrade.state, State::Regression, "{}", upgrade.reason);
    let within = p.replay(&baseline, &slow, &history, Judged::WithinBuild, slow.len());
    assert_eq!(within.state, State::Confirming, "{}", within.reason);

    assert_eq!(p.upgrade_min_candidate_runs, 2);
    // Its first 2 runs are judged, and wait for the 3rd: as far as a
    // two-run spike goes.
    let two = p.replay(&baseline, &slow[..2], &history, Judged::UpgradeSettled, 2);
    assert_eq!(two.state, State::Confirming, "{}", two.reason);
    let three = p.replay(&baseline, &slow[..3], &history, Judged::UpgradeSettled, 3);
    assert_eq!(three.state, State::Regression, "{}", three.reason);
    // Judged as told a young history the same 2 runs are judged, one
    // evaluation not yet enough; within one build they are too few.
    let young_two = p.replay(&baseline, &slow[..2], &history, Judged::UpgradeYoung, 2);
    assert_eq!(young_two.state, State::Confirming, "{}", young_two.reason);
    let refused = p.replay(&baseline, &slow[..2], &history, Judged::WithinBuild, 2);
    assert_eq!(refused.state, State::Inconclusive, "{}", refused.reason);
    assert!(refused.reason.contains("need 4"), "{}", refused.reason);

    // Once the new build has run longer than the candidate window, a
    // slowdown first seen in its newest runs is no longer the upgrade's:
    // it waits for its confirmation (2 slow runs: the median of the
    // newest 3 is slow at the newest evaluation only).
    let mut long_after = runs(&mut rng, p.candidate_window, 1.0);
    long_after.extend(runs(&mut rng, 2, 1.5));
    let late = p.replay(
        &baseline,
        &long_after,
        &history,
        Judged::UpgradeSettled,
        long_after.len(),
    );
    assert_eq!(late.state, State::Confirming, "{}", late.reason);
    long_after.extend(runs(&mut rng, 1, 1.5));
    let confirmed = p.replay(
        &baseline,
        &long_after,
        &history,
        Judged::UpgradeSettled,
        long_after.len(),
    );
    assert_eq!(confirmed.state, State::Regression, "{}", confirmed.reason);
}

/// Against a young history an upgrade is judged on its whole candidate
/// window: a 2-run spell at the end of it, which a span of 3 runs would
/// flag, is no regression, while a step that began at the upgrade still is.
#[test]
fn an_upgrade_against_a_young_history_is_judged_on_its_whole_window() {
    let mut rng = StdRng::seed_from_u64(11);
    let cfg = DetectorSettings::default();
    let p = policy(&cfg);
    let young = p.noise_runs / 2 - 1;
    for (judged, spans_from) in [
        (Judged::UpgradeYoung, 0),
        (Judged::UpgradeOwn, 0),
        (Judged::UpgradeSettled, cfg.scan_min_runs),
        (Judged::UpgradeUntold, cfg.scan_min_runs),
        (Judged::WithinBuild, cfg.scan_min_runs),
    ] {
        assert_eq!(
            p.detector_for(judged, 3).scan_min_runs,
            spans_from,
            "{judged:?}"
        );
    }

    let baseline = runs(&mut rng, 30, 1.0);
    let history = runs(&mut rng, young, 1.0);
    let mut spell = runs(&mut rng, 10, 1.0);
    spell.extend(runs(&mut rng, 2, 2.5));
    let scanned = evaluate_with_noise(&baseline, &spell, &history, &cfg);
    assert!(scanned.flagged(), "{}", scanned.reason);
    for end in [11, 12] {
        let judged = p.replay(
            &baseline,
            &spell[..end],
            &history,
            Judged::UpgradeYoung,
            end,
        );
        assert_eq!(judged.state, State::Ok, "{}", judged.reason);
    }
    let step = runs(&mut rng, 6, 1.5);
    let caught = p.replay(&baseline, &step, &history, Judged::UpgradeYoung, step.len());
    assert_eq!(caught.state, State::Regression, "{}", caught.reason);
}

/// Runs `evaluations` evaluations of a server whose TTFT is multiplied by
/// `factor` after the baseline: each evaluation adds one candidate run to
/// a sliding window of the last 12; returns how many evaluations ended in
/// a confirmed regression, and the index of the first.
fn simulate(rng: &mut StdRng, factor: f64, evaluations: usize) -> (usize, Option<usize>) {
    let cfg = DetectorSettings::default();
    let baseline = runs(rng, 30, 1.0);
    let mut candidate = runs(rng, 11, factor);
    let mut flags = Vec::new();
    let (mut alerts, mut first) = (0, None);
    for i in 0..evaluations {
        candidate.push(run(rng, factor, 0.0));
        let window = &candidate[candidate.len() - 12..];
        let e = evaluate(&baseline, window, &cfg);
        if confirm(&e, &flags, &cfg) == State::Regression {
            if factor == 1.0 {
                for m in e.metrics.iter().filter(|m| m.flagged) {
                    println!(
                        "false alarm on {}: {:+.1}% [{:+.1}%, {:+.1}%] p_adj {:.2e}",
                        m.metric,
                        m.relative_change * 100.0,
                        m.ci_low * 100.0,
                        m.ci_high * 100.0,
                        m.p_adjusted
                    );
                }
            }
            alerts += 1;
            first.get_or_insert(i);
        }
        flags.push(e.flagged());
    }
    (alerts, first)
}

#[test]
fn no_false_alarm_in_a_thousand_evaluations_of_an_unchanged_server() {
    let mut rng = StdRng::seed_from_u64(42);
    let mut alerts = 0;
    let mut evaluations = 0;
    // 100 baselines x 20 sliding evaluations each.
    for _ in 0..100 {
        alerts += simulate(&mut rng, 1.0, 20).0;
        evaluations += 20;
    }
    println!("false alarms: {alerts} in {evaluations} evaluations of an unchanged server");
    assert_eq!(alerts, 0);
}

#[test]
fn detection_power_within_three_evaluations() {
    let mut rng = StdRng::seed_from_u64(7);
    let trials = 200;
    let mut power = Vec::new();
    for effect in [0.10, 0.15, 0.20, 0.30] {
        let detected = (0..trials)
            .filter(|_| simulate(&mut rng, 1.0 + effect, 3).1.is_some())
            .count();
        let share = detected as f64 / trials as f64;
        println!(
            "TTFT +{:.0}%: flagged within 3 evaluations in {:.1}% of {trials} trials",
            effect * 100.0,
            share * 100.0
        );
        power.push(share);
    }
    assert!(power.windows(2).all(|w| w[0] <= w[1] + 0.05), "{power:?}");
    assert!(
        power[3] >= 0.9,
        "30% slower must nearly always be caught: {power:?}"
    );
}

#[test]
fn a_clearly_slower_candidate_has_a_small_p_value_whichever_sample_is_larger() {
    // Exact method (small samples, no ties): complete separation gives
    // p = 1 / C(20, 8) = 7.9e-6 for 8 against 12, in either order; the
    // faster candidate gives p near 1.
    let slow = |n: usize| (0..n).map(|i| 10.0 + i as f64 * 0.1).collect::<Vec<_>>();
    let fast = |n: usize| (0..n).map(|i| 1.0 + i as f64 * 0.1).collect::<Vec<_>>();
    for (nc, nb) in [(8, 12), (12, 8), (10, 10), (5, 7)] {
        let p = p_greater(&slow(nc), &fast(nb));
        assert!(p < 0.01, "{nc} slower runs against {nb}: p = {p}");
        let p = p_greater(&fast(nc), &slow(nb));
        assert!(p > 0.99, "{nc} faster runs against {nb}: p = {p}");
    }
    let p = p_greater(&slow(8), &fast(12));
    assert!((p - 1.0 / 125_970.0).abs() < 1e-9, "{p}");
}

mod history;
mod hold;
mod load;
mod upgrade_doubt;
