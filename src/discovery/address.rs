//! The `host:port` entries a file_sd file lists, checked before they are
//! made into URLs: the host an IPv4 address, a bracketed IPv6 address or
//! a DNS name (letters, digits, `-`, `.`), the port 1 to 65535. Anything
//! else (`#`, `?`, `/`, quotes, markup, bidi or control characters) would
//! send probes to another path or host, or forge the log.

use std::net::{Ipv4Addr, SocketAddr};

/// Longest DNS name (RFC 1035) and label.
const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// `Ok` for a `host:port` entry; otherwise why it is not one.
pub fn check(address: &str) -> Result<(), String> {
    if let Ok(socket) = address.parse::<SocketAddr>() {
        return match socket.port() {
            0 => Err("port 0 is not a port from 1 to 65535".into()),
            _ => Ok(()),
        };
    }
    // Judged first, over the whole entry: a '/' or '#' makes any split
    // into host and port meaningless.
    if let Some(c) = address
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '[' | ']')))
    {
        return Err(format!(
            "has {c:?}, which is not a letter, digit, '-', '.' or ':'"
        ));
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("has no :port".into());
    };
    if port.is_empty()
        || !port.bytes().all(|b| b.is_ascii_digit())
        || !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(format!(
            "port {} is not a number from 1 to 65535",
            crate::text::quoted(port, 16)
        ));
    }
    if host.starts_with('[') {
        return Err("is not an IPv6 address in brackets".into());
    }
    if host.contains(':') {
        return Err("an IPv6 address is written in brackets, as [::1]:8000".into());
    }
    check_name(host)
}

/// A DNS name, or an IPv4 address in dotted form.
fn check_name(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("has no host".into());
    }
    if host.len() > MAX_NAME + 1 {
        return Err(format!("host is longer than {MAX_NAME} characters"));
    }
    if let Some(c) = host.chars().find(|c| matches!(c, '[' | ']')) {
        return Err(format!("host has {c:?} outside an IPv6 address"));
    }
    // One trailing dot: a fully qualified name.
    let name = host.strip_suffix('.').unwrap_or(host);
    for label in name.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL {
            return Err(format!(
                "host has a part of {} characters; each part between dots has 1 to {MAX_LABEL}",
                label.len()
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a part of the host starts or ends with '-'".into());
        }
    }
    // A name ending in digits is read as an IPv4 address by URL parsers.
    let last = name.rsplit('.').next().unwrap_or(name);
    if last.bytes().all(|b| b.is_ascii_digit()) && name.parse::<Ipv4Addr>().is_err() {
        return Err("host is not an IPv4 address".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_ports_as_prometheus_writes_them_pass() {
        for ok in [
            "10.0.0.5:8000",
            "[::1]:8001",
            "[2001:db8::1]:443",
            "vllm-0.vllm.llm.svc.cluster.local:8000",
            "vllm-0.vllm.llm.svc.cluster.local.:8000",
            "localhost:1",
            "host:65535",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_its_reason() {
        for (bad, why) in [
            ("10.0.0.5", "has no :port"),
            ("h:0", "port \"0\" is not a number from 1 to 65535"),
            (
                "h:+80",
                "has '+', which is not a letter, digit, '-', '.' or ':'",
            ),
            ("h:65536", "port \"65536\" is not a number from 1 to 65535"),
            ("10.0.0.5:0", "port 0 is not a port from 1 to 65535"),
            (
                "h#frag:80",
                "has '#', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "h?q=1:80",
                "has '?', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "h\":80",
                "has '\"', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "<b>:80",
                "has '<', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "a\u{202e}b:80",
                "has '\\u{202e}', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "http://h:80",
                "has '/', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "u@h:80",
                "has '@', which is not a letter, digit, '-', '.' or ':'",
            ),
            (
                "::1:80",
                "an IPv6 address is written in brackets, as [::1]:8000",
            ),
            ("[::g]:80", "is not an IPv6 address in brackets"),
            (":80", "has no host"),
            (
                "a..b:80",
                "host has a part of 0 characters; each part between dots has 1 to 63",
            ),
            ("-a:80", "a part of the host starts or ends with '-'"),
            ("999.1.1.1:80", "host is not an IPv4 address"),
            ("a]b:80", "host has ']' outside an IPv6 address"),
        ] {
            assert_eq!(check(bad), Err(why.to_owned()), "{bad:?}");
        }
    }
}
