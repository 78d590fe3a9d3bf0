//! `promtool test rules` unit tests for the generated rules, three per
//! objective, derived from its own windows and factors: a fast burn pages
//! (and the page ends once the burn stops), a slow burn opens a ticket
//! without paging, and a blip (one bad interval after a clean history)
//! does neither.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::prometheus_duration;
use super::rules::{self, GOOD_REQUESTS, PAGE_ALERT, REQUESTS, Rule, TICKET_ALERT};
use crate::config::SloConfig;
use crate::config::slos::{BurnAlert, Severity};

#[derive(Serialize)]
struct TestFile {
    rule_files: Vec<String>,
    evaluation_interval: String,
    tests: Vec<Test>,
}

#[derive(Serialize)]
struct Test {
    name: String,
    interval: String,
    input_series: Vec<InputSeries>,
    alert_rule_test: Vec<AlertTest>,
}

#[derive(Serialize)]
struct InputSeries {
    series: String,
    values: String,
}

#[derive(Serialize)]
struct AlertTest {
    eval_time: String,
    alertname: String,
    exp_alerts: Vec<ExpAlert>,
}

#[derive(Serialize, Clone)]
struct ExpAlert {
    exp_labels: BTreeMap<String, String>,
    exp_annotations: BTreeMap<String, String>,
}

/// Requests per interval in the test series.
const RATE: f64 = 1000.0;
/// Spacings of the test series, each a multiple of the one before, so
/// one evaluation interval (the smallest used) reaches every eval time.
const SPACINGS: [u64; 4] = [1, 5, 15, 60];

/// The spacing of an objective's series: at least five samples in its
/// shortest window (so `increase` has data there), at most 60 s.
fn spacing(slo: &SloConfig) -> Duration {
    let shortest = slo
        .alerts
        .iter()
        .map(|a| a.short_window)
        .min()
        .unwrap_or(slo.window);
    let wanted = shortest.as_secs() / 5;
    let secs = SPACINGS
        .iter()
        .copied()
        .filter(|s| *s <= wanted.max(1))
        .max()
        .unwrap_or(1);
    Duration::from_secs(secs)
}

/// Cumulative counter values, segment by segment, in promtool's
/// expanding notation.
struct Counter {
    value: f64,
    points: u64,
    text: Vec<String>,
}

impl Counter {
    fn new() -> Counter {
        Counter {
            value: 0.0,
            points: 0,
            text: Vec::new(),
        }
    }

    /// `intervals` more intervals, each adding `step`.
    fn grow(&mut self, step: f64, intervals: u64) {
        if intervals == 0 {
            return;
        }
        if self.points == 0 {
            // The first value (0) is a point of its own.
            self.text
                .push(format!("0+{}x{intervals}", rules::number(step)));
            self.points = intervals + 1;
        } else {
            let first = self.value + step;
            self.text.push(format!(
                "{}+{}x{}",
                rules::number(first),
                rules::number(step),
                intervals - 1
            ));
            self.points += intervals;
        }
        self.value += step * intervals as f64;
    }
}

/// One test's two counters: `(intervals, bad share)` per phase.
fn series(slo: &SloConfig, phases: &[(u64, f64)]) -> Vec<InputSeries> {
    let (mut total, mut good) = (Counter::new(), Counter::new());
    for &(intervals, bad) in phases {
        total.grow(RATE, intervals);
        good.grow(RATE * (1.0 - bad), intervals);
    }
    let selector = format!("{{slo=\"{}\"}}", slo.name);
    vec![
        InputSeries {
            series: format!("{REQUESTS}{selector}"),
            values: total.text.join(" "),
        },
        InputSeries {
            series: format!("{GOOD_REQUESTS}{selector}"),
            values: good.text.join(" "),
        },
    ]
}

/// Whole intervals in `d`, rounded up.
fn intervals(d: Duration, step: Duration) -> u64 {
    d.as_millis().div_ceil(step.as_millis().max(1)) as u64
}

/// What the objective's alert of `severity` looks like when it fires.
fn expected(slo: &SloConfig, severity: Severity) -> Option<ExpAlert> {
    let name = rules::alert_name(severity);
    rules::group(slo).rules.into_iter().find_map(|r| match r {
        Rule::Alert(a) if a.alert == name => Some(ExpAlert {
            exp_labels: a.labels,
            exp_annotations: a.annotations,
        }),
        _ => None,
    })
}

fn check(at: u64, step: Duration, alertname: &str, firing: Option<&ExpAlert>) -> AlertTest {
    AlertTest {
        eval_time: prometheus_duration(step * at as u32),
        alertname: alertname.to_owned(),
        exp_alerts: firing.into_iter().cloned().collect(),
    }
}

fn of(slo: &SloConfig, severity: Severity) -> Vec<&BurnAlert> {
    slo.alerts
        .iter()
        .filter(|a| a.severity == severity)
        .collect()
}

/// The intervals of burning at `bad` after a clean history of at least
/// each condition's long window until the first of `conditions` holds,
/// with a tenth more and two intervals for the evaluation to see it.
fn until_firing(conditions: &[&BurnAlert], budget: f64, bad: f64, step: Duration) -> u64 {
    conditions
        .iter()
        .map(|a| {
            let burning = a.long_window.as_secs_f64() * a.factor * budget / bad;
            intervals(Duration::from_secs_f64(burning * 1.1), step) + 2
        })
        .min()
        .unwrap_or(1)
}

fn longest(conditions: &[&BurnAlert], of: impl Fn(&BurnAlert) -> Duration) -> Duration {
    conditions.iter().map(|a| of(a)).max().unwrap_or_default()
}

/// A fast burn (twice the fastest page's factor, or every request
/// failing) pages; once it stops, the page ends within the longest
/// short window.
fn fast_burn(slo: &SloConfig, step: Duration) -> Option<Test> {
    let pages = of(slo, Severity::Page);
    let fastest = pages.iter().map(|a| a.factor).fold(0.0, f64::max);
    let page = expected(slo, Severity::Page)?;
    let budget = slo.budget();
    let bad = (2.0 * fastest * budget).min(1.0);
    let history = intervals(longest(&pages, |a| a.long_window), step);
    let burning = until_firing(&pages, budget, bad, step);
    let after = intervals(longest(&pages, |a| a.short_window), step) + 2;
    Some(Test {
        name: format!(
            "{}: {:.1}% bad requests (a fast burn) page, and the page ends once they stop",
            slo.name,
            bad * 100.0
        ),
        interval: prometheus_duration(step),
        input_series: series(slo, &[(history, 0.0), (burning, bad), (after + 2, 0.0)]),
        alert_rule_test: vec![
            check(history, step, PAGE_ALERT, None),
            check(history + burning, step, PAGE_ALERT, Some(&page)),
            check(history + burning + after, step, PAGE_ALERT, None),
        ],
    })
}

/// A slow burn (between the slowest page and the fastest ticket) after
/// a clean history as long as the shortest ticket's long window opens a
/// ticket and never pages.
fn slow_burn(slo: &SloConfig, step: Duration) -> Option<Test> {
    let tickets = of(slo, Severity::Ticket);
    let ticket = expected(slo, Severity::Ticket)?;
    let budget = slo.budget();
    let fastest_ticket = tickets.iter().map(|a| a.factor).fold(0.0, f64::max);
    let slowest_page = of(slo, Severity::Page)
        .iter()
        .map(|a| a.factor * budget)
        .fold(1.0, f64::min);
    let bad = (fastest_ticket * budget + slowest_page) / 2.0;
    let shortest = tickets
        .iter()
        .map(|a| a.long_window)
        .min()
        .unwrap_or_default();
    let history = intervals(shortest.mul_f64(1.1), step);
    // Each condition holds once its long window (or the whole history,
    // when shorter) burns enough; the first to hold opens the ticket.
    let burning = tickets
        .iter()
        .map(|a| {
            let needed = a.factor * budget / bad;
            let long = a.long_window.as_secs_f64();
            let seen = (history as f64 * step.as_secs_f64()).min(long);
            // Burning t of a window holding min(seen + t, long) of data:
            // while it is not full, t / (seen + t) must pass `needed`.
            let partial = needed * seen / (1.0 - needed);
            let t = if needed < 1.0 && seen + partial < long {
                partial
            } else {
                needed * long
            };
            intervals(
                Duration::from_secs_f64(t.max(a.short_window.as_secs_f64()) * 1.1),
                step,
            ) + 2
        })
        .min()
        .unwrap_or(1);
    let end = history + burning;
    let mut checks = vec![
        check(history, step, TICKET_ALERT, None),
        check(end, step, TICKET_ALERT, Some(&ticket)),
    ];
    if expected(slo, Severity::Page).is_some() {
        checks.push(check(end, step, PAGE_ALERT, None));
    }
    Some(Test {
        name: format!(
            "{}: {:.2}% bad requests (a slow burn) open a ticket and do not page",
            slo.name,
            bad * 100.0
        ),
        interval: prometheus_duration(step),
        input_series: series(slo, &[(history, 0.0), (burning + 1, bad)]),
        alert_rule_test: checks,
    })
}

/// One bad interval after a clean history a little longer than the
/// longest page window burns the short windows only: neither a page nor
/// a ticket.
fn blip(slo: &SloConfig, step: Duration) -> Test {
    let all: Vec<&BurnAlert> = slo.alerts.iter().collect();
    let budget = slo.budget();
    let pages = of(slo, Severity::Page);
    let reach = if pages.is_empty() { &all } else { &pages };
    let history = intervals(longest(reach, |a| a.long_window).mul_f64(1.1), step);
    let held = Duration::from_secs_f64(history as f64 * step.as_secs_f64());
    // Half of what the most sensitive long window (or the history, when
    // shorter) could take in one interval, or every request failing.
    let bad = all
        .iter()
        .map(|a| {
            let long = a.long_window.min(held).as_secs_f64();
            0.5 * a.factor * budget * long / step.as_secs_f64()
        })
        .fold(1.0, f64::min);
    let short = intervals(longest(&all, |a| a.short_window), step);
    let mut checks = Vec::new();
    for at in [history + 1, history + 2, history + 1 + short / 2] {
        for severity in [Severity::Page, Severity::Ticket] {
            if expected(slo, severity).is_some() {
                checks.push(check(at, step, rules::alert_name(severity), None));
            }
        }
    }
    Test {
        name: format!(
            "{}: one interval of {:.0}% bad requests (a blip) neither pages nor opens a ticket",
            slo.name,
            bad * 100.0
        ),
        interval: prometheus_duration(step),
        input_series: series(slo, &[(history, 0.0), (1, bad), (short + 2, 0.0)]),
        alert_rule_test: checks,
    }
}

/// The unit tests of every objective's rules, for `promtool test rules`;
/// `rules_path` is the rules file as the test file names it (relative to
/// the test file's folder).
pub fn test_file(slos: &[SloConfig], rules_path: &str) -> String {
    let steps: Vec<Duration> = slos.iter().map(spacing).collect();
    let evaluation = steps
        .iter()
        .min()
        .copied()
        .unwrap_or(Duration::from_secs(60));
    let mut tests = Vec::new();
    for (slo, step) in slos.iter().zip(steps) {
        tests.extend(fast_burn(slo, step));
        tests.extend(slow_burn(slo, step));
        tests.push(blip(slo, step));
    }
    let file = TestFile {
        rule_files: vec![rules_path.to_owned()],
        evaluation_interval: prometheus_duration(evaluation),
        tests,
    };
    let body = yaml_serde::to_string(&file).unwrap_or_default();
    format!(
        "# Generated by `vllm-sentinel rules --tests`: promtool test rules of the\n\
# objectives' burn-rate alerts (fast burn pages, slow burn tickets, a blip neither).\n{body}"
    )
}
