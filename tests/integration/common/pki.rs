//! A test certificate authority: a CA certificate written as PEM and
//! certificates it signs, for the TLS tests (SMTP, the exporter's port).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub struct Pki {
    /// The CA's certificate, PEM.
    pub ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// A fresh CA, its certificate written to `dir/ca.pem`.
    pub fn new(dir: &Path) -> Pki {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.pem()).unwrap();
        Pki {
            ca,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` and its key, PEM.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A certificate for `names` written to `dir/<stem>.pem` and its key to
    /// `dir/<stem>.key`.
    pub fn issue_files(&self, names: &[&str], dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.issue(names);
        let paths = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&paths.0, cert).unwrap();
        std::fs::write(&paths.1, key).unwrap();
        paths
    }
}
