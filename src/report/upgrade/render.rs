//! The upgrade report rendered: Markdown, and HTML with one inline SVG
//! chart per scenario; both lay out the same tables.

use std::fmt::Write as _;

use super::{LATENCIES, ScenarioReport, Side, UpgradeReport};

/// When the new build rolled out, e.g. "Rollout: started 12:11:06 UTC,
/// finished 12:12:04 UTC (58 s)".
fn rollout_line(r: &UpgradeReport) -> Option<String> {
    let rollout = r.rollout.as_ref()?;
    let at = |t: &chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    Some(match (&rollout.ended_at, &rollout.outcome) {
        (Some(end), Some(outcome)) => format!(
            "Rollout: started {}, {outcome} {} ({} s).",
            at(&rollout.started_at),
            at(end),
            (*end - rollout.started_at).num_seconds()
        ),
        _ => format!(
            "Rollout: started {}, in progress: the verdict compares the builds measured at the same time until it ends.",
            at(&rollout.started_at)
        ),
    })
}

fn ms(x: f64) -> String {
    format!("{:.2}", x * 1e3)
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

fn load_text(s: &Side) -> String {
    let busy = s
        .load
        .map_or("n/a".into(), |l| format!("{l:.1} running+waiting"));
    let kv = s
        .kv_cache_usage
        .map_or(String::new(), |k| format!(", KV cache {:.0}%", k * 100.0));
    format!("{busy}{kv}")
}

/// One scenario's tables as rows of cells, shared by both renderings.
struct Tables {
    sides: Vec<[String; 3]>,
    latencies: Vec<Vec<String>>,
    metrics: Vec<Vec<String>>,
}

const SIDES_HEADER: [&str; 3] = ["", "before", "after"];
const LATENCY_HEADER: [&str; 9] = [
    "metric (ms)",
    "before mean",
    "after mean",
    "before p50",
    "after p50",
    "before p90",
    "after p90",
    "before p99",
    "after p99",
];
const METRIC_HEADER: [&str; 5] = [
    "per-run statistic",
    "change",
    "interval",
    "p-value (adjusted)",
    "flagged",
];

fn tables(s: &ScenarioReport) -> Tables {
    let (b, a) = (&s.before, &s.after);
    let sides = vec![
        ["version".into(), b.version.clone(), a.version.clone()],
        ["runs".into(), b.runs.to_string(), a.runs.to_string()],
        [
            "requests".into(),
            b.requests.to_string(),
            a.requests.to_string(),
        ],
        ["load".into(), load_text(b), load_text(a)],
        [
            "output tok/s (mean per run)".into(),
            format!("{:.1}", b.output_throughput),
            format!("{:.1}", a.output_throughput),
        ],
        [
            "requests/s (mean per run)".into(),
            format!("{:.2}", b.request_throughput),
            format!("{:.2}", a.request_throughput),
        ],
    ];
    let latencies = LATENCIES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (b, a) = (b.latency[i], a.latency[i]);
            let mut row = vec![(*name).to_owned()];
            for (x, y) in [
                (b.mean, a.mean),
                (b.p50, a.p50),
                (b.p90, a.p90),
                (b.p99, a.p99),
            ] {
                row.push(ms(x));
                row.push(ms(y));
            }
            row
        })
        .collect();
    let metrics = s
        .metrics
        .iter()
        .map(|m| {
            let flag = if m.flagged && m.alerting {
                "slower"
            } else if m.flagged {
                "slower (not alerting)"
            } else if m.improvement {
                "faster"
            } else {
                ""
            };
            vec![
                m.metric.clone(),
                pct(m.relative_change),
                format!("{} .. {}", pct(m.ci_low), pct(m.ci_high)),
                format!("{:.2e}", m.p_adjusted),
                flag.to_owned(),
            ]
        })
        .collect();
    Tables {
        sides,
        latencies,
        metrics,
    }
}

fn verdict_line(s: &ScenarioReport) -> (String, String) {
    let confirmed = s
        .confirmed
        .map(|c| format!(", daemon's confirmed state: {}", c.as_str()))
        .unwrap_or_default();
    (
        s.state.as_str().to_owned(),
        format!("{confirmed} ({})", s.reason),
    )
}

fn md_table<S: AsRef<str>>(o: &mut String, header: &[&str], rows: &[impl AsRef<[S]>]) {
    let _ = writeln!(o, "| {} |", header.join(" | "));
    let align: Vec<&str> = (0..header.len())
        .map(|i| if i == 0 { "---" } else { "---:" })
        .collect();
    let _ = writeln!(o, "|{}|", align.join("|"));
    for row in rows {
        let cells: Vec<String> = row.as_ref().iter().map(|c| md_escape(c.as_ref())).collect();
        let _ = writeln!(o, "| {} |", cells.join(" | "));
    }
    o.push('\n');
}

/// Text for Markdown: HTML escaped (Markdown renderers pass HTML through)
/// and table pipes and backticks made literal.
fn md_escape(s: &str) -> String {
    escape(s).replace('|', "\\|").replace('`', "\\`")
}

fn html_table<S: AsRef<str>>(o: &mut String, header: &[&str], rows: &[impl AsRef<[S]>]) {
    o.push_str("<table><tr>");
    for h in header {
        let _ = write!(o, "<th>{}</th>", escape(h));
    }
    o.push_str("</tr>");
    for row in rows {
        o.push_str("<tr>");
        for cell in row.as_ref() {
            let _ = write!(o, "<td>{}</td>", escape(cell.as_ref()));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
}

/// The Markdown report.
pub fn markdown(r: &UpgradeReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# {}: version {} compared with {}\n\nModel {}. Generated {}. A metric is flagged when it is at least {:.0}% slower, its {:.0}% interval excludes zero and its adjusted p-value passes.\n",
        md_escape(&r.target),
        md_escape(&r.to),
        md_escape(&r.from),
        md_escape(&r.model),
        r.generated_at.format("%Y-%m-%d %H:%M UTC"),
        r.threshold * 100.0,
        r.confidence * 100.0
    );
    if let Some(line) = rollout_line(r) {
        let _ = writeln!(o, "{}\n", md_escape(&line));
    }
    let (overall, why) = r.overall();
    let _ = writeln!(
        o,
        "Overall: **{}** ({})\n",
        overall.as_str(),
        md_escape(&why)
    );
    if r.scenarios.is_empty() {
        o.push_str("No scenario has completed runs on both versions.\n");
    }
    for s in &r.scenarios {
        let (state, rest) = verdict_line(s);
        let _ = writeln!(
            o,
            "## {}\n\nVerdict: **{state}**{}\n",
            md_escape(&s.scenario),
            md_escape(&rest)
        );
        let t = tables(s);
        md_table(&mut o, &SIDES_HEADER, &t.sides);
        md_table(&mut o, &LATENCY_HEADER, &t.latencies);
        md_table(&mut o, &METRIC_HEADER, &t.metrics);
    }
    for d in &r.drift {
        let _ = writeln!(
            o,
            "## {}: output drift\n\n**{}**\n",
            md_escape(&d.scenario),
            md_escape(&d.sentence)
        );
        md_table(&mut o, &DRIFT_HEADER, &drift_rows(d));
    }
    o
}

const DRIFT_HEADER: [&str; 3] = ["prompt", "first divergence", "mean abs log-prob diff"];

/// One row per prompt of a drift canary.
fn drift_rows(d: &super::DriftSection) -> Vec<[String; 3]> {
    d.report
        .prompts
        .iter()
        .map(|p| {
            [
                (p.prompt + 1).to_string(),
                p.first_divergence
                    .map_or("none".to_owned(), |t| format!("token {t}")),
                format!("{:.4}", p.mean_abs_logprob_diff),
            ]
        })
        .collect()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Grouped bars: p50/p90/p99 of each latency, before and after, each
/// latency scaled to its own maximum so milliseconds and seconds share
/// one chart.
fn svg_chart(s: &ScenarioReport) -> String {
    let (w, row_h, label_w, bar_w) = (640.0, 16.0, 110.0, 440.0);
    let mut rows = Vec::new();
    for (i, name) in LATENCIES.iter().enumerate() {
        let (b, a) = (s.before.latency[i], s.after.latency[i]);
        for (stat, bv, av) in [
            ("p50", b.p50, a.p50),
            ("p90", b.p90, a.p90),
            ("p99", b.p99, a.p99),
        ] {
            rows.push((format!("{name} {stat}"), bv, av));
        }
    }
    let h = rows.len() as f64 * row_h * 2.2 + 30.0;
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"latency before and after\">"
    );
    let _ = write!(
        o,
        "<rect x=\"{label_w}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#7f8c8d\"/><text x=\"{}\" y=\"13\" font-size=\"11\">before ({})</text><rect x=\"{}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#c0392b\"/><text x=\"{}\" y=\"13\" font-size=\"11\">after ({})</text>",
        label_w + 14.0,
        escape(&s.before.version),
        label_w + 200.0,
        label_w + 214.0,
        escape(&s.after.version)
    );
    for (i, (label, bv, av)) in rows.iter().enumerate() {
        let group_max = rows[(i / 3) * 3..(i / 3) * 3 + 3]
            .iter()
            .flat_map(|(_, b, a)| [*b, *a])
            .fold(0.0f64, f64::max)
            .max(1e-12);
        let y = 24.0 + i as f64 * row_h * 2.2;
        let _ = write!(
            o,
            "<text x=\"0\" y=\"{}\" font-size=\"11\">{label}</text>",
            y + row_h
        );
        for (j, (v, color)) in [(bv, "#7f8c8d"), (av, "#c0392b")].iter().enumerate() {
            let yy = y + j as f64 * row_h;
            let len = (*v / group_max * bar_w).max(0.5);
            let _ = write!(
                o,
                "<rect x=\"{label_w}\" y=\"{yy}\" width=\"{len:.1}\" height=\"{}\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"10\">{} ms</text>",
                row_h - 3.0,
                label_w + len + 4.0,
                yy + row_h - 5.0,
                ms(**v)
            );
        }
    }
    o.push_str("</svg>");
    o
}

/// The HTML report: the Markdown tables as HTML plus one chart per scenario.
pub fn html(r: &UpgradeReport) -> String {
    let mut o = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>vllm-sentinel report</title><style>body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}.regression{color:#c0392b}.ok{color:#27ae60}.inconclusive{color:#e67e22}</style></head><body>",
    );
    let _ = write!(
        o,
        "<h1>{}: version {} compared with {}</h1><p>Model <code>{}</code>. Generated {}.</p>",
        escape(&r.target),
        escape(&r.to),
        escape(&r.from),
        escape(&r.model),
        r.generated_at.format("%Y-%m-%d %H:%M UTC")
    );
    if let Some(line) = rollout_line(r) {
        let _ = write!(o, "<p>{}</p>", escape(&line));
    }
    let (overall, why) = r.overall();
    let _ = write!(
        o,
        "<p>Overall: <b class=\"{0}\">{0}</b> ({1})</p>",
        overall.as_str(),
        escape(&why)
    );
    for s in &r.scenarios {
        let (state, rest) = verdict_line(s);
        let _ = write!(
            o,
            "<h2>{}</h2><p>Verdict: <b class=\"{state}\">{state}</b>{}</p>",
            escape(&s.scenario),
            escape(&rest)
        );
        let t = tables(s);
        html_table(&mut o, &SIDES_HEADER, &t.sides);
        o.push_str(&svg_chart(s));
        html_table(&mut o, &LATENCY_HEADER, &t.latencies);
        html_table(&mut o, &METRIC_HEADER, &t.metrics);
    }
    for d in &r.drift {
        let class = if d.report.drift { "regression" } else { "ok" };
        let _ = write!(
            o,
            "<h2>{}: output drift</h2><p><b class=\"{class}\">{}</b></p>",
            escape(&d.scenario),
            escape(&d.sentence)
        );
        html_table(&mut o, &DRIFT_HEADER, &drift_rows(d));
    }
    o.push_str("</body></html>\n");
    o
}
