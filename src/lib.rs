//! vllm-sentinel: synthetic probes against vLLM servers, measured exactly
//! as `vllm bench serve` measures.
//!
//! The modules form layers, each using only those below it (declared in
//! ARCHITECTURE.md and checked by the `layers` test), from the bottom:
//!
//! - [`text`], [`limits`], [`stats`], [`bounded_file`]; [`secret`]
//! - [`vocabulary`]: plain data every layer shares (run records, outcomes,
//!   pair keys, answers, GPU readings)
//! - [`client`], [`workload`]: the streaming client; prompts and arrivals
//! - [`config`]: the daemon's TOML configuration, validated
//! - [`telemetry`]: server and GPU readings beside the probes
//! - [`probe`], [`discovery`]: one run; a fleet's replicas
//! - [`store`]: SQLite runs, builds, baselines and evaluations
//! - [`verdict`]: every decision: detector, baselines, canary, drift,
//!   liveness
//! - [`metrics`], [`notify`], [`report`]: the registry, notifications,
//!   reports
//! - [`state`]: what the daemon knows of each target now
//! - [`http`], [`daemon`]: the exporter's routes; the wiring and workers
//! - [`sim`], [`selftest`]: the simulated vLLM server and the client's
//!   self-test

pub mod bounded_file;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod detection;
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
pub mod slo;
pub mod state;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod verdict;
pub mod vocabulary;
pub mod workload;
