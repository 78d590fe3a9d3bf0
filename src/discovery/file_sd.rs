//! Prometheus file_sd files: a JSON array of `{"targets": [...], "labels":
//! {...}}` groups; the targets (`host:port`) of every group are replicas.

use std::path::Path;

use serde::Deserialize;

use super::DiscoveryError;

/// A file_sd file larger than this is refused: it is read every refresh.
const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Deserialize)]
struct Group {
    #[serde(default)]
    targets: Vec<String>,
}

/// The `host:port` addresses the file lists now.
pub async fn read(path: &Path) -> Result<Vec<String>, DiscoveryError> {
    let failed = |message: String| DiscoveryError::FileSd {
        path: path.display().to_string(),
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
    let size = tokio::fs::metadata(path)
        .await
        .map_err(|e| failed(e.to_string()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(failed(format!(
            "{size} bytes is more than the {MAX_FILE_BYTES} allowed"
        )));
    }
    let text = tokio::fs::read(path)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let groups: Vec<Group> = serde_json::from_slice(&text).map_err(|e| failed(e.to_string()))?;
    let mut addresses = Vec::new();
    for address in groups.into_iter().flat_map(|g| g.targets) {
        if !valid_address(&address) {
            let shown = crate::text::clean(&address, 80);
            return Err(failed(format!("{shown:?} is not host:port")));
        }
        addresses.push(address);
    }
    Ok(addresses)
}

/// `host:port`, as Prometheus writes targets: no scheme, no path.
fn valid_address(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    !host.is_empty()
        && port.parse::<u16>().is_ok_and(|p| p > 0)
        && !address.contains('/')
        && !address.contains('@')
        && !address.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_targets_of_every_group_are_read_and_bad_files_named() {
        let dir = std::env::temp_dir().join(format!("file-sd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("replicas.json");
        std::fs::write(
            &path,
            r#"[{"targets": ["10.0.0.5:8000"], "labels": {"pod": "a"}},
                {"targets": ["10.0.0.6:8000", "[::1]:8001"]}]"#,
        )
        .unwrap();
        assert_eq!(
            read(&path).await.unwrap(),
            vec!["10.0.0.5:8000", "10.0.0.6:8000", "[::1]:8001"]
        );
        std::fs::write(&path, r#"[{"targets": ["http://x:1/path"]}]"#).unwrap();
        let e = read(&path).await.unwrap_err().to_string();
        assert!(e.contains("is not host:port"), "{e}");
        std::fs::write(&path, "{not json").unwrap();
        let e = read(&path).await.unwrap_err().to_string();
        assert!(e.contains("replicas.json"), "{e}");
        let missing = read(&dir.join("none.json")).await.unwrap_err().to_string();
        assert!(missing.contains("none.json"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
