//! A target behind a gateway: `[[targets.headers]]`, the headers its
//! requests carry (routing, priority, tenancy; values written, or read
//! from an environment variable or a file at each run, never shown), and
//! `[targets.gateway]`, the response header naming the endpoint that
//! served a request and the statuses by which the gateway sheds requests.

use super::key_source;
use super::reader::{Errors, Fields};
use crate::client::{GatewayRules, RequestHeaders, Secret, SecretSource};

/// Where a header's value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValueSource {
    /// Written in the file (kept as a secret all the same).
    Written(Secret),
    /// Read at each run, as an API key is.
    Read(SecretSource),
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeaderSetting {
    pub name: String,
    pub value: HeaderValueSource,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The response header naming the endpoint that served a request.
    pub endpoint_header: Option<String>,
    /// Statuses meaning the gateway queued or shed the request.
    pub shed_statuses: Vec<u16>,
}

/// What an inference gateway answers when its flow control rejects or
/// gives up on a request (and what a saturated pool behind it answers).
pub const DEFAULT_SHED_STATUSES: [u16; 2] = [429, 503];

/// Headers the client sets itself or that frame the request: a
/// configured value would break the request or be overwritten.
const RESERVED: [&str; 11] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "keep-alive",
    "trailer",
    "proxy-connection",
    "x-request-id",
];

/// The most headers one target sends besides its own.
const MAX_HEADERS: usize = 32;

/// `[[targets.headers]]`. `has_key`: the target has an API key, which is
/// its `Authorization` header.
pub fn headers(f: &mut Fields, has_key: bool, errors: &mut Errors) -> Vec<HeaderSetting> {
    let mut out: Vec<HeaderSetting> = Vec::new();
    let tables = f.tables("headers", errors);
    if tables.len() > MAX_HEADERS {
        errors.push(
            f.path_of("headers"),
            format!("{} headers: at most {MAX_HEADERS}", tables.len()),
        );
    }
    for mut h in tables {
        if let Some(setting) = header(&mut h, has_key, errors) {
            if out
                .iter()
                .any(|o| o.name.eq_ignore_ascii_case(&setting.name))
            {
                errors.push(
                    h.path_of("name"),
                    format!("{:?} is set more than once", setting.name),
                );
            }
            out.push(setting);
        }
        h.finish(errors);
    }
    out
}

fn header(h: &mut Fields, has_key: bool, errors: &mut Errors) -> Option<HeaderSetting> {
    let name = h.string("name", errors);
    let lower = name.as_deref().map(str::to_ascii_lowercase);
    match lower.as_deref() {
        None => errors.push(h.path_of("name"), "is required"),
        Some(n) if reqwest::header::HeaderName::from_bytes(n.as_bytes()).is_err() => {
            errors.push(h.path_of("name"), format!("{n:?} is not a header name"))
        }
        Some(n) if RESERVED.contains(&n) => errors.push(
            h.path_of("name"),
            format!("{n:?} is set by the client itself"),
        ),
        Some("authorization") if has_key => errors.push(
            h.path_of("name"),
            "\"authorization\" carries the target's API key (api_key_env or api_key_file)",
        ),
        Some(_) => {}
    }
    let written = h.string("value", errors);
    let read = key_source(h, "value_env", "value_file", errors);
    let value = match (written, read) {
        (Some(_), Some(_)) => {
            errors.push(
                h.path_of("value"),
                "set one of value, value_env or value_file",
            );
            None
        }
        (Some(v), None) => {
            // Checked here without saying the value: it may be a secret.
            if reqwest::header::HeaderValue::from_str(&v).is_err() {
                errors.push(
                    h.path_of("value"),
                    "contains characters not allowed in a header",
                );
                None
            } else {
                Some(HeaderValueSource::Written(Secret::new(v)))
            }
        }
        (None, Some(source)) => Some(HeaderValueSource::Read(source)),
        (None, None) => {
            errors.push(
                h.path_of("value"),
                "is required: value, value_env or value_file",
            );
            None
        }
    };
    Some(HeaderSetting {
        name: lower?,
        value: value?,
    })
}

/// `[targets.gateway]`.
pub fn gateway(f: &mut Fields, errors: &mut Errors) -> Option<GatewayConfig> {
    let mut g = f.table("gateway", errors)?;
    let endpoint_header = g.string("endpoint_header", errors).and_then(|n| {
        let lower = n.to_ascii_lowercase();
        if reqwest::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            errors.push(
                g.path_of("endpoint_header"),
                format!("{n:?} is not a header name"),
            );
            return None;
        }
        Some(lower)
    });
    let mut shed_statuses = DEFAULT_SHED_STATUSES.to_vec();
    if g.has("shed_statuses") {
        let path = g.path_of("shed_statuses");
        shed_statuses = statuses(&mut g, &path, errors);
    }
    g.finish(errors);
    Some(GatewayConfig {
        endpoint_header,
        shed_statuses,
    })
}

fn statuses(g: &mut Fields, path: &str, errors: &mut Errors) -> Vec<u16> {
    let Some(written) = g.integers("shed_statuses", errors) else {
        return Vec::new();
    };
    written
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| {
            if (400..=599).contains(&s) {
                Some(s as u16)
            } else {
                errors.push(
                    format!("{path}[{i}]"),
                    format!("{s} is not an HTTP error status (400 to 599)"),
                );
                None
            }
        })
        .collect()
}

/// The headers' values now (read from their variables and files),
/// ready to send; an error names the header, never a value.
pub fn load_headers(settings: &[HeaderSetting]) -> Result<RequestHeaders, String> {
    let mut pairs = Vec::with_capacity(settings.len());
    for s in settings {
        let value = match &s.value {
            HeaderValueSource::Written(v) => v.clone(),
            HeaderValueSource::Read(source) => source
                .load(false)
                .map_err(|e| format!("header {}: {e}", s.name))?
                .ok_or_else(|| format!("header {}: no value", s.name))?,
        };
        pairs.push((s.name.clone(), value));
    }
    RequestHeaders::new(&pairs).map_err(|e| e.to_string())
}

/// What the client reads of a gateway's answers; nothing without a
/// `[targets.gateway]`.
pub fn rules(gateway: Option<&GatewayConfig>) -> GatewayRules {
    let Some(g) = gateway else {
        return GatewayRules::default();
    };
    GatewayRules {
        endpoint_header: g
            .endpoint_header
            .as_deref()
            .and_then(|n| reqwest::header::HeaderName::from_bytes(n.as_bytes()).ok()),
        shed_statuses: g.shed_statuses.clone(),
    }
}
