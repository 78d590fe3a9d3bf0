//! The three delivery channels, one attempt each: SMTP through lettre, a
//! JSON webhook, and Alertmanager's v2 API. Retries live in the caller.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::detector_notify::{EmailConfig, SmtpSecurity, WebhookConfig, WebhookUrl};

/// Why one delivery attempt failed; never carries a secret. Causes are
/// part of the messages, not chained, so each is printed once.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("credentials: {0}")]
    Secret(crate::secret::SecretError),
    #[error("email: {0}")]
    Email(String),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("HTTP status {0}")]
    Status(u16),
}

impl From<crate::secret::SecretError> for NotifyError {
    fn from(e: crate::secret::SecretError) -> Self {
        NotifyError::Secret(e)
    }
}

fn http_error(e: reqwest::Error) -> NotifyError {
    // The chain without the URL: a webhook URL can be a secret.
    NotifyError::Http(crate::client::http::error_chain(&e))
}

/// The SMTP transport for the configured security, trusting the extra CA
/// certificates (besides the system's) when a `ca_file` is set.
fn transport(
    cfg: &EmailConfig,
) -> Result<lettre::transport::smtp::AsyncSmtpTransportBuilder, NotifyError> {
    use lettre::transport::smtp::client::{Tls, TlsParameters};
    let email_error = |e: lettre::transport::smtp::Error| NotifyError::Email(e.to_string());
    let parameters = || match &cfg.ca_certificates {
        None => TlsParameters::new(cfg.smtp_host.clone()).map_err(email_error),
        Some(ca) => TlsParameters::builder(cfg.smtp_host.clone())
            .add_root_certificate(ca.get().clone())
            .build()
            .map_err(email_error),
    };
    let plain = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&cfg.smtp_host);
    Ok(match cfg.security {
        SmtpSecurity::StartTls => plain.tls(Tls::Required(parameters()?)),
        SmtpSecurity::Tls => plain.tls(Tls::Wrapper(parameters()?)),
        SmtpSecurity::None => plain,
    })
}

pub async fn email(
    cfg: &EmailConfig,
    subject: &str,
    body: &str,
    timeout: Duration,
) -> Result<(), NotifyError> {
    let builder = transport(cfg)?;
    let mut builder = builder.port(cfg.smtp_port).timeout(Some(timeout));
    if let (Some(user), Some(password)) = (&cfg.username, &cfg.password) {
        let user = user
            .load(false)?
            .map(|k| k.expose().to_owned())
            .unwrap_or_default();
        let password = password
            .load(false)?
            .map(|k| k.expose().to_owned())
            .unwrap_or_default();
        builder = builder.credentials(Credentials::new(user, password));
    }
    let mailer = builder.build();
    let mut message = Message::builder()
        .from(
            cfg.from
                .parse()
                .map_err(|e| NotifyError::Email(format!("from: {e}")))?,
        )
        .subject(subject)
        .header(ContentType::TEXT_PLAIN);
    for to in &cfg.to {
        message = message.to(to
            .parse()
            .map_err(|e| NotifyError::Email(format!("to: {e}")))?);
    }
    let message = message
        .body(body.to_owned())
        .map_err(|e| NotifyError::Email(e.to_string()))?;
    mailer
        .send(message)
        .await
        .map_err(|e| NotifyError::Email(e.to_string()))?;
    Ok(())
}

pub async fn webhook(
    http: &reqwest::Client,
    cfg: &WebhookConfig,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<(), NotifyError> {
    let url = match &cfg.url {
        WebhookUrl::Plain(u) => u.clone(),
        WebhookUrl::Secret(source) => source
            .load(false)?
            .map(|k| k.expose().to_owned())
            .unwrap_or_default(),
    };
    let mut request = http.post(url).timeout(timeout).json(body);
    if let Some(token) = &cfg.bearer_token
        && let Some(key) = token.load(false)?
    {
        request = request.header(reqwest::header::AUTHORIZATION, key.bearer());
    }
    let response = request.send().await.map_err(http_error)?;
    if !response.status().is_success() {
        return Err(NotifyError::Status(response.status().as_u16()));
    }
    Ok(())
}

pub async fn alertmanager(
    http: &reqwest::Client,
    base_url: &str,
    alerts: &[serde_json::Value],
    timeout: Duration,
) -> Result<(), NotifyError> {
    let response = http
        .post(format!("{base_url}/api/v2/alerts"))
        .timeout(timeout)
        .json(alerts)
        .send()
        .await
        .map_err(http_error)?;
    if !response.status().is_success() {
        return Err(NotifyError::Status(response.status().as_u16()));
    }
    Ok(())
}
