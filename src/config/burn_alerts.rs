//! `[[slos.alerts]]`: an objective's multiwindow burn-rate conditions,
//! page or ticket, each a factor over a long and a short window; the SRE
//! workbook's four, scaled to the objective's window, when none is
//! written.

use std::time::Duration;

use super::reader::{Errors, Fields};
use super::slos::MIN_ALERT_WINDOW;

/// How loud a burn-rate alert is: the workbook's page and ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Page,
    Ticket,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Page => "page",
            Severity::Ticket => "ticket",
        }
    }
}

/// One multiwindow burn-rate condition: the budget burns more than
/// `factor` times the sustainable rate over both windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BurnAlert {
    pub severity: Severity,
    pub factor: f64,
    pub long_window: Duration,
    pub short_window: Duration,
}

/// The SRE workbook's four conditions for a 30-day objective: page at
/// 14.4x over 1 h and 5 min (2% of the budget in an hour) or 6x over 6 h
/// and 30 min (5% in six hours); ticket at 3x over 1 day and 2 h or 1x
/// over 3 days and 6 h.
pub fn workbook_alerts() -> Vec<BurnAlert> {
    let h = |n: u64| Duration::from_secs(n * 3600);
    let m = |n: u64| Duration::from_secs(n * 60);
    let alert = |severity, factor, long_window, short_window| BurnAlert {
        severity,
        factor,
        long_window,
        short_window,
    };
    vec![
        alert(Severity::Page, 14.4, h(1), m(5)),
        alert(Severity::Page, 6.0, h(6), m(30)),
        alert(Severity::Ticket, 3.0, h(24), h(2)),
        alert(Severity::Ticket, 1.0, h(72), h(6)),
    ]
}

/// The window the workbook's conditions are written for.
const WORKBOOK_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// The shortest window a default condition gets, whatever its objective's
/// window: the workbook's own shortest, which holds several scrapes at
/// any common scrape interval (an `increase` over a window with fewer
/// than two samples is empty, and a condition over it never fires).
const MIN_DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The workbook's conditions for an objective over `window`: each window
/// scaled by `window` / 30 days and the factors kept, so that each spends
/// the share of the budget the workbook's spend of a 30-day one (14.4x
/// over 1 h is 2% of the budget; over a 7-day window that is 14.4x over
/// 14 min). A short window is at least 5 minutes and its long window at
/// least twice that, so that a day-long objective's page still has
/// samples to fire on (it then spends a little more before it fires).
fn workbook_alerts_for(window: Duration) -> Vec<BurnAlert> {
    let ratio = window.as_secs_f64() / WORKBOOK_WINDOW.as_secs_f64();
    let scaled = |d: Duration| Duration::from_secs((d.as_secs_f64() * ratio).round() as u64);
    workbook_alerts()
        .into_iter()
        .map(|a| {
            let short_window = scaled(a.short_window).max(MIN_DEFAULT_WINDOW);
            BurnAlert {
                short_window,
                long_window: scaled(a.long_window).max(2 * short_window),
                ..a
            }
        })
        .collect()
}

/// A factor whose burn over a budget of `1 - objective` needs at least
/// every request to fail: a condition at it could never fire.
fn never_fires(factor: f64, objective: f64) -> bool {
    factor * (1.0 - objective) >= 1.0
}

/// The workbook's conditions for an objective not written any: scaled to
/// its window, without those its budget could never burn that fast
/// (the 14.4x page at 93.05% or below); refused, naming `objective`, when
/// that leaves no page.
fn default_alerts(
    f: &Fields,
    objective: Option<f64>,
    window: Option<Duration>,
    errors: &mut Errors,
) -> Option<Vec<BurnAlert>> {
    let (objective, window) = (objective?, window?);
    let alerts: Vec<BurnAlert> = workbook_alerts_for(window)
        .into_iter()
        .filter(|a| !never_fires(a.factor, objective))
        .collect();
    if !alerts.iter().any(|a| a.severity == Severity::Page) {
        let pages: Vec<String> = workbook_alerts()
            .iter()
            .filter(|a| a.severity == Severity::Page)
            .map(|a| format!("{}x", a.factor))
            .collect();
        errors.push(
            f.path_of("objective"),
            format!(
                "{}% leaves a budget of {:.3}%, which no page of the workbook's ({}) can burn that fast: write [[slos.alerts]] with factors below {:.2}",
                (objective * 1e8).round() / 1e6,
                (1.0 - objective) * 100.0,
                pages.join(", "),
                1.0 / (1.0 - objective)
            ),
        );
        return None;
    }
    Some(alerts)
}

/// `[[slos.alerts]]`, or the workbook's scaled to `window` when none is
/// written. `objective` (when valid) bounds the factors: one whose burn
/// needs more errors than requests could never fire.
pub(super) fn alerts(
    f: &mut Fields,
    objective: Option<f64>,
    window: Option<Duration>,
    errors: &mut Errors,
) -> Option<Vec<BurnAlert>> {
    if !f.has("alerts") {
        return default_alerts(f, objective, window, errors);
    }
    let mut out = Vec::new();
    let mut ok = true;
    for mut a in f.tables("alerts", errors) {
        match alert(&mut a, objective, errors) {
            Some(alert) => out.push(alert),
            None => ok = false,
        }
        a.finish(errors);
    }
    if out.is_empty() && ok {
        errors.push(
            f.path_of("alerts"),
            "no alert: leave [[slos.alerts]] out for the workbook's",
        );
        return None;
    }
    let slowest_page = out
        .iter()
        .filter(|a| a.severity == Severity::Page)
        .map(|a| a.factor)
        .fold(f64::INFINITY, f64::min);
    if let Some(t) = out
        .iter()
        .find(|a| a.severity == Severity::Ticket && a.factor >= slowest_page)
    {
        errors.push(
            f.path_of("alerts"),
            format!(
                "a ticket's factor ({}) must be below every page's ({slowest_page}): a ticket is for burns too slow to page",
                t.factor
            ),
        );
        ok = false;
    }
    ok.then_some(out)
}

fn alert(a: &mut Fields, objective: Option<f64>, errors: &mut Errors) -> Option<BurnAlert> {
    let severity = match a.string("severity", errors).as_deref() {
        Some("page") => Some(Severity::Page),
        Some("ticket") => Some(Severity::Ticket),
        Some(other) => {
            errors.push(
                a.path_of("severity"),
                format!("{other:?} must be \"page\" or \"ticket\""),
            );
            None
        }
        None => {
            errors.push(a.path_of("severity"), "is required: \"page\" or \"ticket\"");
            None
        }
    };
    let factor = a.number("factor", 0.0, 1e6, errors);
    if factor.is_some_and(|v| v <= 0.0) {
        errors.push(a.path_of("factor"), "must be above 0");
    }
    if let (Some(factor), Some(objective)) = (factor, objective)
        && never_fires(factor, objective)
    {
        errors.push(
            a.path_of("factor"),
            format!(
                "{factor} times a budget of {:.3}% is every request failing or more: this alert could never fire",
                (1.0 - objective) * 100.0
            ),
        );
    }
    let mut window = |key: &'static str| {
        let d = a.positive_duration(key, errors);
        if d.is_none() && !a.has(key) {
            errors.push(a.path_of(key), "is required, e.g. \"1h\"");
        }
        d.filter(|d| {
            let short = *d < MIN_ALERT_WINDOW;
            if short {
                errors.push(
                    a.path_of(key),
                    format!("{d:?} is too short: at least {MIN_ALERT_WINDOW:?}"),
                );
            }
            !short
        })
    };
    let long_window = window("long_window");
    let short_window = window("short_window");
    if let (Some(long), Some(short)) = (long_window, short_window)
        && short >= long
    {
        errors.push(
            a.path_of("short_window"),
            "must be shorter than long_window: it is what lets the alert end soon after the burn",
        );
        return None;
    }
    let factor = factor.filter(|v| *v > 0.0 && objective.is_none_or(|o| !never_fires(*v, o)))?;
    Some(BurnAlert {
        severity: severity?,
        factor,
        long_window: long_window?,
        short_window: short_window?,
    })
}
