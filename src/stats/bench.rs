//! Run-level benchmark metrics computed exactly as `vllm bench serve`'s
//! `calculate_metrics` does: TTFT, TPOT, pooled ITL, E2EL, throughputs,
//! goodput, peak output throughput, plus the derived PP/TG speeds.

use super::Distribution;

/// One request in seconds, relative to the run's first dispatch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestSample {
    pub success: bool,
    pub start_s: f64,
    pub ttft_s: f64,
    /// Time to the first answer token (TTFO), when one arrived.
    pub ttfo_s: Option<f64>,
    /// Reasoning arrived before the answer.
    pub reasoning: bool,
    pub reasoning_tokens: u32,
    /// The turn of its conversation, in a multi-turn run.
    pub turn: Option<u32>,
    /// Gaps between successive choice-bearing chunks.
    pub itls_s: Vec<f64>,
    /// Start to the last choice-bearing chunk.
    pub latency_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

impl RequestSample {
    /// `(E2EL - TTFT) / (output tokens - 1)`, for successful requests with
    /// more than one output token.
    pub fn tpot_s(&self) -> Option<f64> {
        (self.success && self.output_tokens > 1)
            .then(|| (self.latency_s - self.ttft_s) / f64::from(self.output_tokens - 1))
    }
}

/// Service-level objectives for goodput, in seconds; a request is good when
/// it meets every one given.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Slos {
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub e2el_s: Option<f64>,
}

impl Slos {
    pub fn is_empty(&self) -> bool {
        self.ttft_s.is_none() && self.tpot_s.is_none() && self.e2el_s.is_none()
    }
}

/// Everything `vllm bench serve` reports for a run. Latencies in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchMetrics {
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    /// Good requests per second; `None` without SLOs.
    pub request_goodput: Option<f64>,
    /// Requests meeting every SLO; `None` without SLOs.
    pub good_requests: Option<usize>,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft: Distribution,
    /// Time to the first answer token after the reasoning, over successful
    /// requests that had one; `None` when no request reasoned.
    pub ttfo: Option<Distribution>,
    /// Successful requests that reasoned, and their reasoning tokens as
    /// the server counted them.
    pub reasoning_requests: usize,
    pub total_reasoning_tokens: u64,
    pub tpot: Distribution,
    pub itl: Distribution,
    pub e2el: Distribution,
    /// Max choice chunks completed in any one-second bucket.
    pub max_output_tokens_per_s: f64,
    pub max_concurrent_requests: usize,
    /// Mean input tokens / mean TTFT (prompt processing speed, "PP" in
    /// llama-bench style reports).
    pub prefill_tokens_per_s: f64,
    /// 1 / mean TPOT (token generation speed per user, "TG").
    pub decode_tokens_per_s: f64,
    /// Output length per request, 0 for failures (vLLM's `output_lens`).
    pub output_lens: Vec<u32>,
    /// TTFT and ITL by turn index, in a multi-turn run.
    pub turns: Vec<TurnLatency>,
}

/// One turn index's latencies over a run's conversations (turn 1 first).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnLatency {
    pub turn: u32,
    pub ttft: Distribution,
    pub itl: Distribution,
}

/// TTFT and pooled ITL of the successful requests of each turn index.
fn by_turn(samples: &[RequestSample], percentiles: &[f64]) -> Vec<TurnLatency> {
    let mut turns: Vec<u32> = samples.iter().filter_map(|s| s.turn).collect();
    turns.sort_unstable();
    turns.dedup();
    turns
        .into_iter()
        .map(|turn| {
            let of_turn = samples.iter().filter(|s| s.success && s.turn == Some(turn));
            let ttfts: Vec<f64> = of_turn.clone().map(|s| s.ttft_s).collect();
            let itls: Vec<f64> = of_turn.flat_map(|s| s.itls_s.iter().copied()).collect();
            TurnLatency {
                turn,
                ttft: Distribution::of(&ttfts, percentiles),
                itl: Distribution::of(&itls, percentiles),
            }
        })
        .collect()
}

/// Computes the run metrics. `duration_s` is first dispatch to last
/// completion; `percentiles` are those to report (e.g. 50, 90, 99).
pub fn compute(
    samples: &[RequestSample],
    duration_s: f64,
    percentiles: &[f64],
    slos: &Slos,
) -> BenchMetrics {
    let mut ttfts = Vec::new();
    let mut tpots = Vec::new();
    let mut all_tpots = Vec::new();
    let mut itls = Vec::new();
    let mut e2els = Vec::new();
    let mut ttfos = Vec::new();
    let (mut reasoning_requests, mut total_reasoning_tokens) = (0usize, 0u64);
    let mut output_lens = Vec::with_capacity(samples.len());
    let (mut completed, mut total_input) = (0usize, 0u64);
    let mut input_of_completed = Vec::new();
    for s in samples {
        if !s.success {
            output_lens.push(0);
            continue;
        }
        let output_len = s.output_tokens.max(1);
        output_lens.push(output_len);
        total_input += u64::from(s.prompt_tokens);
        input_of_completed.push(f64::from(s.prompt_tokens));
        let tpot = s.tpot_s();
        tpots.extend(tpot);
        // Like vLLM, a one-token output counts as TPOT 0 for goodput.
        all_tpots.push(tpot.unwrap_or(0.0));
        itls.extend_from_slice(&s.itls_s);
        ttfts.push(s.ttft_s);
        ttfos.extend(s.ttfo_s);
        if s.reasoning {
            reasoning_requests += 1;
            total_reasoning_tokens += u64::from(s.reasoning_tokens);
        }
        e2els.push(s.latency_s);
        completed += 1;
    }
    let total_output: u64 = output_lens.iter().map(|&l| u64::from(l)).sum();
    let good = (!slos.is_empty()).then(|| {
        (0..ttfts.len())
            .filter(|&i| {
                slos.ttft_s.is_none_or(|l| ttfts[i] <= l)
                    && slos.tpot_s.is_none_or(|l| all_tpots[i] <= l)
                    && slos.e2el_s.is_none_or(|l| e2els[i] <= l)
            })
            .count()
    });
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let (max_output_tokens_per_s, max_concurrent_requests) = peaks(samples);
    let ttft = Distribution::of(&ttfts, percentiles);
    let tpot = Distribution::of(&tpots, percentiles);
    BenchMetrics {
        completed,
        failed: samples.len() - completed,
        duration_s,
        total_input_tokens: total_input,
        total_output_tokens: total_output,
        request_throughput: per_s(completed as f64),
        request_goodput: good.map(|g| per_s(g as f64)),
        good_requests: good,
        output_throughput: per_s(total_output as f64),
        total_token_throughput: per_s((total_input + total_output) as f64),
        prefill_tokens_per_s: if ttft.mean > 0.0 {
            super::mean(&input_of_completed) / ttft.mean
        } else {
            0.0
        },
        decode_tokens_per_s: if tpot.mean > 0.0 {
            1.0 / tpot.mean
        } else {
            0.0
        },
        ttft,
        ttfo: (reasoning_requests > 0).then(|| Distribution::of(&ttfos, percentiles)),
        reasoning_requests,
        total_reasoning_tokens,
        tpot,
        itl: Distribution::of(&itls, percentiles),
        e2el: Distribution::of(&e2els, percentiles),
        max_output_tokens_per_s,
        max_concurrent_requests,
        output_lens,
        turns: by_turn(samples, percentiles),
    }
}

/// vLLM's peak output throughput and peak concurrency: chunk arrival times
/// (start + TTFT + cumulative ITL) and request lifetimes, bucketed by whole
/// seconds from the earliest successful start.
fn peaks(samples: &[RequestSample]) -> (f64, usize) {
    let ok: Vec<&RequestSample> = samples.iter().filter(|s| s.success).collect();
    let Some(min_start) = ok.iter().map(|s| s.start_s).reduce(f64::min) else {
        return (0.0, 0);
    };
    let max_end = ok
        .iter()
        .map(|s| s.start_s + s.latency_s)
        .fold(f64::MIN, f64::max);
    let buckets = (max_end - min_start).ceil() as usize + 1;
    let mut tokens = vec![0u64; buckets];
    let mut concurrent = vec![0usize; buckets];
    for s in ok {
        let mut t = s.start_s + s.ttft_s;
        let mut add = |t: f64| {
            let b = (t - min_start) as usize;
            if b < buckets {
                tokens[b] += 1;
            }
        };
        add(t);
        for gap in &s.itls_s {
            t += gap;
            add(t);
        }
        let first = (s.start_s - min_start) as usize;
        let last = ((s.start_s + s.latency_s - min_start) as usize).min(buckets - 1);
        for c in &mut concurrent[first..=last] {
            *c += 1;
        }
    }
    (
        tokens.iter().copied().max().unwrap_or(0) as f64,
        concurrent.iter().copied().max().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn sample(start: f64, ttft: f64, itls: &[f64], prompt: u32, out: u32) -> RequestSample {
        RequestSample {
            success: true,
            start_s: start,
            ttft_s: ttft,
            ttfo_s: Some(ttft),
            reasoning: false,
            reasoning_tokens: 0,
            turn: None,
            itls_s: itls.to_vec(),
            latency_s: ttft + itls.iter().sum::<f64>(),
            prompt_tokens: prompt,
            output_tokens: out,
        }
    }

    /// Hand-computed: two requests of 3 chunks/tokens each, one failure.
    #[test]
    fn matches_hand_computed_values() {
        let samples = vec![
            sample(0.0, 0.1, &[0.02, 0.04], 10, 3), // e2el 0.16, tpot 0.03
            sample(0.5, 0.3, &[0.01, 0.03], 20, 3), // e2el 0.34, tpot 0.02
            RequestSample {
                success: false,
                ..Default::default()
            },
        ];
        let m = compute(
            &samples,
            2.0,
            &[50.0, 99.0],
            &Slos {
                ttft_s: Some(0.2),
                ..Default::default()
            },
        );
        assert_eq!((m.completed, m.failed), (2, 1));
        assert_eq!((m.total_input_tokens, m.total_output_tokens), (30, 6));
        assert!(close(m.request_throughput, 1.0));
        assert!(close(m.output_throughput, 3.0));
        assert!(close(m.total_token_throughput, 18.0));
        assert!(close(m.request_goodput.unwrap(), 0.5));
        assert!(close(m.ttft.mean, 0.2));
        assert!(close(m.ttft.std, 0.1));
        assert!(close(m.ttft.at(99.0).unwrap(), 0.1 + 0.2 * 0.99));
        assert!(close(m.tpot.mean, 0.025));
        // ITLs pooled: [0.02, 0.04, 0.01, 0.03] -> median 0.025, p99 0.0397
        assert_eq!(m.itl.count, 4);
        assert!(close(m.itl.median, 0.025));
        assert!(close(m.itl.at(99.0).unwrap(), 0.03 + 0.01 * 0.97));
        assert!(close(m.e2el.mean, 0.25));
        assert_eq!(m.output_lens, vec![3, 3, 0]);
        // PP = mean input 15 / mean TTFT 0.2; TG = 1 / 0.025
        assert!(close(m.prefill_tokens_per_s, 75.0));
        assert!(close(m.decode_tokens_per_s, 40.0));
        // All six chunks land in second 0; both requests overlap second 0.
        assert!(close(m.max_output_tokens_per_s, 6.0));
        assert_eq!(m.max_concurrent_requests, 2);
    }

    #[test]
    fn single_token_outputs_have_no_tpot_but_count_for_goodput() {
        let samples = vec![sample(0.0, 0.1, &[], 5, 1)];
        let m = compute(
            &samples,
            1.0,
            &[99.0],
            &Slos {
                tpot_s: Some(0.001),
                ..Default::default()
            },
        );
        assert_eq!(m.tpot.count, 0);
        assert_eq!(m.tpot.mean, 0.0);
        assert!(close(m.request_goodput.unwrap(), 1.0));
    }

    #[test]
    fn peak_throughput_buckets_by_second() {
        // Tokens at 0.5, 1.2, 1.4, 1.9 -> buckets [1, 3]
        let samples = vec![sample(0.0, 0.5, &[0.7, 0.2, 0.5], 1, 4)];
        let m = compute(&samples, 2.0, &[], &Slos::default());
        assert!(close(m.max_output_tokens_per_s, 3.0));
        assert!(m.request_goodput.is_none());
    }

    #[test]
    fn all_failed_gives_zeros_not_nan() {
        let samples = vec![RequestSample::default(); 3];
        let m = compute(&samples, 1.0, &[99.0], &Slos::default());
        assert_eq!(m.completed, 0);
        assert_eq!(m.ttft.mean, 0.0);
        assert_eq!(m.max_output_tokens_per_s, 0.0);
        assert!(!m.ttft.at(99.0).unwrap().is_nan());
    }
}
