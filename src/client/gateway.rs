//! What a target's requests carry and read when a gateway stands in front
//! of its servers (an inference gateway, llm-d, a proxy): extra request
//! headers (routing, priority, tenancy), whose values are secrets; the
//! response header naming the endpoint that served a request; and the
//! statuses by which the gateway sheds what it will not serve.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::{ClientError, Secret};

/// Headers every request to the target carries. Values are kept as
/// secrets and marked sensitive: `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct RequestHeaders {
    headers: Vec<(HeaderName, HeaderValue)>,
    values: Vec<Secret>,
}

impl std::fmt::Debug for RequestHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        write!(f, "RequestHeaders({names:?})")
    }
}

impl RequestHeaders {
    /// From `(name, value)` pairs; an error names the header, never its
    /// value.
    pub fn new(pairs: &[(String, Secret)]) -> Result<RequestHeaders, ClientError> {
        let mut out = RequestHeaders::default();
        for (name, value) in pairs {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ClientError::Build(format!("{name:?} is not a valid header name")))?;
            let mut v = HeaderValue::from_str(value.expose()).map_err(|_| {
                ClientError::Build(format!(
                    "the value of header {name} contains characters not allowed in a header"
                ))
            })?;
            v.set_sensitive(true);
            out.headers.push((header, v));
            out.values.push(value.clone());
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }

    /// `request` with every header added.
    pub fn apply(&self, mut request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        for (name, value) in &self.headers {
            request = request.header(name.clone(), value.clone());
        }
        request
    }

    /// `text` with every header value replaced by `[redacted]`: a gateway
    /// may echo what it refused.
    pub fn scrub(&self, text: &str) -> String {
        crate::text::redact(text, self.values.iter().map(Secret::expose))
    }
}

/// Longest endpoint name kept from a response header.
const MAX_ENDPOINT_LEN: usize = 128;

/// What the client reads of a gateway's answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayRules {
    /// The response header naming the endpoint that served the request
    /// (`x-gateway-destination-endpoint`, nginx's `$upstream_addr`).
    pub endpoint_header: Option<HeaderName>,
    /// Answers meaning the gateway queued or shed the request.
    pub shed_statuses: Vec<u16>,
}

impl GatewayRules {
    /// The endpoint the response names, cleaned and bounded; of a list
    /// (`a, b`: nginx tried `a`, then `b` answered) the last.
    pub fn served_by(&self, headers: &HeaderMap) -> Option<String> {
        let name = self.endpoint_header.as_ref()?;
        let value = headers.get(name)?;
        let text = String::from_utf8_lossy(value.as_bytes());
        let last = text.rsplit(',').next().unwrap_or("").trim();
        let cleaned = crate::text::clean_identifier(last, MAX_ENDPOINT_LEN);
        (!cleaned.is_empty()).then_some(cleaned)
    }

    /// Whether `status` means the gateway shed the request.
    pub fn sheds(&self, status: u16) -> bool {
        self.shed_statuses.contains(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_never_shown_and_are_scrubbed_from_server_text() {
        let headers = RequestHeaders::new(&[
            ("x-tenant".into(), Secret::new("tenant-secret-42")),
            ("x-gateway-priority".into(), Secret::new("low")),
        ])
        .unwrap();
        let shown = format!("{headers:?}");
        assert!(
            shown.contains("x-tenant") && !shown.contains("secret-42"),
            "{shown}"
        );
        assert_eq!(
            headers.scrub("denied for tenant-secret-42"),
            "denied for [redacted]"
        );
        let bad = RequestHeaders::new(&[("x-a".into(), Secret::new("line\nbreak"))]).unwrap_err();
        assert!(!bad.to_string().contains("line"), "{bad}");
        assert!(RequestHeaders::new(&[("bad name".into(), Secret::new("v"))]).is_err());
    }

    #[test]
    fn the_serving_endpoint_is_the_last_of_a_list_cleaned() {
        let rules = GatewayRules {
            endpoint_header: Some(HeaderName::from_static("x-upstream")),
            shed_statuses: vec![429, 503],
        };
        let mut headers = HeaderMap::new();
        assert_eq!(rules.served_by(&headers), None);
        headers.insert(
            "x-upstream",
            HeaderValue::from_static("10.0.0.1:80, 10.0.0.2:80"),
        );
        assert_eq!(rules.served_by(&headers).as_deref(), Some("10.0.0.2:80"));
        headers.insert("x-upstream", HeaderValue::from_static("10.0.0.3:8000"));
        assert_eq!(rules.served_by(&headers).as_deref(), Some("10.0.0.3:8000"));
        headers.insert("x-upstream", HeaderValue::from_bytes(b"a\tb").unwrap());
        assert_eq!(rules.served_by(&headers).as_deref(), Some("a b"));
        assert!(rules.sheds(429) && rules.sheds(503) && !rules.sheds(500));
        assert_eq!(GatewayRules::default().served_by(&headers), None);
    }
}
