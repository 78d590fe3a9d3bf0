use super::*;
use crate::verdict::MetricResult;

fn verdict(target: &str, scenario: &str, state: State) -> PairVerdict {
    let mut v = PairVerdict::example(
        target,
        scenario,
        state,
        vec![MetricResult::example("ttft_p50", 0.2, true)],
    );
    v.reason = "slower in 3 of the last 4 evaluations: ttft_p50 +20.0%".into();
    v.evaluation.state = State::Ok;
    v.evaluation.reason = "slower: ttft_p50".into();
    v
}

#[test]
fn regressions_of_one_target_are_grouped_and_announced_once() {
    let mut l = Ledger::default();
    l.accept(verdict("a", "s1", State::Regression));
    l.accept(verdict("a", "s2", State::Regression));
    l.accept(verdict("b", "s1", State::Ok));
    // Still firing: evidence is refreshed, nothing new to announce.
    l.accept(verdict("a", "s1", State::Regression));
    let groups = l.due(Duration::ZERO, Duration::ZERO);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].target, "a");
    assert_eq!(groups[0].status, Status::Firing);
    assert_eq!(groups[0].verdicts.len(), 2);
    l.accept(verdict("a", "s1", State::Regression));
    l.accept(verdict("a", "s2", State::Inconclusive));
    assert!(l.due(Duration::ZERO, Duration::ZERO).is_empty());
    // Back to ok: one resolution, for the pair that returned.
    l.accept(verdict("a", "s1", State::Ok));
    let groups = l.due(Duration::ZERO, Duration::ZERO);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].status, Status::Resolved);
    assert_eq!(groups[0].verdicts[0].scenario, "s1");
    assert!(l.firing.contains_key(&verdict("a", "s2", State::Ok).key()));
}

#[test]
fn a_target_is_told_at_most_once_per_interval_and_late_news_is_merged() {
    let mut l = Ledger::default();
    l.accept(verdict("a", "s1", State::Regression));
    assert_eq!(l.due(Duration::ZERO, Duration::from_secs(3600)).len(), 1);
    l.accept(verdict("a", "s2", State::Regression));
    l.accept(verdict("a", "s3", State::Regression));
    assert!(
        l.due(Duration::ZERO, Duration::from_secs(3600)).is_empty(),
        "rate-limited"
    );
    let groups = l.due(Duration::ZERO, Duration::ZERO);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].verdicts.len(), 2, "merged while waiting");
}

#[test]
fn a_flap_inside_the_group_window_says_nothing() {
    let mut l = Ledger::default();
    l.accept(verdict("a", "s1", State::Regression));
    l.accept(verdict("a", "s1", State::Ok));
    assert!(l.due(Duration::ZERO, Duration::ZERO).is_empty());
    assert!(l.firing.is_empty());
}

/// The other way round: announced, its resolution held by the target's
/// interval, then a regression again. It was never said to end, so no
/// second REGRESSION is sent, and it fires on.
#[test]
fn a_flap_back_before_the_resolution_went_out_says_nothing() {
    let mut l = Ledger::default();
    l.accept(verdict("a", "s1", State::Regression));
    assert_eq!(l.due(Duration::ZERO, Duration::from_secs(3600)).len(), 1);
    l.accept(verdict("a", "s1", State::Ok));
    l.accept(verdict("a", "s1", State::Regression));
    assert!(l.due(Duration::ZERO, Duration::ZERO).is_empty());
    assert!(l.firing.contains_key(&verdict("a", "s1", State::Ok).key()));
}

#[test]
fn messages_say_what_by_how_much_with_what_confidence_since_when_and_link() {
    let g = Group {
        target: "prod".into(),
        status: Status::Firing,
        verdicts: vec![verdict("prod", "chat", State::Regression)],
        began: Default::default(),
    };
    let text = message::text(&g, Some("http://sentinel:9464"), 0.98);
    assert!(
        text.starts_with("[vllm-sentinel] REGRESSION on prod: chat slower"),
        "{text}"
    );
    assert!(
        text.contains("version 0.33.0 compared with 0.32.0"),
        "{text}"
    );
    assert!(text.contains("ttft_p50 +20.0% (98% CI +17.0% .. +23.0%, adjusted p = 1.0e-5; median 100.0 ms -> 120.0 ms)"), "{text}");
    // Medians put at the baseline's load say so.
    let mut at_load = verdict("prod", "chat", State::Regression);
    at_load.evaluation.metrics[0].at_load = Some(crate::verdict::load_covariate::AtLoad {
        reference: 1.0,
        per_request: 0.1,
    });
    let at_load = Group {
        verdicts: vec![at_load],
        ..g.clone()
    };
    let text_at_load = message::text(&at_load, None, 0.98);
    assert!(
        text_at_load
            .contains("median 100.0 ms -> 120.0 ms at the baseline's load, 1.0 running+waiting)"),
        "{text_at_load}"
    );
    // A phase against the other is a ratio: its medians carry no unit.
    let mut ratio = verdict("prod", "chat", State::Regression);
    let m = &mut ratio.evaluation.metrics[0];
    (m.metric, m.baseline_median, m.candidate_median) = ("ttft_p50_over_tpot".into(), 3.92, 5.81);
    let ratio = Group {
        verdicts: vec![ratio],
        ..g.clone()
    };
    let text_ratio = message::text(&ratio, None, 0.98);
    assert!(
        text_ratio.contains("ttft_p50_over_tpot +20.0% (98% CI +17.0% .. +23.0%, adjusted p = 1.0e-5; median ratio 3.92 -> 5.81)"),
        "{text_ratio}"
    );
    assert!(
        text.contains("report: http://sentinel:9464/report?target=prod&from=0.32.0&to=0.33.0"),
        "{text}"
    );
    let body = message::webhook_body(&g, None, 0.98);
    assert_eq!(
        body["text"],
        text.replace(
            "  report: http://sentinel:9464/report?target=prod&from=0.32.0&to=0.33.0\n",
            ""
        )
    );
    assert_eq!(body["status"], "firing");
    assert_eq!(body["verdicts"][0]["slower"][0]["metric"], "ttft_p50");
    let now = Utc::now();
    let alert = message::alertmanager_alert(&g.verdicts[0], Status::Resolved, now, now, None, 0.98);
    assert_eq!(alert["labels"]["alertname"], "SentinelRegression");
    assert_eq!(alert["labels"]["scenario"], "chat");
    assert_eq!(alert["endsAt"], now.to_rfc3339());
}

/// A pair under a model no longer served: its alert ends at the third
/// verdict of another model with none of its own between, whatever those
/// verdicts say, and no message of its own is sent. Two models served at
/// once (a rollout) end nothing.
#[test]
fn a_model_that_no_longer_serves_its_target_ends_its_alert() {
    let mut l = Ledger::default();
    let under = |model: &str, state| {
        let mut v = verdict("a", "s1", state);
        v.model = model.into();
        v
    };
    assert!(l.accept(under("m1", State::Regression)).is_empty());
    assert_eq!(l.due(Duration::ZERO, Duration::ZERO).len(), 1);
    assert!(l.accept(verdict("b", "s1", State::Ok)).is_empty());
    for _ in 0..3 {
        assert!(l.accept(under("m2", State::Inconclusive)).is_empty());
        assert!(l.accept(under("m1", State::Regression)).is_empty());
    }
    assert!(l.accept(under("m2", State::Inconclusive)).is_empty());
    assert!(l.accept(under("m2", State::Ok)).is_empty());
    let ended = l.accept(under("m2", State::Inconclusive));
    let ended: Vec<&str> = ended.iter().map(|f| f.verdict.model.as_str()).collect();
    assert_eq!(ended, ["m1"]);
    assert!(l.firing.is_empty());
    assert!(l.due(Duration::ZERO, Duration::ZERO).is_empty());
}

/// Pairs the configuration no longer watches end their alerts; one not
/// announced yet is dropped without a word.
#[test]
fn pairs_no_longer_watched_end_their_alerts() {
    let mut l = Ledger::default();
    l.accept(verdict("a", "s1", State::Regression));
    l.accept(verdict("a", "s2", State::Regression));
    assert_eq!(l.due(Duration::ZERO, Duration::ZERO).len(), 1);
    l.accept(verdict("b", "s1", State::Regression));
    let ended = l.retire(|k| k.scenario != "s1");
    let ended: Vec<&str> = ended.iter().map(|f| f.verdict.target.as_str()).collect();
    assert_eq!(ended, ["a"], "b's was never announced");
    let left: Vec<&PairKey> = l.firing.keys().collect();
    assert_eq!(left, [&verdict("a", "s2", State::Ok).key()]);
    assert!(l.due(Duration::ZERO, Duration::ZERO).is_empty());
}

/// A resolution is posted with the start of the alert it ends, and an
/// alert back before its resolution went out goes on from its own start.
#[test]
fn an_alert_keeps_its_start_through_its_resolution_and_a_flap_back() {
    let config = Config::from_text(
        "[[targets]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9\"\n\
[[scenarios]]\nname = \"s1\"\ninput_len = 8\noutput_len = 8\n\
[notify.alertmanager]\nurl = \"http://127.0.0.1:9\"\n",
        "the test configuration",
    )
    .unwrap();
    let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    let at = |state, minutes| {
        let mut v = verdict("a", "s1", state);
        v.at = t0 + chrono::Duration::minutes(minutes);
        v
    };
    let starts_at = |l: &Ledger, group: &Group| {
        let alerts = alerts_for(&config, group, l, t0 + chrono::Duration::hours(1));
        alerts[0]["startsAt"].as_str().unwrap().to_owned()
    };
    let mut l = Ledger::default();
    l.accept(at(State::Regression, 0));
    assert_eq!(l.due(Duration::ZERO, Duration::from_secs(3600)).len(), 1);
    // Its resolution is held by the interval; the regression comes back.
    l.accept(at(State::Ok, 10));
    l.accept(at(State::Regression, 20));
    l.accept(at(State::Ok, 30));
    let groups = l.due(Duration::ZERO, Duration::ZERO);
    assert_eq!(groups[0].status, Status::Resolved);
    assert_eq!(starts_at(&l, &groups[0]), t0.to_rfc3339());
    assert!(l.pending["a"].began.is_empty(), "nothing kept once sent");
}
