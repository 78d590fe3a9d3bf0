//! One probe run end to end: find the model, build calibrated prompts,
//! send the workload, compute the metrics. Used by the `probe` command and
//! by the daemon alike.

mod prepare;
pub mod record;

use std::time::{Duration, Instant};

use crate::client::server_api::{ModelInfo, ServerApi, ServerError};
use crate::client::{
    ClientConfig, ClientError, Endpoint, GatewayRules, RequestHeaders, RequestRecord, Secret,
    StreamingClient, Timeouts,
};
use crate::stats::bench::{self, BenchMetrics, Slos};
use crate::vocabulary::records::PrefixCacheUse;
use crate::workload::dataset::SharedDataset;
use crate::workload::kinds::ScenarioKind;
use crate::workload::{self, LoadShape, OnComplete, conversation};

/// What to run against which server.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    pub base_url: String,
    /// `None`: the first model `/v1/models` lists.
    pub model: Option<String>,
    pub endpoint: Endpoint,
    pub api_key: Option<Secret>,
    pub timeouts: Timeouts,
    pub input_len: u32,
    pub output_len: u32,
    pub range_ratio: f64,
    pub num_requests: usize,
    pub concurrency: Option<usize>,
    pub request_rate: Option<f64>,
    pub burstiness: f64,
    pub warmup: usize,
    pub percentiles: Vec<f64>,
    pub slos: Slos,
    pub seed: u64,
    /// Appears in every `x-request-id` as `sentinel-<run_id>-<n>`.
    pub run_id: String,
    pub ignore_eos: bool,
    /// Send `min_tokens` equal to the output length along with `ignore_eos`.
    pub min_tokens: bool,
    /// Calibrate prompt lengths through `/tokenize` when the server has it.
    pub calibrate: bool,
    /// Send for this long at most (`num_requests` is then the cap).
    pub dispatch_window: Option<Duration>,
    /// Send these prompts instead of random ones.
    pub dataset: Option<SharedDataset>,
    /// Every request of the run starts with the same prefix of this many
    /// tokens (new each run), to probe the prefix cache; 0 for none.
    pub shared_prefix_len: u32,
    /// The server's `/metrics`, read before and after the measured requests
    /// of a run with a shared prefix for its prefix-cache counters.
    pub metrics_url: Option<String>,
    /// What the requests ask for: text, structured output, a tool call.
    pub kind: ScenarioKind,
    /// Turns per conversation of a multi-turn run; `num_requests` then
    /// counts conversations.
    pub turns: u32,
    /// Where the run's requests note their first tokens while in flight.
    pub progress: Option<std::sync::Arc<crate::client::progress::RunProgress>>,
    /// Headers every request carries besides the key (a gateway's).
    pub headers: RequestHeaders,
    /// What the answers of a gateway in front of the server say.
    pub gateway: GatewayRules,
    /// A response header naming the build that answered each request.
    pub build_header: Option<String>,
}

impl Default for ProbeSpec {
    fn default() -> Self {
        ProbeSpec {
            base_url: "http://127.0.0.1:8000".into(),
            model: None,
            endpoint: Endpoint::Completions,
            api_key: None,
            timeouts: Timeouts::default(),
            input_len: 128,
            output_len: 64,
            range_ratio: 0.0,
            num_requests: 64,
            concurrency: Some(8),
            request_rate: None,
            burstiness: 1.0,
            warmup: 0,
            percentiles: vec![50.0, 90.0, 99.0],
            slos: Slos::default(),
            seed: 0,
            run_id: "probe".into(),
            ignore_eos: true,
            min_tokens: true,
            calibrate: true,
            dispatch_window: None,
            dataset: None,
            shared_prefix_len: 0,
            metrics_url: None,
            kind: ScenarioKind::Text,
            turns: 3,
            progress: None,
            headers: RequestHeaders::default(),
            gateway: GatewayRules::default(),
            build_header: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("invalid probe settings: {0}")]
    Invalid(String),
}

/// The outcome of a run: raw records and the metrics derived from them.
#[derive(Debug)]
pub struct ProbeResult {
    pub model: ModelInfo,
    pub server_version: Option<String>,
    pub calibrated: bool,
    pub records: Vec<RequestRecord>,
    pub started: Instant,
    pub duration: Duration,
    pub metrics: BenchMetrics,
    /// The server's prefix cache during the measured requests, when the
    /// run shared a prefix and the server counts it.
    pub prefix_cache: Option<PrefixCacheUse>,
}

/// Whether a run's fingerprints change on (nearly) every request: three
/// or more, and more than half as many as the requests that carried one.
/// A fleet mid-rollout serves two builds (sometimes three) to many
/// requests each; a server whose fingerprint is new per request names no
/// build at all, and splitting its runs would make a build, a rollout and
/// a run of every request.
pub fn fingerprints_churn(distinct: usize, with_fingerprint: usize) -> bool {
    distinct >= 3 && distinct * 2 > with_fingerprint
}

impl ProbeResult {
    /// Whether this run's fingerprints churn (see [`fingerprints_churn`]).
    pub fn fingerprint_churn(&self) -> bool {
        let mut seen: Vec<&str> = self
            .records
            .iter()
            .filter_map(|r| r.system_fingerprint.as_deref())
            .collect();
        let with_fingerprint = seen.len();
        seen.sort_unstable();
        seen.dedup();
        fingerprints_churn(seen.len(), with_fingerprint)
    }

    /// The run as each build that served it saw it: one result per
    /// `system_fingerprint` and build header value, each with its own
    /// metrics over the same duration (throughputs are that build's
    /// share). Requests that name no build (failed ones, or a server that
    /// sends neither) go with the build that served the most requests. One
    /// build, or none: `None`.
    pub fn split_by_build(&self, percentiles: &[f64], slos: &Slos) -> Option<Vec<ProbeResult>> {
        let mut builds: Vec<(BuildKey<'_>, usize)> = Vec::new();
        for key in self.records.iter().filter_map(build_key) {
            match builds.iter_mut().find(|(b, _)| *b == key) {
                Some((_, n)) => *n += 1,
                None => builds.push((key, 1)),
            }
        }
        let fingerprints = {
            let mut distinct: Vec<&str> = builds.iter().filter_map(|(k, _)| k.0).collect();
            distinct.sort_unstable();
            distinct.dedup();
            distinct.len()
        };
        let with_fingerprint: usize = builds
            .iter()
            .filter(|(k, _)| k.0.is_some())
            .map(|(_, n)| n)
            .sum();
        if builds.len() < 2 || fingerprints_churn(fingerprints, with_fingerprint) {
            return None;
        }
        // Most requests first; ties by name, so the order is stable.
        builds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let largest = builds[0].0;
        let parts = builds
            .iter()
            .map(|(build, _)| {
                let records: Vec<RequestRecord> = self
                    .records
                    .iter()
                    .filter(|r| build_key(r).unwrap_or(largest) == *build)
                    .cloned()
                    .collect();
                let samples: Vec<_> = records.iter().map(|r| r.to_sample(self.started)).collect();
                ProbeResult {
                    model: self.model.clone(),
                    server_version: self.server_version.clone(),
                    calibrated: self.calibrated,
                    metrics: bench::compute(
                        &samples,
                        self.duration.as_secs_f64(),
                        percentiles,
                        slos,
                    ),
                    records,
                    started: self.started,
                    duration: self.duration,
                    prefix_cache: self.prefix_cache,
                }
            })
            .collect();
        Some(parts)
    }
}

/// What names the build that answered a request: its fingerprint and
/// what the build header said; `None` when it says neither.
type BuildKey<'a> = (Option<&'a str>, Option<&'a str>);

fn build_key(record: &RequestRecord) -> Option<BuildKey<'_>> {
    let key = (
        record.system_fingerprint.as_deref(),
        record.build_tag.as_deref(),
    );
    (key != (None, None)).then_some(key)
}

impl ProbeSpec {
    /// The longest output a request asks for: a dataset's lines may ask
    /// for more than the output length.
    fn longest_output(&self) -> u32 {
        self.dataset
            .as_ref()
            .map_or(self.output_len, |d| d.max_output(self.output_len))
    }

    /// Every number in its documented range ([`crate::limits`]), the same
    /// ranges the configuration file is held to.
    pub fn validate(&self) -> Result<(), ProbeError> {
        use crate::limits::*;
        let fail = |m: String| Err(ProbeError::Invalid(m));
        let count = |name: &str, v: u64, min: u64, max: u64| {
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(ProbeError::Invalid(format!(
                    "{name} {v} is out of range: must be between {min} and {max}"
                )))
            }
        };
        count(
            "the number of requests",
            self.num_requests as u64,
            1,
            MAX_REQUESTS,
        )?;
        count("the warm-up count", self.warmup as u64, 0, MAX_WARMUP)?;
        count("the input length", u64::from(self.input_len), 1, MAX_LEN)?;
        count("the output length", u64::from(self.output_len), 1, MAX_LEN)?;
        if let Some(c) = self.concurrency {
            count("the concurrency", c as u64, 1, MAX_CONCURRENCY)?;
        }
        if !(0.0..1.0).contains(&self.range_ratio) {
            return fail("the range ratio must be in [0, 1)".into());
        }
        if let Some(rate) = self.request_rate
            && !(MIN_REQUEST_RATE..=MAX_REQUEST_RATE).contains(&rate)
        {
            return fail(format!(
                "the request rate {rate:?} is out of range: must be between {MIN_REQUEST_RATE} and {MAX_REQUEST_RATE} requests/s"
            ));
        }
        if !(MIN_BURSTINESS..=MAX_BURSTINESS).contains(&self.burstiness) {
            return fail(format!(
                "the burstiness {:?} is out of range: must be between {MIN_BURSTINESS} and {MAX_BURSTINESS}",
                self.burstiness
            ));
        }
        if self.percentiles.iter().any(|p| !(0.0..=100.0).contains(p)) {
            return fail("percentiles must be between 0 and 100".into());
        }
        let t = &self.timeouts;
        for (name, d, max) in [
            ("connect", t.connect, MAX_CONNECT_TIMEOUT),
            ("first-token", t.first_token, MAX_REQUEST_TIMEOUT),
            ("request", t.request, MAX_REQUEST_TIMEOUT),
        ] {
            if d.is_zero() || d > max {
                return fail(format!(
                    "the {name} timeout {d:?} is out of range: must be above zero and at most {max:?}"
                ));
            }
        }
        if let Some(w) = self.dispatch_window
            && w > MAX_REQUEST_TIMEOUT
        {
            return fail(format!(
                "the run duration {w:?} is more than {MAX_REQUEST_TIMEOUT:?}"
            ));
        }
        if let Some(problem) = self
            .kind
            .endpoint_problem(self.dataset.as_deref(), self.endpoint)
        {
            return fail(problem);
        }
        if self.dataset.is_none() && self.shared_prefix_len >= self.input_len {
            return fail(format!(
                "the shared prefix ({} tokens) must be shorter than the input length ({})",
                self.shared_prefix_len, self.input_len
            ));
        }
        // A conversation's last turn carries every turn before it.
        let (turns, input_len) = match self.kind {
            ScenarioKind::MultiTurn => (
                u64::from(self.turns),
                self.turns
                    .saturating_mul(self.input_len.saturating_add(self.output_len)),
            ),
            _ => (1, self.input_len),
        };
        check_run_tokens(
            input_len,
            self.longest_output(),
            self.range_ratio,
            (self.num_requests as u64).saturating_mul(turns),
            self.warmup as u64,
        )
        .map_err(ProbeError::Invalid)
    }
}

/// Runs the probe. `on_complete` sees each measured request as it ends.
pub async fn run(
    spec: &ProbeSpec,
    on_complete: Option<OnComplete>,
) -> Result<ProbeResult, ProbeError> {
    spec.validate()?;
    let api = ServerApi::new(
        &spec.base_url,
        spec.api_key.as_ref(),
        spec.timeouts.connect.max(Duration::from_secs(10)),
    )?
    .with_headers(spec.headers.clone());
    let model = api.resolve_model(spec.model.as_deref()).await?;
    if let Some(max_model_len) = model.max_model_len {
        crate::limits::check_context(
            spec.input_len,
            spec.longest_output(),
            spec.range_ratio,
            max_model_len,
        )
        .map_err(ProbeError::Invalid)?;
    }
    let server_version = api.version().await.unwrap_or(None);
    let calibrator = spec.calibrate.then_some((&api, model.id.as_str()));
    let prepared = prepare::prepare(spec, calibrator).await?;
    let client = StreamingClient::new(ClientConfig {
        base_url: spec.base_url.clone(),
        endpoint: spec.endpoint,
        model: model.id.clone(),
        api_key: spec.api_key.clone(),
        timeouts: spec.timeouts,
        ignore_eos: spec.ignore_eos && spec.kind.exact_length(),
        min_tokens: spec.ignore_eos && spec.min_tokens && spec.kind.exact_length(),
        capture: spec.kind.capture(),
        extra: spec.kind.extra(spec.endpoint),
        check: spec.kind.check(),
        progress: spec.progress.clone(),
        headers: spec.headers.clone(),
        gateway: spec.gateway.clone(),
        build_header: spec.build_header.clone(),
    })?;
    let shape = LoadShape {
        concurrency: spec.concurrency,
        request_rate: spec.request_rate,
        burstiness: spec.burstiness,
        seed: spec.seed,
        dispatch_window: spec.dispatch_window,
    };
    let counters = match &spec.metrics_url {
        Some(url) if spec.shared_prefix_len > 0 => Some(PrefixCounters {
            http: crate::client::http::client_builder()
                .build()
                .map_err(|e| ClientError::Build(crate::client::http::error_chain(&e)))?,
            url,
            base_url: &spec.base_url,
            key: spec.api_key.as_ref(),
            model: &model.id,
        }),
        _ => None,
    };
    // The warm-up goes alone first when something comes between it and
    // the measured requests: conversations, or reading the counters (the
    // warm-up's prefix is another one).
    let apart = spec.kind == ScenarioKind::MultiTurn || counters.is_some();
    let warmup = if apart {
        workload::run(&client, prepared.warmup, Vec::new(), &shape, None).await;
        Vec::new()
    } else {
        prepared.warmup
    };
    let before = match &counters {
        Some(c) => c.read().await,
        None => None,
    };
    let output = if spec.kind == ScenarioKind::MultiTurn {
        let conversations = prepare::in_conversations(prepared.measured);
        let concurrency = spec.concurrency.unwrap_or(conversations.len());
        conversation::run(&client, conversations, concurrency, on_complete).await
    } else {
        workload::run(&client, warmup, prepared.measured, &shape, on_complete).await
    };
    let prefix_cache = match &counters {
        Some(c) => before
            .zip(c.read().await)
            .and_then(|(b, a)| PrefixCacheUse::between(&b, &a)),
        None => None,
    };
    let samples: Vec<_> = output
        .records
        .iter()
        .map(|r| r.to_sample(output.started))
        .collect();
    let duration = output.duration();
    let metrics = bench::compute(
        &samples,
        duration.as_secs_f64(),
        &spec.percentiles,
        &spec.slos,
    );
    Ok(ProbeResult {
        model,
        server_version,
        calibrated: prepared.calibrated,
        records: output.records,
        started: output.started,
        duration,
        metrics,
        prefix_cache,
    })
}

/// Where a run reads the server's prefix-cache counters.
struct PrefixCounters<'a> {
    http: reqwest::Client,
    url: &'a str,
    base_url: &'a str,
    key: Option<&'a Secret>,
    model: &'a str,
}

impl PrefixCounters<'_> {
    /// The server's load now; `None` when it cannot be read (the run goes
    /// on without the counters).
    async fn read(&self) -> Option<crate::vocabulary::records::ServerLoad> {
        crate::telemetry::read_load(
            &self.http,
            self.url,
            self.base_url,
            self.key,
            Duration::from_secs(10),
            Some(self.model),
        )
        .await
        .ok()
    }
}
