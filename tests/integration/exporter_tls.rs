//! The exporter's port secured by an exporter-toolkit web configuration
//! (the file format node_exporter reads), through the daemon's binary: a
//! real Prometheus scrapes it over TLS with basic auth; plain requests get
//! 401 without or with wrong credentials and 200 with the right ones
//! (the health checks need none);
//! plain HTTP to the TLS port is refused; a reload re-reads the file (a new
//! user, then client certificates required); a broken file is refused with
//! the key named and the running security kept.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Killed;
use vllm_sentinel::sim::{SimConfig, SimHandle};

/// A CA, a server certificate for localhost and 127.0.0.1 (as
/// `server.pem` and `server.key`, where the web configuration names them),
/// and a client certificate with its key, PEM.
struct Pki {
    ca: PathBuf,
    client_pem: Vec<u8>,
}

fn make_pki(dir: &Path) -> Pki {
    let authority = common::pki::Pki::new(dir);
    authority.issue_files(&["localhost", "127.0.0.1"], dir, "server");
    let (client_cert, client_key) = authority.issue(&["prometheus"]);
    Pki {
        ca: authority.ca,
        client_pem: format!("{client_cert}{client_key}").into_bytes(),
    }
}

fn web_yaml(users: &[(&str, &str)], client_certs: bool) -> String {
    let mut text =
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n".to_owned();
    if client_certs {
        text.push_str("  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n");
    }
    text.push_str("basic_auth_users:\n");
    for (user, password) in users {
        let hash = bcrypt::hash(password, 8).unwrap();
        text.push_str(&format!("  {user}: {hash}\n"));
    }
    text
}

fn client(pki: &Pki, with_cert: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let mut builder = reqwest::Client::builder()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(10));
    if with_cert {
        builder = builder.identity(reqwest::Identity::from_pem(&pki.client_pem).unwrap());
    }
    builder.build().unwrap()
}

async fn status(request: reqwest::RequestBuilder) -> u16 {
    request.send().await.map_or(0, |r| r.status().as_u16())
}

fn start_prometheus(dir: &Path, target: &str, ca: &Path) -> (Killed, u16) {
    let config = [
        "global:".to_owned(),
        "  scrape_interval: 1s".into(),
        "scrape_configs:".into(),
        "  - job_name: sentinel".into(),
        "    scheme: https".into(),
        "    tls_config:".into(),
        format!("      ca_file: {}", ca.display()),
        "      server_name: localhost".into(),
        "    basic_auth:".into(),
        "      username: prometheus".into(),
        "      password: right-password".into(),
        "    static_configs:".into(),
        format!("      - targets: [\"{target}\"]"),
    ]
    .join("\n");
    common::prom::start_prometheus(dir, &config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_over_tls_with_basic_auth_and_a_reload_rereads_the_file() {
    if !common::have(&["prometheus"]) {
        return;
    }
    let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let dir = common::temp_dir("exporter-tls");
    let pki = make_pki(&dir);
    let web = dir.join("web.yml");
    std::fs::write(&web, web_yaml(&[("prometheus", "right-password")], false)).unwrap();
    let port = common::free_port();
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            "[exporter]\nlisten = \"127.0.0.1:{port}\"\nweb_config = \"{}\"\nenable_lifecycle = true\n\
[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n[[targets]]\nname = \"a\"\nbase_url = \"{}\"\n\
schedule = \"*/2 * * * * *\"\n[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 4\n\
num_requests = 1\nconcurrency = 1\nwarmup = 0\n",
            web.display(),
            dir.join("store.db").display(),
            sim.base_url()
        ),
    )
    .unwrap();
    let _daemon = Killed(
        Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(std::fs::File::create(dir.join("daemon.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    common::wait_for_port(port, "the daemon").await;
    let https = client(&pki, false);
    let metrics = format!("https://localhost:{port}/metrics");
    assert_eq!(status(https.get(&metrics)).await, 401, "no credentials");
    let wrong = https.get(&metrics).basic_auth("prometheus", Some("wrong"));
    assert_eq!(status(wrong).await, 401, "a wrong password");
    let unknown = https
        .get(&metrics)
        .basic_auth("nobody", Some("right-password"));
    assert_eq!(status(unknown).await, 401, "an unknown user");
    let right = https
        .get(&metrics)
        .basic_auth("prometheus", Some("right-password"));
    assert_eq!(status(right).await, 200, "the right password");
    // The health checks need no password (a Kubernetes probe carries none),
    // only TLS.
    for health in ["healthz", "readyz"] {
        let url = format!("https://localhost:{port}/{health}");
        assert_eq!(status(https.get(&url)).await, 200, "/{health}");
    }
    let status_page = https.get(format!("https://localhost:{port}/"));
    assert_eq!(
        status(status_page).await,
        401,
        "the status page needs the password"
    );
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP to the TLS port: {plain:?}");

    // A real Prometheus, over TLS with basic auth.
    let (_prometheus, prom_port) = start_prometheus(&dir, &format!("127.0.0.1:{port}"), &pki.ca);
    let query = format!("http://127.0.0.1:{prom_port}/api/v1/query?query=sentinel_build_info");
    let scraped = common::until(
        Duration::from_secs(60),
        "Prometheus to scrape",
        async || {
            let page: serde_json::Value = reqwest::get(&query).await.ok()?.json().await.ok()?;
            let series = page["data"]["result"].as_array()?.first()?.clone();
            Some(series)
        },
    )
    .await;
    println!("Prometheus scraped over TLS with basic auth: {scraped}");
    let targets: serde_json::Value =
        reqwest::get(format!("http://127.0.0.1:{prom_port}/api/v1/targets"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let target = &targets["data"]["activeTargets"][0];
    assert_eq!(target["health"], "up", "{target}");
    assert!(
        target["scrapeUrl"]
            .as_str()
            .unwrap()
            .starts_with("https://")
    );

    // A reload re-reads the file: a second user.
    let both = [
        ("prometheus", "right-password"),
        ("second", "other-password"),
    ];
    std::fs::write(&web, web_yaml(&both, false)).unwrap();
    let reload = format!("https://localhost:{port}/-/reload");
    let r = https
        .post(&reload)
        .basic_auth("prometheus", Some("right-password"));
    assert_eq!(status(r).await, 200);
    let second = https
        .get(&metrics)
        .basic_auth("second", Some("other-password"));
    assert_eq!(status(second).await, 200, "the new user after the reload");

    // A broken file: the reload is refused with the key named; the running
    // security stays.
    std::fs::write(&web, "basic_auth_users:\n  prometheus: plaintext\n").unwrap();
    let r = https
        .post(&reload)
        .basic_auth("prometheus", Some("right-password"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("exporter.web_config") && text.contains("basic_auth_users.prometheus"),
        "{text}"
    );
    let still = https
        .get(&metrics)
        .basic_auth("second", Some("other-password"));
    assert_eq!(status(still).await, 200);

    // Client certificates required: none refused, the CA's accepted.
    std::fs::write(&web, web_yaml(&both, true)).unwrap();
    let r = https
        .post(&reload)
        .basic_auth("prometheus", Some("right-password"));
    assert_eq!(status(r).await, 200);
    // A fresh client: the handshake of a connection open before the reload
    // was made under the file of its time.
    let without = client(&pki, false)
        .get(&metrics)
        .basic_auth("prometheus", Some("right-password"));
    assert_eq!(status(without).await, 0, "no client certificate: refused");
    let with = client(&pki, true)
        .get(&metrics)
        .basic_auth("prometheus", Some("right-password"));
    assert_eq!(status(with).await, 200, "with the CA's client certificate");
    let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap();
    assert!(
        !log.contains("right-password"),
        "a password reached the log"
    );
}
