//! The one place wall-clock time is read: the daemon is handed a
//! [`Clock`], the system's in production, one that follows tokio's
//! (pausable) clock in tests, and every part reads the time from it.

use chrono::{DateTime, Utc};

/// Wall-clock time, as every part of the daemon reads it.
#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    #[default]
    System,
    /// `start` plus what tokio's clock says has passed since `at`: with
    /// the clock paused (tests), schedules run in virtual time.
    Tokio {
        start: DateTime<Utc>,
        at: tokio::time::Instant,
    },
}

impl Clock {
    pub fn tokio(start: DateTime<Utc>) -> Clock {
        Clock::Tokio {
            start,
            at: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Clock::System => Utc::now(),
            Clock::Tokio { start, at } => {
                *start + chrono::Duration::from_std(at.elapsed()).unwrap_or_default()
            }
        }
    }
}
