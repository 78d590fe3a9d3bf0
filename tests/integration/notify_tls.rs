//! Email over STARTTLS and over implicit TLS to a real SMTP server (Debian's
//! `python3-aiosmtpd`) whose certificate comes from a private CA made for
//! the test: with `ca_file` naming that CA the message arrives in the
//! maildir; without it the certificate is refused, the error says so, and
//! nothing arrives. A bad `ca_file` is a configuration error on its field.

use crate::common;

use common::{SmtpTls, start_smtp, temp_dir};

use std::path::{Path, PathBuf};
use std::time::Duration;

use vllm_sentinel::config::Config;
use vllm_sentinel::notify::channels;

/// A CA, and a certificate for `localhost` it signed, written as PEM.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    let authority = common::pki::Pki::new(dir);
    let (cert, key) = authority.issue_files(&["localhost"], dir, "smtp");
    Pki {
        ca: authority.ca,
        cert,
        key,
    }
}

fn config(port: u16, security: &str, ca_file: Option<&Path>) -> String {
    let ca = ca_file.map_or(String::new(), |p| format!("ca_file = {:?}\n", p));
    format!(
        r#"
[notify.email]
smtp_host = "localhost"
smtp_port = {port}
security = "{security}"
{ca}from = "sentinel@example.com"
to = ["oncall@example.com"]

[[scenarios]]
name = "s"
input_len = 8
output_len = 4

[[targets]]
name = "t"
base_url = "http://127.0.0.1:1"
"#
    )
}

fn messages_in(maildir: &Path) -> Vec<String> {
    let new = maildir.join("new");
    std::fs::read_dir(&new)
        .map(|entries| {
            entries
                .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

async fn send(text: &str, subject: &str) -> Result<(), channels::NotifyError> {
    let config = Config::from_text(text, "test").unwrap_or_else(|e| panic!("{e}"));
    let email = config.notify.email.expect("email configured");
    channels::email(&email, subject, "body text", Duration::from_secs(10)).await
}

#[tokio::test]
async fn email_over_starttls_and_tls_trusts_the_configured_ca_only() {
    if !common::have(&["aiosmtpd"]) {
        return;
    }
    let dir = temp_dir("notify-tls");
    let pki = make_pki(&dir);
    for (security, implicit) in [("starttls", false), ("tls", true)] {
        let maildir = dir.join(format!("mail-{security}"));
        let (cert, key) = (pki.cert.as_path(), pki.key.as_path());
        let tls = if implicit {
            SmtpTls::Implicit { cert, key }
        } else {
            SmtpTls::StartTls { cert, key }
        };
        let (_smtp, port) = start_smtp(&maildir, tls).await;

        // The private CA is not among the system's roots: refused.
        let refused = send(&config(port, security, None), "untrusted")
            .await
            .expect_err("a certificate from an unknown CA must be refused");
        eprintln!("{security} without ca_file: {refused}");
        let text = refused.to_string().to_lowercase();
        assert!(text.contains("certificate"), "{security}: {refused}");
        assert!(messages_in(&maildir).is_empty(), "{security}");

        // Trusted through ca_file: delivered over the encrypted session.
        send(&config(port, security, Some(&pki.ca)), "over tls")
            .await
            .unwrap_or_else(|e| panic!("{security}: {e}"));
        let messages = messages_in(&maildir);
        assert_eq!(messages.len(), 1, "{security}");
        assert!(messages[0].contains("Subject: over tls"), "{}", messages[0]);
        assert!(messages[0].contains("body text"), "{}", messages[0]);
    }
}

#[test]
fn a_bad_ca_file_is_a_configuration_error_on_its_field() {
    let dir = temp_dir("notify-tls-config");
    let missing = dir.join("missing.pem");
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    for (path, problem) in [(&missing, "cannot read"), (&not_pem, "no PEM certificate")] {
        let err = Config::from_text(&config(25, "starttls", Some(path)), "test")
            .expect_err("a bad ca_file is refused")
            .to_string();
        assert!(err.contains("notify.email.ca_file"), "{err}");
        assert!(err.contains(problem), "{err}");
    }
    let pki = make_pki(&dir);
    let err = Config::from_text(&config(25, "none", Some(&pki.ca)), "test")
        .expect_err("ca_file with plain SMTP is refused")
        .to_string();
    assert!(err.contains("notify.email.ca_file"), "{err}");
    assert!(err.contains("plain SMTP"), "{err}");
}
