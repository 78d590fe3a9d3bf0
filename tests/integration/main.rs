//! The integration tests, one binary with one module per area: the daemon
//! in-process or as a child process against simulators, hostile servers
//! and real tools (Prometheus, Alertmanager, nginx, an SMTP server,
//! promtool, kubectl). Helpers shared by every area are in `common`.
//!
//! Run one area with a filter on its module, e.g.
//! `cargo test --release --test integration daemon::`. A test whose tool or
//! fixture is missing prints `SKIPPED: <test>: <what>` on stderr and
//! returns, except under `CI=true`, where it fails (`common::skip`).

mod common;

mod alert_rules;
mod api_pages;
mod build_header;
mod cli_baseline;
mod cli_errors;
mod cli_files;
mod crash_recovery;
mod daemon;
mod dashboards_prometheus;
mod deploy_files;
mod descriptors;
mod detection;
mod drift;
mod exporter_logins;
mod exporter_tls;
mod fleet_discovery;
mod fleet_nginx;
mod gateway_nginx;
mod hostile_builds;
mod hostile_cli;
mod hostile_daemon;
mod hostile_discovery;
mod hostile_memory;
mod hostile_stream;
mod http_surface;
mod kubernetes;
mod kubernetes_fleet;
mod kubernetes_service;
mod kubernetes_watch_binary;
mod layers;
mod liveness;
mod notify_ends;
mod notify_failures;
mod notify_tls;
mod probe_against_sim;
mod real_vllm;
mod real_vllm_liveness;
mod real_vllm_regression;
mod real_vllm_restart;
mod real_vllm_workloads;
mod realworld_pages;
mod regression_e2e;
mod regression_load;
mod replay;
mod run_cut;
mod series_budget;
mod server_restart;
mod shards;
mod sim_wedge;
mod slo_burn;
mod slo_outage;
mod slo_rules;
mod store_busy;
mod telemetry_sources;
mod workloads;
mod workloads_prompts;
