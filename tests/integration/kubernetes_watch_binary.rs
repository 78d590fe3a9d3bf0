//! The daemon binary finding its replicas through a stand-in Kubernetes
//! API server, with its credentials found as Kubernetes clients find them
//! (`KUBECONFIG`): a namespace of 5,000 other pods and 4 behind the
//! Service costs memory and traffic only for those 4 (the server selects
//! them); a watch refused with 403 is said once at WARN, naming the verb
//! and resource the role lacks, counted on every retry, and the last list
//! is kept; the token reaches the API server and nothing else.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::kube_api::{KubeApi, PodSpec, TOKEN, digest};
use common::{Killed, free_port, temp_dir, until, value, wait_for_port};
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

const OTHER_PODS: usize = 5_000;
const MATCHED: u8 = 4;

async fn page(port: u16, path: &str) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn replicas_listed(port: u16) -> usize {
    let targets: serde_json::Value =
        serde_json::from_str(&page(port, "/api/v1/targets").await).unwrap();
    targets["fleet"]["replicas"]
        .as_object()
        .map_or(0, |m| m.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_other_pods_cost_nothing_and_a_403_is_said_once() {
    let dir = temp_dir("kube-binary");
    let first = SimHandle::start("127.0.0.2:0", SimConfig::default())
        .await
        .unwrap();
    let port = first.addr.port();
    let mut sims = vec![first];
    for n in 3..2 + MATCHED {
        let addr = format!("127.0.0.{n}:{port}");
        sims.push(SimHandle::start(&addr, SimConfig::default()).await.unwrap());
    }
    let kube = KubeApi::start().await;
    kube.put_other_pods(OTHER_PODS);
    for n in 0..MATCHED {
        let ip = format!("127.0.0.{}", n + 2);
        kube.put_pod(PodSpec::ready(
            &format!("vllm-{n}"),
            &ip,
            port,
            &digest(0xaa),
        ));
    }
    let kubeconfig = kube.kubeconfig(&dir);

    let listen = free_port();
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[exporter]
listen = "127.0.0.1:{listen}"
[store]
path = "{}"
[scheduler]
schedule = "* * * * * *"
[telemetry]
nvml = false
[[targets]]
name = "fleet"
base_url = "http://127.0.0.1:9"
[targets.replicas]
kubernetes = {{ service = "vllm", port = "http" }}
probe = "replicas"
max_parallel = 4
[[scenarios]]
name = "s"
input_len = 16
output_len = 4
num_requests = 2
warmup = 0
"#,
            dir.join("store.db").display(),
        ),
    )
    .unwrap();
    let log_path = dir.join("daemon.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let started = Instant::now();
    let child = Killed(
        Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove("RUST_LOG")
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", &*dir)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    wait_for_port(listen, "the daemon").await;
    until(
        Duration::from_secs(30),
        "the four pods listed",
        async || (replicas_listed(listen).await == MATCHED as usize).then_some(()),
    )
    .await;
    let listed_after = started.elapsed();
    until(Duration::from_secs(30), "every pod probed", async || {
        sims.iter()
            .all(|s| s.state.stats().completed_streams > 0)
            .then_some(())
    })
    .await;
    let served = kube.served();
    let resident_kib = common::hostile::peak_rss_kib(pid).unwrap();
    let requests: u64 = served.requests.values().sum();

    // The role loses watch on endpointslices, and the open watch drops:
    // each retry is refused and counted, one WARN line says what is
    // missing, and the four pods stay listed and probed.
    let failures = |page: &Exposition| {
        value(
            page,
            "sentinel_replica_discovery_failures_total",
            &[("target", "fleet")],
        )
        .unwrap_or(0.0)
    };
    kube.forbid("watch", "endpointslices", true);
    kube.cut_watches();
    until(
        Duration::from_secs(30),
        "three refused watches",
        async || {
            let metrics = Exposition::parse(&page(listen, "/metrics").await).unwrap();
            (failures(&metrics) >= 3.0).then_some(())
        },
    )
    .await;
    let probed_before = sims[0].state.stats().requests;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        replicas_listed(listen).await,
        MATCHED as usize,
        "the last list is kept"
    );
    assert!(
        sims[0].state.stats().requests > probed_before,
        "still probed"
    );
    kube.forbid("watch", "endpointslices", false);
    // The next change the watch brings says it works again.
    kube.put_pod(PodSpec::ready("vllm-0", "127.0.0.2", port, &digest(0xaa)));
    let metrics_text = page(listen, "/metrics").await;
    let refused = failures(&Exposition::parse(&metrics_text).unwrap());
    let status = page(listen, "/").await;
    let targets = page(listen, "/api/v1/targets").await;
    until(
        Duration::from_secs(60),
        "the watch working again",
        async || {
            let log = std::fs::read_to_string(&log_path).unwrap();
            log.contains("watching the replicas works again")
                .then_some(())
        },
    )
    .await;
    drop(child);

    let log = std::fs::read_to_string(&log_path).unwrap();
    let warns: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    // "403 Forbidden", not "403": a timestamp's microseconds may hold it.
    let forbidden: Vec<&&str> = warns
        .iter()
        .filter(|l| l.contains("403 Forbidden"))
        .collect();
    assert_eq!(forbidden.len(), 1, "{warns:#?}");
    assert!(
        forbidden[0].contains("lacks watch on endpointslices.discovery.k8s.io in namespace llm"),
        "{}",
        forbidden[0]
    );
    for text in [&log, &metrics_text, &status, &targets] {
        assert!(!text.contains(TOKEN), "the token leaked");
    }
    let served_after = kube.served();
    assert!(served_after.tokens_ok, "every request carried the token");
    // Only the Service's slices and its pods were ever sent.
    assert!(
        served.bytes < 64 * 1024,
        "{} bytes served for {MATCHED} pods among {OTHER_PODS}",
        served.bytes
    );
    assert!(resident_kib < 64 * 1024, "peak resident {resident_kib} KiB");
    println!(
        "{OTHER_PODS} other pods and {MATCHED} behind the Service: listed after {:.1} s; \
peak resident {:.1} MiB; {requests} API requests ({:?}), {} bytes served; \
403 on watch: {refused} failures counted, {} WARN line naming it, {} WARN lines in all",
        listed_after.as_secs_f64(),
        resident_kib as f64 / 1024.0,
        served.requests,
        served.bytes,
        forbidden.len(),
        warns.len()
    );
}
