//! Prometheus file_sd files: a JSON array of `{"targets": [...], "labels":
//! {...}}` groups; the targets (`host:port`) of every group are replicas.

use std::path::Path;

use serde::Deserialize;

use super::{DiscoveryError, Rejected, address};

/// A file_sd file larger than this is refused: it is read every refresh.
const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Deserialize)]
struct Group {
    #[serde(default)]
    targets: Vec<String>,
}

/// Bad entries named in full, with their reasons; the rest only counted.
const REJECTED_EXAMPLES: usize = 3;

/// The `host:port` addresses the file lists now, and the entries that are
/// not one. A file whose every entry is bad is a failed read, as an empty
/// DNS answer is: a broken file must not drop every replica.
pub async fn read(path: &Path) -> Result<(Vec<String>, Rejected), DiscoveryError> {
    let failed = |message: String| DiscoveryError::FileSd {
        path: crate::text::quoted(&path.display().to_string(), 200),
        message,
    };
    if matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yml" | "yaml")
    ) {
        return Err(failed(
            "only the JSON form of file_sd is read; write the file as .json".into(),
        ));
    }
    let owned = path.to_owned();
    let text =
        tokio::task::spawn_blocking(move || crate::bounded_file::read(&owned, MAX_FILE_BYTES))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(e.to_string()))?;
    // Editors on some systems start a UTF-8 file with a byte order mark.
    let json = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&text);
    let groups: Vec<Group> = serde_json::from_slice(json).map_err(|e| failed(e.to_string()))?;
    let mut addresses = Vec::new();
    let mut rejected = Rejected::default();
    for address in groups.into_iter().flat_map(|g| g.targets) {
        match address::check(&address) {
            Ok(()) => addresses.push(address),
            Err(why) => {
                rejected.count += 1;
                if rejected.examples.len() < REJECTED_EXAMPLES {
                    let shown = crate::text::quoted(&address, 80);
                    rejected.examples.push(format!("{shown}: {why}"));
                }
            }
        }
    }
    if addresses.is_empty() && rejected.count > 0 {
        return Err(failed(format!(
            "no entry is a host:port address ({})",
            rejected.examples.join("; ")
        )));
    }
    Ok((addresses, rejected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_targets_of_every_group_are_read_and_bad_files_named() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("replicas.json");
        std::fs::write(
            &path,
            r#"[{"targets": ["10.0.0.5:8000"], "labels": {"pod": "a"}},
                {"targets": ["10.0.0.6:8000", "[::1]:8001"]}]"#,
        )
        .unwrap();
        let (found, rejected) = read(&path).await.unwrap();
        assert_eq!(found, vec!["10.0.0.5:8000", "10.0.0.6:8000", "[::1]:8001"]);
        assert_eq!(rejected, Rejected::default());
        std::fs::write(&path, r#"[{"targets": ["http://x:1/path"]}]"#).unwrap();
        let e = read(&path).await.unwrap_err().to_string();
        assert!(
            e.ends_with(r#"no entry is a host:port address ("http://x:1/path": has '/', which is not a letter, digit, '-', '.' or ':')"#),
            "{e}"
        );
        std::fs::write(&path, "{not json").unwrap();
        let e = read(&path).await.unwrap_err().to_string();
        assert!(e.contains("replicas.json"), "{e}");
        let missing = read(&dir.join("none.json")).await.unwrap_err().to_string();
        assert!(missing.contains("none.json"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_byte_order_mark_is_read_past_and_bad_entries_are_set_aside() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("replicas.json");
        let entries = [
            "10.0.0.5:8000",
            "a#b:80",
            "h?x:80",
            "q\":80",
            "<i>:80",
            "evil\u{202e}txt:80",
        ];
        let body = serde_json::json!([{ "targets": entries }]).to_string();
        std::fs::write(&path, [&b"\xEF\xBB\xBF"[..], body.as_bytes()].concat()).unwrap();
        let (found, rejected) = read(&path).await.unwrap();
        assert_eq!(found, ["10.0.0.5:8000"]);
        assert_eq!(rejected.count, 5);
        assert_eq!(
            rejected.examples,
            [
                r#""a#b:80": has '#', which is not a letter, digit, '-', '.' or ':'"#,
                r#""h?x:80": has '?', which is not a letter, digit, '-', '.' or ':'"#,
                r#""q\":80": has '"', which is not a letter, digit, '-', '.' or ':'"#,
            ]
        );
        // The bidi override is never shown raw, only escaped.
        std::fs::write(&path, r#"[{"targets": ["evil\u202etxt:80"]}]"#).unwrap();
        let e = read(&path).await.unwrap_err().to_string();
        assert!(!e.contains('\u{202e}') && e.contains(r"\u{202e}"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
