//! A Service probed only through itself, its pods found through the
//! Kubernetes API (a stand-in server, the daemon's real client): while
//! every ready pod runs one image, each run is filed under it; while they
//! run two, the pods per image come from the API and runs name no image;
//! once every pod runs the new image, the runs are a new build of the same
//! version. The pods themselves are never probed.

use crate::common;

use std::time::Duration;

use common::kube_api::{KubeApi, PodSpec, digest};
use common::{metrics, temp_dir, until, value};
use vllm_sentinel::daemon::DaemonHandle;
use vllm_sentinel::sim::{SimConfig, SimHandle};

const LIMIT: Duration = Duration::from_secs(30);

/// The target's runs as `/api/v1/runs` lists them, newest first.
async fn runs(handle: &DaemonHandle) -> Vec<serde_json::Value> {
    let text = common::get_text(handle, "/api/v1/runs?target=svc&limit=200").await;
    let page: serde_json::Value = serde_json::from_str(&text).unwrap();
    page["runs"].as_array().cloned().unwrap_or_default()
}

/// `(image, digest, pods)` of each image the target's pods run now.
async fn images(handle: &DaemonHandle) -> Vec<(String, String, u64)> {
    let text = common::get_text(handle, "/api/v1/targets").await;
    let targets: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut found: Vec<(String, String, u64)> = targets["svc"]["images"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|i| {
            (
                i["image"].as_str().unwrap_or_default().to_owned(),
                i["digest"].as_str().unwrap_or_default().to_owned(),
                i["pods"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    found.sort();
    found
}

/// The digest the newest run was filed with (`None`: no image), once a
/// run newer than `after` runs exists.
async fn newest_run_digest(handle: &DaemonHandle, after: usize) -> Option<Option<String>> {
    let runs = runs(handle).await;
    (runs.len() > after).then(|| {
        runs[0]["server"]["image_digest"]
            .as_str()
            .map(str::to_owned)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_service_runs_take_the_one_image_its_pods_run_and_none_while_they_run_two() {
    let dir = temp_dir("kube-service");
    let service = SimHandle::start(
        "127.0.0.1:0",
        SimConfig {
            ttft_ms: 20.0,
            itl_ms: 2.0,
            version: "0.32.0".into(),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let kube = KubeApi::start().await;
    let (old, new) = (digest(0xaa), digest(0xbb));
    // The pods' addresses answer nothing: only the Service is probed.
    kube.put_pod(PodSpec::ready("vllm-6f7c9-a2x4q", "127.0.0.2", 9, &old));
    kube.put_pod(PodSpec::ready("vllm-6f7c9-k8m3z", "127.0.0.3", 9, &old));
    let text = format!(
        r#"
[scheduler]
schedule = "* * * * * *"
[store]
path = "{}"
[[scenarios]]
name = "interactive"
input_len = 32
output_len = 8
concurrency = 2
num_requests = 4
warmup = 0
[[targets]]
name = "svc"
base_url = "{}"
scenarios = ["interactive"]
[targets.replicas]
kubernetes = {{ service = "vllm", port = "http", kubeconfig = "{}" }}
probe = "service"
"#,
        dir.join("store.db").display(),
        service.base_url(),
        kube.kubeconfig(&dir).display()
    );
    let handle = common::start_daemon(&text, None).await;
    let official = "vllm/vllm-openai:v0.32.0".to_owned();

    // One image on every pod: the runs through the Service ran it.
    until(LIMIT, "a run filed under the pods' one image", async || {
        (newest_run_digest(&handle, 0).await == Some(Some(old.clone()))).then_some(())
    })
    .await;
    assert_eq!(
        images(&handle).await,
        vec![(official.clone(), old.clone(), 2)]
    );
    let page = metrics(&handle).await;
    assert_eq!(
        value(
            &page,
            "sentinel_fleet_image_pods",
            &[("target", "svc"), ("digest", &old)]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &page,
            "sentinel_build_image_info",
            &[("target", "svc"), ("build", "0.32.0"), ("digest", &old)]
        ),
        Some(1.0)
    );
    assert!(
        common::run_label_values(&page, "replica")
            .iter()
            .all(String::is_empty),
        "only the Service is probed"
    );

    // One pod replaced by a new image: two images, one pod each, from the
    // API; a run through the Service cannot tell which served it.
    kube.delete_pod("vllm-6f7c9-k8m3z");
    let mut arriving = PodSpec::ready("vllm-84d2b-p5n7w", "127.0.0.3", 9, &new);
    arriving.image = "registry.example/team/vllm-openai:v0.32.0-cu129".into();
    kube.put_pod(arriving.clone());
    let both = {
        let mut both = vec![
            (official.clone(), old.clone(), 1),
            (arriving.image.clone(), new.clone(), 1),
        ];
        both.sort();
        both
    };
    until(LIMIT, "both images listed", async || {
        (images(&handle).await == both).then_some(())
    })
    .await;
    let filed = runs(&handle).await.len();
    until(LIMIT, "a run that names no image", async || {
        (newest_run_digest(&handle, filed).await == Some(None)).then_some(())
    })
    .await;
    let page = metrics(&handle).await;
    for digest in [&old, &new] {
        assert_eq!(
            value(
                &page,
                "sentinel_fleet_image_pods",
                &[("target", "svc"), ("digest", digest)]
            ),
            Some(1.0),
            "{digest}"
        );
    }
    let status = common::get_text(&handle, "/").await;
    assert!(
        status.contains("images: ") && status.contains(&new) && status.contains(&old),
        "the status page lists both images with their pods"
    );

    // Every pod runs the new image: the runs are a new build of 0.32.0.
    kube.delete_pod("vllm-6f7c9-a2x4q");
    let mut second = PodSpec::ready("vllm-84d2b-x9q2r", "127.0.0.2", 9, &new);
    second.image = arriving.image.clone();
    kube.put_pod(second);
    let filed = runs(&handle).await.len();
    until(LIMIT, "a run filed under the new image", async || {
        (newest_run_digest(&handle, filed).await == Some(Some(new.clone()))).then_some(())
    })
    .await;
    until(LIMIT, "the new image as build 0.32.0+2", async || {
        let page = metrics(&handle).await;
        (value(
            &page,
            "sentinel_build_image_info",
            &[("target", "svc"), ("build", "0.32.0+2"), ("digest", &new)],
        ) == Some(1.0)
            && value(&page, "sentinel_build_changes_total", &[("target", "svc")]) == Some(1.0))
        .then_some(())
    })
    .await;
    let newest = &runs(&handle).await[0];
    assert_eq!(
        newest["server"]["image"],
        arriving.image.as_str(),
        "{newest}"
    );
    assert!(
        service.state.stats().max_in_flight <= 2,
        "{:?}",
        service.state.stats()
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
