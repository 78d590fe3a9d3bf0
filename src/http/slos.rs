//! The objectives in view: `GET /api/v1/slos` and the status page's
//! Objectives table. Each objective's SLI over its window, the error
//! budget left and the burn rate over every window its alerts use, from
//! the counts in the store, computed as the generated Prometheus rules
//! compute them (so the page and the dashboards agree).

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::AppState;
use super::status_page::escape;
use crate::config::SloConfig;
use crate::slo::{Tally, prometheus_duration, rules};
use crate::store::StoreError;

/// One window's counts and burn rate.
#[derive(Debug, Clone, Serialize)]
pub struct Burn {
    pub window: String,
    pub good: u64,
    pub total: u64,
    /// The bad share over the budget; `null` without events.
    pub burn_rate: Option<f64>,
}

/// One burn-rate condition and whether both its windows burn past it.
#[derive(Debug, Clone, Serialize)]
pub struct Condition {
    pub severity: &'static str,
    pub factor: f64,
    pub long_window: String,
    pub short_window: String,
    pub burning: bool,
}

/// What one objective's counts say now.
#[derive(Debug, Clone, Serialize)]
pub struct SloStatus {
    pub name: String,
    pub sli: String,
    /// The promised good share, as a ratio.
    pub objective: f64,
    pub window: String,
    pub good: u64,
    pub total: u64,
    /// The good share over the window; `null` without events.
    pub sli_ratio: Option<f64>,
    /// The share of the window's budget not spent (below 0: overspent).
    pub error_budget_remaining: Option<f64>,
    /// Every window the rules record, shortest first (the objective's own
    /// among them).
    pub burn_rates: Vec<Burn>,
    pub alerts: Vec<Condition>,
}

/// The objectives' status now, and when "now" was.
#[derive(Debug, Clone, Serialize)]
pub struct Objectives {
    pub computed_at: DateTime<Utc>,
    pub slos: Vec<SloStatus>,
}

/// Reads the counts of every configured objective.
pub async fn objectives(app: &AppState) -> Result<Objectives, StoreError> {
    let slos = app.live.current().slos.clone();
    let now = app.clock.now();
    app.store
        .call(move |store| {
            let mut out = Vec::with_capacity(slos.len());
            for slo in &slos {
                let windows = rules::windows(slo);
                let since: Vec<DateTime<Utc>> = windows
                    .iter()
                    .map(|w| now - chrono::Duration::from_std(*w).unwrap_or_default())
                    .collect();
                let counted = store.slo_counts(&slo.name, now, &since)?;
                let tallies: Vec<(std::time::Duration, Tally)> = windows
                    .into_iter()
                    .zip(counted)
                    .map(|(w, c)| {
                        let t = Tally {
                            good: c.good,
                            total: c.total,
                        };
                        (w, t)
                    })
                    .collect();
                out.push(status(slo, &tallies));
            }
            Ok(Objectives {
                computed_at: now,
                slos: out,
            })
        })
        .await
}

/// One objective's status from its tally over each window.
fn status(slo: &SloConfig, tallies: &[(std::time::Duration, Tally)]) -> SloStatus {
    let budget = slo.budget();
    let over = |w: std::time::Duration| {
        tallies
            .iter()
            .find(|(d, _)| *d == w)
            .map(|(_, t)| *t)
            .unwrap_or_default()
    };
    let whole = over(slo.window);
    let burning = |w| over(w).burn_rate(budget);
    SloStatus {
        name: slo.name.clone(),
        sli: slo.sli.describe(),
        objective: slo.objective,
        window: prometheus_duration(slo.window),
        good: whole.good,
        total: whole.total,
        sli_ratio: whole.sli(),
        error_budget_remaining: whole.budget_remaining(budget),
        burn_rates: tallies
            .iter()
            .map(|(w, t)| Burn {
                window: prometheus_duration(*w),
                good: t.good,
                total: t.total,
                burn_rate: t.burn_rate(budget),
            })
            .collect(),
        alerts: slo
            .alerts
            .iter()
            .map(|a| Condition {
                severity: a.severity.as_str(),
                factor: a.factor,
                long_window: prometheus_duration(a.long_window),
                short_window: prometheus_duration(a.short_window),
                burning: [a.long_window, a.short_window]
                    .into_iter()
                    .all(|w| burning(w).is_some_and(|r| r > a.factor)),
            })
            .collect(),
    }
}

/// `GET /api/v1/slos`.
pub(super) async fn api(State(app): State<AppState>) -> Response {
    match objectives(&app).await {
        Ok(o) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(&o).unwrap_or_default(),
        )
            .into_response(),
        Err(e) => super::store_failure(e),
    }
}

fn percent(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{:.*}%", digits, v * 100.0))
        .unwrap_or_default()
}

/// The status page's Objectives table; nothing without objectives.
pub(super) fn table(page: &mut String, objectives: &Objectives) {
    if objectives.slos.is_empty() {
        return;
    }
    page.push_str("<h2>Objectives</h2><table><tr><th>objective</th><th>SLI</th><th>objective</th><th>window</th>\
<th>good / total</th><th>SLI over the window</th><th>error budget left</th><th>burn rate per window</th><th>burning</th></tr>");
    for s in &objectives.slos {
        let left = s.error_budget_remaining;
        let class = match left {
            Some(l) if l <= 0.0 => "bad",
            Some(l) if l < 0.25 => "warn",
            Some(_) => "ok",
            None => "",
        };
        let burns: Vec<String> = s
            .burn_rates
            .iter()
            .map(|b| match b.burn_rate {
                Some(r) => format!("{}: {r:.2}", b.window),
                None => format!("{}: no events", b.window),
            })
            .collect();
        let burning: Vec<String> = s
            .alerts
            .iter()
            .filter(|a| a.burning)
            .map(|a| {
                format!(
                    "<span class=\"bad\">{} ({}x over {} and {})</span>",
                    a.severity, a.factor, a.long_window, a.short_window
                )
            })
            .collect();
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(&s.name),
            escape(&s.sli),
            percent(Some(s.objective), 3),
            escape(&s.window),
            s.good,
            s.total,
            percent(s.sli_ratio, 3),
            percent(left, 1),
            burns.join("<br>"),
            burning.join("<br>"),
        );
    }
    page.push_str("</table>");
}
