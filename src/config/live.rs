//! The running configuration: the current [`Config`], a generation that
//! moves on every applied reload, and the one reload path that SIGHUP and
//! `POST /-/reload` both go through, one reload at a time: both steps of
//! [`Config::load`] again, so the files the configuration names (a renewed
//! certificate, a changed dataset) are read again too. A reload that
//! would change what only a restart can change is refused whole, and the
//! running configuration stays.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use tokio::sync::watch;

use super::{Config, ConfigError};

/// Why a reload left the running configuration in place.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "{field} cannot change while the daemon runs ({from} -> {to}); restart to apply it; the running configuration is kept"
    )]
    Fixed {
        field: &'static str,
        from: String,
        to: String,
    },
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// The file was read and applied.
    Applied,
    /// The configuration came from no file (the demo): nothing to read.
    NoFile,
}

/// Called with each reload's result, after a new configuration is in place
/// and before workers are told: the parts that mirror the configuration
/// (declared series, policies) follow it here.
pub type ReloadHook = Box<dyn Fn(Result<&Config, &ReloadError>) + Send + Sync>;

/// The current configuration and its reload path; shared as `Arc`.
pub struct LiveConfig {
    current: RwLock<Arc<Config>>,
    path: Option<PathBuf>,
    generation: watch::Sender<u64>,
    /// Held for a whole reload: two reloads never interleave.
    reloading: Mutex<()>,
    hook: OnceLock<ReloadHook>,
}

impl LiveConfig {
    pub fn new(config: Config, path: Option<PathBuf>) -> Self {
        LiveConfig {
            current: RwLock::new(Arc::new(config)),
            path,
            generation: watch::channel(0).0,
            reloading: Mutex::new(()),
            hook: OnceLock::new(),
        }
    }

    /// The configuration now; a reload does not change a copy already taken.
    pub fn current(&self) -> Arc<Config> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes (to any value) after every applied reload.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Sets what follows each reload; only the first call takes effect.
    pub fn on_reload(&self, hook: ReloadHook) {
        let _ = self.hook.set(hook);
    }

    /// Reads the file again, and the files it names, and applies it if it
    /// is valid and changes nothing that needs a restart. Blocking (file
    /// I/O): call it off the async threads.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let Some(path) = &self.path else {
            return Ok(Reloaded::NoFile);
        };
        let pinned = self.current().cluster.pinned;
        let fresh = Config::load_shard(path, pinned)
            .map_err(ReloadError::from)
            .and_then(|fresh| {
                fixed_fields_kept(&self.current(), &fresh)?;
                Ok(fresh)
            });
        match fresh {
            Ok(fresh) => {
                self.apply(fresh);
                Ok(Reloaded::Applied)
            }
            Err(e) => {
                if let Some(hook) = self.hook.get() {
                    hook(Err(&e));
                }
                Err(e)
            }
        }
    }

    /// Puts `fresh` in place as a reload would, without a file (tests and
    /// callers that build the configuration themselves).
    pub fn replace(&self, fresh: Config) -> Result<(), ReloadError> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        fixed_fields_kept(&self.current(), &fresh)?;
        self.apply(fresh);
        Ok(())
    }

    /// Runs `f` on the configuration now with no reload in between, so
    /// what `f` does to the parts that mirror the configuration cannot
    /// interleave with a reload's hook. Blocking (a reload holds the lock
    /// while it reads files): call it off the async threads.
    pub fn between_reloads<R>(&self, f: impl FnOnce(&Config) -> R) -> R {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        f(&self.current())
    }

    fn apply(&self, fresh: Config) {
        let fresh = Arc::new(fresh);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        if let Some(hook) = self.hook.get() {
            hook(Ok(&fresh));
        }
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Settings applied once at start: a reload that changes one is refused
/// rather than half applied.
fn fixed_fields_kept(old: &Config, new: &Config) -> Result<(), ReloadError> {
    let fixed = [
        (
            "exporter.listen",
            old.exporter.listen.to_string(),
            new.exporter.listen.to_string(),
        ),
        (
            "store.path",
            old.store.path.display().to_string(),
            new.store.path.display().to_string(),
        ),
        (
            "exporter.max_connections",
            old.exporter.max_connections.to_string(),
            new.exporter.max_connections.to_string(),
        ),
        (
            "exporter.header_timeout",
            format!("{:?}", old.exporter.header_timeout),
            format!("{:?}", new.exporter.header_timeout),
        ),
        (
            "exporter.histograms",
            old.exporter.histograms.as_str().to_owned(),
            new.exporter.histograms.as_str().to_owned(),
        ),
        (
            "exporter.max_requests",
            old.exporter.max_requests.to_string(),
            new.exporter.max_requests.to_string(),
        ),
        (
            "exporter.request_timeout",
            format!("{:?}", old.exporter.request_timeout),
            format!("{:?}", new.exporter.request_timeout),
        ),
    ];
    for (field, from, to) in fixed {
        if from != to {
            return Err(ReloadError::Fixed { field, from, to });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const BASE: &str = "[exporter]\nlisten = \"127.0.0.1:9464\"\n[store]\npath = \"/tmp/a.db\"\n\
[[targets]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nnum_requests = 1\n";

    fn write(path: &std::path::Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_shard_from_the_command_line_outlives_reloads_and_the_files_follows_the_file() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        // Of four shards, b is 1's, c is 2's, d is 3's.
        let targets: String = ["b", "c", "d"]
            .iter()
            .map(|n| format!("[[targets]]\nname = \"{n}\"\nbase_url = \"http://127.0.0.1:9\"\n"))
            .collect();
        let text = |shard: &str| {
            let body = BASE.split("[[targets]]").next().unwrap();
            let scenarios = BASE.split("[[scenarios]]").nth(1).unwrap();
            format!("{body}[cluster]\nshard = \"{shard}\"\n{targets}[[scenarios]]{scenarios}")
        };
        let names = |live: &LiveConfig| -> Vec<String> {
            live.current()
                .targets
                .iter()
                .map(|t| t.name.clone())
                .collect()
        };
        write(&path, &text("2/4"));
        let pinned = "1/4".parse().ok();
        let live = LiveConfig::new(
            Config::load_shard(&path, pinned).unwrap(),
            Some(path.clone()),
        );
        assert_eq!(names(&live), ["b"]);
        write(&path, &text("3/4"));
        live.reload().unwrap();
        assert_eq!(names(&live), ["b"], "the command line's shard stays");

        let unpinned = LiveConfig::new(Config::load(&path).unwrap(), Some(path.clone()));
        assert_eq!(names(&unpinned), ["d"]);
        write(&path, &text("2/4"));
        unpinned.reload().unwrap();
        assert_eq!(names(&unpinned), ["c"], "the file's shard follows the file");
    }

    #[test]
    fn a_reload_changing_the_listen_address_is_refused_and_the_old_config_stays() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        write(&path, BASE);
        let live = LiveConfig::new(Config::load(&path).unwrap(), Some(path.clone()));
        let applied = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let (a, f) = (applied.clone(), failed.clone());
        live.on_reload(Box::new(move |r| {
            match r {
                Ok(_) => a.fetch_add(1, Ordering::SeqCst),
                Err(_) => f.fetch_add(1, Ordering::SeqCst),
            };
        }));
        let mut generation = live.subscribe();

        write(
            &path,
            &BASE
                .replace("9464", "9465")
                .replace("name = \"a\"", "name = \"b\""),
        );
        let e = live.reload().unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("exporter.listen cannot change")
                && text.contains("127.0.0.1:9464 -> 127.0.0.1:9465"),
            "{text}"
        );
        assert_eq!(live.current().targets[0].name, "a", "nothing half applied");
        assert!(!generation.has_changed().unwrap());
        assert_eq!(failed.load(Ordering::SeqCst), 1);

        write(&path, &BASE.replace("name = \"a\"", "name = \"b\""));
        assert_eq!(live.reload().unwrap(), Reloaded::Applied);
        assert_eq!(live.current().targets[0].name, "b");
        assert!(generation.has_changed().unwrap());
        generation.borrow_and_update();
        assert_eq!(applied.load(Ordering::SeqCst), 1);

        write(&path, "not toml [");
        assert!(matches!(live.reload(), Err(ReloadError::Config(_))));
        assert_eq!(live.current().targets[0].name, "b");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn reloads_from_two_threads_are_serialized() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        write(&path, BASE);
        let live = Arc::new(LiveConfig::new(
            Config::load(&path).unwrap(),
            Some(path.clone()),
        ));
        let inside = Arc::new(AtomicUsize::new(0));
        let overlapped = Arc::new(AtomicUsize::new(0));
        let (i, o) = (inside.clone(), overlapped.clone());
        live.on_reload(Box::new(move |_| {
            if i.fetch_add(1, Ordering::SeqCst) > 0 {
                o.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            i.fetch_sub(1, Ordering::SeqCst);
        }));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let live = live.clone();
                std::thread::spawn(move || {
                    for _ in 0..3 {
                        live.reload().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(overlapped.load(Ordering::SeqCst), 0);
        assert_eq!(*live.subscribe().borrow(), 12);
        std::fs::remove_dir_all(&dir).ok();
    }
}
