//! What a notification says: one text for people (email body, the Slack
//! `text` field) and one JSON body for machines, from a group of verdicts
//! of one target.

use crate::verdict::pair::PairVerdict;

/// Whether a group announces regressions or their end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Firing,
    Resolved,
}

/// The verdicts of one target that changed together.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub target: String,
    pub status: Status,
    pub verdicts: Vec<PairVerdict>,
    /// When each alert a resolution ends began, by its pair.
    pub began:
        std::collections::BTreeMap<crate::store::baselines::PairKey, chrono::DateTime<chrono::Utc>>,
}

fn percent(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// Link to the before/after report of one verdict, when the daemon's
/// external URL is known.
pub fn report_url(external: Option<&str>, v: &PairVerdict) -> Option<String> {
    let base = external?;
    let from = v.reference_build.as_deref()?;
    let mut url = reqwest::Url::parse(&format!("{base}/report")).ok()?;
    url.query_pairs_mut()
        .append_pair("target", &v.target)
        .append_pair("from", from)
        .append_pair("to", &v.build);
    Some(url.to_string())
}

/// One line per slower metric: by how much, with what interval and
/// p-value; a drift canary's verdict says how its answers changed.
pub fn evidence(v: &PairVerdict, confidence: f64) -> Vec<String> {
    if v.drift {
        return vec![v.reason.clone()];
    }
    v.slower()
        .iter()
        .map(|m| {
            // Medians put at the baseline's load are not what was measured.
            let at_load = m
                .at_load
                .map(|a| {
                    format!(
                        " at the baseline's load, {:.1} running+waiting",
                        a.reference
                    )
                })
                .unwrap_or_default();
            let medians = crate::verdict::phases::medians_text(
                &m.metric,
                m.baseline_median,
                m.candidate_median,
            );
            format!(
                "{} {} ({:.0}% CI {} .. {}, adjusted p = {:.1e}; {medians}{at_load})",
                m.metric,
                percent(m.relative_change),
                confidence * 100.0,
                percent(m.ci_low),
                percent(m.ci_high),
                m.p_adjusted,
            )
        })
        .collect()
}

pub fn subject(g: &Group) -> String {
    let scenarios: Vec<&str> = g.verdicts.iter().map(|v| v.scenario.as_str()).collect();
    let drift_only = g.verdicts.iter().all(|v| v.drift);
    match g.status {
        Status::Firing if drift_only => format!(
            "[vllm-sentinel] DRIFT on {}: {} answer differently",
            g.target,
            scenarios.join(", ")
        ),
        Status::Resolved if drift_only => format!(
            "[vllm-sentinel] RESOLVED on {}: {} answer as before",
            g.target,
            scenarios.join(", ")
        ),
        Status::Firing => format!(
            "[vllm-sentinel] REGRESSION on {}: {} slower",
            g.target,
            scenarios.join(", ")
        ),
        Status::Resolved => format!(
            "[vllm-sentinel] RESOLVED on {}: {} back to baseline",
            g.target,
            scenarios.join(", ")
        ),
    }
}

/// The human text: subject line, then one paragraph per scenario.
pub fn text(g: &Group, external: Option<&str>, confidence: f64) -> String {
    let mut out = subject(g);
    out.push('\n');
    for v in &g.verdicts {
        let since = match &v.reference_build {
            Some(r) if v.is_upgrade() => format!("version {} compared with {r}", v.build),
            Some(_) => format!("version {} compared with its own baseline (drift)", v.build),
            None => format!("version {}", v.build),
        };
        out.push_str(&format!(
            "\n{} / {} ({}): {} [{} baseline runs, {} candidate runs]\n",
            v.scenario,
            v.model,
            since,
            v.state.as_str(),
            v.baseline_runs,
            v.candidate_runs
        ));
        match g.status {
            Status::Firing => {
                for line in evidence(v, confidence) {
                    out.push_str(&format!("  - {line}\n"));
                }
            }
            Status::Resolved => out.push_str(&format!("  {}\n", v.reason)),
        }
        for m in v.faster() {
            out.push_str(&format!(
                "  - faster: {} {}\n",
                m.metric,
                percent(m.relative_change)
            ));
        }
        if let Some(url) = report_url(external, v) {
            out.push_str(&format!("  report: {url}\n"));
        }
    }
    out
}

/// The webhook body: Slack's `text`, plus structured fields.
pub fn webhook_body(g: &Group, external: Option<&str>, confidence: f64) -> serde_json::Value {
    let verdicts: Vec<serde_json::Value> = g
        .verdicts
        .iter()
        .map(|v| {
            serde_json::json!({
                "target": v.target,
                "model": v.model,
                "scenario": v.scenario,
                "state": v.state,
                "version": v.build,
                "baseline_version": v.reference_build,
                "baseline_runs": v.baseline_runs,
                "candidate_runs": v.candidate_runs,
                "evaluated_at": v.at,
                "reason": v.reason,
                "slower": v.slower(),
                "faster": v.faster(),
                "report_url": report_url(external, v),
            })
        })
        .collect();
    serde_json::json!({
        "text": text(g, external, confidence),
        "status": g.status,
        "target": g.target,
        "verdicts": verdicts,
    })
}

/// One Alertmanager v2 alert per verdict.
pub fn alertmanager_alert(
    v: &PairVerdict,
    status: Status,
    started: chrono::DateTime<chrono::Utc>,
    ends: chrono::DateTime<chrono::Utc>,
    external: Option<&str>,
    confidence: f64,
) -> serde_json::Value {
    let evidence = evidence(v, confidence);
    let summary = match status {
        Status::Firing if v.drift => format!("{} / {}: {}", v.target, v.scenario, v.reason),
        Status::Resolved if v.drift => {
            format!("{} / {} answers as before", v.target, v.scenario)
        }
        Status::Firing => format!(
            "{} / {} slower on version {} than on {}",
            v.target,
            v.scenario,
            v.build,
            v.reference_build.as_deref().unwrap_or("its baseline")
        ),
        Status::Resolved => format!("{} / {} back to its baseline", v.target, v.scenario),
    };
    let mut alert = serde_json::json!({
        "labels": {
            "alertname": if v.drift { "SentinelOutputDrift" } else { "SentinelRegression" },
            "source": "vllm-sentinel",
            "severity": "warning",
            "target": v.target,
            "model": v.model,
            "scenario": v.scenario,
        },
        "annotations": {
            "summary": summary,
            "description": evidence.join("; "),
            "version": v.build,
            "baseline_version": v.reference_build.clone().unwrap_or_default(),
        },
        "startsAt": started.to_rfc3339(),
        "endsAt": ends.to_rfc3339(),
    });
    if let Some(url) = report_url(external, v) {
        alert["generatorURL"] = url.clone().into();
        alert["annotations"]["report_url"] = url.into();
    }
    alert
}
