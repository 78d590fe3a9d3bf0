//! Whether a server generates: the state machine behind heartbeats and
//! the requests of runs in flight. Generating (a token came); not
//! generating (the server answers, but no token came within the
//! heartbeat's timeout: a wedged engine); down (no answer at all). Pure:
//! the daemon feeds it evidence and acts on the transitions it returns.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The liveness state of one target or replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Generating {
    Generating,
    NotGenerating,
    Down,
}

impl Generating {
    pub fn as_str(self) -> &'static str {
        match self {
            Generating::Generating => "generating",
            Generating::NotGenerating => "not_generating",
            Generating::Down => "down",
        }
    }
}

/// What a heartbeat, or a run's requests in flight, showed.
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// A token came; `ttft` when it was a heartbeat's.
    Token { ttft: Option<Duration> },
    /// The server answers, but a request waited `waited` with no token.
    NoToken { waited: Duration },
    /// Nothing answered: `why` for the log.
    Unreachable { why: String },
}

/// The state, since when, and the last token seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LiveState {
    /// `None` until the first evidence.
    pub state: Option<Generating>,
    pub since: Option<DateTime<Utc>>,
    pub last_token_at: Option<DateTime<Utc>>,
    /// The last heartbeat's time to first token, in seconds.
    pub heartbeat_ttft_s: Option<f64>,
    /// For a service not generating: the replicas behind it found not
    /// generating at the time, to whom its failures are attributed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributed_to: Vec<String>,
}

/// A change of state, to be said once.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub from: Option<Generating>,
    pub to: Generating,
    /// How long the state left lasted, when it was an outage.
    pub outage: Option<Duration>,
    pub evidence: Evidence,
}

impl LiveState {
    /// Takes evidence seen at `now`; returns the transition it caused.
    pub fn note(&mut self, evidence: Evidence, now: DateTime<Utc>) -> Option<Transition> {
        let to = match &evidence {
            Evidence::Token { ttft } => {
                self.last_token_at = Some(now);
                if let Some(t) = ttft {
                    self.heartbeat_ttft_s = Some(t.as_secs_f64());
                }
                Generating::Generating
            }
            Evidence::NoToken { .. } => Generating::NotGenerating,
            Evidence::Unreachable { .. } => Generating::Down,
        };
        if self.state == Some(to) {
            return None;
        }
        let from = self.state;
        let outage = match from {
            Some(Generating::NotGenerating | Generating::Down) => {
                self.since.and_then(|since| (now - since).to_std().ok())
            }
            _ => None,
        };
        self.state = Some(to);
        self.since = Some(now);
        self.attributed_to.clear();
        Some(Transition {
            from,
            to,
            outage,
            evidence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn transitions_are_said_once_and_recovery_carries_the_outage() {
        let mut s = LiveState::default();
        let first = s.note(
            Evidence::Token {
                ttft: Some(Duration::from_millis(40)),
            },
            at(0),
        );
        assert_eq!(
            first.map(|t| (t.from, t.to)),
            Some((None, Generating::Generating))
        );
        assert_eq!(s.note(Evidence::Token { ttft: None }, at(15)), None);
        let wedge = s
            .note(
                Evidence::NoToken {
                    waited: Duration::from_secs(20),
                },
                at(35),
            )
            .unwrap();
        assert_eq!(
            (wedge.from, wedge.to),
            (Some(Generating::Generating), Generating::NotGenerating)
        );
        assert_eq!(wedge.outage, None);
        assert_eq!(
            s.note(
                Evidence::NoToken {
                    waited: Duration::from_secs(20)
                },
                at(55)
            ),
            None
        );
        let back = s.note(Evidence::Token { ttft: None }, at(95)).unwrap();
        assert_eq!(back.to, Generating::Generating);
        assert_eq!(back.outage, Some(Duration::from_secs(60)));
        assert_eq!(s.last_token_at, Some(at(95)));
        assert_eq!(s.heartbeat_ttft_s, Some(0.04));
        let down = s
            .note(
                Evidence::Unreachable {
                    why: "refused".into(),
                },
                at(100),
            )
            .unwrap();
        assert_eq!(down.to, Generating::Down);
    }
}
