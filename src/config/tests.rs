//! The configuration parsed and validated: defaults, and every error on its field.

use super::*;
use std::time::Duration;

pub(super) const MINIMAL: &str = r#"
[[targets]]
name = "a"
base_url = "http://127.0.0.1:8000/"

[[scenarios]]
name = "s"
input_len = 16
output_len = 8
"#;

/// Every error of both steps, the parse's and the named files'.
pub(super) fn errors_of(text: &str) -> Vec<String> {
    match Config::from_text(text, "test.toml") {
        Ok(_) => Vec::new(),
        Err(e) => e.field_errors().iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn minimal_config_gets_the_documented_defaults() {
    let c = Config::parse(MINIMAL, "t").unwrap();
    assert_eq!(c.exporter.listen.to_string(), "127.0.0.1:9464");
    assert_eq!(c.store.retention, Duration::from_secs(90 * 86400));
    let t = &c.targets[0];
    assert_eq!(t.base_url, "http://127.0.0.1:8000");
    assert_eq!(
        t.metrics_url.as_deref(),
        Some("http://127.0.0.1:8000/metrics")
    );
    assert_eq!(t.scenarios, vec!["s"]);
    let s = &c.scenarios[0];
    assert_eq!((s.input_len, s.output_len, s.concurrency), (16, 8, 1));
    assert_eq!(s.length, RunLength::Requests(16));
    assert_eq!(c.schedule_for(t, s).expression, "*/10 * * * *");
}

#[test]
fn the_shipped_example_is_valid_and_expands_concurrency_scaling() {
    let text = include_str!("../../config/example.toml");
    let c = Config::parse(text, "example.toml").unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<_> = c.scenarios.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"scaling-c2") && names.contains(&"scaling-c32"));
    let single = c.scenario("single-user-latency").unwrap();
    assert_eq!((single.input_len, single.output_len), (512, 128));
    assert_eq!(single.slos.ttft_s, Some(0.5));
    let mixed = c.scenario("mixed-traffic").unwrap();
    assert_eq!(mixed.range_ratio, 0.5);
    assert_eq!(
        mixed.length,
        RunLength::Duration {
            duration: Duration::from_secs(60),
            max_requests: 200
        }
    );
    // The target's schedule wins over the scenario's.
    let t = &c.targets[0];
    let short = c.scenario("short-context-throughput").unwrap();
    assert_eq!(c.schedule_for(t, short).expression, "*/5 * * * *");
    // Its `[detector]` says "defaults shown": copied, it must be the
    // detector the README's figures were measured with.
    assert_eq!(c.verdict_policy, verdict_policy::VerdictPolicy::default());
}

#[test]
fn every_preset_alone_is_a_valid_scenario() {
    for p in presets::PRESETS {
        let text = format!(
            "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n[[scenarios]]\nname = \"x\"\npreset = \"{}\"\n",
            p.name
        );
        let c = Config::parse(&text, "t").unwrap_or_else(|e| panic!("{}: {e}", p.name));
        assert_eq!(c.scenarios.len(), p.concurrency.len());
        assert_eq!(c.scenarios[0].input_len, p.input_len);
    }
}

/// Each invalid file with the exact errors it must produce, all at once.
#[test]
fn invalid_configs_name_the_field_and_the_problem() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[[targets]]\nname = \"local\"\nbase_url = \"http://h:1\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n",
            &[
                "targets[0].name: \"local\" is this host's GPUs' target label while telemetry.nvml is on; rename the target, or set telemetry.nvml = false",
            ],
        ),
        (
            "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\nbogus = 1\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n",
            &[
                "targets[0].bogus: unknown key; expected one of: api_key_env, api_key_file, base_url, build_header, dcgm_match, dcgm_url, endpoint, gateway, headers, heartbeat, jitter, metrics_url, model, name, replicas, scenarios, schedule, server_metrics, timeouts",
            ],
        ),
        (
            "[[targets]]\nname = \"a b\"\nbase_url = \"ftp://h\"\n[[scenarios]]\nname = \"s\"\ninput_len = 0\noutput_len = \"x\"\n",
            &[
                "scenarios[0].input_len: 0 is out of range: must be between 1 and 1048576",
                "scenarios[0].output_len: expected an integer, found a string",
                "targets[0].name: \"a b\" must be 1-64 characters of letters, digits, '-', '_' or '.'",
                "targets[0].base_url: \"ftp://h\" must be an http:// or https:// URL",
            ],
        ),
        (
            "[[targets]]\nname = \"a\"\nbase_url = \"http://user:pw@h:1\"\nscenarios = [\"nope\"]\nschedule = \"* * *\"\n[targets.timeouts]\nconnect = \"soon\"\n[[scenarios]]\nname = \"s\"\npreset = \"huge\"\n",
            &[
                "scenarios[0].preset: no preset named \"huge\"; presets: single-user-latency, short-context-throughput, long-context, decode-stress, mixed-traffic, concurrency-scaling",
                "scenarios[0].input_len: is required (or name a preset, or a dataset_path)",
                "scenarios[0].output_len: is required (or name a preset, or a dataset_path)",
                "targets[0].base_url: must not carry credentials; use api_key_env or api_key_file",
                "targets[0].timeouts.connect: \"soon\" is not a duration (expected number at 0); write e.g. \"30s\", \"5m\", \"250ms\"",
                "targets[0].scenarios[0]: no scenario named \"nope\"; defined: ",
                "targets[0].schedule: \"* * *\" has 3 fields; write 5 (min hour day month weekday) or 6 with seconds first",
            ],
        ),
        (
            "[exporter]\nlisten = \"nowhere\"\n[scheduler]\nbackoff_initial = \"10m\"\nbackoff_max = \"1m\"\n",
            &[
                "exporter.listen: \"nowhere\" is not an address like 127.0.0.1:9464",
                "scheduler.backoff_max: must not be shorter than backoff_initial",
                "targets: at least one [[targets]] is required",
                "scenarios: at least one [[scenarios]] is required",
            ],
        ),
        (
            "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\napi_key_env = \"K\"\napi_key_file = \"/k\"\n[[targets]]\nname = \"a\"\nbase_url = \"http://h:2\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\nnum_requests = 3\nduration = \"1m\"\nrange_ratio = 1\n[scenarios.slo]\nttft = \"0s\"\n",
            &[
                "scenarios[0].range_ratio: must be below 1",
                "scenarios[0].duration: set either num_requests or duration, not both",
                "scenarios[0].slo.ttft: must be longer than zero",
                "targets[0].api_key_env: set either api_key_env or api_key_file, not both",
                "targets[1].name: \"a\" is used by more than one target",
            ],
        ),
        (
            "[exporter]\nhistograms = \"medium\"\n[cluster]\nshard = \"2/2\"\n[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n",
            &[
                "exporter.histograms: \"medium\" is not \"off\", \"coarse\" or \"fine\"",
                "cluster.shard: \"2/2\": i counts from 0, so it must be below N (2)",
            ],
        ),
        (
            // Numbers that once passed and then panicked or exhausted memory.
            "[store]\nretention = \"200000000000000d\"\n[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n[targets.timeouts]\nrequest = \"200000000000000d\"\nfirst_token = \"2d\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1048576\noutput_len = 64\nnum_requests = 200\nwarmup = 0\n",
            &[
                "store.retention: \"200000000000000d\" is longer than the 3650 days any duration may be",
                "scenarios[0].input_len: 200 requests and 0 warm-up requests of up to 1048640 tokens each are 209728000 tokens, more than the 16777216 one run may hold; send fewer or shorter requests",
                "targets[0].timeouts.first_token: 2days is more than the 1day allowed",
                "targets[0].timeouts.request: \"200000000000000d\" is longer than the 3650 days any duration may be",
            ],
        ),
        (
            // Schedules: a year field, a jitter past the next tick, a
            // jitter without a schedule, and the cron crate's own errors
            // on one line with the field path.
            "[scheduler]\njitter = \"1m\"\n[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\nschedule = \"0 0 * * * * 2030\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\nschedule = \"*/10 * * * * *\"\njitter = \"1h\"\n[[scenarios]]\nname = \"t\"\ninput_len = 1\noutput_len = 1\nschedule = \"*/0 * * * *\"\n",
            &[
                "scheduler.jitter: applies only with schedule",
                "scenarios[0].jitter: 1h is longer than the 10s between two ticks of \"*/10 * * * * *\": a run would be pushed past the next tick",
                "scenarios[1].schedule: \"*/0 * * * *\" is not a cron expression: the minute field \"*/0\": range step cannot be zero",
                "targets[0].schedule: \"0 0 * * * * 2030\" has 7 fields; a year field is not supported: write 5 (min hour day month weekday) or 6 with seconds first",
            ],
        ),
        (
            // Replicas: the cap's range, and a static list longer than it.
            "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n[targets.replicas]\nstatic = [\"http://a:1\", \"http://b:1\", \"http://c:1\"]\nmax_replicas = 2\n[[targets]]\nname = \"b\"\nbase_url = \"http://h:1\"\n[targets.replicas]\nfile_sd = \"/x.json\"\nmax_replicas = 0\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n",
            &[
                "targets[0].replicas.static: lists 3 replicas, more than max_replicas (2)",
                "targets[1].replicas.max_replicas: 0 is out of range: must be between 1 and 4096",
            ],
        ),
    ];
    for (text, expected) in cases {
        let got = errors_of(text);
        let want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "for config:\n{text}");
    }
}

#[test]
fn a_jitter_within_the_shortest_gap_is_kept() {
    let text = "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\nschedule = \"0,5 * * * *\"\njitter = \"5m\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n";
    let c = Config::parse(text, "t").unwrap_or_else(|e| panic!("{e}"));
    let schedule = c.targets[0].schedule.as_ref().unwrap();
    assert_eq!(schedule.jitter, Duration::from_secs(300));
    let longer = text.replace("\"5m\"", "\"6m\"");
    assert_eq!(
        errors_of(&longer),
        [
            "targets[0].jitter: 6m is longer than the 5m between two ticks of \"0,5 * * * *\": a run would be pushed past the next tick"
        ]
    );
}

#[test]
fn syntax_errors_say_where() {
    let e = Config::parse("[[targets]\nname=", "bad.toml").unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("bad.toml is not valid TOML:"), "{text}");
    assert!(text.contains("line 1"), "{text}");
}

#[test]
fn a_target_selects_expanded_scenarios_by_their_written_name_only() {
    let text = |selected: &str| {
        format!(
            "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\nscenarios = [{selected}]\n\
[[scenarios]]\nname = \"short-context\"\npreset = \"short-context-throughput\"\n\
[[scenarios]]\nname = \"scaling\"\npreset = \"concurrency-scaling\"\n"
        )
    };
    let c = Config::parse(&text("\"scaling\""), "t").unwrap();
    assert_eq!(
        c.targets[0].scenarios,
        vec![
            "scaling-c2",
            "scaling-c4",
            "scaling-c8",
            "scaling-c16",
            "scaling-c32"
        ]
    );
    let c = Config::parse(&text("\"scaling-c8\""), "t").unwrap();
    assert_eq!(c.targets[0].scenarios, vec!["scaling-c8"]);
    // "short" is no scenario, although "short-context" starts with "short-c".
    let errors = errors_of(&text("\"short\""));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("targets[0].scenarios[0]: no scenario named \"short\""));
}

#[test]
fn detector_and_notify_sections_default_and_name_their_problems() {
    let c = Config::parse(MINIMAL, "t").unwrap();
    assert_eq!(
        c.verdict_policy,
        crate::config::verdict_policy::VerdictPolicy::default()
    );
    assert_eq!(c.verdict_policy.runs_for_verdict(), 5);
    // The first run after warm-up alone; without that rule the upgrade's
    // fewest runs; without any level beyond doubt, a confirmed verdict's.
    let mut policy = c.verdict_policy.clone();
    assert_eq!(policy.runs_for_first_verdict(), 3);
    // A minimum of one run leaves no first run to judge alone.
    let one_run = crate::config::verdict_policy::VerdictPolicy {
        upgrade_min_candidate_runs: 1,
        upgrade_decisive_q: 0.0,
        ..policy.clone()
    };
    assert_eq!(one_run.runs_for_first_verdict(), one_run.runs_for_verdict());
    policy.upgrade_first_run_q = 0.0;
    assert_eq!(policy.runs_for_first_verdict(), 4);
    policy.upgrade_decisive_q = 0.0;
    assert_eq!(policy.runs_for_first_verdict(), 5);
    assert!(c.notify.email.is_none() && c.notify.webhooks.is_empty());

    let good = format!(
        "{MINIMAL}[detector]\nthreshold = 0.15\nbaseline_runs = 40\nyoung_hurst = 0.8\nmeasured_stretches = 0\ndecisive_q = 1e-9\nupgrade_decisive_q = 1e-7\nupgrade_first_run_q = 1e-10\nsettled_tail_df = 7\nupgrade_candidate_window = 60\nload_covariate = false\nheavy_tails = false\nexact_median_variance = true\nphase_ratios = false\n[notify]\nexternal_url = \"https://sentinel.example\"\n[notify.email]\nsmtp_host = \"smtp.example\"\nusername_env = \"U\"\npassword_env = \"P\"\nfrom = \"s@example.com\"\nto = [\"a@example.com\"]\n[[notify.webhooks]]\nurl_env = \"SLACK_URL\"\n[notify.alertmanager]\nurl = \"http://am:9093\"\n"
    );
    let c = Config::from_text(&good, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.verdict_policy.detector.threshold, 0.15);
    assert_eq!(c.verdict_policy.baseline_runs, 40);
    assert_eq!(c.verdict_policy.young_hurst, 0.8);
    assert!(!c.verdict_policy.detector.phase_ratios);
    assert_eq!(c.verdict_policy.detector.measured_stretches, 0);
    assert_eq!(c.verdict_policy.detector.decisive_q, 1e-9);
    assert_eq!(c.verdict_policy.upgrade_decisive_q, 1e-7);
    assert_eq!(c.verdict_policy.upgrade_first_run_q, 1e-10);
    assert_eq!(c.verdict_policy.settled_tail_df, 7.0);
    assert_eq!(c.verdict_policy.upgrade_candidate_window, 60);
    assert!(!c.verdict_policy.detector.load_covariate);
    assert!(!c.verdict_policy.detector.heavy_tails);
    assert!(c.verdict_policy.detector.exact_median_variance);
    let email = c.notify.email.unwrap();
    assert_eq!(
        (email.smtp_port, email.security),
        (587, detector_notify::SmtpSecurity::StartTls)
    );
    assert!(matches!(
        c.notify.webhooks[0].url,
        detector_notify::WebhookUrl::Secret(_)
    ));
    assert_eq!(
        c.notify.alertmanager.unwrap().resend_interval,
        Duration::from_secs(60)
    );

    let bad = format!(
        "{MINIMAL}[detector]\nthreshold = -1\nyoung_hurst = 0.3\nsettled_tail_df = 2\ndecisive_q = 0.01\nupgrade_decisive_q = 0.002\nupgrade_first_run_q = 0.003\nconfirm_needed = 5\nupgrade_confirm_needed = 4\nupgrade_min_candidate_runs = 13\nmin_baseline_runs = 50\nbogus = true\n[notify]\ngroup_wait = \"soon\"\n[notify.email]\nsecurity = \"ssl\"\nusername_env = \"U\"\nfrom = \"nobody\"\n[[notify.webhooks]]\nurl = \"http://u:p@hook\"\n[notify.alertmanager]\nresend_interval = \"1m\"\n"
    );
    assert_eq!(
        errors_of(&bad),
        vec![
            "detector.threshold: -1 is out of range: must be between 0 and 10",
            "detector.young_hurst: 0.3 is out of range: must be between 0.5 and 0.95",
            "detector.settled_tail_df: 2 is out of range: must be 0 (assume no tails) or at least 3",
            "detector.decisive_q: 0.01 is more than fdr_q (0.001): a slowdown beyond doubt must first be one beyond the noise",
            "detector.upgrade_decisive_q: 0.002 is more than fdr_q (0.001): a slowdown beyond doubt must first be one beyond the noise",
            "detector.upgrade_first_run_q: 0.003 is more than fdr_q (0.001): a slowdown beyond doubt must first be one beyond the noise",
            "detector.confirm_needed: 5 is more than confirm_window (3)",
            "detector.upgrade_confirm_needed: 4 is more than confirm_window (3)",
            "detector.min_baseline_runs: 50 is more than baseline_runs (30): no baseline could ever be judged",
            "detector.upgrade_min_candidate_runs: 13 is not less than candidate_window (12): no run of an upgrade would be left where upgrade_confirm_needed applies",
            "detector.bogus: unknown key; expected one of: alert_on_p99, baseline_runs, canary_window, candidate_window, confidence, confirm_needed, confirm_window, correlation, decisive_q, drift_logprob_shift, drift_position, drift_share, exact_median_variance, fdr_q, heavy_tails, load_covariate, load_ks_alpha, load_min_difference, log_test, max_new_builds_per_hour, measured_stretches, min_baseline_runs, min_canary_requests, min_candidate_runs, noise_runs, phase_ratios, rollout_timeout, scan_min_runs, settled_tail_df, spell_runs, threshold, upgrade_candidate_window, upgrade_confirm_needed, upgrade_decisive_q, upgrade_first_run_q, upgrade_min_candidate_runs, upgrade_round_gap, upgrade_rounds, warmup_runs, young_hurst",
            "notify.group_wait: \"soon\" is not a duration (expected number at 0); write e.g. \"30s\", \"5m\", \"250ms\"",
            "notify.email.security: \"ssl\" must be \"starttls\", \"tls\" or \"none\"",
            "notify.email.smtp_host: is required",
            "notify.email.password_env: username and password are set together or not at all",
            "notify.email.from: \"nobody\" is not an email address",
            "notify.email.to: needs at least one address",
            "notify.webhooks[0].url: must not carry credentials; put a secret URL in url_env or url_file",
            "notify.alertmanager.url: is required",
        ]
    );
    let one_run = format!(
        "{MINIMAL}[detector]\nmin_candidate_runs = 1\nmin_baseline_runs = 0\nupgrade_min_candidate_runs = 1\n"
    );
    assert_eq!(
        errors_of(&one_run),
        vec![
            "detector.min_candidate_runs: 1 is out of range: must be between 2 and 100000",
            "detector.min_baseline_runs: 0 is out of range: must be between 2 and 100000",
            "detector.upgrade_min_candidate_runs: 1 is out of range: must be between 2 and 100000",
        ]
    );
}

#[test]
fn replicas_default_to_both_one_at_a_time_and_name_their_problems() {
    let text = "[[targets]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:8000/\"\n\
[targets.replicas]\nstatic = [\"http://10.0.0.5:8000/\", \"http://10.0.0.6:8000\"]\n\
[[scenarios]]\nname = \"s\"\ninput_len = 16\noutput_len = 8\n";
    let c = Config::parse(text, "t").unwrap();
    let r = c.targets[0].replicas.clone().unwrap();
    assert_eq!(
        r.source,
        ReplicaSource::Static(vec![
            "http://10.0.0.5:8000".into(),
            "http://10.0.0.6:8000".into()
        ])
    );
    assert_eq!((r.probe, r.max_parallel), (ProbeMode::Both, 1));
    assert_eq!(r.refresh, Duration::from_secs(30));
    assert_eq!(r.max_replicas, 256);
    assert_eq!(c.targets[0].probe_mode(), ProbeMode::Both);
    let at = c.targets[0].at_replica("http://10.0.0.5:8000");
    assert_eq!(
        at.metrics_url.as_deref(),
        Some("http://10.0.0.5:8000/metrics")
    );

    let target = "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n";
    let scenario = "[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "[targets.replicas]\nstatic = [\"http://a:1\"]\ndns = \"x:1\"\nprobe = \"all\"\nmax_parallel = 0\n",
            &[
                "targets[0].replicas: set exactly one of kubernetes, static, dns, file_sd; static and dns are set",
                "targets[0].replicas.probe: \"all\" is not one of \"service\", \"replicas\", \"both\"",
                "targets[0].replicas.max_parallel: 0 is out of range: must be between 1 and 64",
            ],
        ),
        (
            "[targets.replicas]\ndns = \"vllm-headless\"\nname_server = \"localhost\"\nrefresh = \"10ms\"\n",
            &[
                "targets[0].replicas.name_server: \"localhost\" is not an ip:port address",
                "targets[0].replicas.dns: \"vllm-headless\" must be name:port, e.g. \"vllm-headless.llm.svc.cluster.local:8000\"",
                "targets[0].replicas.refresh: must be at least 1s",
            ],
        ),
        (
            "[targets.replicas]\nstatic = [\"ftp://a\", \"http://u:p@b:1\"]\nscheme = \"grpc\"\n",
            &[
                "targets[0].replicas.static[0]: \"ftp://a\" must be an http:// or https:// URL",
                "targets[0].replicas.static[1]: must not carry credentials; use the target's api_key_env or api_key_file",
                "targets[0].replicas.scheme: \"grpc\" is not \"http\" or \"https\"",
            ],
        ),
        (
            "[targets.replicas]\nrefresh = \"5s\"\n",
            &[
                "targets[0].replicas: set exactly one of kubernetes, static, dns, file_sd; none is set",
            ],
        ),
    ];
    for (section, expected) in cases {
        let got = errors_of(&format!("{target}{section}{scenario}"));
        for e in *expected {
            assert!(got.iter().any(|g| g == e), "missing {e:?} in {got:#?}");
        }
    }
}

#[test]
fn workload_settings_are_read_and_name_their_problems() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.jsonl");
    std::fs::write(&good, "{\"prompt\":\"one two three\",\"max_tokens\":40}\n").unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\":\"ok\"}\nnot json\n").unwrap();
    let text = format!(
        "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n\
[[scenarios]]\nname = \"d\"\ndataset_path = \"{}\"\nshared_prefix_len = 8\n",
        good.display()
    );
    let c = Config::from_text(&text, "t").unwrap();
    let s = &c.scenarios[0];
    assert_eq!(s.dataset.as_ref().unwrap().get().entries.len(), 1);
    assert_eq!((s.output_len, s.shared_prefix_len), (128, 8));
    let text = format!(
        "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n\
[[scenarios]]\nname = \"d\"\ndataset_path = \"{}\"\n\
[[scenarios]]\nname = \"p\"\ninput_len = 16\noutput_len = 4\nshared_prefix_len = 16\n",
        bad.display()
    );
    // The parse's errors, then the files'.
    let errors = errors_of(&text);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(
        errors[0],
        "scenarios[1].shared_prefix_len: must be shorter than input_len (16)"
    );
    assert!(
        errors[1].starts_with(&format!(
            "scenarios[0].dataset_path: {} line 2: not JSON",
            bad.display()
        )),
        "{errors:?}"
    );
    // A dataset that is not a regular file (a device through a symlink, a
    // FIFO) is refused without being read; a target naming the scenario
    // is not told a second time that it does not exist.
    let zero = dir.join("zero.jsonl");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = dir.join("fifo.jsonl");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let text = format!(
        "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\nscenarios = [\"z\", \"f\", \"nope\"]\n\
[[scenarios]]\nname = \"z\"\ndataset_path = \"{}\"\n\
[[scenarios]]\nname = \"f\"\ndataset_path = \"{}\"\n",
        zero.display(),
        fifo.display()
    );
    assert_eq!(
        errors_of(&text),
        [
            "targets[0].scenarios[2]: no scenario named \"nope\"; defined: z, f".to_owned(),
            format!(
                "scenarios[0].dataset_path: cannot read {}: a character device, not a regular file",
                zero.display()
            ),
            format!(
                "scenarios[1].dataset_path: cannot read {}: a FIFO (named pipe), not a regular file",
                fifo.display()
            ),
        ]
    );
    // Kinds by name, and requests that must suit the target's endpoint.
    let text = "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n\
[[scenarios]]\nname = \"tools\"\nkind = \"tool_call\"\npreset = \"concurrency-scaling\"\ninput_len = 8\noutput_len = 8\n\
[[scenarios]]\nname = \"odd\"\nkind = \"poem\"\ninput_len = 8\noutput_len = 8\n\
[[scenarios]]\nname = \"chat\"\nkind = \"multi_turn\"\nendpoint = \"chat\"\ninput_len = 8\noutput_len = 8\n";
    assert_eq!(
        errors_of(text),
        [
            "scenarios[1].kind: \"poem\" is not a scenario kind; kinds: text, json_schema, tool_call, drift, multi_turn",
            "targets[0].scenarios: \"tools\": a tool_call scenario needs the chat endpoint",
        ]
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn heartbeats_are_on_by_default_and_their_bounds_name_the_field() {
    let target = "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\n";
    let scenario = "[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n";
    let c = Config::parse(&format!("{target}{scenario}"), "t").unwrap();
    let h = c.targets[0].heartbeat;
    assert!(h.enabled);
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_secs(15), Duration::from_secs(20))
    );
    let c = Config::parse(
        &format!("{target}[targets.heartbeat]\nenabled = false\ninterval = \"1m\"\ntimeout = \"5s\"\n{scenario}"),
        "t",
    )
    .unwrap();
    let h = c.targets[0].heartbeat;
    assert!(!h.enabled);
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_secs(60), Duration::from_secs(5))
    );
    let err = Config::parse(
        &format!("{target}[targets.heartbeat]\ninterval = \"500ms\"\ntimeout = \"2h\"\nevery = 1\n{scenario}"),
        "t",
    )
    .unwrap_err()
    .to_string();
    for expected in [
        "targets[0].heartbeat.interval: 500ms is too short: at least 1s",
        "targets[0].heartbeat.timeout:",
        "targets[0].heartbeat.every: unknown key",
    ] {
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
}

#[test]
fn a_login_over_plain_smtp_is_only_for_a_relay_on_this_machine() {
    let email = |host: &str| {
        format!(
            "{MINIMAL}[notify.email]\nsmtp_host = \"{host}\"\nsecurity = \"none\"\nusername_env = \"U\"\npassword_env = \"P\"\nfrom = \"s@example.com\"\nto = [\"a@example.com\"]\n"
        )
    };
    assert_eq!(
        errors_of(&email("smtp.example.com")),
        vec![
            "notify.email.security: \"none\" would send the password in clear text to \"smtp.example.com\": plain SMTP with a login is for a relay on this machine (localhost, 127.0.0.1, ::1); use \"starttls\" or \"tls\""
        ]
    );
    for host in ["localhost", "127.0.0.1", "::1", "[::1]"] {
        assert!(errors_of(&email(host)).is_empty(), "{host}");
    }
}

#[test]
fn a_target_may_be_named_local_only_while_the_hosts_gpus_are_not_read() {
    let text = |nvml: bool| {
        format!(
            "[telemetry]\nnvml = {nvml}\n[[targets]]\nname = \"local\"\nbase_url = \"http://h:1\"\n[[scenarios]]\nname = \"s\"\ninput_len = 1\noutput_len = 1\n"
        )
    };
    assert!(Config::from_text(&text(false), "t").is_ok());
    let refused = Config::from_text(&text(true), "t").unwrap_err().to_string();
    assert!(refused.contains("targets[0].name: \"local\""), "{refused}");
}
