//! Files the configuration names, read whole and bounded: only a regular
//! file is read (a device such as `/dev/zero`, a FIFO or a directory is
//! refused, symlinks followed), and never more bytes than the limit,
//! whatever length the file reports.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}, not a regular file")]
    NotRegular(&'static str),
    #[error("more than the {0} bytes allowed")]
    TooLarge(u64),
}

/// The whole of the regular file at `path`, at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedReadError> {
    // Judged before opening: opening a FIFO for reading waits for a writer.
    let before = std::fs::metadata(path)?;
    regular(&before)?;
    if before.len() > limit {
        return Err(BoundedReadError::TooLarge(limit));
    }
    // Non-blocking, and judged again once open, in case the path was
    // replaced in between; a regular file reads the same either way.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    regular(&file.metadata()?)?;
    read_at_most(file, limit, before.len())
}

/// Reads `file` to its end, failing past `limit` bytes: the length the
/// file reported (`expected`) only sizes the buffer, it is not trusted.
fn read_at_most(file: File, limit: u64, expected: u64) -> Result<Vec<u8>, BoundedReadError> {
    let mut bytes = Vec::with_capacity(expected.min(limit) as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(BoundedReadError::TooLarge(limit));
    }
    Ok(bytes)
}

fn regular(metadata: &Metadata) -> Result<(), BoundedReadError> {
    let kind = metadata.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(BoundedReadError::NotRegular(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory removed when the test ends.
    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let scratch = scratch();
        let dir = scratch.path().to_path_buf();
        let file = dir.join("ok.txt");
        std::fs::write(&file, b"four").unwrap();
        assert_eq!(read(&file, 4).unwrap(), b"four");
        let e = read(&file, 3).unwrap_err().to_string();
        assert_eq!(e, "more than the 3 bytes allowed");

        let zero = dir.join("zero.jsonl");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(
            read(&zero, 1 << 20).unwrap_err().to_string(),
            "a character device, not a regular file"
        );
        let fifo = dir.join("fifo.jsonl");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(
            read(&fifo, 1 << 20).unwrap_err().to_string(),
            "a FIFO (named pipe), not a regular file"
        );
        assert_eq!(
            read(&dir, 1 << 20).unwrap_err().to_string(),
            "a directory, not a regular file"
        );
        let missing = read(&dir.join("none"), 1).unwrap_err().to_string();
        assert!(missing.contains("No such file"), "{missing}");
    }

    #[test]
    fn a_stream_longer_than_its_reported_length_stops_at_the_limit() {
        // /dev/zero opened directly: a reported length of 0, and no end.
        let zero = File::open("/dev/zero").unwrap();
        let e = read_at_most(zero, 1 << 20, 0).unwrap_err().to_string();
        assert_eq!(e, "more than the 1048576 bytes allowed");
    }
}
