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
    /// When a request last went without a token.
    #[serde(skip)]
    pub last_silence_at: Option<DateTime<Utc>>,
    /// The first token after that: where an outage held past its end
    /// (see [`LiveState::note_held`]) really ended.
    #[serde(skip)]
    first_token_after_silence: Option<DateTime<Utc>>,
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
        self.note_held(evidence, now, Duration::ZERO)
    }

    /// As [`note`](Self::note), but a token ends "not generating" only
    /// once no request went without one for `hold`: through a balancer,
    /// one token shows that one replica generates, not that all do, and
    /// without the hold a wedged replica among healthy ones would flip
    /// the service's state on every heartbeat.
    pub fn note_held(
        &mut self,
        evidence: Evidence,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Option<Transition> {
        let to = match &evidence {
            Evidence::Token { ttft } => {
                self.last_token_at = Some(now);
                if let Some(t) = ttft {
                    self.heartbeat_ttft_s = Some(t.as_secs_f64());
                }
                if self.state == Some(Generating::NotGenerating) {
                    self.first_token_after_silence.get_or_insert(now);
                }
                let silent_lately = self
                    .last_silence_at
                    .is_some_and(|at| (now - at).to_std().unwrap_or(Duration::ZERO) < hold);
                if self.state == Some(Generating::NotGenerating) && silent_lately {
                    return None;
                }
                Generating::Generating
            }
            Evidence::NoToken { .. } => {
                self.last_silence_at = Some(now);
                self.first_token_after_silence = None;
                Generating::NotGenerating
            }
            Evidence::Unreachable { .. } => Generating::Down,
        };
        if self.state == Some(to) {
            return None;
        }
        let from = self.state;
        let ended = match (from, &evidence) {
            (Some(Generating::NotGenerating), Evidence::Token { .. }) => {
                self.first_token_after_silence.unwrap_or(now)
            }
            _ => now,
        };
        self.first_token_after_silence = None;
        let outage = match from {
            Some(Generating::NotGenerating | Generating::Down) => {
                self.since.and_then(|since| (ended - since).to_std().ok())
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

    #[test]
    fn a_held_state_needs_tokens_for_the_whole_hold_to_recover() {
        let hold = Duration::from_secs(70);
        let mut s = LiveState::default();
        let silent = || Evidence::NoToken {
            waited: Duration::from_secs(20),
        };
        let token = || Evidence::Token { ttft: None };
        s.note_held(token(), at(0), hold);
        // Behind a balancer, beats alternate between a wedged replica
        // and a healthy one: one change, not one per beat.
        let mut changes = 0;
        for beat in 0..10 {
            let evidence = if beat % 2 == 0 { silent() } else { token() };
            changes += s.note_held(evidence, at(35 * (beat + 1)), hold).is_some() as u32;
        }
        assert_eq!(changes, 1);
        assert_eq!(s.state, Some(Generating::NotGenerating));
        // The wedge ends (last silence at 315 s): tokens only, and the
        // state comes back once the hold has passed.
        assert_eq!(s.note_held(token(), at(350), hold), None);
        let back = s.note_held(token(), at(385), hold).unwrap();
        assert_eq!(back.to, Generating::Generating);
        // The outage ended with the first token after the last silence
        // (350 s), not when the hold let it go: since 35 s, 315 s long.
        assert_eq!(back.outage, Some(Duration::from_secs(315)));
        // Without a hold (one server), the first token is enough.
        let mut one = LiveState::default();
        one.note(silent(), at(0));
        assert!(one.note(token(), at(1)).is_some());
    }
}
