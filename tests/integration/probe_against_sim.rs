//! The probe engine against the in-process simulator: numbers agree with
//! the injected latencies, token totals with what the simulator served,
//! and every injected fault ends in its outcome label while the rest of the
//! run is counted correctly.

use std::collections::BTreeMap;
use std::time::Duration;

use vllm_sentinel::client::{Endpoint, Outcome, Timeouts};
use vllm_sentinel::probe::{self, ProbeSpec};
use vllm_sentinel::sim::{Fault, SimConfig, SimHandle};

fn spec(base_url: String) -> ProbeSpec {
    ProbeSpec {
        base_url,
        input_len: 32,
        output_len: 8,
        num_requests: 16,
        concurrency: Some(4),
        run_id: "t".into(),
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            first_token: Duration::from_millis(800),
            stall: Duration::from_millis(1200),
            request: Duration::from_millis(1500),
        },
        ..ProbeSpec::default()
    }
}

fn outcomes(result: &probe::ProbeResult) -> BTreeMap<Outcome, usize> {
    let mut map = BTreeMap::new();
    for r in &result.records {
        *map.entry(r.outcome).or_default() += 1;
    }
    map
}

#[tokio::test]
async fn latencies_and_tokens_match_what_the_simulator_served() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 30.0,
            itl_ms: 5.0,
            empty_text_every: 3,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.warmup = 2;
    let result = probe::run(&s, None).await.unwrap();
    let m = &result.metrics;
    assert_eq!((m.completed, m.failed), (16, 0));
    // The simulator saw warm-up and measured requests; only the latter count.
    let stats = sim.state.stats();
    assert_eq!(stats.requests, 18);
    let ids = sim.state.request_ids();
    assert!(ids.contains(&"sentinel-t-0".to_owned()) && ids.contains(&"sentinel-t-17".to_owned()));
    // Calibrated through /tokenize: exactly the requested prompt length.
    assert!(result.calibrated);
    assert_eq!(m.total_input_tokens, 16 * 32);
    assert_eq!(m.total_output_tokens, 16 * 8);
    assert_eq!(stats.output_tokens, 18 * 8);
    // Empty-text chunks still count: 8 chunks per request, 7 gaps.
    assert!(result.records.iter().all(|r| r.chunk_times.len() == 8));
    assert_eq!(m.itl.count, 16 * 7);
    // Injected 30 ms TTFT and 5 ms ITL; the client adds well under 5 ms.
    assert!(
        m.ttft.median >= 0.030 && m.ttft.median < 0.035,
        "ttft {}",
        m.ttft.median
    );
    assert!(
        m.itl.median >= 0.004 && m.itl.median < 0.007,
        "itl {}",
        m.itl.median
    );
    assert!((m.tpot.mean - 0.005).abs() < 0.002, "tpot {}", m.tpot.mean);
    assert!(m.e2el.median >= 0.065, "e2el {}", m.e2el.median);
    assert_eq!(result.server_version.as_deref(), Some("0.32.0"));
    assert!(result.records.iter().all(|r| {
        r.system_fingerprint
            .as_deref()
            .is_some_and(|f| f.starts_with("vllm-0.32.0-"))
    }));
    sim.stop().await;
}

#[tokio::test]
async fn chat_endpoint_counts_the_role_chunk_like_vllm() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 10.0,
            itl_ms: 2.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.endpoint = Endpoint::Chat;
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(result.metrics.completed, 16);
    // Role chunk + 8 content chunks, all choice-bearing.
    assert!(result.records.iter().all(|r| r.chunk_times.len() == 9));
    // The chat template adds tokens on the server; usage is what we report.
    assert!(result.metrics.total_input_tokens > 16 * 32);
    assert_eq!(result.metrics.total_output_tokens, 16 * 8);
    sim.stop().await;
}

#[tokio::test]
async fn open_loop_measures_from_the_intended_send_time() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 5.0,
            itl_ms: 1.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.concurrency = None;
    s.request_rate = Some(40.0);
    s.num_requests = 20;
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(result.metrics.completed, 20);
    // Starts follow the precomputed arrivals: spread over about 0.5 s.
    let last_start = result
        .records
        .iter()
        .map(|r| r.start.duration_since(result.started))
        .max()
        .unwrap();
    assert!(last_start > Duration::from_millis(150), "{last_start:?}");
    assert!(result.records.iter().all(|r| r.start <= r.sent));
    sim.stop().await;
}

#[tokio::test]
async fn concurrency_is_never_exceeded() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 20.0,
            itl_ms: 2.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.num_requests = 24;
    s.concurrency = Some(3);
    let result = probe::run(&s, None).await.unwrap();
    // At every request's send, count the requests in flight.
    for r in &result.records {
        let in_flight = result
            .records
            .iter()
            .filter(|o| o.sent <= r.sent && o.end > r.sent)
            .count();
        assert!(in_flight <= 3, "{in_flight} in flight");
    }
    sim.stop().await;
}

/// Each fault on every 4th request: 4 of 16 fail with the fault's label,
/// the other 12 complete and are counted as usual.
#[tokio::test]
async fn every_fault_gets_its_outcome_and_the_rest_is_counted() {
    let cases = [
        (Fault::Http500, Outcome::Http5xx),
        (Fault::Http429, Outcome::Http4xx),
        (Fault::StreamError, Outcome::StreamError),
        (Fault::Hang, Outcome::NoFirstToken),
        (Fault::Stall, Outcome::Stalled),
        (Fault::Truncate, Outcome::StreamError),
        (Fault::Garbage, Outcome::StreamError),
        (Fault::ShortOutput, Outcome::ShortOutput),
    ];
    for (fault, expected) in cases {
        let sim = SimHandle::start(
            "127.0.0.1:0",
            SimConfig {
                ttft_ms: 5.0,
                itl_ms: 1.0,
                fault: Some(fault),
                fault_every: 4,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let mut s = spec(sim.base_url());
        s.calibrate = false;
        let result = probe::run(&s, None).await.unwrap();
        let counts = outcomes(&result);
        assert_eq!(counts.get(&expected), Some(&4), "{fault:?}: {counts:?}");
        assert_eq!(counts.get(&Outcome::Ok), Some(&12), "{fault:?}: {counts:?}");
        assert_eq!(
            (result.metrics.completed, result.metrics.failed),
            (12, 4),
            "{fault:?}"
        );
        assert_eq!(result.metrics.total_output_tokens, 12 * 8, "{fault:?}");
        assert!(
            result
                .records
                .iter()
                .filter(|r| !r.outcome.is_ok())
                .all(|r| r.error.is_some()),
            "{fault:?}: failures carry a reason"
        );
        assert_eq!(sim.state.stats().faults_injected, 4, "{fault:?}");
        sim.stop().await;
    }
}

/// A simulator whose every `nth` stream goes silent after its first
/// tokens, and a probe of it with a long whole-request limit.
async fn stalling(nth: u64) -> (SimHandle, ProbeSpec) {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 5.0,
            itl_ms: 1.0,
            fault: Some(Fault::Stall),
            fault_every: nth,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.calibrate = false;
    s.timeouts.request = Duration::from_secs(60);
    (sim, s)
}

/// A stream that goes silent after its first token fails by the stall
/// bound, long before the whole-request timeout would end it.
#[tokio::test]
async fn a_stalled_stream_fails_at_the_stall_timeout_not_the_request_timeout() {
    let (sim, mut s) = stalling(4).await;
    s.timeouts.stall = Duration::from_millis(300);
    let result = probe::run(&s, None).await.unwrap();
    let stalled: Vec<_> = result
        .records
        .iter()
        .filter(|r| r.outcome == Outcome::Stalled)
        .collect();
    assert_eq!(stalled.len(), 4, "{:?}", outcomes(&result));
    for r in stalled {
        let error = r.error.as_deref().unwrap_or_default();
        assert!(
            error.contains("chunks: no token for 300ms") && error.starts_with("stalled after "),
            "{error}"
        );
        assert!(!r.chunk_times.is_empty(), "the first token came");
        let silent = r.end.duration_since(*r.chunk_times.last().unwrap());
        assert!(
            silent >= Duration::from_millis(300) && silent < Duration::from_secs(30),
            "ended {silent:?} after the last chunk"
        );
    }
    sim.stop().await;
}

/// An engine that dies mid-run: the API server accepts, streams the first
/// tokens, then holds every connection silently. The run ends within one
/// stall timeout (plus a second), with the requests in flight failed as
/// stalled and no more sent; not one stall timeout per request left.
#[tokio::test]
async fn a_server_whose_engine_died_ends_the_run_within_one_stall_timeout() {
    let (sim, mut s) = stalling(1).await;
    s.num_requests = 40;
    s.timeouts.stall = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let result = probe::run(&s, None).await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the run took {took:?} with a 2 s stall timeout"
    );
    assert_eq!(outcomes(&result).get(&Outcome::Stalled), Some(&4));
    assert_eq!(result.records.len(), 4, "no request sent after the loss");
    for r in &result.records {
        let error = r.error.as_deref().unwrap_or_default();
        assert!(error.starts_with("stalled after "), "{error}");
    }
    sim.stop().await;
}

/// A wedged engine that loses the run in its warm-up: no measured request
/// is sent, and the warm-up's failure is what the run shows (never "0
/// completed, 0 failed").
#[tokio::test]
async fn a_run_lost_in_its_warm_up_counts_the_warm_up() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    sim.state.set_wedged(true);
    let mut s = spec(sim.base_url());
    s.calibrate = false;
    s.warmup = 1;
    s.timeouts.first_token = Duration::from_millis(300);
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(outcomes(&result).get(&Outcome::NoFirstToken), Some(&1));
    assert_eq!((result.metrics.completed, result.metrics.failed), (0, 1));
    assert_eq!(sim.state.stats().requests, 1, "nothing sent after the loss");
    sim.state.set_wedged(false);
    sim.stop().await;
}

/// Requests cut by the whole-request limit while the server still streams
/// are timeouts, but the server is not lost: every request is sent.
#[tokio::test]
async fn requests_past_the_request_limit_on_a_live_server_do_not_end_the_run() {
    let sim = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 5.0,
            itl_ms: 20.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let mut s = spec(sim.base_url());
    s.calibrate = false;
    // 100 tokens at 20 ms: 2 s of streaming against a 500 ms limit.
    s.output_len = 100;
    s.timeouts.request = Duration::from_millis(500);
    let result = probe::run(&s, None).await.unwrap();
    assert_eq!(result.records.len(), 16, "{:?}", outcomes(&result));
    assert_eq!(outcomes(&result).get(&Outcome::Timeout), Some(&16));
    assert!(result.records.iter().all(|r| !r.server_silent));
    sim.stop().await;
}

#[tokio::test]
async fn unreachable_server_fails_each_request_as_connect() {
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let s = spec(sim.base_url());
    // Resolve the model while the server is up, then take it away.
    let client = vllm_sentinel::client::StreamingClient::new(vllm_sentinel::client::ClientConfig {
        base_url: s.base_url.clone(),
        endpoint: Endpoint::Completions,
        model: "sim-model".into(),
        api_key: None,
        timeouts: s.timeouts,
        ignore_eos: true,
        min_tokens: true,
        capture: Default::default(),
        extra: None,
        check: None,
        progress: None,
        headers: Default::default(),
        gateway: Default::default(),
        build_header: None,
    })
    .unwrap();
    sim.stop().await;
    let request = vllm_sentinel::client::PreparedRequest {
        request_id: "x".into(),
        prompt: "hello".into(),
        max_tokens: 4,
        ..Default::default()
    };
    let record = client.send(&request, None).await;
    assert_eq!(record.outcome, Outcome::Connect, "{:?}", record.error);
}
