//! Probe runs: per-request latency histograms and outcome counters, and
//! the exact statistics of each pair's last run.

use std::sync::Arc;

use super::page::{Counters, Gauges, Histograms, Page};
use super::stale::ModelSeries;
use super::{HistogramResolution, MetricsError, PAIR, RUN, coarse_buckets, latency_buckets, with};
use crate::client::Outcome;
use crate::vocabulary::records::RunRecord;

pub struct RunMetrics {
    /// Per-request histograms, those the resolution keeps.
    ttft: Option<Histograms>,
    tpot: Option<Histograms>,
    itl: Option<Histograms>,
    e2el: Option<Histograms>,
    latency: Gauges,
    output_tps: Gauges,
    rps: Gauges,
    goodput: Gauges,
    success: Gauges,
    last_ts: Gauges,
    last_success_ts: Gauges,
    duration: Gauges,
    input_tokens: Gauges,
    prefix_hits: Gauges,
    prefix_queries: Gauges,
    turn_latency: Gauges,
    runs_total: Counters,
    requests_total: Counters,
    models: Arc<ModelSeries>,
}

impl RunMetrics {
    pub fn new(
        page: &Page,
        models: Arc<ModelSeries>,
        resolution: HistogramResolution,
    ) -> Result<Self, MetricsError> {
        use HistogramResolution::{Coarse, Fine};
        let histogram = |name: &str, help: &str, kept_at: &[HistogramResolution]| {
            let buckets = match resolution {
                Fine => latency_buckets(),
                _ => coarse_buckets(),
            };
            kept_at
                .contains(&resolution)
                .then(|| page.histograms(name, help, PAIR, buckets))
                .transpose()
        };
        // Run-level series say which replica and build a run measured;
        // per-request histograms stay per pair (the series budget).
        let gauge = |name: &str, help: &str| page.gauges(name, help, RUN);
        let m = RunMetrics {
            ttft: histogram(
                "sentinel_ttft_seconds",
                "Time to first token per probe request (vLLM's definition).",
                &[Coarse, Fine],
            )?,
            tpot: histogram(
                "sentinel_tpot_seconds",
                "Time per output token after the first, per probe request.",
                &[Fine],
            )?,
            itl: histogram(
                "sentinel_itl_seconds",
                "Gaps between successive streamed chunks of probe requests.",
                &[Fine],
            )?,
            e2el: histogram(
                "sentinel_e2e_latency_seconds",
                "Probe request start to its last streamed chunk.",
                &[Fine],
            )?,
            latency: page.gauges(
                "sentinel_run_latency_seconds",
                "Exact statistics of the last run, from its raw samples.",
                &with(RUN, &["metric", "stat"]),
            )?,
            output_tps: gauge(
                "sentinel_run_output_tokens_per_second",
                "Output token throughput of the last run.",
            )?,
            rps: gauge(
                "sentinel_run_requests_per_second",
                "Completed requests per second in the last run.",
            )?,
            goodput: gauge(
                "sentinel_run_goodput_ratio",
                "Share of the last run's requests meeting every SLO of the scenario.",
            )?,
            success: gauge(
                "sentinel_run_success",
                "1 if every request of the last run succeeded.",
            )?,
            last_ts: gauge(
                "sentinel_run_last_timestamp_seconds",
                "When the last run started.",
            )?,
            last_success_ts: gauge(
                "sentinel_run_last_success_timestamp_seconds",
                "When the last run in which every request succeeded started.",
            )?,
            duration: gauge(
                "sentinel_run_duration_seconds",
                "How long the last run took.",
            )?,
            input_tokens: gauge(
                "sentinel_run_input_tokens_mean",
                "Mean prompt tokens per request in the last run, as the server counted them.",
            )?,
            prefix_hits: gauge(
                "sentinel_run_prefix_cache_hit_tokens",
                "Prompt tokens the server's prefix cache found during the last run's measured requests (scenarios with a shared prefix).",
            )?,
            prefix_queries: gauge(
                "sentinel_run_prefix_cache_query_tokens",
                "Prompt tokens the server's prefix cache looked up during the last run's measured requests (scenarios with a shared prefix).",
            )?,
            turn_latency: page.gauges(
                "sentinel_run_turn_latency_seconds",
                "Exact statistics of the last multi-turn run by turn index (1 first): TTFT and ITL.",
                &with(RUN, &["turn", "metric", "stat"]),
            )?,
            runs_total: page.counters(
                "sentinel_runs_total",
                "Runs by how they ended.",
                &["target", "scenario", "outcome"],
            )?,
            requests_total: page.counters(
                "sentinel_requests_total",
                "Probe requests by outcome.",
                &with(PAIR, &["outcome"]),
            )?,
            models,
        };
        for h in [&m.ttft, &m.tpot, &m.itl, &m.e2el].into_iter().flatten() {
            m.models.add(h);
        }
        for g in m.last_run_gauges() {
            m.models.add(g);
        }
        m.models.add(&m.last_success_ts);
        m.models.add(&m.requests_total);
        Ok(m)
    }

    fn last_run_gauges(&self) -> [&Gauges; 11] {
        [
            &self.latency,
            &self.output_tps,
            &self.rps,
            &self.goodput,
            &self.success,
            &self.last_ts,
            &self.duration,
            &self.input_tokens,
            &self.prefix_hits,
            &self.prefix_queries,
            &self.turn_latency,
        ]
    }

    /// Creates every label combination a configured pair will use, at 0,
    /// so rates and dashboards have series before the first failure.
    /// The request outcomes wait for a known model (a run declares them).
    pub fn declare_pair(&self, target: &str, model: Option<&str>, scenario: &str) {
        if let Some(model) = model {
            self.models.note(target, model);
            self.declare_outcomes(&[target, model, scenario]);
        }
        for o in ["ok", "partial", "connect", "no_first_token", "http_5xx"] {
            self.runs_total.declare(&[target, scenario, o]);
        }
    }

    /// The outcomes every pair shows from the start: success and the
    /// ways a server goes down, which error-rate alerts must see from
    /// their first occurrence. The others (a refused key or model, a
    /// broken stream, a short or invalid answer, a shed request, the
    /// whole-request timeout, a stall, our own resources) appear with
    /// their first request rather than cost every pair a series: the
    /// series budget holds a pair and two objectives.
    fn declare_outcomes(&self, pair: &[&str; 3]) {
        for o in [
            Outcome::Ok,
            Outcome::Http5xx,
            Outcome::NoFirstToken,
            Outcome::Connect,
        ] {
            self.requests_total
                .declare(&[pair[0], pair[1], pair[2], o.as_str()]);
        }
    }

    /// Records a run: histograms and counters only for live runs
    /// (`fresh`), last-run gauges always (also when restoring from the store).
    pub fn record_run(&self, run: &RunRecord, fresh: bool) {
        if run.summary.completed > 0 {
            self.models.note(&run.target, &run.model);
        }
        let pair = [
            run.target.as_str(),
            run.model.as_str(),
            run.scenario.as_str(),
        ];
        if fresh {
            if run.summary.completed > 0 {
                self.declare_outcomes(&pair);
            }
            for s in &run.samples {
                self.requests_total
                    .inc(&[pair[0], pair[1], pair[2], s.outcome.as_str()]);
                if !s.outcome.is_ok() {
                    continue;
                }
                if let Some(h) = &self.ttft {
                    h.observe_all(&pair, s.ttft_s);
                }
                if let Some(h) = &self.tpot {
                    h.observe_all(&pair, s.tpot_s);
                }
                if let Some(h) = &self.e2el {
                    h.observe_all(&pair, s.e2el_s);
                }
                if let Some(h) = &self.itl {
                    h.observe_all(&pair, s.itls_s.iter().copied());
                }
            }
            self.runs_total
                .inc(&[&run.target, &run.scenario, run.outcome.as_str()]);
        }
        let build = run.build.as_deref().unwrap_or("unknown");
        let labels = [pair[0], pair[1], pair[2], run.replica.as_str(), build];
        let started = run.started_at.timestamp_millis() as f64 / 1000.0;
        self.success
            .set(&labels, if run.success() { 1.0 } else { 0.0 });
        if run.success() {
            self.last_success_ts.set(&labels, started);
        }
        self.last_ts.set(&labels, started);
        self.duration.set(&labels, run.duration_s);
        let sum = &run.summary;
        if sum.completed > 0 {
            for (metric, summary) in sum.latencies() {
                if summary.count == 0 {
                    continue;
                }
                for (stat, value) in summary.stats() {
                    let [t, m, sc, r, b] = labels;
                    self.latency.set(&[t, m, sc, r, b, metric, stat], value);
                }
            }
            self.input_tokens.set(
                &labels,
                sum.total_input_tokens as f64 / sum.completed as f64,
            );
        }
        self.output_tps.set(&labels, sum.output_throughput);
        self.rps.set(&labels, sum.request_throughput);
        if let Some(g) = sum.goodput_ratio {
            self.goodput.set(&labels, g);
        }
        for t in &sum.turns {
            let turn = t.turn.to_string();
            for (metric, summary) in [("ttft", &t.ttft), ("itl", &t.itl)] {
                for (stat, value) in summary.stats() {
                    let [tg, m, sc, r, b] = labels;
                    self.turn_latency
                        .set(&[tg, m, sc, r, b, &turn, metric, stat], value);
                }
            }
        }
        if let Some(used) = sum.prefix_cache {
            self.prefix_hits.set(&labels, used.hits);
            self.prefix_queries.set(&labels, used.queries);
        }
    }

    /// Removes the target's run series of builds that no longer serve it.
    pub fn retain_fleet(&self, target: &str, builds: &[String]) {
        self.models.remove_where(target, |l| {
            l.get("build")
                .is_some_and(|b| !builds.iter().any(|k| k == b))
        });
    }

    /// A replica now serving another build keeps only that build's series.
    pub fn keep_replica_build(&self, target: &str, replica: &str, build: &str) {
        self.models.remove_where(target, |l| {
            l.get("replica") == Some(&replica) && l.get("build").is_some_and(|b| *b != build)
        });
    }

    /// Removes the series of a replica no longer found.
    pub fn remove_replica(&self, target: &str, replica: &str) {
        self.models
            .remove_where(target, |l| l.get("replica") == Some(&replica));
    }

    /// Drops the last-run gauges (before a reload declares the pairs
    /// again); histograms and counters keep counting.
    pub fn reset(&self) {
        for g in self.last_run_gauges() {
            g.reset();
        }
    }
}
