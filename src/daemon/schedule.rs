//! The schedule's arithmetic, apart from the worker that follows it: the
//! back-off after a target is found down, the ticks missed while busy, the
//! next tick with its jitter, and the budget that keeps upgrade rounds
//! within `max_rate_factor` of the schedule. Pure: tested without a clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::RngExt;
use rand::rngs::StdRng;

use crate::config::{Config, Schedule, TargetConfig};

/// Exponential back-off for a target found down.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub failures: u32,
}

impl Backoff {
    /// The wait after the current number of consecutive failures.
    pub fn delay(&self) -> Duration {
        if self.failures == 0 {
            return Duration::ZERO;
        }
        let factor = 2u32.saturating_pow(self.failures.saturating_sub(1).min(30));
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Ticks strictly after `from` and at or before `to`: runs that were due
/// while the target was busy (or the daemon paused) and are coalesced into
/// one. Capped so a long pause costs nothing to count.
pub fn missed_ticks(schedule: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> u32 {
    schedule
        .cron
        .after(&from)
        .take_while(|t| *t <= to)
        .take(10_000)
        .count() as u32
}

/// The next tick after `now` and when to actually start it (with jitter).
pub fn plan_next(
    schedule: &Schedule,
    now: DateTime<Utc>,
    rng: &mut StdRng,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let tick = schedule.next_after(now)?;
    let jitter_ms = schedule.jitter.as_millis() as i64;
    let offset = if jitter_ms > 0 {
        rng.random_range(0..=jitter_ms)
    } else {
        0
    };
    Some((tick, tick + chrono::Duration::milliseconds(offset)))
}

pub(super) fn chrono_of(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// How many upgrade runs a worker may still start: refilled at
/// `max_rate_factor - 1` times its scheduled rate, holding at most one
/// verdict's worth (the detector's runs for a verdict, per scenario). So
/// a new build is judged at once, and over any period the upgrade runs are
/// at most `max_rate_factor - 1` times the scheduled ones plus that one
/// verdict's worth, however often the server claims a new build.
#[derive(Debug)]
pub(super) struct UpgradeBudget {
    pub(super) runs: f64,
    pub(super) at: Option<DateTime<Utc>>,
    /// Said once when it runs out, again only after it refilled.
    pub(super) exhausted: bool,
}

impl UpgradeBudget {
    /// Takes one run from the budget if there is one.
    pub(super) fn take(
        &mut self,
        config: &Config,
        target: &TargetConfig,
        now: DateTime<Utc>,
    ) -> bool {
        let capacity =
            (config.verdict_policy.runs_for_verdict() * target.scenarios.len().max(1)) as f64;
        let per_second: f64 = target
            .scenarios
            .iter()
            .filter_map(|s| config.scenario(s))
            .filter_map(|s| config.schedule_for(target, s).interval_seconds())
            .filter(|i| *i > 0.0)
            .map(|i| 1.0 / i)
            .sum();
        let refill = (config.scheduler.max_rate_factor - 1.0).max(0.0) * per_second;
        let elapsed = self.at.map_or(f64::INFINITY, |at| {
            (now - at).num_milliseconds().max(0) as f64 / 1e3
        });
        self.runs = (self.runs + elapsed * refill).min(capacity);
        if self.runs.is_nan() {
            self.runs = capacity;
        }
        self.at = Some(now);
        if self.runs >= 1.0 {
            self.runs -= 1.0;
            self.exhausted = false;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff {
            initial: Duration::from_secs(30),
            max: Duration::from_secs(300),
            failures: 0,
        };
        let delays: Vec<u64> = (0..7)
            .map(|_| {
                b.failures += 1;
                b.delay().as_secs()
            })
            .collect();
        assert_eq!(delays, vec![30, 60, 120, 240, 300, 300, 300]);
        b.failures = u32::MAX;
        assert_eq!(b.delay(), Duration::from_secs(300));
    }

    #[test]
    fn missed_ticks_are_counted_not_replayed() {
        let every_minute = Schedule::parse("* * * * *", Duration::ZERO).unwrap();
        // Due at 00:01; the target was busy until 00:04:30: ticks 00:02,
        // 00:03 and 00:04 were missed and are coalesced.
        assert_eq!(
            missed_ticks(
                &every_minute,
                at("2026-01-01T00:01:00Z"),
                at("2026-01-01T00:04:30Z")
            ),
            3
        );
        assert_eq!(
            missed_ticks(
                &every_minute,
                at("2026-01-01T00:01:00Z"),
                at("2026-01-01T00:01:59Z")
            ),
            0
        );
        // A week-long pause is cheap to count and still one run.
        assert_eq!(
            missed_ticks(
                &every_minute,
                at("2026-01-01T00:00:00Z"),
                at("2026-01-08T00:00:00Z")
            ),
            10_000
        );
    }

    #[test]
    fn jitter_delays_within_its_bound() {
        let s = Schedule::parse("*/5 * * * *", Duration::from_secs(20)).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let now = at("2026-01-01T00:01:00Z");
        for _ in 0..100 {
            let (tick, start) = plan_next(&s, now, &mut rng).unwrap();
            assert_eq!(tick, at("2026-01-01T00:05:00Z"));
            let offset = (start - tick).num_milliseconds();
            assert!((0..=20_000).contains(&offset), "{offset}");
        }
    }
}
