//! The console result block, line for line in `vllm bench serve`'s layout
//! (so people and scripts that read one read the other), followed by the
//! derived speeds and failure breakdown vLLM does not print.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::client::Outcome;
use crate::probe::{ProbeResult, ProbeSpec};
use crate::stats::Distribution;

fn line_int(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {:<10}", value.to_string());
}

fn line_f(out: &mut String, label: &str, value: f64) {
    let _ = writeln!(out, "{label:<40} {value:<10.2}");
}

fn header(out: &mut String, title: &str, fill: char) {
    let title = format!(" {title} ");
    let _ = match fill {
        '=' => writeln!(out, "{title:=^50}"),
        _ => writeln!(out, "{title:-^50}"),
    };
}

fn section(out: &mut String, short: &str, title: &str, d: &Distribution) {
    let _ = writeln!(out, "{title:-^50}");
    line_f(out, &format!("Mean {short} (ms):"), d.mean * 1000.0);
    line_f(out, &format!("Median {short} (ms):"), d.median * 1000.0);
    for (p, v) in &d.percentiles {
        line_f(
            out,
            &format!("P{} {short} (ms):", percentile_word(*p)),
            v * 1000.0,
        );
    }
}

/// `99` for 99.0, `99.9` for 99.9: the form vLLM uses in labels and keys.
pub fn percentile_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// Renders the block for a finished run.
pub fn render(spec: &ProbeSpec, result: &ProbeResult) -> String {
    let m = &result.metrics;
    let mut out = String::new();
    header(&mut out, "Serving Benchmark Result", '=');
    line_int(&mut out, "Successful requests:", m.completed);
    line_int(&mut out, "Failed requests:", m.failed);
    if let Some(c) = spec.concurrency {
        line_int(&mut out, "Maximum request concurrency:", c);
    }
    if let Some(rate) = spec.request_rate {
        line_f(&mut out, "Request rate configured (RPS):", rate);
    }
    line_f(&mut out, "Benchmark duration (s):", m.duration_s);
    line_int(&mut out, "Total input tokens:", m.total_input_tokens);
    line_int(&mut out, "Total generated tokens:", m.total_output_tokens);
    line_f(
        &mut out,
        "Request throughput (req/s):",
        m.request_throughput,
    );
    if let Some(g) = m.request_goodput {
        line_f(&mut out, "Request goodput (req/s):", g);
    }
    line_f(
        &mut out,
        "Output token throughput (tok/s):",
        m.output_throughput,
    );
    line_f(
        &mut out,
        "Peak output token throughput (tok/s):",
        m.max_output_tokens_per_s,
    );
    line_f(
        &mut out,
        "Peak concurrent requests:",
        m.max_concurrent_requests as f64,
    );
    line_f(
        &mut out,
        "Total token throughput (tok/s):",
        m.total_token_throughput,
    );
    section(&mut out, "TTFT", "Time to First Token", &m.ttft);
    if let Some(ttfo) = &m.ttfo {
        // The first token of a reasoning model is reasoning: the answer
        // starts later.
        section(&mut out, "TTFO", "Time to First Output Token", ttfo);
        line_int(&mut out, "Requests that reasoned:", m.reasoning_requests);
        line_int(
            &mut out,
            "Total reasoning tokens:",
            m.total_reasoning_tokens,
        );
    }
    section(
        &mut out,
        "TPOT",
        "Time per Output Token (excl. 1st token)",
        &m.tpot,
    );
    section(&mut out, "ITL", "Inter-token Latency", &m.itl);
    section(&mut out, "E2EL", "End-to-end Latency", &m.e2el);
    for t in &m.turns {
        let title = format!("Turn {}: Time to First Token", t.turn);
        section(&mut out, "TTFT", &title, &t.ttft);
        line_f(&mut out, "Mean ITL (ms):", t.itl.mean * 1000.0);
        line_f(&mut out, "Median ITL (ms):", t.itl.median * 1000.0);
    }
    let _ = writeln!(out, "{:-^50}", "Derived speeds");
    line_f(
        &mut out,
        "Prefill speed PP (tok/s):",
        m.prefill_tokens_per_s,
    );
    line_f(
        &mut out,
        "Decode speed TG (tok/s per user):",
        m.decode_tokens_per_s,
    );
    if let Some(used) = &result.prefix_cache {
        let _ = writeln!(out, "{:-^50}", "Server prefix cache (measured requests)");
        line_f(&mut out, "Prefix cache hit tokens:", used.hits);
        line_f(&mut out, "Prefix cache query tokens:", used.queries);
    }
    let mut by_outcome: BTreeMap<Outcome, usize> = BTreeMap::new();
    for r in &result.records {
        *by_outcome.entry(r.outcome).or_default() += 1;
    }
    if m.failed > 0 {
        let _ = writeln!(out, "{:-^50}", "Failed requests by outcome");
        for (outcome, n) in by_outcome.iter().filter(|(o, _)| !o.is_ok()) {
            line_int(&mut out, &format!("{outcome}:"), n);
        }
        if let Some(first) = result.records.iter().find_map(|r| r.error.as_deref()) {
            let _ = writeln!(out, "First error: {first}");
        }
    }
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_centered_like_python() {
        let mut s = String::new();
        header(&mut s, "Serving Benchmark Result", '=');
        assert_eq!(s, "============ Serving Benchmark Result ============\n");
        let mut s = String::new();
        let _ = writeln!(s, "{:-^50}", "Time per Output Token (excl. 1st token)");
        assert_eq!(s, "-----Time per Output Token (excl. 1st token)------\n");
        assert_eq!(percentile_word(99.0), "99");
        assert_eq!(percentile_word(99.9), "99.9");
    }
}
