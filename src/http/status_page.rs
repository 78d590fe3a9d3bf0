//! The plain HTML status page at `/`: targets, the last run of each
//! scenario, and the verdicts, one table each.

use std::fmt::Write as _;

use axum::extract::State;
use axum::response::Html;

use super::AppState;
use crate::config::Config;
use crate::state::{TargetStates, TargetStatus};
use crate::verdict::State as VerdictState;
use crate::verdict::liveness::{Generating, LiveState};
use crate::vocabulary::records::RunRecord;

/// What the board knows of each target, as one snapshot.
type Board = std::collections::BTreeMap<String, TargetStatus>;

const HEAD: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><title>vllm-sentinel</title>\
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}\
td:first-child,td:nth-child(2){text-align:left}.bad{color:#b00}.warn{color:#a60}.ok{color:#070}</style></head><body>\
<h1>vllm-sentinel</h1><p><a href=\"/metrics\">Metrics</a> · <a href=\"/api/v1/runs\">Runs (JSON)</a> · <a href=\"/api/v1/targets\">Targets (JSON)</a> · <a href=\"/api/v1/slos\">Objectives (JSON)</a></p>";

pub(super) async fn render(State(app): State<AppState>) -> Html<String> {
    let config = app.live.current();
    let latest = app
        .store
        .call_or_none(|store| store.latest_runs())
        .await
        .unwrap_or_default();
    let mut page = String::from(HEAD);
    // One snapshot of the board for every table: they agree with each other.
    let status = app.board.targets();
    targets(&mut page, &config, &status);
    replicas(&mut page, &config, &status);
    served_by(&mut page, &config, &status);
    if let Ok(objectives) = super::slos::objectives(&app).await {
        super::slos::table(&mut page, &objectives);
    }
    last_runs(&mut page, &config, &status, &latest);
    verdicts(&mut page, &app.board);
    page.push_str("</body></html>");
    Html(page)
}

fn targets(page: &mut String, config: &Config, status: &Board) {
    page.push_str("<h2>Targets</h2><table><tr><th>target</th><th>state</th><th>generating</th><th>server</th><th>builds serving</th><th>model</th><th>running</th><th>backed off until</th><th>telemetry</th></tr>");
    for t in &config.targets {
        let s = status.get(&t.name).cloned().unwrap_or_default();
        let state = match s.up {
            Some(true) => "<span class=\"ok\">up</span>",
            Some(false) => "<span class=\"bad\">down</span>",
            None => "unknown",
        };
        let version = s
            .identity
            .as_ref()
            .and_then(|i| i.version.clone())
            .unwrap_or_default();
        let server = match s.kind {
            Some(kind) => format!("{} {version}", kind.as_str()),
            None => version,
        };
        let mut builds: Vec<String> = s
            .fleet
            .iter()
            .map(|b| {
                let share = if b.by_replica {
                    format!("{} replica{}", b.count, if b.count == 1 { "" } else { "s" })
                } else {
                    format!("{:.0}% of requests", b.share * 100.0)
                };
                match &b.image_digest {
                    Some(digest) => format!(
                        "{} ({share}; image {} {})",
                        escape(&b.build),
                        escape(b.image.as_deref().unwrap_or("")),
                        escape(digest)
                    ),
                    None => format!("{} ({share})", escape(&b.build)),
                }
            })
            .collect();
        // A Service probed only through itself: the pods' images, as the
        // API lists them, are what its runs cannot tell apart.
        if s.replicas.is_empty() && s.images.len() > 1 {
            let pods: Vec<String> = s
                .images
                .iter()
                .map(|i| {
                    format!(
                        "{} {} ({} pods)",
                        escape(&i.image),
                        escape(&i.digest),
                        i.pods
                    )
                })
                .collect();
            builds.push(format!("images: {}", pods.join(", ")));
        }
        if let Some(c) = &s.build_identity {
            builds.push(format!(
                "<span class=\"warn\">{}</span>",
                escape(&c.sentence())
            ));
        }
        if let Some((from, to)) = &s.rollout {
            builds.push(format!(
                "<span class=\"warn\">rollout {} to {} in progress</span>",
                escape(from),
                escape(to)
            ));
        }
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{state}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.name),
            liveness_cell(s.liveness.as_ref()),
            escape(server.trim()),
            builds.join("<br>"),
            escape(s.model.as_deref().unwrap_or("")),
            escape(s.running.as_deref().unwrap_or("")),
            s.backoff_until.map(|u| u.to_rfc3339()).unwrap_or_default(),
            telemetry_cell(&s.telemetry),
        );
    }
    page.push_str("</table>");
}

/// Whether it generates, since when, and the last token; a service not
/// generating names the replicas it is attributed to.
fn liveness_cell(live: Option<&LiveState>) -> String {
    let Some(live) = live else {
        return String::new();
    };
    let since = live.since.map(|t| t.to_rfc3339()).unwrap_or_default();
    let (class, text) = match live.state {
        Some(Generating::Generating) => ("ok", "generating".to_owned()),
        Some(Generating::NotGenerating) => ("bad", format!("not generating since {since}")),
        Some(Generating::Down) => ("bad", format!("down since {since}")),
        None => return String::new(),
    };
    let mut cell = format!("<span class=\"{class}\">{}</span>", escape(&text));
    if !live.attributed_to.is_empty() {
        let _ = write!(
            cell,
            "<br>replicas: {}",
            escape(&live.attributed_to.join(", "))
        );
    }
    if let Some(at) = live.last_token_at {
        let _ = write!(cell, "<br>last token {}", at.to_rfc3339());
    }
    cell
}

/// Each telemetry source of a target: "ok", or why its last read failed.
fn telemetry_cell(sources: &std::collections::BTreeMap<String, Option<String>>) -> String {
    sources
        .iter()
        .map(|(source, failure)| match failure {
            None => format!("{}: <span class=\"ok\">ok</span>", escape(source)),
            Some(reason) => format!(
                "{}: <span class=\"bad\">{}</span>",
                escape(source),
                escape(reason)
            ),
        })
        .collect::<Vec<_>>()
        .join("<br>")
}

/// Each replica found, with the build it serves; only when a target
/// probes replicas.
fn replicas(page: &mut String, config: &Config, status: &Board) {
    let rows: Vec<(&str, String, crate::state::ReplicaStatus)> = config
        .targets
        .iter()
        .filter_map(|t| Some((t.name.as_str(), status.get(&t.name)?)))
        .flat_map(|(t, s)| {
            s.replicas
                .iter()
                .map(move |(l, r)| (t, l.clone(), r.clone()))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    page.push_str("<h2>Replicas</h2><table><tr><th>target</th><th>replica</th><th>generating</th><th>build</th><th>pod: node, zone, image</th><th>last run</th><th>outcome</th><th>backed off until</th></tr>");
    for (target, label, r) in rows {
        let outcome = r.last_outcome.unwrap_or_default();
        let class = if outcome == "ok" { "ok" } else { "bad" };
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td></tr>",
            escape(target),
            escape(&label),
            liveness_cell(r.liveness.as_ref()),
            escape(r.build.as_deref().unwrap_or("")),
            escape(&pod_cell(r.pod.as_ref())),
            r.last_run_at.map(|u| u.to_rfc3339()).unwrap_or_default(),
            escape(&outcome),
            r.backoff_until.map(|u| u.to_rfc3339()).unwrap_or_default(),
        );
    }
    page.push_str("</table>");
}

/// Requests through the service by the endpoint the gateway named as
/// serving them; only for targets that read one.
fn served_by(page: &mut String, config: &Config, status: &Board) {
    let rows: Vec<(&str, &String, &crate::state::EndpointTally)> = config
        .targets
        .iter()
        .filter_map(|t| Some((t.name.as_str(), status.get(&t.name)?)))
        .flat_map(|(t, s)| s.served_by.iter().map(move |(e, n)| (t, e, n)))
        .collect();
    if rows.is_empty() {
        return;
    }
    page.push_str("<h2>Served through the gateway</h2><table><tr><th>target</th><th>endpoint</th><th>requests</th><th>ok</th><th>shed</th><th>last seen</th></tr>");
    for (target, endpoint, n) in rows {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(target),
            escape(endpoint),
            n.requests,
            n.ok,
            n.shed,
            n.last_seen.map(|u| u.to_rfc3339()).unwrap_or_default(),
        );
    }
    page.push_str("</table>");
}

fn last_runs(page: &mut String, config: &Config, status: &Board, latest: &[RunRecord]) {
    page.push_str("<h2>Last run per scenario</h2><table><tr><th>target</th><th>scenario</th><th>started</th><th>outcome</th>\
<th>ok / failed</th><th>TTFT p50 ms</th><th>TTFT p99 ms</th><th>TPOT p50 ms</th><th>TPOT p99 ms</th><th>ITL p99 ms</th>\
<th>output tok/s</th><th>next run</th></tr>");
    for t in &config.targets {
        let s = status.get(&t.name).cloned().unwrap_or_default();
        for scenario in &t.scenarios {
            let next = s
                .next_due
                .get(scenario)
                .map(|d| d.to_rfc3339())
                .unwrap_or_default();
            match latest
                .iter()
                .find(|r| r.target == t.name && &r.scenario == scenario)
            {
                Some(r) => run_row(page, r, &next),
                None => {
                    let _ = write!(
                        page,
                        "<tr><td>{}</td><td>{}</td><td colspan=\"9\">no run yet</td><td>{next}</td></tr>",
                        escape(&t.name),
                        escape(scenario)
                    );
                }
            }
        }
    }
    page.push_str("</table>");
}

fn run_row(page: &mut String, r: &RunRecord, next: &str) {
    let class = if r.success() { "ok" } else { "bad" };
    let _ = write!(
        page,
        "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{next}</td></tr>",
        escape(&r.target),
        escape(&r.scenario),
        r.started_at.format("%Y-%m-%d %H:%M:%S UTC"),
        r.outcome.as_str(),
        r.summary.completed,
        r.summary.failed,
        ms(r.summary.ttft.p50),
        ms(r.summary.ttft.p99),
        ms(r.summary.tpot.p50),
        ms(r.summary.tpot.p99),
        ms(r.summary.itl.p99),
        r.summary.output_throughput,
    );
    if let Some(e) = &r.error
        && !r.success()
    {
        let _ = write!(
            page,
            "<tr><td></td><td colspan=\"11\" class=\"bad\" style=\"text-align:left\">{}</td></tr>",
            escape(e)
        );
    }
}

fn verdicts(page: &mut String, board: &TargetStates) {
    page.push_str("<h2>Verdicts</h2><table><tr><th>target</th><th>scenario</th><th>version</th><th>compared with</th>\
<th>state</th><th>candidate / baseline runs</th><th>why</th><th>report</th></tr>");
    for v in board.verdicts() {
        let class = match v.state {
            VerdictState::Regression => "bad",
            VerdictState::Ok => "ok",
            VerdictState::Confirming => "warn",
            VerdictState::Inconclusive => "",
        };
        let report = v
            .reference_build
            .as_deref()
            .filter(|r| *r != v.build)
            .map(|from| report_link(&v.target, from, &v.build))
            .unwrap_or_default();
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{} / {}</td><td style=\"text-align:left\">{}</td><td>{report}</td></tr>",
            escape(&v.target),
            escape(&v.scenario),
            escape(&v.build),
            escape(v.reference_build.as_deref().unwrap_or("")),
            v.state.as_str(),
            v.candidate_runs,
            v.baseline_runs,
            escape(&v.reason),
        );
    }
    page.push_str("</table>");
}

fn report_link(target: &str, from: &str, to: &str) -> String {
    let mut url = reqwest::Url::parse("http://x/report").expect("literal URL");
    url.query_pairs_mut()
        .append_pair("target", target)
        .append_pair("from", from)
        .append_pair("to", to);
    format!(
        "<a href=\"/report?{}\">{} to {}</a>",
        escape(url.query().unwrap_or_default()),
        escape(from),
        escape(to)
    )
}

pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(v: f64) -> String {
    format!("{:.1}", v * 1e3)
}

/// Where a replica's pod runs and what image: `10.0.0.5:8000 on gpu-1
/// (eu-1a), vllm/vllm-openai:v0.32.0 sha256:...`; empty without Kubernetes.
fn pod_cell(pod: Option<&crate::discovery::Placement>) -> String {
    let Some(p) = pod else {
        return String::new();
    };
    let mut cell = p.address.clone();
    if let Some(node) = &p.node {
        cell.push_str(&format!(" on {node}"));
    }
    if let Some(zone) = &p.zone {
        cell.push_str(&format!(" ({zone})"));
    }
    if let Some(image) = &p.image {
        cell.push_str(&format!(", {image}"));
    }
    if let Some(digest) = &p.image_digest {
        cell.push_str(&format!(" {digest}"));
    }
    cell
}
