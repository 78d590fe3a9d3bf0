//! The bounded set of request outcomes: safe as a Prometheus label value.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How one probe request ended. The set is closed on purpose: every failure
/// maps to one of these, so metrics never grow a label per error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    #[serde(rename = "http_4xx")]
    Http4xx,
    #[serde(rename = "http_5xx")]
    Http5xx,
    Timeout,
    /// Accepted, but no first token came within the first-token timeout:
    /// what a wedged engine behind a live API server does.
    NoFirstToken,
    /// Tokens came, then nothing for the stall timeout.
    Stalled,
    Connect,
    StreamError,
    ShortOutput,
    /// The answer arrived but is not what was asked for: structured output
    /// that does not parse or match its schema, or no usable tool call.
    InvalidOutput,
    /// Our own resources ran out (file descriptors, socket buffers): the
    /// target is not to blame and is not backed off.
    Local,
    /// A gateway in front of the servers queued the request and gave up on
    /// it, or shed it (429, or 503 with its reason): refused before any
    /// model ran, under the target's `[targets.gateway] shed_statuses`.
    Shed,
}

impl Outcome {
    pub const ALL: [Outcome; 12] = [
        Outcome::Ok,
        Outcome::Http4xx,
        Outcome::Http5xx,
        Outcome::Timeout,
        Outcome::NoFirstToken,
        Outcome::Stalled,
        Outcome::Connect,
        Outcome::StreamError,
        Outcome::ShortOutput,
        Outcome::InvalidOutput,
        Outcome::Local,
        Outcome::Shed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Http4xx => "http_4xx",
            Outcome::Http5xx => "http_5xx",
            Outcome::Timeout => "timeout",
            Outcome::NoFirstToken => "no_first_token",
            Outcome::Stalled => "stalled",
            Outcome::Connect => "connect",
            Outcome::StreamError => "stream_error",
            Outcome::ShortOutput => "short_output",
            Outcome::InvalidOutput => "invalid_output",
            Outcome::Local => "local",
            Outcome::Shed => "shed",
        }
    }

    /// The outcome whose label is `label`.
    pub fn parse(label: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == label)
    }

    pub fn is_ok(self) -> bool {
        self == Outcome::Ok
    }

    /// What this outcome says of the server: the one rule by which a run
    /// backs its target off and a heartbeat tells liveness.
    pub fn blame(self) -> Blame {
        match self {
            // It answered; or the request was refused before any engine
            // saw it (a key, a model, a gateway shedding it); or our own
            // resources ran out.
            Outcome::Ok
            | Outcome::ShortOutput
            | Outcome::InvalidOutput
            | Outcome::Http4xx
            | Outcome::Shed
            | Outcome::Local => Blame::Nothing,
            Outcome::Connect => Blame::Unreachable,
            Outcome::NoFirstToken | Outcome::Stalled | Outcome::Timeout | Outcome::Http5xx => {
                Blame::Silent
            }
            Outcome::StreamError => Blame::Garbled,
        }
    }

    /// The outcome for a non-200 HTTP status.
    pub fn from_status(status: u16) -> Outcome {
        if (400..500).contains(&status) {
            Outcome::Http4xx
        } else if status >= 500 {
            Outcome::Http5xx
        } else {
            // 1xx/3xx/other 2xx where a stream was expected: the body is not
            // what a completion server sends.
            Outcome::StreamError
        }
    }
}

/// What a request's outcome says of the server that was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// Nothing of the server or its engine.
    Nothing,
    /// The server could not be reached.
    Unreachable,
    /// Reached, it gave no token, or stopped giving them, or failed with a
    /// server error.
    Silent,
    /// Reached, it sent what is not a completion stream: the server is
    /// there, and did not generate what was asked.
    Garbled,
}

impl Blame {
    /// Whether the target is down: its runs and heartbeats back off.
    pub fn down(self) -> bool {
        matches!(self, Blame::Unreachable | Blame::Silent)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_and_stable() {
        let labels: std::collections::BTreeSet<_> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(Outcome::parse("deadline"), None);
        assert_eq!(Outcome::from_status(401), Outcome::Http4xx);
        assert_eq!(Outcome::from_status(429), Outcome::Http4xx);
        assert_eq!(Outcome::from_status(503), Outcome::Http5xx);
        assert_eq!(Outcome::from_status(302), Outcome::StreamError);
    }

    /// Our own resources and a gateway's refusal blame no server; silence
    /// and server errors do, and back the target off, as an address that
    /// refuses connections does; a garbled stream is the server's, but
    /// says it is up.
    #[test]
    fn what_each_outcome_blames() {
        let down: Vec<Outcome> = Outcome::ALL
            .into_iter()
            .filter(|o| o.blame().down())
            .collect();
        use Outcome::*;
        assert_eq!(down, [Http5xx, Timeout, NoFirstToken, Stalled, Connect]);
        assert_eq!(Local.blame(), Blame::Nothing);
        assert_eq!(Shed.blame(), Blame::Nothing);
        assert_eq!(StreamError.blame(), Blame::Garbled);
    }
}
