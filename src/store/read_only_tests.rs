//! Reading a store: `Store::open_read_only`, the offline commands' way
//! in, which never writes the file whatever its schema; and a stored
//! value this build cannot read, named by its run and column.

use super::tests::run;
use super::*;
use crate::vocabulary::records::{RunSummary, SampleRow};
use std::path::Path;

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

fn version_on_disk(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_current_store_is_read_as_it_is_and_refuses_writes() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("s.db");
    let store = Store::open(&path).unwrap();
    store.insert_run(&run("a", "s", 1, 0.5)).unwrap();
    drop(store);
    let before = bytes(&path);
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(reader.count_runs().unwrap(), 1);
    let refused = reader.insert_run(&run("a", "s", 0, 0.5)).unwrap_err();
    assert!(refused.to_string().contains("readonly"), "{refused}");
    drop(reader);
    assert_eq!(bytes(&path), before);
}

/// Whether the store was written with a rollback journal or, as the
/// daemon writes it, a write-ahead log (which the copy's header then says,
/// though the copy can have no log beside it).
#[test]
fn an_older_store_is_migrated_in_a_copy_and_its_file_keeps_its_schema() {
    for journal in ["delete", "wal"] {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("old.db");
        let older = schema::MIGRATIONS.len() - 1;
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "journal_mode", journal).unwrap();
            for sql in &schema::MIGRATIONS[..older] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", older as i64)
                .unwrap();
            let summary = serde_json::to_string(&RunSummary::default()).unwrap();
            conn.execute(
                "INSERT INTO runs (target, scenario, model, started_at, duration_s, outcome, summary, build)
                 VALUES ('a', 's', 'm', 1.0e9, 1.5, 'ok', ?1, '0.32.0')",
                [summary],
            )
            .unwrap();
        }
        let before = bytes(&path);
        let reader = Store::open_read_only(&path).unwrap();
        assert_eq!(
            reader.schema_version().unwrap(),
            schema::MIGRATIONS.len() as i64
        );
        assert_eq!(reader.count_runs().unwrap(), 1, "{journal}");
        // The last step's index is there to use, in the copy only.
        assert!(reader.latest_evaluations().unwrap().is_empty());
        let copy_journal: String = reader
            .lock()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(copy_journal, "off", "{journal}");
        drop(reader);
        assert_eq!(version_on_disk(&path), older as i64);
        assert_eq!(bytes(&path), before, "{journal}");
    }
}

#[test]
fn a_newer_store_is_refused_and_a_missing_one_is_not_created() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("new.db");
    Store::open(&path)
        .unwrap()
        .lock()
        .pragma_update(None, "user_version", 999)
        .unwrap();
    let err = Store::open_read_only(&path).unwrap_err().to_string();
    assert!(err.contains("schema version 999"), "{err}");
    let missing = scratch.path().join("missing.db");
    assert!(Store::open_read_only(&missing).is_err());
    assert!(!missing.exists());
}

#[test]
fn a_store_that_cannot_be_opened_is_named_once() {
    let scratch = tempfile::tempdir().unwrap();
    // A directory where the file should be.
    let shown = scratch.path().display().to_string();
    for err in [
        Store::open(scratch.path()).unwrap_err(),
        Store::open_read_only(scratch.path()).unwrap_err(),
    ] {
        let message = err.to_string();
        assert_eq!(message.matches(&shown).count(), 1, "{message}");
        assert!(
            message.starts_with(&format!("store {shown}: ")),
            "{message}"
        );
    }
}

#[test]
fn a_value_this_build_cannot_read_names_its_run_and_column() {
    let store = Store::in_memory().unwrap();
    let mut record = run("a", "s", 1, 0.5);
    record.samples = vec![SampleRow {
        index: 0,
        outcome: crate::vocabulary::Outcome::Ok,
        ttft_s: Some(0.1),
        tpot_s: None,
        e2el_s: Some(0.2),
        itls_s: vec![],
        prompt_tokens: 4,
        output_tokens: 1,
        served_by: None,
    }];
    let id = store.insert_run(&record).unwrap();
    let damage = |sql: &str| store.lock().execute(sql, [id]).unwrap();
    damage("UPDATE samples SET itls = 'x' WHERE run_id = ?1");
    let e = store.samples(id).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "store: run {id}'s request 0 itls is unreadable (expected value"
        )) && e.ends_with("written by a newer vllm-sentinel, or damaged"),
        "{e}"
    );
    damage("UPDATE runs SET summary = '{\"completed\": \"many\"}' WHERE id = ?1");
    let e = store.run(id).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "store: run {id}'s summary is unreadable (invalid type"
        )),
        "{e}"
    );
    damage("UPDATE runs SET outcome = 'weird' WHERE id = ?1");
    let e = store.run(id).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "store: run {id}'s outcome \"weird\" is no outcome this build knows: written by a newer vllm-sentinel, or damaged"
        )
    );
}
