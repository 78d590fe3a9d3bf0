//! The daemon's claim on its store: an exclusive lock on `<store>.lock`,
//! held from before the store is opened until the daemon has stopped, so
//! that two daemons never share one store (each would prune, restore and
//! file beside the other, and both would probe the same servers).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::StoreError;

/// Held while a daemon uses the store; the lock ends when it is dropped
/// (or when the process ends, however it ends).
#[derive(Debug)]
pub struct WriterLock {
    file: Option<File>,
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        // Dropped by a panic, the daemon's other tasks may still write:
        // the lock then stays until the process ends.
        if std::thread::panicking() {
            std::mem::forget(self.file.take());
        }
    }
}

/// The lock file of the store at `store`: beside it, named after it.
fn lock_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

impl WriterLock {
    /// Takes the store's lock, or says which process holds it. Never
    /// waits: a second daemon on one store is a configuration mistake
    /// to report at start, not a turn to wait for.
    pub fn acquire(store: &Path) -> Result<WriterLock, StoreError> {
        let path = lock_path(store);
        let shown = || path.display().to_string();
        let io = |cause: std::io::Error| StoreError::Lock {
            path: shown(),
            cause: cause.to_string(),
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                // The holder's pid, written when it took the lock; a
                // file being rewritten reads as no pid.
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim().parse::<u32>().ok();
                return Err(StoreError::InUse {
                    store: store.display().to_string(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        // The pid is for the message above only; the lock is what counts.
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(WriterLock { file: Some(file) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_with_the_holder_and_granted_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store.db");
        let first = WriterLock::acquire(&store).unwrap();
        let refused = WriterLock::acquire(&store).unwrap_err();
        let message = refused.to_string();
        assert!(
            matches!(refused, StoreError::InUse { holder: Some(pid), .. } if pid == std::process::id()),
            "{message}"
        );
        assert!(
            message.contains(&store.display().to_string())
                && message.contains(&std::process::id().to_string()),
            "{message}"
        );
        drop(first);
        let again = WriterLock::acquire(&store).unwrap();
        let pid = std::fs::read_to_string(lock_path(&store)).unwrap();
        assert_eq!(pid, format!("{}\n", std::process::id()));
        drop(again);
    }

    #[test]
    fn a_lock_dropped_by_a_panic_is_kept_until_the_process_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store.db");
        let holder = std::thread::spawn({
            let store = store.clone();
            move || {
                let _claim = WriterLock::acquire(&store).unwrap();
                panic!("a task of the daemon failed");
            }
        });
        assert!(holder.join().is_err());
        assert!(matches!(
            WriterLock::acquire(&store),
            Err(StoreError::InUse { .. })
        ));
    }

    #[test]
    fn a_lock_file_that_cannot_be_made_is_an_error_naming_it() {
        let missing = Path::new("/nonexistent-dir-of-a-test/store.db");
        let e = WriterLock::acquire(missing).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("store lock /nonexistent-dir-of-a-test/store.db.lock: "),
            "{e}"
        );
    }
}
