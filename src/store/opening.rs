//! Opening the store: read-write with its migrations (the daemon and the
//! commands that change it), read-only (the commands that only read), or
//! in memory (tests, replays); and noticing its file replaced.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use super::{Store, StoreError, schema};

fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The error of a step of opening the store at `shown`.
fn opening(shown: &str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |cause| StoreError::Open {
        path: shown.to_owned(),
        cause,
    }
}

impl Store {
    /// Opens (creating if needed) and migrates the store.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let shown = path.display().to_string();
        let conn = Connection::open(path).map_err(opening(&shown))?;
        (|| {
            // First: another process opening the file at the same time
            // holds its lock for a moment, which the steps below wait out.
            conn.busy_timeout(Duration::from_secs(5))?;
            // WAL: readers (the HTTP API) never block the writer, and a
            // crash loses at most the transaction in progress.
            write_ahead_log(&conn)?;
            conn.pragma_update(None, "synchronous", "NORMAL")
        })()
        .map_err(opening(&shown))?;
        let file = file_identity(path).map(|id| (path.to_owned(), id));
        migrated(conn, &shown, file)
    }

    /// From now on a write that another process holds the store against
    /// is refused at once, not after SQLite's 5 s wait: a stopping
    /// daemon's writes queue on the one connection, and each wait would
    /// add to its stop. Told without the connection (a call may hold it
    /// through its own wait): the next call to take it turns the wait off.
    pub fn stop_waiting_for_others(&self) {
        self.no_waiting
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// A new, empty store that need not outlive it (a replay's), in a
    /// file under `TMPDIR` unlinked as soon as it is open: the data stays
    /// on disk, so memory stays within SQLite's page cache however much is
    /// filed, and nothing is left behind however the process ends.
    pub fn scratch() -> Result<Store, StoreError> {
        let (dir, conn) = scratch_connection(SCRATCH)?;
        migrated(unlinked(conn, dir)?, SCRATCH, None)
    }

    /// Opens an existing store for reading only, as the offline commands
    /// do: the file is never written, so a store in use by a daemon (of
    /// this build or an older one) or a read-only copy is read as it is.
    /// A store of an older schema is copied and the copy migrated; the
    /// file keeps its schema for the daemon that owns it.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let shown = path.display().to_string();
        let open = opening(&shown);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(&open)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(&open)?;
        let found: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(&open)?;
        let known = schema::MIGRATIONS.len() as i64;
        let conn = match found.cmp(&known) {
            std::cmp::Ordering::Equal => conn,
            std::cmp::Ordering::Greater => {
                return Err(StoreError::TooNew {
                    path: shown.clone(),
                    found,
                    known,
                });
            }
            std::cmp::Ordering::Less => return migrated_copy(&conn, &shown),
        };
        Ok(Store {
            conn: Arc::new(Mutex::new(conn)),
            file: file_identity(path).map(|id| (path.to_owned(), id)),
            no_waiting: Arc::default(),
        })
    }

    /// `Err` with the reason when the store's file is no longer the one
    /// opened (deleted, or replaced): SQLite keeps writing to the open,
    /// unlinked file, and everything it holds is gone at the next restart.
    pub fn check_file(&self) -> Result<(), String> {
        let Some((path, opened)) = &self.file else {
            return Ok(());
        };
        match file_identity(path) {
            Some(now) if now == *opened => Ok(()),
            Some(_) => Err(format!("{} was replaced by another file", path.display())),
            None => Err(format!("{} was deleted", path.display())),
        }
    }

    /// An in-memory store, for tests and one-off commands.
    pub fn in_memory() -> Result<Store, StoreError> {
        let shown = ":memory:";
        let conn = Connection::open_in_memory().map_err(opening(shown))?;
        migrated(conn, shown, None)
    }
}

/// Turns the write-ahead log on. Switching a new file's journal is
/// refused at once (not waited for) while another process opens it too:
/// asked again for up to the busy timeout.
fn write_ahead_log(conn: &Connection) -> rusqlite::Result<()> {
    let mut tries = 0;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && tries < 100 =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// How a replay's scratch store is named in errors: its file has no name.
const SCRATCH: &str = "(scratch, under TMPDIR)";

/// A new file under `TMPDIR`, in a directory of its own, whose rollback
/// journal is kept in memory and whose writes wait for no disk; see
/// [`unlinked`]. `shown` names it in errors.
fn scratch_connection(shown: &str) -> Result<(tempfile::TempDir, Connection), StoreError> {
    let dir = tempfile::Builder::new()
        .prefix("vllm-sentinel-")
        .tempdir()
        .map_err(|e| StoreError::Scratch(e.to_string()))?;
    let conn = Connection::open(dir.path().join(SCRATCH_FILE)).map_err(opening(shown))?;
    conn.pragma_update(None, "journal_mode", "MEMORY")
        .map_err(opening(shown))?;
    conn.pragma_update(None, "synchronous", "OFF")
        .map_err(opening(shown))?;
    Ok((dir, conn))
}

/// The scratch file's name in its directory.
const SCRATCH_FILE: &str = "scratch.db";

/// Takes the scratch file's name away (and its directory's): the
/// connection keeps the file, which the system frees when the process
/// ends, killed or not. With its journal in memory, SQLite never needs the
/// name again (it checks that a database still has its name only when it
/// opens a journal file), nor without one.
fn unlinked(conn: Connection, dir: tempfile::TempDir) -> Result<Connection, StoreError> {
    let scratch = |e: std::io::Error| StoreError::Scratch(e.to_string());
    std::fs::remove_file(dir.path().join(SCRATCH_FILE)).map_err(scratch)?;
    dir.close().map_err(scratch)?;
    Ok(conn)
}

/// `conn` as a store: foreign keys on, migrated to this build's schema;
/// `file` is the file to watch.
fn migrated(
    mut conn: Connection,
    shown: &str,
    file: Option<(std::path::PathBuf, (u64, u64))>,
) -> Result<Store, StoreError> {
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(opening(shown))?;
    schema::migrate(&mut conn, shown)?;
    Ok(Store {
        conn: Arc::new(Mutex::new(conn)),
        file,
        no_waiting: Arc::default(),
    })
}

/// A copy of an older store at this build's schema, read from `source`
/// in one step (one snapshot, whatever its daemon writes meanwhile: a copy
/// in steps starts again at every write) into a scratch store: memory
/// stays bounded whatever the store's size.
fn migrated_copy(source: &Connection, shown: &str) -> Result<Store, StoreError> {
    let copy_shown = format!("{shown}'s copy under TMPDIR");
    let (dir, mut copy) = scratch_connection(&copy_shown)?;
    {
        let backup = Backup::new(source, &mut copy).map_err(opening(shown))?;
        // A writer holding the file a moment is waited out, as a read is.
        let mut tries = 0;
        loop {
            match backup.step(-1).map_err(opening(shown))? {
                StepResult::Done => break,
                _ if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    return Err(StoreError::Copy {
                        store: shown.to_owned(),
                        cause: "it stayed busy for 5 s".into(),
                    });
                }
            }
        }
    }
    // The copy's header says write-ahead log, as its source's does, and a
    // log needs files beside the database: turned off before the names go.
    // No journal at all from here: a migration rewrites much of a big
    // store in one transaction, which a journal in memory would hold whole,
    // and a failed one drops the copy anyway.
    copy.pragma_update(None, "journal_mode", "OFF")
        .map_err(opening(&copy_shown))?;
    migrated(unlinked(copy, dir)?, &copy_shown, None)
}
