//! vllm-sentinel: synthetic probes against vLLM servers, measured exactly
//! as `vllm bench serve` measures.
//!
//! - [`client`]: streaming OpenAI client, SSE decoding, raw timings
//! - [`stats`]: percentiles and run metrics (pure functions)
//! - [`workload`]: prompts, arrival processes, concurrency
//! - [`report`]: console block and `--result-json` output
//! - [`sim`]: the simulated vLLM server
//! - [`selftest`]: the client's own capacity and timing error
//! - [`config`]: the daemon's TOML configuration, validated
//! - [`limits`]: the range of every number a probe takes
//! - [`probe`]: one probe run, start to finish, shared by the command line
//!   and the daemon
//! - [`records`]: run and request records as stored and exported
//! - [`secret`]: API keys, passwords, tokens: sources and redaction
//! - [`daemon`]: the always-on daemon: wiring, per-target workers and
//!   telemetry loops, verdicts
//! - [`http`], [`metrics`], [`telemetry`], [`status`]: the exporter, the
//!   metric families, server/GPU readings, and the status board
//! - [`store`]: SQLite runs, builds, baselines and verdicts
//! - [`detect`]: the regression detector and verdicts over stored runs
//! - [`notify`]: email, webhook and Alertmanager notifications
//! - [`text`]: server text made safe to keep: bounded, clean, redacted
//! - [`bounded_file`]: files the configuration names, read bounded

pub mod bounded_file;
pub mod client;
pub mod config;
pub mod daemon;
pub mod detect;
pub mod discovery;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod notify;
pub mod probe;
pub mod report;
pub mod secret;
pub mod selftest;
pub mod sim;
pub mod stats;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod vocabulary;
pub mod workload;
