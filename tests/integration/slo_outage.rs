//! An outage burns the error budget at the schedule's rate: the runs and
//! heartbeats a down target's back-off skips count as bad events (they
//! counted nothing, so a target down for hours gave a handful of events
//! against a healthy one's thousands).

use crate::common;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_and_heartbeats_skipped_while_a_target_is_down_count_as_bad() {
    let dir = common::temp_dir("slo-outage");
    // Nothing listens there: every run and heartbeat finds it down.
    let text = format!(
        "[store]\npath = \"{}\"\n[telemetry]\nnvml = false\n\
[scheduler]\nbackoff_initial = \"4s\"\nbackoff_max = \"16s\"\n\
[[scenarios]]\nname = \"chat\"\ninput_len = 8\noutput_len = 4\nschedule = \"* * * * * *\"\n\
[[targets]]\nname = \"down\"\nbase_url = \"http://127.0.0.1:{}\"\n\
[targets.heartbeat]\ninterval = \"1s\"\ntimeout = \"1s\"\n\
[[slos]]\nname = \"up\"\nsli = \"success\"\nobjective = 99\nwindow = \"1h\"\n\
[[slos]]\nname = \"alive\"\nsli = \"liveness\"\nobjective = 99\nwindow = \"1h\"\n",
        dir.join("store.db").display(),
        common::free_port()
    );
    let handle = common::start_daemon(&text, None).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // About one event a second each; the back-off alone sends two runs
    // (at 0 and 4 s) and a heartbeat or two in these 10 s.
    let ([(up_good, up_total), (alive_good, alive_total)], slos) =
        common::slo_counts(&handle, ["up", "alive"]).await;
    assert_eq!((up_good, alive_good), (0, 0), "{slos}");
    assert!(up_total >= 6, "{up_total} run events in 10 s: {slos}");
    assert!(
        alive_total >= 6,
        "{alive_total} liveness events in 10 s: {slos}"
    );
    handle.shutdown();
    handle.wait().await.unwrap();
}
