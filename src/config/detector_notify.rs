//! The `[detector]` and `[notify]` sections: how baselines form, how the
//! regression verdict is reached, and where verdicts are delivered; the
//! relay's `ca_file` is read in the load step, not by the reader.

use std::time::Duration;

use lettre::transport::smtp::client::Certificate;

use super::FileRef;
use super::reader::{Errors, Fields};
use crate::client::SecretSource;
use crate::config::verdict_policy::VerdictPolicy;

/// SMTP transport security.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpSecurity {
    StartTls,
    Tls,
    /// Plain SMTP, for a relay on localhost only.
    None,
}

#[derive(Debug, Clone)]
pub struct EmailConfig {
    pub smtp_host: String,
    pub smtp_port: u16,
    pub security: SmtpSecurity,
    pub username: Option<SecretSource>,
    pub password: Option<SecretSource>,
    pub from: String,
    pub to: Vec<String>,
    /// Extra CA certificates (PEM) trusted for the SMTP server's
    /// certificate besides the system's, for a relay with a private CA:
    /// the bundle `ca_file` names, read and parsed once, in the load step.
    pub ca_certificates: Option<FileRef<Certificate>>,
}

/// The load step's part: reads the CA bundle, or says what is wrong with it.
pub(super) fn read_ca_file(ca: &mut FileRef<Certificate>, errors: &mut Errors) {
    ca.fill(errors, |path| {
        let pem = crate::bounded_file::read(path, super::web::MAX_PEM_BYTES)
            .map_err(|e| format!("cannot read {path:?}: {e}"))?;
        // lettre accepts a file without any certificate as an empty bundle.
        if memchr::memmem::find(&pem, b"-----BEGIN CERTIFICATE-----").is_none() {
            return Err(format!("{path:?} holds no PEM certificate"));
        }
        Certificate::from_pem(&pem).map_err(|e| format!("{path:?} is not a valid PEM bundle: {e}"))
    });
}

/// A generic JSON webhook; its URL may be a secret (Slack's are).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub name: String,
    pub url: WebhookUrl,
    pub bearer_token: Option<SecretSource>,
}

#[derive(Debug, Clone)]
pub enum WebhookUrl {
    Plain(String),
    Secret(SecretSource),
}

#[derive(Debug, Clone)]
pub struct AlertmanagerConfig {
    pub url: String,
    /// Firing alerts are posted again this often, as Alertmanager expects.
    pub resend_interval: Duration,
}

#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// Base URL of this daemon as users reach it; messages link reports there.
    pub external_url: Option<String>,
    /// Verdicts of one target arriving within this window go in one message.
    pub group_wait: Duration,
    /// At most one message per target and channel this often; later ones
    /// wait and are merged.
    pub min_interval: Duration,
    pub max_attempts: u32,
    pub retry_initial: Duration,
    pub timeout: Duration,
    pub email: Option<EmailConfig>,
    pub webhooks: Vec<WebhookConfig>,
    pub alertmanager: Option<AlertmanagerConfig>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            external_url: None,
            group_wait: Duration::from_secs(30),
            min_interval: Duration::from_secs(300),
            max_attempts: 5,
            retry_initial: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
            email: None,
            webhooks: Vec::new(),
            alertmanager: None,
        }
    }
}

/// Settings that contradict each other, named by the one to change.
fn check_policy(c: &VerdictPolicy, f: &Fields, errors: &mut Errors) {
    let d = &c.detector;
    // Each level beyond doubt is a stricter one than the noise's.
    for (key, level) in [
        ("decisive_q", d.decisive_q),
        ("upgrade_decisive_q", c.upgrade_decisive_q),
        ("upgrade_first_run_q", c.upgrade_first_run_q),
    ] {
        if level > d.fdr_q {
            errors.push(
                f.path_of(key),
                format!(
                    "{level} is more than fdr_q ({}): a slowdown beyond doubt must first be one beyond the noise",
                    d.fdr_q
                ),
            );
        }
    }
    if d.confirm_needed > d.confirm_window {
        errors.push(
            f.path_of("confirm_needed"),
            format!(
                "{} is more than confirm_window ({})",
                d.confirm_needed, d.confirm_window
            ),
        );
    }
    if c.upgrade_confirm_needed > d.confirm_window {
        errors.push(
            f.path_of("upgrade_confirm_needed"),
            format!(
                "{} is more than confirm_window ({})",
                c.upgrade_confirm_needed, d.confirm_window
            ),
        );
    }
    if d.min_baseline_runs > c.baseline_runs {
        errors.push(
            f.path_of("min_baseline_runs"),
            format!(
                "{} is more than baseline_runs ({}): no baseline could ever be judged",
                d.min_baseline_runs, c.baseline_runs
            ),
        );
    }
    if d.min_candidate_runs > c.candidate_window {
        errors.push(
            f.path_of("min_candidate_runs"),
            format!(
                "{} is more than candidate_window ({})",
                d.min_candidate_runs, c.candidate_window
            ),
        );
    }
    // `upgrade_confirm_needed` applies from the run after the first one
    // judged up to the `candidate_window`-th: there must be one.
    if c.upgrade_min_candidate_runs >= c.candidate_window {
        errors.push(
            f.path_of("upgrade_min_candidate_runs"),
            format!(
                "{} is not less than candidate_window ({}): no run of an upgrade would be left where upgrade_confirm_needed applies",
                c.upgrade_min_candidate_runs, c.candidate_window
            ),
        );
    }
}

pub fn verdict_policy(root: &mut Fields, errors: &mut Errors) -> VerdictPolicy {
    let mut c = VerdictPolicy::default();
    let Some(mut f) = root.table("detector", errors) else {
        return c;
    };
    let d = &mut c.detector;
    let count = |f: &mut Fields, key, errors: &mut Errors| {
        f.integer(key, 1, 100_000, errors).map(|v| v as usize)
    };
    // A sample of one run has no median to speak of, nor a spread.
    let sample = |f: &mut Fields, key, errors: &mut Errors| {
        f.integer(key, 2, 100_000, errors).map(|v| v as usize)
    };
    if let Some(v) = f.number("threshold", 0.0, 10.0, errors) {
        d.threshold = v;
    }
    if let Some(v) = f.number("fdr_q", 1e-9, 0.5, errors) {
        d.fdr_q = v;
    }
    if let Some(v) = f.number("confidence", 0.5, 0.9999, errors) {
        d.confidence = v;
    }
    if let Some(v) = sample(&mut f, "min_candidate_runs", errors) {
        d.min_candidate_runs = v;
    }
    if let Some(v) = sample(&mut f, "min_baseline_runs", errors) {
        d.min_baseline_runs = v;
    }
    if let Some(v) = count(&mut f, "confirm_needed", errors) {
        d.confirm_needed = v;
    }
    if let Some(v) = count(&mut f, "confirm_window", errors) {
        d.confirm_window = v;
    }
    if let Some(v) = f.number("load_ks_alpha", 0.0, 1.0, errors) {
        d.load_ks_alpha = v;
    }
    if let Some(v) = f.number("load_min_difference", 0.0, 1e6, errors) {
        d.load_min_difference = v;
    }
    if let Some(v) = f.boolean("correlation", errors) {
        d.correlation = v;
    }
    if let Some(v) = f.boolean("phase_ratios", errors) {
        d.phase_ratios = v;
    }
    if let Some(v) = f.integer("scan_min_runs", 0, 1000, errors) {
        d.scan_min_runs = v as usize;
    }
    if let Some(v) = f.number("decisive_q", 0.0, 0.5, errors) {
        d.decisive_q = v;
    }
    if let Some(v) = f.integer("measured_stretches", 0, 100_000, errors) {
        d.measured_stretches = v as usize;
    }
    if let Some(v) = f.boolean("heavy_tails", errors) {
        d.heavy_tails = v;
    }
    if let Some(v) = f.boolean("exact_median_variance", errors) {
        d.exact_median_variance = v;
    }
    if let Some(v) = f.boolean("load_covariate", errors) {
        d.load_covariate = v;
    }
    if let Some(v) = f.boolean("log_test", errors) {
        d.log_test = v;
    }
    if let Some(v) = f.boolean("alert_on_p99", errors) {
        d.alert_on_p99 = v;
    }
    if let Some(v) = count(&mut f, "baseline_runs", errors) {
        c.baseline_runs = v;
    }
    if let Some(v) = f.integer("warmup_runs", 0, 1000, errors) {
        c.warmup_runs = v as usize;
    }
    if let Some(v) = count(&mut f, "candidate_window", errors) {
        c.candidate_window = v;
    }
    if let Some(v) = count(&mut f, "upgrade_candidate_window", errors) {
        c.upgrade_candidate_window = v;
    }
    if let Some(v) = f.integer("noise_runs", 0, 100_000, errors) {
        c.noise_runs = v as usize;
    }
    if let Some(v) = f.integer("spell_runs", 0, 100_000, errors) {
        c.spell_runs = v as usize;
    }
    if let Some(v) = f.number("young_hurst", 0.5, 0.95, errors) {
        c.young_hurst = v;
    }
    // Student's t needs more than 2 degrees of freedom for a variance;
    // below 3 its tails would judge nothing.
    match f.number("settled_tail_df", 0.0, 1000.0, errors) {
        Some(v) if v > 0.0 && v < 3.0 => errors.push(
            f.path_of("settled_tail_df"),
            format!("{v} is out of range: must be 0 (assume no tails) or at least 3"),
        ),
        Some(v) => c.settled_tail_df = v,
        None => {}
    }
    if let Some(v) = count(&mut f, "upgrade_confirm_needed", errors) {
        c.upgrade_confirm_needed = v;
    }
    if let Some(v) = sample(&mut f, "upgrade_min_candidate_runs", errors) {
        c.upgrade_min_candidate_runs = v;
    }
    if let Some(v) = f.number("upgrade_decisive_q", 0.0, 0.5, errors) {
        c.upgrade_decisive_q = v;
    }
    if let Some(v) = f.number("upgrade_first_run_q", 0.0, 0.5, errors) {
        c.upgrade_first_run_q = v;
    }
    if let Some(v) = f.boolean("upgrade_rounds", errors) {
        c.upgrade_rounds = v;
    }
    if let Some(v) = f.duration("upgrade_round_gap", errors) {
        c.upgrade_round_gap = v;
    }
    if let Some(v) = f.integer("canary_window", 1, 1000, errors) {
        c.canary_window = v as usize;
    }
    if let Some(v) = f.integer("min_canary_requests", 3, 1_000_000, errors) {
        c.min_canary_requests = v as usize;
    }
    if let Some(v) = f.integer("max_new_builds_per_hour", 1, 1000, errors) {
        c.max_new_builds_per_hour = v as u32;
    }
    if let Some(v) = f.positive_duration("rollout_timeout", errors) {
        c.rollout_timeout = v;
    }
    if let Some(v) = f.integer("drift_position", 1, 100_000, errors) {
        c.drift.position = v as usize;
    }
    if let Some(v) = f.number("drift_share", 0.01, 1.0, errors) {
        c.drift.share = v;
    }
    if let Some(v) = f.number("drift_logprob_shift", 0.0, 100.0, errors) {
        c.drift.logprob_shift = v;
    }
    check_policy(&c, &f, errors);
    f.finish(errors);
    c
}

/// Whether an SMTP host is this machine, where a password in clear text
/// never crosses a network.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn email(mut f: Fields, errors: &mut Errors) -> Option<EmailConfig> {
    let host = f.string("smtp_host", errors);
    let security = match f.string("security", errors).as_deref() {
        None | Some("starttls") => Some(SmtpSecurity::StartTls),
        Some("tls") => Some(SmtpSecurity::Tls),
        Some("none") => Some(SmtpSecurity::None),
        Some(other) => {
            errors.push(
                f.path_of("security"),
                format!("{other:?} must be \"starttls\", \"tls\" or \"none\""),
            );
            None
        }
    };
    let default_port = match security {
        Some(SmtpSecurity::Tls) => 465,
        Some(SmtpSecurity::None) => 25,
        _ => 587,
    };
    let port = f
        .integer("smtp_port", 1, 65_535, errors)
        .map_or(default_port, |p| p as u16);
    let username = super::key_source(&mut f, "username_env", "username_file", errors);
    let password = super::key_source(&mut f, "password_env", "password_file", errors);
    let from = f.string("from", errors);
    let to = f.strings("to", errors).unwrap_or_default();
    let ca_certificates = f
        .string("ca_file", errors)
        .map(|path| FileRef::named(f.path_of("ca_file"), path));
    if ca_certificates.is_some() && security == Some(SmtpSecurity::None) {
        errors.push(
            f.path_of("ca_file"),
            "is for security = \"starttls\" or \"tls\"; plain SMTP checks no certificate",
        );
    }
    if host.as_deref().is_none_or(str::is_empty) {
        errors.push(f.path_of("smtp_host"), "is required");
    }
    if security == Some(SmtpSecurity::None)
        && password.is_some()
        && let Some(host) = host.as_deref().filter(|h| !is_loopback(h))
    {
        errors.push(
            f.path_of("security"),
            format!(
                "\"none\" would send the password in clear text to {host:?}: plain SMTP with a login is for a relay on this machine (localhost, 127.0.0.1, ::1); use \"starttls\" or \"tls\""
            ),
        );
    }
    if username.is_some() != password.is_some() {
        errors.push(
            f.path_of("password_env"),
            "username and password are set together or not at all",
        );
    }
    for (key, address) in from
        .iter()
        .map(|a| ("from", a))
        .chain(to.iter().map(|a| ("to", a)))
    {
        if address.parse::<lettre::message::Mailbox>().is_err() {
            errors.push(
                f.path_of(key),
                format!("{address:?} is not an email address"),
            );
        }
    }
    if from.is_none() {
        errors.push(f.path_of("from"), "is required");
    }
    if to.is_empty() {
        errors.push(f.path_of("to"), "needs at least one address");
    }
    f.finish(errors);
    Some(EmailConfig {
        smtp_host: host?,
        smtp_port: port,
        security: security?,
        username,
        password,
        from: from?,
        to,
        ca_certificates,
    })
}

fn webhook(mut f: Fields, index: usize, errors: &mut Errors) -> Option<WebhookConfig> {
    let name = f
        .string("name", errors)
        .unwrap_or_else(|| format!("webhook{index}"));
    let plain = f.string("url", errors);
    let secret_url = super::key_source(&mut f, "url_env", "url_file", errors);
    let bearer_token = super::key_source(&mut f, "bearer_token_env", "bearer_token_file", errors);
    let url = match (plain, secret_url) {
        (Some(_), Some(_)) => {
            errors.push(
                f.path_of("url"),
                "set either url or url_env/url_file, not both",
            );
            None
        }
        (Some(u), None) => super::check_url(
            &f,
            "url",
            &u,
            "put a secret URL in url_env or url_file",
            errors,
        )
        .map(WebhookUrl::Plain),
        (None, Some(s)) => Some(WebhookUrl::Secret(s)),
        (None, None) => {
            errors.push(f.path_of("url"), "is required (or url_env / url_file)");
            None
        }
    };
    f.finish(errors);
    Some(WebhookConfig {
        name,
        url: url?,
        bearer_token,
    })
}

pub fn notify(root: &mut Fields, errors: &mut Errors) -> NotifyConfig {
    let mut c = NotifyConfig::default();
    let Some(mut f) = root.table("notify", errors) else {
        return c;
    };
    if let Some(u) = f.string("external_url", errors) {
        c.external_url = super::check_url(
            &f,
            "external_url",
            &u,
            "this URL is shown in messages",
            errors,
        );
    }
    if let Some(d) = f.duration("group_wait", errors) {
        c.group_wait = d;
    }
    if let Some(d) = f.duration("min_interval", errors) {
        c.min_interval = d;
    }
    if let Some(n) = f.integer("max_attempts", 1, 100, errors) {
        c.max_attempts = n as u32;
    }
    if let Some(d) = f.positive_duration("retry_initial", errors) {
        c.retry_initial = d;
    }
    if let Some(d) = f.positive_duration("timeout", errors) {
        c.timeout = d;
    }
    if let Some(e) = f.table("email", errors) {
        c.email = email(e, errors);
    }
    for (i, w) in f.tables("webhooks", errors).into_iter().enumerate() {
        if let Some(w) = webhook(w, i, errors) {
            c.webhooks.push(w);
        }
    }
    if let Some(mut a) = f.table("alertmanager", errors) {
        let url = a.string("url", errors);
        let resend = a
            .positive_duration("resend_interval", errors)
            .unwrap_or(Duration::from_secs(60));
        match url {
            Some(u) => {
                if let Some(url) = super::check_url(
                    &a,
                    "url",
                    &u,
                    "put them in front of Alertmanager, not here",
                    errors,
                ) {
                    c.alertmanager = Some(AlertmanagerConfig {
                        url,
                        resend_interval: resend,
                    });
                }
            }
            None => errors.push(a.path_of("url"), "is required"),
        }
        a.finish(errors);
    }
    f.finish(errors);
    c
}
