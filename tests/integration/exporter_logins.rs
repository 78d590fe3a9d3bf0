//! What basic-auth logins to the exporter may cost, through the daemon's
//! binary: 200 wrong-password logins whose clients hang up at once run
//! no more bcrypt checks than the bound lets run together (counted by
//! `sentinel_exporter_password_checks_total`) and start no threads; an
//! unknown user is refused after as much work as a known one; a bcrypt
//! cost above 14 is refused by `check-config` and by a reload, with the
//! key named; SIGTERM stops the daemon while checks run.
//!
//! The tests take turns: each measures time or threads, which another
//! test's bcrypt work beside it would disturb.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Killed;
use tokio::io::AsyncWriteExt;
use vllm_sentinel::http::password_checks::MAX_CHECKS_AT_ONCE;
use vllm_sentinel::sim::{SimConfig, SimHandle};
use vllm_sentinel::telemetry::exposition::Exposition;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const ADMIN_TOKEN: &str = "admin-token-for-reads";

/// A bcrypt hash of `password` at `cost`, made at cost 4 (the hash is
/// only ever checked, never compared with one made at its cost, so the
/// test need not pay the cost to make it).
fn hash_with_cost(password: &str, cost: u32) -> String {
    let cheap = bcrypt::hash(password, 4).unwrap();
    format!("$2b${cost:02}${}", &cheap[7..])
}

/// The daemon's binary with basic auth over plain HTTP (`web` is the web
/// configuration's text), an admin token (which passes basic auth without
/// a bcrypt check: reading `/metrics` with it costs no check), lifecycle
/// reloads and one simulated target probed once a year.
struct Daemon {
    process: Killed,
    port: u16,
    web: PathBuf,
    _sim: SimHandle,
}

impl Daemon {
    async fn start(dir: &Path, web: &str) -> Daemon {
        let sim = SimHandle::start("127.0.0.1:0", SimConfig::default())
            .await
            .unwrap();
        let web_path = dir.join("web.yml");
        std::fs::write(&web_path, web).unwrap();
        let token = dir.join("admin.token");
        std::fs::write(&token, ADMIN_TOKEN).unwrap();
        let port = common::free_port();
        let config = dir.join("sentinel.toml");
        std::fs::write(
            &config,
            format!(
                "[exporter]\nlisten = \"127.0.0.1:{port}\"\nweb_config = \"{}\"\n\
admin_token_file = \"{}\"\n[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n[[targets]]\n\
name = \"a\"\nbase_url = \"{}\"\nschedule = \"0 0 0 1 1 *\"\n[[scenarios]]\nname = \"s\"\n\
input_len = 8\noutput_len = 4\nnum_requests = 1\nconcurrency = 1\nwarmup = 0\n",
                web_path.display(),
                token.display(),
                dir.join("store.db").display(),
                sim.base_url()
            ),
        )
        .unwrap();
        let process = Killed(
            Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"))
                .args(["serve", "--config"])
                .arg(&config)
                .stdout(std::fs::File::create(dir.join("daemon.log")).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        common::wait_for_port(port, "the daemon").await;
        Daemon {
            process,
            port,
            web: web_path,
            _sim: sim,
        }
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// bcrypt checks the daemon has run, read with the admin token.
    async fn checks_run(&self) -> f64 {
        let text = reqwest::Client::new()
            .get(self.url("/metrics"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let page = Exposition::parse(&text).unwrap();
        common::value(&page, "sentinel_exporter_password_checks_total", &[])
            .expect("the checks counter is exported")
    }
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

/// Threads of process `pid` now.
fn threads(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// CPU time process `pid` has used (user and system), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_logins_run_bounded_checks_and_unknown_users_cost_a_check() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = common::temp_dir("exporter-logins");
    let web = format!(
        "basic_auth_users:\n  prometheus: '{}'\n",
        bcrypt::hash("right-password", 10).unwrap()
    );
    let daemon = Daemon::start(&dir, &web).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let status = async |authorization: &str| {
        http.get(daemon.url("/metrics"))
            .header("authorization", authorization)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };

    // Timing: a known user with a wrong password against an unknown user,
    // taking turns, one login at a time.
    let (mut known, mut unknown) = (Vec::new(), Vec::new());
    for round in 0..15 {
        for (user, samples) in [("prometheus", &mut known), ("nobody", &mut unknown)] {
            let started = Instant::now();
            assert_eq!(status(&basic(user, &format!("guess-{round}"))).await, 401);
            samples.push(started.elapsed());
        }
    }
    let (known, unknown) = (median(known), median(unknown));
    println!("login refused: known user median {known:?}, unknown user median {unknown:?}");
    assert!(
        unknown.as_secs_f64() >= 0.5 * known.as_secs_f64(),
        "an unknown user is refused much faster ({unknown:?}) than a known one ({known:?})"
    );
    assert_eq!(daemon.checks_run().await, 30.0, "one check per login");

    // 200 wrong-password logins whose clients hang up once the request is
    // sent: all connected first, so the requests arrive together.
    let pid = daemon.pid();
    let threads_before = threads(pid);
    let cpu_before = cpu_seconds(pid);
    let before = daemon.checks_run().await;
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {}\r\n\r\n",
        basic("prometheus", "wrong")
    );
    let mut clients = Vec::new();
    for _ in 0..200 {
        clients.push(
            tokio::net::TcpStream::connect(("127.0.0.1", daemon.port))
                .await
                .unwrap(),
        );
    }
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        for _ in 0..400 {
            peak = peak.max(threads(pid));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak
    });
    for client in &mut clients {
        client.write_all(request.as_bytes()).await.unwrap();
    }
    drop(clients);
    let threads_peak = sampler.await.unwrap();
    // Longer than any login may wait for its turn plus a check.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ran = daemon.checks_run().await - before;
    let threads_after = threads(pid);
    let cpu = cpu_seconds(pid) - cpu_before;
    println!(
        "200 dropped logins: {ran} bcrypt checks run, {cpu:.2} CPU seconds; threads \
         {threads_before} before, {threads_peak} at most during, {threads_after} after"
    );
    assert!(
        ran <= (MAX_CHECKS_AT_ONCE + 4) as f64,
        "{ran} checks for 200 logins nobody waited for"
    );
    assert!(
        threads_peak <= threads_before + MAX_CHECKS_AT_ONCE as u64 + 4,
        "threads {threads_before} -> {threads_peak}"
    );
    assert_eq!(
        daemon.checks_run().await - before,
        ran,
        "no check left running"
    );

    // The daemon still answers logins: a wrong one refused, the right one
    // let in (and remembered).
    assert_eq!(status(&basic("prometheus", "wrong")).await, 401);
    assert_eq!(status(&basic("prometheus", "right-password")).await, 200);

    // A reload with a cost above the bound is refused with the key named,
    // and the running users stay.
    std::fs::write(
        &daemon.web,
        format!(
            "basic_auth_users:\n  alice: '{}'\n",
            hash_with_cost("pw", 31)
        ),
    )
    .unwrap();
    let reload = http
        .post(daemon.url("/-/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status().as_u16(), 400);
    let why = reload.text().await.unwrap();
    assert!(
        why.contains("exporter.web_config")
            && why.contains("basic_auth_users.alice: bcrypt cost 31 is above 14"),
        "{why}"
    );
    assert_eq!(status(&basic("prometheus", "right-password")).await, 200);
}

#[tokio::test]
async fn check_config_refuses_a_cost_above_the_bound_naming_the_user() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = common::temp_dir("exporter-logins-cost");
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  bob: '{}'\n  alice: '{}'\n",
            hash_with_cost("pw", 10),
            hash_with_cost("pw", 31)
        ),
    )
    .unwrap();
    let config = dir.join("sentinel.toml");
    std::fs::write(
        &config,
        format!(
            "[exporter]\nweb_config = \"{}\"\n[[targets]]\nname = \"a\"\n\
base_url = \"http://127.0.0.1:9\"\n[[scenarios]]\nname = \"s\"\n",
            web.display()
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_vllm-sentinel"));
    command.arg("check-config").arg("--config").arg(&config);
    let (ok, text) = common::output_of(command);
    assert!(!ok, "{text}");
    assert!(
        text.contains("exporter.web_config")
            && text.contains("basic_auth_users.alice: bcrypt cost 31 is above 14"),
        "{text}"
    );
}

/// SIGTERM while the most expensive checks allowed run and more logins
/// wait: the logins are answered 503 at once and the daemon exits without
/// waiting for the checks under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_daemon_while_checks_run() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = common::temp_dir("exporter-logins-term");
    let web = format!(
        "basic_auth_users:\n  prometheus: '{}'\n",
        hash_with_cost("right-password", 14)
    );
    let mut daemon = Daemon::start(&dir, &web).await;
    let http = reqwest::Client::new();
    let logins: Vec<_> = (0..6)
        .map(|n| {
            let request = http
                .get(daemon.url("/metrics"))
                .header("authorization", basic("prometheus", &format!("guess-{n}")));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    common::until(Duration::from_secs(20), "checks to start", async || {
        (daemon.checks_run().await >= MAX_CHECKS_AT_ONCE as f64).then_some(())
    })
    .await;
    // The checks under way say two logins arrived, not that the other
    // four have: on a loaded machine one may still be connecting, and a
    // connection the daemon never took is not a login it left unanswered.
    // Nothing counts waiting logins, so they are given a quarter of a
    // second; a check that ends meanwhile is answered 401 and the next
    // waiting login's check is under way when the signal comes.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let asked = Instant::now();
    let sent = Command::new("kill")
        .args(["-TERM", &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let exited = common::until(Duration::from_secs(30), "the daemon to exit", async || {
        daemon.process.0.try_wait().unwrap()
    })
    .await;
    let took = asked.elapsed();
    let mut answers = Vec::new();
    for login in logins {
        answers.push(login.await.unwrap().unwrap_or(0));
    }
    println!(
        "SIGTERM with two cost-14 checks running and four logins waiting: exited in \
         {took:?} ({exited}); the logins were answered {answers:?}"
    );
    assert!(exited.success(), "{exited}");
    // Each login is answered (a 503 once the daemon stops checking), not
    // left to the connection's close.
    assert!(
        answers.iter().all(|s| [401, 503].contains(s)),
        "{answers:?}"
    );
}
