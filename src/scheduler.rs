//! Turns cron schedules into runs, one target at a time: each target has
//! one worker that runs its due scenarios one after another (never two
//! probes at once against a target), coalesces ticks missed while busy or
//! paused instead of replaying them, and backs off a target found down.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Schedule};
use crate::daemon::Shared;
use crate::daemon::execute;

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

/// Whether a target is backed off after it was found down.
#[derive(Debug, Default)]
struct DownState {
    backoff: Option<Backoff>,
    until: Option<DateTime<Utc>>,
}

impl DownState {
    fn backing_off(&self, now: DateTime<Utc>) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Grows the back-off after a run that found the target down, clears
    /// it after one that reached it. A server that asked for a pause
    /// (`Retry-After` on a 429 or 503) gets at least that long.
    fn after(&mut self, shared: &Shared, config: &Config, name: &str, end: execute::RunEnd) {
        let outcome = end.outcome;
        if let Some(pause) = end.retry_after.filter(|p| !p.is_zero()) {
            let until = Utc::now() + chrono::Duration::from_std(pause).unwrap_or_default();
            if self.until.is_none_or(|u| u < until) {
                tracing::warn!(target = %name, retry_after = ?pause, "the server asked for a pause (Retry-After); honouring it");
                self.until = Some(until);
                shared.metrics.set_backoff(name, pause.as_secs_f64());
                shared.set_backoff(name, self.until);
            }
            if !outcome.target_down() {
                return;
            }
        }
        if outcome.target_down() {
            let mut b = self.backoff.unwrap_or(Backoff {
                initial: config.scheduler.backoff_initial,
                max: config.scheduler.backoff_max,
                failures: 0,
            });
            b.failures += 1;
            let delay = b.delay();
            tracing::warn!(target = %name, failures = b.failures, backoff = ?delay, "target down; backing off");
            let until = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
            self.until = Some(self.until.map_or(until, |u| u.max(until)));
            shared.metrics.set_backoff(name, delay.as_secs_f64());
            shared.set_backoff(name, self.until);
            self.backoff = Some(b);
        } else if self.backoff.is_some() {
            tracing::info!(target = %name, "target answers again; back-off cleared");
            *self = DownState::default();
            shared.metrics.set_backoff(name, 0.0);
            shared.set_backoff(name, None);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Due {
    tick: DateTime<Utc>,
    at: DateTime<Utc>,
}

/// Runs one target's schedule until `stop` (config removed the target, or
/// shutdown). A probe in flight always finishes under the config it
/// started with; shutdown aborts it only after the grace period.
pub async fn run_target(shared: Arc<Shared>, name: String, stop: CancellationToken) {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let mut generation = shared.generation.subscribe();
    let mut due: HashMap<String, Due> = HashMap::new();
    let mut upgrades = shared.upgrades.subscribe();
    let mut down = DownState::default();
    'schedule: loop {
        if stop.is_cancelled() {
            break;
        }
        let config: Arc<Config> = shared.config();
        let Some(target) = config.target(&name).cloned() else {
            break;
        };
        // A reload while a run was going: schedules may have changed, so
        // plan again from now. (Reloads seen while waiting clear below.)
        if generation.has_changed().unwrap_or(false) {
            generation.borrow_and_update();
            due.clear();
        }
        let now = Utc::now();
        due.retain(|s, _| target.scenarios.contains(s));
        for s in &target.scenarios {
            if let (false, Some(scenario)) = (due.contains_key(s), config.scenario(s))
                && let Some((tick, at)) =
                    plan_next(config.schedule_for(&target, scenario), now, &mut rng)
            {
                due.insert(s.clone(), Due { tick, at });
            }
        }
        shared.set_next_due(&name, due.iter().map(|(s, d)| (s.clone(), d.at)).collect());
        // After a version change, the new build's runs come first, back to
        // back (still one at a time), until its verdict can be reached.
        if !down.backing_off(now)
            && let Some(scenario_name) =
                crate::daemon::verdicts::pending_upgrade(&shared, &config, &target).await
            && let Some(scenario) = config.scenario(&scenario_name).cloned()
        {
            tokio::select! {
                _ = tokio::time::sleep(config.detection.upgrade_round_gap) => {}
                _ = stop.cancelled() => break,
            }
            tracing::info!(target = %name, scenario = %scenario_name, "upgrade round: probing the new build");
            shared.metrics.upgrade_run(&name, &scenario_name);
            let end = execute::run_once(&shared, &config, &target, &scenario).await;
            down.after(&shared, &config, &name, end);
            if stop.is_cancelled() || end.outcome == crate::run::RunOutcome::Aborted {
                break 'schedule;
            }
            continue;
        }
        upgrades.borrow_and_update();
        let Some(next_at) = due.values().map(|d| d.at).min() else {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = generation.changed() => {
                due.clear();
                continue;
            }
            }
        };
        let wait = (next_at - now).to_std().unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = upgrades.changed() => continue,
            _ = stop.cancelled() => break,
            _ = generation.changed() => {
                due.clear();
                continue;
            }
        }
        // Everything due now runs in order, one at a time.
        loop {
            let now = Utc::now();
            let Some((scenario_name, this)) = due
                .iter()
                .filter(|(_, d)| d.at <= now)
                .min_by_key(|(_, d)| d.at)
                .map(|(s, d)| (s.clone(), *d))
            else {
                break;
            };
            let Some(scenario) = config.scenario(&scenario_name).cloned() else {
                due.remove(&scenario_name);
                continue;
            };
            let schedule = config.schedule_for(&target, &scenario).clone();
            for _ in 0..missed_ticks(&schedule, this.tick, now) {
                shared.metrics.run_skipped(&name, &scenario_name, "busy");
            }
            match plan_next(&schedule, now, &mut rng) {
                Some((tick, at)) => {
                    due.insert(scenario_name.clone(), Due { tick, at });
                }
                None => {
                    due.remove(&scenario_name);
                }
            }
            if down.backing_off(now) {
                shared.metrics.run_skipped(&name, &scenario_name, "backoff");
                continue;
            }
            if (now - this.at).num_milliseconds() > 1000 {
                shared.metrics.run_delayed(&name, &scenario_name);
            }
            let end = execute::run_once(&shared, &config, &target, &scenario).await;
            down.after(&shared, &config, &name, end);
            if stop.is_cancelled() || end.outcome == crate::run::RunOutcome::Aborted {
                break 'schedule;
            }
        }
    }
    shared.set_next_due(&name, Vec::new());
}

#[cfg(test)]
mod tests {
    use super::*;

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
