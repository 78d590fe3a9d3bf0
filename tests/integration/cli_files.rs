//! What the offline commands write and read: a failed `export` or
//! `probe` leaves an earlier output file as it was, an export onto its
//! own store is refused, `replay --runs` refuses runs newest first, a
//! length no run has and a line without end (in bounded memory), a
//! reader closing the pipe or a full standard error is no crash, and the
//! commands that only read never write (nor migrate) the store.

use std::io::Read;
use std::process::{Command, Stdio};

use crate::cli_baseline::{run, sentinel};
use crate::common;

use vllm_sentinel::store::Store;

const BIN: &str = env!("CARGO_BIN_EXE_vllm-sentinel");

/// A store of `n` runs of one version.
fn store_of(dir: &std::path::Path, n: i64) -> std::path::PathBuf {
    let path = dir.join("store.db");
    let store = Store::open(&path).unwrap();
    for i in 0..n {
        store.insert_run(&run("0.32.0", i, 0.1)).unwrap();
    }
    path
}

/// A store of 34 runs of 0.32.0, then 16 of a slower 0.33.0.
fn store_upgraded(dir: &std::path::Path) -> std::path::PathBuf {
    let path = store_of(dir, 34);
    let store = Store::open(&path).unwrap();
    for i in 34..50 {
        store.insert_run(&run("0.33.0", i, 0.125)).unwrap();
    }
    path
}

/// The store's runs exported to `runs.jsonl` beside it; its path.
fn exported(store: &std::path::Path) -> std::path::PathBuf {
    let runs = store.with_file_name("runs.jsonl");
    let (code, _, err) = sentinel(&[
        "export",
        "--store",
        store.to_str().unwrap(),
        "--out",
        runs.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    runs
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).unwrap().lines().count()
}

#[test]
fn failed_exports_and_probes_leave_earlier_files_and_the_store_whole() {
    let dir = common::temp_dir("cli-files");
    let store = store_of(&dir, 5);
    let s = store.to_str().unwrap();
    let kept = dir.join("kept.jsonl");
    let k = kept.to_str().unwrap();
    let (code, _, err) = sentinel(&["export", "--store", s, "--out", k]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines(&kept), 5);

    // A store with a row this build cannot read: the export fails, and
    // the file written before is still there, whole.
    let bad = dir.join("bad.db");
    std::fs::copy(&store, &bad).unwrap();
    rusqlite::Connection::open(&bad)
        .unwrap()
        .execute("UPDATE runs SET outcome = 'weird' WHERE id = 3", [])
        .unwrap();
    let (code, _, err) = sentinel(&["export", "--store", bad.to_str().unwrap(), "--out", k]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err.trim(),
        "error: store: run 3's outcome \"weird\" is no outcome this build knows: written by a newer vllm-sentinel, or damaged"
    );
    assert_eq!(lines(&kept), 5);

    // Onto its own store: refused before anything is written.
    let (code, _, err) = sentinel(&["export", "--store", s, "--out", s]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        format!("error: --out {s} is the store itself: writing it would destroy the store")
    );
    assert_eq!(
        Store::open(&store)
            .unwrap()
            .runs_filed_after(0, 100)
            .unwrap()
            .len(),
        5
    );

    // A probe that cannot run leaves the last result file as it was.
    let result = dir.join("result.json");
    std::fs::write(&result, "{\"earlier\": 1}").unwrap();
    let (code, _, err) = sentinel(&[
        "probe",
        "--base-url",
        "http://127.0.0.1:1",
        "--result-json",
        result.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        std::fs::read_to_string(&result).unwrap(),
        "{\"earlier\": 1}"
    );
    // Nothing is left beside it either.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn replay_refuses_runs_newest_first_lengths_no_run_has_and_endless_lines() {
    let dir = common::temp_dir("cli-replay-input");
    let store = store_of(&dir, 5);
    let runs = exported(&store);
    let text = std::fs::read_to_string(&runs).unwrap();

    // `/api/v1/runs` pages newest first: replayed as they come, every
    // verdict would be made up.
    let reversed = dir.join("reversed.jsonl");
    let mut newest_first: Vec<&str> = text.lines().collect();
    newest_first.reverse();
    std::fs::write(&reversed, newest_first.join("\n")).unwrap();
    let (code, _, err) = sentinel(&["replay", "--runs", reversed.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("reversed.jsonl line 2: the run ended before a run above it started")
            && err.ends_with("runs are replayed oldest first\n"),
        "{err}"
    );

    // A length past what a time can hold: an error on its line, no panic.
    let long = dir.join("long.jsonl");
    let mut line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    line["duration_s"] = serde_json::json!(1e13);
    std::fs::write(&long, line.to_string()).unwrap();
    let (code, _, err) = sentinel(&["replay", "--runs", long.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("long.jsonl line 1: duration_s 10000000000000 is not a run's length"),
        "{err}"
    );

    // A file without line ends is not read whole.
    let (code, _, err) = sentinel(&["replay", "--runs", "/dev/zero"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err.trim(),
        "error: /dev/zero line 1: longer than 64 MiB without a line end"
    );
}

#[test]
fn a_closed_pipe_ends_an_export_quietly_and_a_full_stderr_is_no_crash() {
    let dir = common::temp_dir("cli-pipes");
    let store = store_of(&dir, 300);
    let mut export = Command::new(BIN)
        .args(["export", "--store", store.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little, as `| head` does, then close the pipe.
    let mut first = [0u8; 100];
    export
        .stdout
        .take()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    let out = export.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let status = Command::new(BIN)
        .args(["export", "--store", dir.join("none.db").to_str().unwrap()])
        .stderr(full)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
}

/// `sentinel` with `TMPDIR` set to `tmp`.
fn sentinel_with_tmp(tmp: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The store's schema version on disk.
fn version_on_disk(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// The commands that only read leave a store of an older schema as it is
/// (its daemon, of that older build, still owns it) and read it all the
/// same; a pin is a change, and migrates it.
#[test]
fn reading_commands_leave_an_older_store_unmigrated_and_a_pin_migrates_it() {
    let dir = common::temp_dir("cli-read-only");
    let store = store_upgraded(&dir);
    let s = store.to_str().unwrap();
    // One step back: the newest step only adds an index; undone, the
    // file is what the build before wrote.
    let newest = version_on_disk(&store);
    assert_eq!(
        newest, 11,
        "this test undoes step 11 of the schema: undo the newest step instead"
    );
    let conn = rusqlite::Connection::open(&store).unwrap();
    conn.execute_batch("DROP INDEX evaluations_in_order; PRAGMA user_version = 10;")
        .unwrap();
    drop(conn);
    let before = std::fs::read(&store).unwrap();

    let pair = [
        "--target",
        "prod",
        "--scenario",
        "chat",
        "--version",
        "0.32.0",
    ];
    let show = [&["baseline", "--store", s, "show"][..], &pair].concat();
    // Each with what it says: every run, no baseline kept yet, the
    // replayed regression and the report's.
    let readers: [(&[&str], &str); 4] = [
        (&["export", "--store", s], "\"0.33.0\""),
        (&["baseline", "--store", s, "list"], "no baselines yet"),
        (&["replay", "--store", s, "--format", "table"], "regression"),
        (
            &[
                "report", "--store", s, "--target", "prod", "--from", "0.32.0", "--to", "0.33.0",
            ],
            "Overall: **regression**",
        ),
    ];
    // The copy at this build's schema goes under TMPDIR, and goes.
    let scratch = dir.join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    for (args, said) in readers {
        let (code, out, err) = sentinel_with_tmp(&scratch, args);
        assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
        assert_eq!(version_on_disk(&store), 10, "{args:?} migrated the file");
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains(said), "{args:?}: {out}");
    }
    let (_, exported, _) = sentinel(&["export", "--store", s]);
    assert_eq!(exported.lines().count(), 50);
    let (code, _, err) = sentinel_with_tmp(&dir.join("missing"), &["export", "--store", s]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: cannot make a scratch store under TMPDIR: "),
        "{err}"
    );
    // Nothing pinned: no baseline to show, and none made by showing.
    let (code, _, err) = sentinel(&show);
    assert_eq!(
        (code, err.trim()),
        (1, "error: no baseline for prod/m/chat")
    );
    assert_eq!(std::fs::read(&store).unwrap(), before);

    let pin = [
        &["baseline", "--store", s, "pin"][..],
        &pair,
        &["--recent", "10"],
    ]
    .concat();
    let (code, _, err) = sentinel(&pin);
    assert_eq!(code, 0, "{err}");
    assert_eq!(version_on_disk(&store), newest);
    let (code, out, err) = sentinel(&show);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pinned"), "{out}");
}

/// A replay files the runs again into a scratch store under `TMPDIR`
/// (bounded memory however many runs), gives the same verdicts from a
/// store or its export, and leaves nothing behind; a `TMPDIR` it cannot
/// use is one error line.
#[test]
fn a_replay_files_into_a_scratch_store_it_removes() {
    let dir = common::temp_dir("cli-replay-scratch");
    let store = store_upgraded(&dir);
    let s = store.to_str().unwrap();
    let runs = exported(&store);
    let scratch = dir.join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    let replay = |source: &[&str], tmp: &std::path::Path| {
        sentinel_with_tmp(tmp, &[&["replay"][..], source].concat())
    };
    let (code, from_store, err) = replay(&["--store", s], &scratch);
    assert_eq!(code, 0, "{err}");
    assert!(from_store.contains("\"regression\""), "{from_store}");
    let (code, from_file, err) = replay(&["--runs", runs.to_str().unwrap()], &scratch);
    assert_eq!(code, 0, "{err}");
    assert_eq!(from_file, from_store);
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);

    let (code, _, err) = replay(&["--store", s], &dir.join("missing"));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: cannot make a scratch store under TMPDIR: "),
        "{err}"
    );
}

/// The files a process has open (their paths, "(deleted)" when unlinked).
fn open_files(pid: u32) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .map(|target| target.display().to_string())
        .collect()
}

/// A replay killed mid-way (here while it waits for more runs on its
/// input) leaves nothing under `TMPDIR`: its scratch store is open but
/// already has no name.
#[test]
fn a_killed_replay_leaves_nothing_under_tmpdir() {
    let dir = common::temp_dir("cli-replay-killed");
    let store = store_upgraded(&dir);
    let runs = exported(&store);
    let scratch = dir.join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    let mut replay = Command::new(BIN)
        .args(["replay", "--runs", "/dev/stdin"])
        .env("TMPDIR", &scratch)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = replay.stdin.take().unwrap();
    std::io::Write::write_all(&mut input, &std::fs::read(&runs).unwrap()).unwrap();
    // Its scratch store is open, and has lost its name, while it waits
    // for the rest of its input. (Without the name taken away, the store
    // never shows as deleted and the test fails here.)
    let prefix = scratch.display().to_string();
    let scratch_open = |files: &[String]| {
        files
            .iter()
            .any(|f| f.starts_with(&prefix) && f.ends_with(" (deleted)"))
    };
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = open_files(replay.id());
        if scratch_open(&seen) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        scratch_open(&seen),
        "no unlinked scratch store open: {seen:?}"
    );
    assert!(
        replay.try_wait().unwrap().is_none(),
        "the replay ended early"
    );
    replay.kill().unwrap();
    replay.wait().unwrap();
    drop(input);
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left under TMPDIR: {left:?}");
}
