//! Replicas found through the Kubernetes API: a stand-in API server
//! (`common::kube_api`) serves the Service's EndpointSlice and its pods,
//! simulators at 127.0.0.2 and 127.0.0.3 (one port) are the pods' servers,
//! and the daemon's real Kubernetes client lists and watches them. Series
//! are named by pod; a pod replaced by one of a new image of the same
//! version and fingerprint is a new build, a rollout and a canary verdict
//! naming both images; a pod going not ready or terminating stops being
//! probed; the list survives the API server going away and a 410.

use crate::common;

use std::time::{Duration, Instant};

use common::kube_api::{KubeApi, PodSpec, digest};
use common::{metrics, temp_dir, until, until_equal, value};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

/// A simulated replica serving 0.32.0, listening on `addr`.
async fn sim_at(addr: &str) -> SimHandle {
    let config = SimConfig {
        ttft_ms: 20.0,
        itl_ms: 2.0,
        jitter: 0.03,
        version: "0.32.0".into(),
        ..SimConfig::default()
    };
    SimHandle::start(addr, config).await.unwrap()
}

/// Two simulators on one port, at 127.0.0.2 and 127.0.0.3.
async fn two_sims() -> (SimHandle, SimHandle, u16) {
    let a = sim_at("127.0.0.2:0").await;
    let port = a.addr.port();
    let b = sim_at(&format!("127.0.0.3:{port}")).await;
    (a, b, port)
}

/// One target whose replicas are the stand-in's Service, probed every
/// second, replicas only; `detector` as the test needs.
async fn start_daemon(dir: &std::path::Path, kube: &KubeApi, detector: &str) -> DaemonHandle {
    let text = format!(
        r#"
[scheduler]
schedule = "* * * * * *"
[store]
path = "{}"
[detector]
{detector}
[[scenarios]]
name = "interactive"
input_len = 32
output_len = 8
concurrency = 2
num_requests = 16
warmup = 0
[[targets]]
name = "fleet"
base_url = "http://127.0.0.1:9"
scenarios = ["interactive"]
[targets.replicas]
kubernetes = {{ service = "vllm", port = "http", kubeconfig = "{}" }}
probe = "replicas"
max_parallel = 2
"#,
        dir.join("store.db").display(),
        kube.kubeconfig(dir).display()
    );
    common::start_daemon(&text, None).await
}

/// The replicas the daemon lists for the target now.
async fn replicas_found(handle: &DaemonHandle) -> Vec<String> {
    let targets = targets(handle).await;
    targets["fleet"]["replicas"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

async fn targets(handle: &DaemonHandle) -> serde_json::Value {
    serde_json::from_str(&common::get_text(handle, "/api/v1/targets").await).unwrap()
}

fn of_fleet(page: &Exposition, name: &str) -> Option<f64> {
    value(page, name, &[("target", "fleet")])
}

const LIMIT: Duration = Duration::from_secs(30);

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_image_of_the_same_version_on_one_pod_is_a_rollout_with_a_canary_naming_both_images()
{
    let dir = temp_dir("kube-rollout");
    let (a, b, port) = two_sims().await;
    let kube = KubeApi::start().await;
    let (old, new) = (digest(0xaa), digest(0xbb));
    kube.put_pod(PodSpec::ready("vllm-6f7c9-a2x4q", "127.0.0.2", port, &old));
    kube.put_pod(PodSpec::ready("vllm-6f7c9-k8m3z", "127.0.0.3", port, &old));
    let detector =
        "canary_window = 5\nmin_canary_requests = 30\nconfirm_needed = 2\nconfirm_window = 3";
    let handle = start_daemon(&dir, &kube, detector).await;

    // Found from the API, named by pod, and probed.
    let first = names(&["vllm-6f7c9-a2x4q", "vllm-6f7c9-k8m3z"]);
    until_equal(LIMIT, "the pods listed", &first, async || {
        replicas_found(&handle).await
    })
    .await;
    until_equal(LIMIT, "series named by pod", &first, async || {
        common::run_label_values(&metrics(&handle).await, "replica")
    })
    .await;
    until(LIMIT, "0.32.0 serving on both pods", async || {
        let page = metrics(&handle).await;
        (value(&page, "sentinel_fleet_builds", &[("build", "0.32.0")]) == Some(1.0)
            && of_fleet(&page, "sentinel_replicas") == Some(2.0))
        .then_some(())
    })
    .await;
    let targets_now = targets(&handle).await;
    let pod = &targets_now["fleet"]["replicas"]["vllm-6f7c9-a2x4q"]["pod"];
    assert_eq!(pod["node"], "node-vllm-6f7c9-a2x4q", "{pod}");
    assert_eq!(pod["zone"], "zone-a", "{pod}");
    assert_eq!(pod["image_digest"], old.as_str(), "{pod}");

    // One pod is replaced: drained (terminating), deleted, and a new pod
    // with a new image of the same version and fingerprint, 50% slower to
    // first token, comes up on the same address.
    let started = Instant::now();
    let mut leaving = PodSpec::ready("vllm-6f7c9-k8m3z", "127.0.0.3", port, &old);
    leaving.terminating = true;
    kube.put_pod(leaving);
    until_equal(
        LIMIT,
        "the terminating pod drained",
        &names(&["vllm-6f7c9-a2x4q"]),
        async || replicas_found(&handle).await,
    )
    .await;
    let drained_after = started.elapsed();
    kube.delete_pod("vllm-6f7c9-k8m3z");
    b.state
        .update(serde_json::json!({"ttft_ms": 30.0}))
        .unwrap();
    let mut arriving = PodSpec::ready("vllm-84d2b-p5n7w", "127.0.0.3", port, &new);
    arriving.image = "registry.example/team/vllm-openai:v0.32.0-cu129".into();
    kube.put_pod(arriving);
    let state = |page: &Exposition| {
        value(
            page,
            "sentinel_regression_state",
            &[("target", "fleet"), ("scenario", "interactive")],
        )
    };
    until(
        Duration::from_secs(90),
        "the canary regression",
        async || (state(&metrics(&handle).await) == Some(2.0)).then_some(()),
    )
    .await;
    let regression_after = started.elapsed();
    let page = metrics(&handle).await;
    assert_eq!(of_fleet(&page, "sentinel_build_changes_total"), Some(1.0));
    assert_eq!(of_fleet(&page, "sentinel_rollout_in_progress"), Some(1.0));
    for build in ["0.32.0", "0.32.0+2"] {
        assert_eq!(
            value(&page, "sentinel_fleet_builds", &[("build", build)]),
            Some(0.5),
            "{build} serves one of two pods"
        );
    }
    assert_eq!(
        common::run_label_values(&page, "replica"),
        names(&["vllm-6f7c9-a2x4q", "vllm-84d2b-p5n7w"]),
        "the replaced pod's series are gone"
    );
    for (build, image, digest) in [
        ("0.32.0", "vllm/vllm-openai:v0.32.0", &old),
        (
            "0.32.0+2",
            "registry.example/team/vllm-openai:v0.32.0-cu129",
            &new,
        ),
    ] {
        assert_eq!(
            value(
                &page,
                "sentinel_build_image_info",
                &[("build", build), ("image", image), ("digest", digest)]
            ),
            Some(1.0),
            "{build}'s image"
        );
    }
    let verdicts = common::get_text(&handle, "/api/v1/verdicts").await;
    assert!(
        verdicts.contains("rollout of 0.32.0+2 (image registry.example/team/vllm-openai:v0.32.0-cu129@sha256:bbbbbbbbbbbb)")
            && verdicts.contains("against 0.32.0 (image vllm/vllm-openai:v0.32.0@sha256:aaaaaaaaaaaa)")
            && verdicts.contains("(1 of 2 replicas)")
            && verdicts.contains("TTFT p50 +"),
        "{verdicts}"
    );
    let status = common::get_text(&handle, "/").await;
    assert!(
        status.contains("vllm-84d2b-p5n7w")
            && status.contains(&new)
            && status.contains("node-vllm-84d2b-p5n7w"),
        "{status}"
    );
    let runs = common::get_text(&handle, "/api/v1/runs?target=fleet&limit=200").await;
    assert!(
        runs.contains(&format!("\"image_digest\":\"{new}\"")),
        "{runs}"
    );
    // Never two probes at once at a pod.
    for sim in [&a, &b] {
        assert!(
            sim.state.stats().max_in_flight <= 2,
            "{:?}",
            sim.state.stats()
        );
    }
    // The credentials reached the API server, and nothing else.
    let served = kube.served();
    assert!(served.tokens_ok);
    let metrics_text = common::get_text(&handle, "/metrics").await;
    for text in [&metrics_text, &status, &runs, &verdicts] {
        assert!(!text.contains(common::kube_api::TOKEN));
    }
    println!(
        "pod replaced by a new image of 0.32.0: drained after {:.1} s, canary regression after {:.1} s; \
API requests {:?}",
        drained_after.as_secs_f64(),
        regression_after.as_secs_f64(),
        served.requests
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_not_ready_terminating_or_without_a_digest_are_not_probed_and_the_list_survives_the_api()
 {
    let dir = temp_dir("kube-readiness");
    let (a, b, port) = two_sims().await;
    let kube = KubeApi::start().await;
    let d = digest(0xaa);
    kube.put_pod(PodSpec::ready("vllm-a", "127.0.0.2", port, &d));
    // Its container has not started: no digest yet, not probed.
    let mut pulling = PodSpec::ready("vllm-b", "127.0.0.3", port, &d);
    pulling.digest = None;
    kube.put_pod(pulling);
    // Objectives over one pod, listed by its address and by its name
    // (after the empty [detector] table the configuration starts with).
    let objectives = format!(
        "[[slos]]\nname = \"by-address\"\nsli = \"success\"\nreplicas = [\"127.0.0.2:{port}\"]\nobjective = 99\nwindow = \"1h\"\n\
[[slos]]\nname = \"by-name\"\nsli = \"success\"\nreplicas = [\"vllm-a\"]\nobjective = 99\nwindow = \"1h\"\n"
    );
    let handle = start_daemon(&dir, &kube, &objectives).await;
    let both = names(&["vllm-a", "vllm-b"]);
    until_equal(
        LIMIT,
        "the pod with a digest",
        &names(&["vllm-a"]),
        async || replicas_found(&handle).await,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(replicas_found(&handle).await, ["vllm-a"]);
    // The pod's runs count toward both.
    let counted = until(LIMIT, "the pod's runs counted", async || {
        let slos = common::get_json(&handle, "/api/v1/slos").await?;
        let total = |name: &str| {
            slos["slos"]
                .as_array()?
                .iter()
                .find(|s| s["name"] == name)?["total"]
                .as_u64()
        };
        let both = (total("by-address")?, total("by-name")?);
        (both.0 > 0 && both.1 > 0).then_some(both)
    })
    .await;
    assert_eq!(counted.0, counted.1, "the same requests: {counted:?}");
    let started = Instant::now();
    kube.put_pod(PodSpec::ready("vllm-b", "127.0.0.3", port, &d));
    until_equal(LIMIT, "the pod once it has a digest", &both, async || {
        replicas_found(&handle).await
    })
    .await;
    let ready_after = started.elapsed();
    until_equal(LIMIT, "both pods' series", &both, async || {
        common::run_label_values(&metrics(&handle).await, "replica")
    })
    .await;

    // Not ready: no longer probed, its series gone after its last run.
    let started = Instant::now();
    let mut unready = PodSpec::ready("vllm-b", "127.0.0.3", port, &d);
    unready.ready = false;
    kube.put_pod(unready);
    until_equal(
        LIMIT,
        "the unready pod dropped",
        &names(&["vllm-a"]),
        async || replicas_found(&handle).await,
    )
    .await;
    let unready_after = started.elapsed();
    until_equal(LIMIT, "its series gone", &names(&["vllm-a"]), async || {
        common::run_label_values(&metrics(&handle).await, "replica")
    })
    .await;
    let series_gone_after = started.elapsed();
    let requests_b = b.state.stats().requests;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        b.state.stats().requests,
        requests_b,
        "an unready pod is not probed"
    );
    kube.put_pod(PodSpec::ready("vllm-b", "127.0.0.3", port, &d));
    until_equal(LIMIT, "ready again", &both, async || {
        replicas_found(&handle).await
    })
    .await;

    // The API server goes away for a few seconds: the list is kept, the
    // failures counted. It comes back having forgotten the versions the
    // watches had: they get 410 Gone and list again.
    let failures = |page: &Exposition| {
        of_fleet(page, "sentinel_replica_discovery_failures_total").unwrap_or(0.0)
    };
    let before = failures(&metrics(&handle).await);
    kube.set_down(true);
    until(LIMIT, "a counted failure", async || {
        (failures(&metrics(&handle).await) > before).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(replicas_found(&handle).await, both, "the last list is kept");
    kube.compact();
    kube.set_down(false);
    until(LIMIT, "a relist after 410", async || {
        (kube.served().gone > 0).then_some(())
    })
    .await;
    // Changes are seen again after the relist.
    let started = Instant::now();
    let mut leaving = PodSpec::ready("vllm-a", "127.0.0.2", port, &d);
    leaving.terminating = true;
    kube.put_pod(leaving);
    until_equal(
        LIMIT,
        "the terminating pod drained after the relist",
        &names(&["vllm-b"]),
        async || replicas_found(&handle).await,
    )
    .await;
    let terminating_after = started.elapsed();
    for sim in [&a, &b] {
        assert!(
            sim.state.stats().max_in_flight <= 2,
            "{:?}",
            sim.state.stats()
        );
    }
    let served = kube.served();
    assert!(served.bookmarks > 0, "watches asked for bookmarks");
    assert!(
        served
            .selectors
            .contains("endpointslices?labelSelector=kubernetes.io/service-name=vllm")
            && served
                .selectors
                .contains("pods?fieldSelector=metadata.name=vllm-a"),
        "{:?}",
        served.selectors
    );
    println!(
        "pod with a digest probed after {:.1} s; not ready: dropped after {:.1} s, series gone after {:.1} s; \
terminating after a 410 relist: dropped after {:.1} s; {} bookmarks, {} 410s",
        ready_after.as_secs_f64(),
        unready_after.as_secs_f64(),
        series_gone_after.as_secs_f64(),
        terminating_after.as_secs_f64(),
        served.bookmarks,
        served.gone
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
