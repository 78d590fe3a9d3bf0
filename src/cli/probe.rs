//! `vllm-sentinel probe`: flags named as in `vllm bench serve`
//! where they mean the same.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use vllm_sentinel::client::{Endpoint, SecretSource, Timeouts};
use vllm_sentinel::clock::Clock;
use vllm_sentinel::limits;
use vllm_sentinel::probe::{self, ProbeSpec};
use vllm_sentinel::report::{console, result_json};
use vllm_sentinel::stats::bench::Slos;
use vllm_sentinel::workload::dataset::Dataset;
use vllm_sentinel::workload::kinds::ScenarioKind;

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Server base URL, without /v1.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model to probe; by default the first one /v1/models lists.
    #[arg(long)]
    model: Option<String>,
    /// API flavour.
    #[arg(long, value_enum, default_value = "completions")]
    endpoint: Endpoint,
    /// Prompt length in tokens (as the server's /tokenize counts them).
    #[arg(long, default_value_t = 128)]
    input_len: u32,
    /// Output length in tokens (exact: ignore_eos is sent).
    #[arg(long, default_value_t = 64)]
    output_len: u32,
    /// Lengths are drawn uniformly from [L(1-r), L(1+r)].
    #[arg(long, default_value_t = 0.0)]
    range_ratio: f64,
    /// Most requests in flight at once.
    #[arg(long, alias = "max-concurrency", default_value_t = 8)]
    concurrency: usize,
    /// Number of measured requests.
    #[arg(long, alias = "num-prompts", default_value_t = 64)]
    num_requests: usize,
    /// Open-loop request rate (req/s); latency is measured from each
    /// request's intended send time. Without it the loop is closed.
    #[arg(long)]
    request_rate: Option<f64>,
    /// Gamma shape of the inter-arrival gaps (1.0 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Requests sent first and discarded.
    #[arg(long, alias = "num-warmups", default_value_t = 0)]
    warmup: usize,
    /// Percentiles to report, comma-separated.
    #[arg(long, default_value = "50,90,99")]
    metric_percentiles: String,
    /// SLOs for goodput, e.g. `ttft:500 tpot:50 e2el:2000` (milliseconds).
    #[arg(long, num_args = 1..)]
    goodput: Vec<String>,
    /// Write a result object with `vllm bench serve --save-result`'s keys.
    #[arg(long)]
    result_json: Option<PathBuf>,
    /// Environment variable holding the API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    api_key_env: String,
    /// File holding the API key (takes precedence over --api-key-env).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Seed for lengths, prompts and arrivals (random by default, so
    /// prompts differ between runs).
    #[arg(long)]
    seed: Option<u64>,
    /// Connect timeout, seconds.
    #[arg(long, default_value_t = 5.0)]
    connect_timeout: f64,
    /// Time allowed to the first token, seconds.
    #[arg(long, default_value_t = 120.0)]
    first_token_timeout: f64,
    /// Longest silence allowed between chunks after the first token,
    /// seconds.
    #[arg(long, default_value_t = 30.0)]
    stall_timeout: f64,
    /// Time allowed to a whole request, seconds.
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// Do not send ignore_eos (for servers that reject it); shorter outputs
    /// are then not counted as failures.
    #[arg(long)]
    no_ignore_eos: bool,
    /// Do not send min_tokens (for servers that reject it); by default it
    /// is sent equal to the output length along with ignore_eos, since
    /// ignore_eos alone lets models with extra stop tokens end early.
    #[arg(long)]
    no_min_tokens: bool,
    /// Skip prompt-length calibration through /tokenize.
    #[arg(long)]
    no_calibrate: bool,
    /// Send your own prompts: a JSONL file, one object per line with
    /// "prompt" (completions) or "messages" (chat) and an optional
    /// "max_tokens" (else --output-len), drawn in an order set by --seed.
    /// Input lengths are the server's count.
    #[arg(long)]
    dataset_path: Option<PathBuf>,
    /// Every request of the run starts with the same prefix of this many
    /// tokens (part of --input-len; a new prefix each run), and the run
    /// reports the server's prefix-cache hits and queries meanwhile.
    #[arg(long, default_value_t = 0)]
    shared_prefix_len: u32,
    /// What the requests ask for: text of exactly --output-len tokens, a
    /// JSON object matching a schema (response_format), or a tool call
    /// (tools, chat endpoint). Structured answers are checked; one that
    /// does not parse or match counts as invalid_output.
    #[arg(long, value_enum, default_value = "text")]
    kind: ScenarioKind,
    /// Turns per conversation with --kind multi_turn; --num-requests then
    /// counts conversations.
    #[arg(long, default_value_t = 3)]
    turns: u32,
}

fn parse_percentiles(text: &str) -> anyhow::Result<Vec<f64>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let p: f64 = s
                .trim()
                .parse()
                .with_context(|| format!("--metric-percentiles: {s:?} is not a number"))?;
            if !(0.0..=100.0).contains(&p) {
                bail!("--metric-percentiles: {p} is outside 0..100");
            }
            Ok(p)
        })
        .collect()
}

fn parse_goodput(items: &[String]) -> anyhow::Result<Slos> {
    let mut slos = Slos::default();
    for item in items {
        let (name, value) = item
            .split_once(':')
            .with_context(|| format!("--goodput: {item:?} is not NAME:MILLISECONDS"))?;
        let ms: f64 = value
            .parse()
            .with_context(|| format!("--goodput: {value:?} in {item:?} is not a number"))?;
        if ms.is_nan() || ms <= 0.0 {
            bail!("--goodput: {item:?} must be positive");
        }
        let seconds = Some(ms / 1000.0);
        match name {
            "ttft" => slos.ttft_s = seconds,
            "tpot" => slos.tpot_s = seconds,
            "e2el" => slos.e2el_s = seconds,
            other => bail!("--goodput: unknown metric {other:?} (use ttft, tpot or e2el)"),
        }
    }
    Ok(slos)
}

fn seconds(flag: &str, value: f64, max: Duration) -> anyhow::Result<Duration> {
    limits::seconds(flag, value, max).map_err(anyhow::Error::msg)
}

/// The base URL as the configuration file takes it: http(s), and no
/// credentials (they would show in errors; the key has its own flags).
fn base_url(url: &str) -> anyhow::Result<String> {
    let parsed =
        reqwest::Url::parse(url).map_err(|e| anyhow::anyhow!("--base-url: not a URL ({e})"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        bail!("--base-url must not carry credentials; use --api-key-env or --api-key-file");
    }
    if !matches!(parsed.scheme(), "http" | "https") {
        bail!("--base-url must be an http:// or https:// URL");
    }
    Ok(url.to_owned())
}

/// The request bounds from the command line, each within its range.
fn timeouts(args: &ProbeArgs) -> anyhow::Result<Timeouts> {
    Ok(Timeouts {
        connect: seconds(
            "--connect-timeout",
            args.connect_timeout,
            limits::MAX_CONNECT_TIMEOUT,
        )?,
        first_token: seconds(
            "--first-token-timeout",
            args.first_token_timeout,
            limits::MAX_REQUEST_TIMEOUT,
        )?,
        stall: seconds(
            "--stall-timeout",
            args.stall_timeout,
            limits::MAX_REQUEST_TIMEOUT,
        )?,
        request: seconds(
            "--request-timeout",
            args.request_timeout,
            limits::MAX_REQUEST_TIMEOUT,
        )?,
    })
}

pub async fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let api_key = match &args.api_key_file {
        Some(path) => SecretSource::File(path.clone()).load(false)?,
        None => SecretSource::Env(args.api_key_env.clone()).load(true)?,
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let timeouts = timeouts(&args)?;
    let dataset = match &args.dataset_path {
        Some(path) => Some(Arc::new(Dataset::load(path)?)),
        None => None,
    };
    let input_len = match &dataset {
        Some(d) => d.estimated_input_len(),
        None => args.input_len,
    };
    let base_url = base_url(&args.base_url)?;
    let spec = ProbeSpec {
        metrics_url: Some(format!("{}/metrics", base_url.trim_end_matches('/'))),
        base_url,
        model: args.model,
        endpoint: args.endpoint,
        api_key,
        timeouts,
        input_len,
        output_len: args.output_len,
        range_ratio: args.range_ratio,
        num_requests: args.num_requests,
        concurrency: Some(args.concurrency),
        request_rate: args.request_rate,
        burstiness: args.burstiness,
        warmup: args.warmup,
        percentiles: parse_percentiles(&args.metric_percentiles)?,
        slos: parse_goodput(&args.goodput)?,
        seed,
        run_id: format!("{:08x}", seed as u32),
        ignore_eos: !args.no_ignore_eos,
        min_tokens: !args.no_min_tokens,
        calibrate: !args.no_calibrate,
        dispatch_window: None,
        dataset,
        shared_prefix_len: args.shared_prefix_len,
        kind: args.kind,
        turns: args.turns,
        progress: None,
        headers: Default::default(),
        gateway: Default::default(),
        build_header: None,
    };
    spec.validate()?;
    let bar = ProgressBar::new(spec.num_requests as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {elapsed_precise} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // The result file is written beside its destination, opened before
    // the run: a place that cannot be written fails in a second, not
    // after the whole run, and its descriptor is held even when the run's
    // connections use up the rest. It replaces the destination only once
    // the run is done: a failed run leaves an earlier file as it was.
    let mut result_file = match &args.result_json {
        Some(path) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            let file = tempfile::NamedTempFile::new_in(dir)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Some((path, file))
        }
        None => None,
    };
    let progress = bar.clone();
    let on_complete = Arc::new(move |_: &vllm_sentinel::client::RequestRecord| progress.inc(1));
    let result = probe::run(&spec, Some(on_complete)).await;
    bar.finish_and_clear();
    let result = match result {
        Ok(result) => result,
        // The unwritten file goes with `result_file`.
        Err(e) => return Err(e.into()),
    };
    print!("{}", console::render(&spec, &result));
    if let Some((path, mut file)) = result_file.take() {
        // Local time, as `vllm bench serve` writes its date.
        let now = Clock::System.now().with_timezone(&chrono::Local);
        let json = result_json::build(&spec, &result, &now);
        let text = serde_json::to_vec(&json).context("encoding the result")?;
        let cannot = || format!("cannot write {}", path.display());
        std::io::Write::write_all(&mut file, &text)
            .and_then(|()| file.as_file().sync_all())
            .with_context(cannot)?;
        file.persist(path)
            .map_err(|e| e.error)
            .with_context(cannot)?;
    }
    Ok(if result.metrics.completed == 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
