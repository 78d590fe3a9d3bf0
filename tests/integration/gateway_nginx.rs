//! Probing through a gateway: two simulators behind Debian's nginx, which
//! names the upstream that served each request in a response header
//! (`X-Upstream: $upstream_addr`), and the daemon's binary probing only
//! through nginx with two request headers of its own (one written, one
//! read from a file). Every request is attributed to the simulator that
//! really served it, both simulators receive the headers, the headers'
//! values appear in no log line, page or metric, and the requests one
//! simulator answers 429 and the other 503 with a reason are counted as
//! `shed`, not as failures of the server.

use crate::common;

use common::Killed;
use common::nginx::start_nginx_with;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use vllm_sentinel::sim::{Fault, SimConfig, SimHandle};
use vllm_sentinel::store::{RunFilter, Store};

const WRITTEN: &str = "bulk-priority-7f3a9c";
const FROM_FILE: &str = "tenant-secret-5e1d2b";

async fn sim(fault: Fault, every: u64) -> SimHandle {
    let config = SimConfig {
        ttft_ms: 10.0,
        itl_ms: 1.0,
        fault: Some(fault),
        fault_every: every,
        ..SimConfig::default()
    };
    SimHandle::start("127.0.0.1:0", config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_nginx_are_attributed_to_the_upstream_that_served_them() {
    let dir = common::temp_dir("gateway-nginx");
    // Every fifth request of one is shed with 429, every fourth of the
    // other with 503 and its reason.
    let a = sim(Fault::Http429, 5).await;
    let b = sim(Fault::Http503, 4).await;
    let upstreams = [a.addr.to_string(), b.addr.to_string()];
    let location = "      add_header X-Upstream $upstream_addr always;\n";
    let Some((_nginx, base_url)) = start_nginx_with(&dir, &upstreams, location).await else {
        return;
    };
    let tenant = dir.join("tenant");
    std::fs::write(&tenant, format!("{FROM_FILE}\n")).unwrap();
    let store_path = dir.join("store.db");
    let port = common::free_port();
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[exporter]
listen = "127.0.0.1:{port}"
[store]
path = "{store}"
[telemetry]
nvml = false
[[targets]]
name = "gw"
base_url = "{base_url}"
schedule = "* * * * * *"
[targets.heartbeat]
enabled = false
[targets.gateway]
endpoint_header = "X-Upstream"
[[targets.headers]]
name = "x-gateway-priority"
value = "{WRITTEN}"
[[targets.headers]]
name = "x-tenant"
value_file = "{tenant}"
[[scenarios]]
name = "chat"
input_len = 16
output_len = 4
num_requests = 6
concurrency = 2
warmup = 0
[[slos]]
name = "via-a"
sli = "success"
replicas = ["{a}"]
objective = 99
window = "1h"
"#,
            store = store_path.display(),
            tenant = tenant.display(),
            a = a.addr,
        ),
    )
    .unwrap();
    let log = dir.join("daemon.log");
    let child = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut daemon = Killed(child);
    common::wait_for_port(port, "the daemon").await;
    let http = reqwest::Client::new();
    let get = async |path: &str| {
        http.get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    // Runs until both simulators have shed some requests.
    common::until(Duration::from_secs(60), "sheds at both", async || {
        let (sa, sb) = (a.state.stats(), b.state.stats());
        (sa.faults_injected >= 6 && sb.faults_injected >= 6).then_some(())
    })
    .await;
    let pages = [
        get("/metrics").await,
        get("/").await,
        get("/api/v1/targets").await,
        get("/api/v1/runs").await,
        get("/api/v1/slos").await,
    ];
    let metrics = &pages[0];
    let targets: serde_json::Value = serde_json::from_str(&pages[2]).unwrap();
    let served = &targets["gw"]["served_by"];
    for s in [&a, &b] {
        let endpoint = s.addr.to_string();
        assert!(
            served[&endpoint]["requests"].as_u64() > Some(0),
            "{targets}"
        );
        assert!(
            metrics.contains(&format!(
                "sentinel_gateway_requests_total{{endpoint=\"{endpoint}\",outcome=\"ok\",target=\"gw\"}}"
            )),
            "{metrics}"
        );
    }
    assert!(
        pages[1].contains("Served through the gateway"),
        "{}",
        pages[1]
    );
    assert!(
        metrics.contains("sentinel_requests_total{model=\"sim-model\",outcome=\"shed\",scenario=\"chat\",target=\"gw\"}"),
        "{metrics}"
    );
    assert!(
        pages[3].contains("shed by the gateway: HTTP 4")
            || pages[3].contains("shed by the gateway: HTTP 5"),
        "{}",
        pages[3]
    );

    // SIGTERM: runs in flight are filed before the daemon exits.
    let pid = daemon.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = daemon.0.wait().unwrap();
    assert!(status.success(), "{status}");

    // Every request the store kept is attributed to the simulator that
    // counted it, and every request a simulator served was probed.
    let store = Store::open(&store_path).unwrap();
    let mut by_endpoint: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for run in store.runs(&RunFilter::default()).unwrap() {
        for sample in store.samples(run.id.unwrap()).unwrap() {
            let endpoint = sample.served_by.clone().unwrap_or_default();
            let entry = by_endpoint.entry(endpoint).or_default();
            entry.0 += 1;
            entry.1 += u64::from(sample.outcome == vllm_sentinel::vocabulary::Outcome::Shed);
        }
    }
    let (sa, sb) = (a.state.stats(), b.state.stats());
    let expected: BTreeMap<String, (u64, u64)> = [
        (a.addr.to_string(), (sa.requests, sa.faults_injected)),
        (b.addr.to_string(), (sb.requests, sb.faults_injected)),
    ]
    .into();
    println!(
        "attributed (requests, shed) per endpoint: {by_endpoint:?}; served by the simulators: {expected:?}"
    );
    assert_eq!(by_endpoint, expected);

    // Both simulators received both headers with their values.
    for s in [&a, &b] {
        let seen = s.state.headers_seen();
        assert!(!seen.is_empty());
        for headers in seen {
            let value = |name: &str| {
                headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(value("x-gateway-priority").as_deref(), Some(WRITTEN));
            assert_eq!(value("x-tenant").as_deref(), Some(FROM_FILE));
        }
    }
    // Neither value is in the log, a page or a metric.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("run finished"), "{logged}");
    for secret in [WRITTEN, FROM_FILE] {
        assert!(!logged.contains(secret), "{secret} logged");
        for page in &pages {
            assert!(!page.contains(secret), "{secret} shown:\n{page}");
        }
    }
}
