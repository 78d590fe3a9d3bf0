//! Secrets (API keys, SMTP passwords, webhook URLs, bearer tokens): where
//! they come from (an environment variable or a file, never a command-line
//! value in clear) and a wrapper that keeps them out of logs. A key file is
//! read when the key is needed, through [`bounded_file`]: a regular file of
//! at most [`MAX_SECRET_FILE_BYTES`].

use std::fmt;
use std::path::PathBuf;

use crate::bounded_file::{self, BoundedReadError};

/// Largest key file read: a key, a password or a URL, not a document.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;

/// A secret whose `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The header value.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// The bare secret, for protocols that take it as is (SMTP passwords,
    /// webhook URLs whose path is the credential).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of this secret replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        crate::text::redact(text, [self.0.as_str()])
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where to read the key from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The named environment variable; unset or empty means no key.
    Env(String),
    /// A file whose trimmed content is the key.
    File(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {0} named for the secret is not set")]
    EnvMissing(String),
    #[error("cannot read the secret file {path}: {cause}")]
    File {
        path: PathBuf,
        cause: BoundedReadError,
    },
    #[error("the secret file {0} is empty")]
    FileEmpty(PathBuf),
}

impl SecretSource {
    /// Reads the key. `optional` makes an unset variable mean "no key"
    /// (the default `OPENAI_API_KEY` lookup) instead of an error.
    pub fn load(&self, optional: bool) -> Result<Option<Secret>, SecretError> {
        match self {
            SecretSource::Env(name) => match std::env::var(name) {
                Ok(v) if !v.trim().is_empty() => Ok(Some(Secret::new(v.trim()))),
                _ if optional => Ok(None),
                _ => Err(SecretError::EnvMissing(name.clone())),
            },
            SecretSource::File(path) => {
                // A regular file only, and never past the limit: a path
                // to `/dev/zero` or a FIFO is refused, not read forever.
                let fail = |cause| SecretError::File {
                    path: path.clone(),
                    cause,
                };
                let bytes = bounded_file::read(path, MAX_SECRET_FILE_BYTES).map_err(fail)?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    fail(BoundedReadError::Io(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "stream did not contain valid UTF-8",
                    )))
                })?;
                let key = text.trim();
                if key.is_empty() {
                    return Err(SecretError::FileEmpty(path.clone()));
                }
                Ok(Some(Secret::new(key)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_secret() {
        let key = Secret::new("sk-very-secret");
        assert!(!format!("{key:?}").contains("secret"));
        assert!(!format!("{key}").contains("secret"));
        assert_eq!(key.bearer(), "Bearer sk-very-secret");
    }

    #[test]
    fn file_source_trims_and_rejects_empty() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("key");
        std::fs::write(&good, "abc\n").unwrap();
        let key = SecretSource::File(good).load(false).unwrap().unwrap();
        assert_eq!(key.bearer(), "Bearer abc");
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        assert!(matches!(
            SecretSource::File(empty).load(false),
            Err(SecretError::FileEmpty(_))
        ));
        assert!(matches!(
            SecretSource::File(dir.join("missing")).load(false),
            Err(SecretError::File { .. })
        ));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_key_file_that_is_a_device_a_fifo_or_too_long_is_refused_unread() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let zero = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let long = dir.join("long");
        std::fs::write(&long, vec![b'k'; MAX_SECRET_FILE_BYTES as usize + 1]).unwrap();
        for (path, why) in [
            (&zero, "a character device, not a regular file"),
            (&fifo, "a FIFO (named pipe), not a regular file"),
            (&long, "more than the 65536 bytes allowed"),
        ] {
            let e = SecretSource::File(path.clone()).load(false).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("cannot read the secret file {}: {why}", path.display())
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unset_env_is_none_when_optional_and_an_error_otherwise() {
        let name = "SENTINEL_TEST_SURELY_UNSET_VAR";
        assert!(SecretSource::Env(name.into()).load(true).unwrap().is_none());
        assert!(matches!(
            SecretSource::Env(name.into()).load(false),
            Err(SecretError::EnvMissing(_))
        ));
    }
}
