//! Files the configuration names (the exporter's web configuration, the
//! SMTP relay's CA bundle, scenarios' datasets): a [`FileRef`] holds the
//! path as written and the field that names it when the file is parsed,
//! and what the file holds once [`ParsedConfig::load_files`] has read it.
//! A failure to read one is an error on that field.
//!
//! [`ParsedConfig::load_files`]: super::ParsedConfig::load_files

use std::path::{Path, PathBuf};

use super::reader::Errors;

/// A file the configuration names, and its content once read.
#[derive(Clone)]
pub struct FileRef<T> {
    /// The field naming it, e.g. `exporter.web_config`.
    field: String,
    path: PathBuf,
    content: Option<T>,
}

impl<T> FileRef<T> {
    /// A file named in field `field`, not read yet.
    pub(crate) fn named(field: String, path: impl Into<PathBuf>) -> FileRef<T> {
        FileRef {
            field,
            path: path.into(),
            content: None,
        }
    }

    /// A file already read, with what it holds (for callers that build a
    /// configuration themselves).
    pub fn read(field: impl Into<String>, path: impl Into<PathBuf>, content: T) -> FileRef<T> {
        FileRef {
            field: field.into(),
            path: path.into(),
            content: Some(content),
        }
    }

    /// The field naming the file, where its errors are reported.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The path as written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file holds; `None` until it is read.
    pub fn content(&self) -> Option<&T> {
        self.content.as_ref()
    }

    /// What the file holds.
    ///
    /// # Panics
    ///
    /// On a file not read. Every file a [`Config`](super::Config) names has
    /// been read: only a [`ParsedConfig`](super::ParsedConfig) holds files
    /// not read yet.
    pub fn get(&self) -> &T {
        self.content.as_ref().unwrap_or_else(|| {
            panic!(
                "{} ({}) used before the configuration's files were read",
                self.field,
                self.path.display()
            )
        })
    }

    /// Reads the file with `read`, keeping what it gives or reporting its
    /// error on the field.
    pub(crate) fn fill(
        &mut self,
        errors: &mut Errors,
        read: impl FnOnce(&Path) -> Result<T, String>,
    ) {
        match read(&self.path) {
            Ok(content) => self.content = Some(content),
            Err(message) => errors.push(self.field.clone(), message),
        }
    }

    /// Keeps `content`, read elsewhere (a file several parts share).
    pub(crate) fn set(&mut self, content: T) {
        self.content = Some(content);
    }
}

impl<T> std::fmt::Debug for FileRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRef")
            .field("field", &self.field)
            .field("path", &self.path)
            .field("read", &self.content.is_some())
            .finish()
    }
}
