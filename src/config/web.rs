//! The exporter's web configuration file (`[exporter] web_config`), in the
//! exporter-toolkit format node_exporter and blackbox_exporter read: TLS
//! for the exporter's port (`tls_server_config`) and basic-auth users with
//! bcrypt hashes (`basic_auth_users`). Read and checked whole in the
//! configuration's load step (and again on every reload), never by its
//! parse; the file and the PEM files it names are read bounded (regular
//! files of at most 1 MiB). A file it cannot use is a configuration error
//! naming the key.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::bounded_file;

/// Largest web configuration file read: a few users and file names.
pub const MAX_WEB_CONFIG_BYTES: u64 = 1 << 20;
/// Largest certificate, key or CA bundle read.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why a web configuration file cannot be used; `key` is where in the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {key}: {message}", path = path.display())]
pub struct WebConfigError {
    pub path: PathBuf,
    pub key: String,
    pub message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebFile {
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    /// Read only so that keys inside it are checked.
    #[allow(dead_code)]
    http_server_config: Option<HttpFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_ca_file: Option<String>,
    client_auth_type: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
}

/// Only `http2` is read, and HTTP/1.1 is what the exporter speaks either
/// way; other keys are refused rather than silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    #[allow(dead_code)]
    http2: Option<bool>,
}

/// Most distinct credentials remembered as verified: bcrypt costs tens of
/// milliseconds, far too much to pay on every scrape.
pub(crate) const VERIFIED_CACHE: usize = 64;

/// What a web configuration file asks of the exporter's port.
pub struct WebSecurity {
    pub path: PathBuf,
    tls: Option<TlsAcceptor>,
    pub(crate) users: BTreeMap<String, String>,
    /// What an unknown user's password is checked against: a hash of the
    /// highest cost among the users that no password matches.
    pub(crate) decoy: String,
    /// `Authorization` values already checked against a hash.
    pub(crate) verified: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for WebSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSecurity")
            .field("path", &self.path)
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl WebSecurity {
    /// Reads and checks the file at `path`; paths inside it are relative
    /// to its directory, as exporter-toolkit reads them.
    pub fn load(path: &Path) -> Result<WebSecurity, WebConfigError> {
        let fail = |key: &str, message: String| WebConfigError {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let bytes = bounded_file::read(path, MAX_WEB_CONFIG_BYTES)
            .map_err(|e| fail("(file)", e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| fail("(file)", "not UTF-8 text".into()))?;
        let file: WebFile = if text.trim().is_empty() {
            WebFile::default()
        } else {
            yaml_serde::from_str(&text).map_err(|e| fail("(yaml)", e.to_string()))?
        };
        let mut highest_cost = None;
        for (user, hash) in &file.basic_auth_users {
            let cost =
                bcrypt_cost(hash).map_err(|m| fail(&format!("basic_auth_users.{user}"), m))?;
            highest_cost = highest_cost.max(Some(cost));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let tls = match &file.tls_server_config {
            Some(tls) => Some(
                server_config(tls, dir)
                    .map(|c| TlsAcceptor::from(Arc::new(c)))
                    .map_err(|(key, message)| fail(&format!("tls_server_config.{key}"), message))?,
            ),
            None => None,
        };
        Ok(WebSecurity {
            path: path.to_owned(),
            tls,
            users: file.basic_auth_users,
            decoy: decoy_hash(highest_cost.unwrap_or(10)),
            verified: Mutex::new(HashSet::new()),
        })
    }

    /// The TLS acceptor when the port speaks TLS.
    pub fn tls(&self) -> Option<&TlsAcceptor> {
        self.tls.as_ref()
    }

    pub fn has_users(&self) -> bool {
        !self.users.is_empty()
    }
}

/// Highest bcrypt cost accepted: each step doubles the work, and at 14 one
/// check already takes about a second of a core; at 31 it takes days, and
/// two logins would hold two cores for as long.
pub const MAX_BCRYPT_COST: u32 = 14;

/// Least cost bcrypt itself accepts.
const MIN_BCRYPT_COST: u32 = 4;

const MAKE_ONE: &str = "make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`";

/// The cost of a bcrypt hash a login can be checked against, or why it
/// cannot be used.
fn bcrypt_cost(hash: &str) -> Result<u32, String> {
    use base64::Engine;
    let not_a_hash = || format!("is not a bcrypt hash ({MAKE_ONE})");
    let parts: bcrypt::HashParts = hash.parse().map_err(|_| not_a_hash())?;
    // The salt and digest must decode too, or every check fails at once.
    let decodes = |text: &str, bytes: usize| {
        bcrypt::BASE_64
            .decode(text)
            .is_ok_and(|decoded| decoded.len() == bytes)
    };
    let salt_and_digest = hash.trim_end_matches('$').rsplit('$').next();
    match salt_and_digest.and_then(|s| s.split_at_checked(22)) {
        Some((salt, digest)) if decodes(salt, 16) && decodes(digest, 23) => {}
        _ => return Err(not_a_hash()),
    }
    match parts.get_cost() {
        cost if cost > MAX_BCRYPT_COST => Err(format!(
            "bcrypt cost {cost} is above {MAX_BCRYPT_COST}: each check would hold a core for \
             {} times as long as at cost 10; {MAKE_ONE}",
            1u64.checked_shl(cost - 10)
                .map_or_else(|| format!("2^{}", cost - 10), |times| times.to_string())
        )),
        cost if cost < MIN_BCRYPT_COST => Err(format!(
            "bcrypt cost {cost} is below {MIN_BCRYPT_COST}, the least bcrypt accepts; {MAKE_ONE}"
        )),
        cost => Ok(cost),
    }
}

/// A well-formed bcrypt hash of `cost` that no password matches (its
/// digest is all zero bytes): checking against it costs what checking a
/// user's password costs.
fn decoy_hash(cost: u32) -> String {
    use base64::Engine;
    format!(
        "$2b${cost:02}${}{}",
        bcrypt::BASE_64.encode([0u8; 16]),
        bcrypt::BASE_64.encode([0u8; 23])
    )
}

/// User and password of a `Basic` authorization value.
pub(crate) fn basic_credentials(authorization: &str) -> Option<(String, String)> {
    use base64::Engine;
    let (scheme, encoded) = authorization.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// Go's `tls.ClientAuthType` names, as exporter-toolkit reads them.
enum ClientAuth {
    None,
    VerifyIfGiven,
    Require,
}

fn client_auth(tls: &TlsFile) -> Result<ClientAuth, (&'static str, String)> {
    let named = tls.client_auth_type.as_deref();
    let auth = match named {
        None if tls.client_ca_file.is_some() => ClientAuth::Require,
        None | Some("NoClientCert") => ClientAuth::None,
        Some("VerifyClientCertIfGiven") => ClientAuth::VerifyIfGiven,
        Some("RequireAndVerifyClientCert") => ClientAuth::Require,
        Some(other @ ("RequestClientCert" | "RequireAnyClientCert")) => {
            return Err((
                "client_auth_type",
                format!(
                    "{other:?} accepts certificates nobody checked; use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                ),
            ));
        }
        Some(other) => {
            return Err((
                "client_auth_type",
                format!(
                    "{other:?} is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
                ),
            ));
        }
    };
    if !matches!(auth, ClientAuth::None) && tls.client_ca_file.is_none() {
        return Err((
            "client_ca_file",
            "is required to verify client certificates".into(),
        ));
    }
    Ok(auth)
}

fn versions(
    tls: &TlsFile,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, (&'static str, String)> {
    let rank = |key: &'static str, name: Option<&str>, default: u8| match name {
        None => Ok(default),
        Some("TLS12") => Ok(12),
        Some("TLS13") => Ok(13),
        Some(other) => Err((
            key,
            format!("{other:?}: TLS12 or TLS13 (older versions are not offered)"),
        )),
    };
    let min = rank("min_version", tls.min_version.as_deref(), 12)?;
    let max = rank("max_version", tls.max_version.as_deref(), 13)?;
    if min > max {
        return Err(("min_version", "is above max_version".into()));
    }
    Ok(
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, version)| version)
            .collect(),
    )
}

fn server_config(
    tls: &TlsFile,
    dir: &Path,
) -> Result<rustls::ServerConfig, (&'static str, String)> {
    let cert_path = dir.join(
        tls.cert_file
            .as_deref()
            .ok_or(("cert_file", "is required".to_owned()))?,
    );
    let key_path = dir.join(
        tls.key_file
            .as_deref()
            .ok_or(("key_file", "is required".to_owned()))?,
    );
    let unreadable = |path: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    // Each PEM file a regular file of bounded length, read whole.
    let pem = |key: &'static str, path: &Path| {
        bounded_file::read(path, MAX_PEM_BYTES).map_err(|e| (key, unreadable(path, &e)))
    };
    let cert_pem = pem("cert_file", &cert_path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| ("cert_file", unreadable(&cert_path, &e)))?;
    if certs.is_empty() {
        return Err((
            "cert_file",
            format!("{}: no certificate in it", cert_path.display()),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&pem("key_file", &key_path)?)
        .map_err(|e| ("key_file", unreadable(&key_path, &e)))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions(tls)?)
        .map_err(|e| ("min_version", e.to_string()))?;
    let auth = client_auth(tls)?;
    let builder = match (&auth, &tls.client_ca_file) {
        (ClientAuth::None, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let ca_path = dir.join(ca);
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem("client_ca_file", &ca_path)?) {
                let cert = cert.map_err(|e| ("client_ca_file", unreadable(&ca_path, &e)))?;
                roots
                    .add(cert)
                    .map_err(|e| ("client_ca_file", unreadable(&ca_path, &e)))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = match auth {
                ClientAuth::VerifyIfGiven => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|e| ("client_ca_file", unreadable(&ca_path, &e)))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ("key_file", format!("does not go with cert_file: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn load(name: &str, text: &str) -> Result<WebSecurity, WebConfigError> {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.yml"));
        std::fs::write(&path, text).unwrap();
        WebSecurity::load(&path)
    }

    fn message(name: &str, text: &str) -> String {
        load(name, text).unwrap_err().to_string()
    }

    #[test]
    fn an_empty_file_asks_for_nothing() {
        let web = load("empty", "").unwrap();
        assert!(web.tls().is_none() && !web.has_users());
    }

    #[test]
    fn each_mistake_names_its_key() {
        let cases = [
            (
                "hash",
                "basic_auth_users:\n  alice: secret\n",
                "basic_auth_users.alice: is not a bcrypt hash",
            ),
            (
                "unknown",
                "tls_server_config:\n  cipher_suites: [x]\n",
                "unknown field `cipher_suites`",
            ),
            (
                "nocert",
                "tls_server_config:\n  key_file: k.pem\n",
                "tls_server_config.cert_file: is required",
            ),
            (
                "missing",
                "tls_server_config:\n  cert_file: none.pem\n  key_file: none.key\n",
                "tls_server_config.cert_file: ",
            ),
            ("top", "basic_auth:\n  a: b\n", "unknown field `basic_auth`"),
            (
                "headers",
                "http_server_config:\n  headers: {}\n",
                "unknown field `headers`",
            ),
        ];
        for (name, text, expected) in cases {
            let got = message(name, text);
            assert!(got.contains(expected), "{name}: {got}");
        }
    }

    #[test]
    fn a_file_or_pem_that_is_a_device_or_a_fifo_is_refused_unread() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero.pem")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo.yml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = WebSecurity::load(&dir.join("fifo.yml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: (file): a FIFO (named pipe), not a regular file",
                dir.join("fifo.yml").display()
            )
        );
        let web = dir.join("web.yml");
        std::fs::write(
            &web,
            "tls_server_config:\n  cert_file: zero.pem\n  key_file: zero.pem\n",
        )
        .unwrap();
        assert_eq!(
            WebSecurity::load(&web).unwrap_err().to_string(),
            format!(
                "{}: tls_server_config.cert_file: {}: a character device, not a regular file",
                web.display(),
                dir.join("zero.pem").display()
            )
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn costs_past_the_bound_and_broken_salts_are_refused() {
        let valid = bcrypt::hash("pw", 4).unwrap();
        let at = |cost: u32| format!("$2b${cost:02}${}", &valid[7..]);
        let cases = [
            (at(31), "basic_auth_users.alice: bcrypt cost 31 is above 14"),
            // A cost past 73 would shift the times-as-long past 64 bits.
            (
                at(74),
                "basic_auth_users.alice: bcrypt cost 74 is above 14: each check would hold a core for 2^64 times",
            ),
            (at(15), "basic_auth_users.alice: bcrypt cost 15 is above 14"),
            (at(3), "basic_auth_users.alice: bcrypt cost 3 is below 4"),
            // '!' is no bcrypt base64 character: every check would fail.
            (
                format!("{}!{}", &valid[..7], &valid[8..]),
                "basic_auth_users.alice: is not a bcrypt hash",
            ),
            (
                format!("{}$", &valid[..59]),
                "basic_auth_users.alice: is not a bcrypt hash",
            ),
        ];
        for (hash, expected) in cases {
            let got = message("cost", &format!("basic_auth_users:\n  alice: '{hash}'\n"));
            assert!(got.contains(expected), "{hash}: {got}");
        }
        let fine = load(
            "cost14",
            &format!("basic_auth_users:\n  alice: '{}'\n", at(14)),
        );
        assert!(fine.unwrap().has_users());
    }

    /// An unknown name costs one check, as a known one does, against a
    /// hash of the users' highest cost; no password opens it.

    #[test]
    fn client_auth_types_follow_exporter_toolkit() {
        let file = |auth: Option<&str>, ca: bool| TlsFile {
            client_auth_type: auth.map(str::to_owned),
            client_ca_file: ca.then(|| "ca.pem".to_owned()),
            ..TlsFile::default()
        };
        assert!(matches!(
            client_auth(&file(None, false)),
            Ok(ClientAuth::None)
        ));
        assert!(matches!(
            client_auth(&file(None, true)),
            Ok(ClientAuth::Require)
        ));
        assert!(matches!(
            client_auth(&file(Some("VerifyClientCertIfGiven"), true)),
            Ok(ClientAuth::VerifyIfGiven)
        ));
        let Err((key, _)) = client_auth(&file(Some("RequireAndVerifyClientCert"), false)) else {
            panic!("verification without a CA is refused");
        };
        assert_eq!(key, "client_ca_file");
        let Err((_, why)) = client_auth(&file(Some("RequireAnyClientCert"), true)) else {
            panic!("unverified certificates are refused");
        };
        assert!(why.contains("nobody checked"), "{why}");
    }

    #[test]
    fn versions_are_bounded_and_ordered() {
        let file = |min: Option<&str>, max: Option<&str>| TlsFile {
            min_version: min.map(str::to_owned),
            max_version: max.map(str::to_owned),
            ..TlsFile::default()
        };
        assert_eq!(versions(&file(None, None)).unwrap().len(), 2);
        assert_eq!(versions(&file(Some("TLS13"), None)).unwrap().len(), 1);
        assert!(versions(&file(Some("TLS10"), None)).is_err());
        assert!(versions(&file(Some("TLS13"), Some("TLS12"))).is_err());
    }

    #[test]
    fn basic_credentials_are_read_from_any_case_of_the_scheme() {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:pa:ss");
        assert_eq!(
            basic_credentials(&format!("bAsIc {encoded}")),
            Some(("alice".into(), "pa:ss".into()))
        );
        assert_eq!(basic_credentials(&format!("Bearer {encoded}")), None);
        assert_eq!(basic_credentials("Basic !!!"), None);
    }
}
