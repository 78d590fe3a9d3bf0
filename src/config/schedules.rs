//! Schedules: a cron line of 5 fields (minute precision) or 6 with seconds
//! first, and a jitter no longer than the shortest gap between two ticks.
//! The cron crate also takes a seventh field, the year; it is refused, as
//! a probe schedule that stops in some year has no use.

use std::str::FromStr;
use std::time::Duration;

use super::reader::{Errors, Fields};

/// A cron schedule with random jitter added to every tick.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// As written by the user.
    pub expression: String,
    pub cron: cron::Schedule,
    /// Each tick is delayed by a uniform random amount up to this, so many
    /// sentinels (or targets) do not probe in lockstep.
    pub jitter: Duration,
}

/// The fields of a 6-field line, in order.
const FIELD_NAMES: [&str; 6] = [
    "second",
    "minute",
    "hour",
    "day-of-month",
    "month",
    "day-of-week",
];

/// Ticks looked at for the shortest gap: more than a day of a schedule
/// every two minutes, and every tick of any schedule within the horizon.
const GAP_TICKS: usize = 1000;
const GAP_HORIZON_DAYS: i64 = 400;

impl Schedule {
    /// Parses a 5-field crontab line (minute precision), or 6 fields with
    /// seconds first. The message is one line that names the bad field.
    pub fn parse(expression: &str, jitter: Duration) -> Result<Schedule, String> {
        let fields = expression.split_whitespace().count();
        let full = match fields {
            5 => format!("0 {}", expression.trim()),
            6 => expression.trim().to_owned(),
            7 => {
                return Err(format!(
                    "{expression:?} has 7 fields; a year field is not supported: write 5 (min hour day month weekday) or 6 with seconds first"
                ));
            }
            n => {
                return Err(format!(
                    "{expression:?} has {n} fields; write 5 (min hour day month weekday) or 6 with seconds first"
                ));
            }
        };
        let cron = cron::Schedule::from_str(&full).map_err(|e| {
            format!(
                "{expression:?} is not a cron expression: {}",
                one_line(&e.to_string(), &full, fields == 5)
            )
        })?;
        if cron.upcoming(chrono::Utc).next().is_none() {
            return Err(format!("{expression:?} never fires"));
        }
        Ok(Schedule {
            expression: expression.to_owned(),
            cron,
            jitter,
        })
    }

    /// Seconds between the next two ticks: the schedule's period, which
    /// staleness alerts multiply.
    pub fn interval_seconds(&self) -> Option<f64> {
        let mut ticks = self.cron.upcoming(chrono::Utc);
        let a = ticks.next()?;
        let b = ticks.next()?;
        Some((b - a).num_milliseconds() as f64 / 1000.0)
    }

    /// The shortest gap between two ticks (over the next 1000 ticks or
    /// 400 days), `None` for a schedule that ticks once in that time.
    pub fn shortest_gap(&self) -> Option<Duration> {
        let mut ticks = self.cron.upcoming(chrono::Utc);
        let first = ticks.next()?;
        let horizon = first + chrono::Duration::days(GAP_HORIZON_DAYS);
        let mut last = first;
        let mut shortest: Option<chrono::Duration> = None;
        for tick in ticks.take(GAP_TICKS).take_while(|t| *t <= horizon) {
            let gap = tick - last;
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
            last = tick;
        }
        shortest.and_then(|s| s.to_std().ok())
    }

    /// The next tick strictly after `after` (jitter not included).
    pub fn next_after(
        &self,
        after: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        self.cron.after(&after).next()
    }
}

/// The cron crate's message (the expression, a caret under the bad field,
/// then what is wrong, on three lines) as one line naming the field as
/// the user wrote it: a message of several lines would leave all but the
/// first without the field path.
fn one_line(message: &str, full: &str, added_seconds: bool) -> String {
    let lines: Vec<&str> = message.lines().filter(|l| !l.trim().is_empty()).collect();
    // The crate says "less than" of a bound that is itself allowed.
    let what = lines.last().map_or(String::new(), |l| {
        l.trim().replace(" must be less than ", " must be at most ")
    });
    let caret = lines
        .iter()
        .find(|l| l.trim() == "^")
        .and_then(|l| l.find('^'));
    let field = caret.and_then(|column| {
        // Which field starts at or before the caret.
        let mut index = None;
        let mut at = 0;
        for (i, word) in full.split(' ').enumerate() {
            if word.is_empty() {
                at += 1;
                continue;
            }
            if at <= column {
                index = Some((i, word));
            }
            at += word.len() + 1;
        }
        index
    });
    match field {
        Some((i, word)) if !(added_seconds && i == 0) => {
            let name = FIELD_NAMES.get(i).copied().unwrap_or("last");
            format!("the {name} field {word:?}: {what}")
        }
        _ => what,
    }
}

/// `schedule` and `jitter` of one table: the jitter no longer than the
/// shortest gap between two ticks, else a run could be pushed past the
/// next one.
pub(crate) fn schedule(fields: &mut Fields, errors: &mut Errors) -> Option<Schedule> {
    let jitter = fields.duration("jitter", errors);
    let Some(expression) = fields.string("schedule", errors) else {
        if jitter.is_some() {
            errors.push(fields.path_of("jitter"), "applies only with schedule");
        }
        return None;
    };
    let jitter = jitter.unwrap_or(Duration::ZERO);
    let parsed = Schedule::parse(&expression, jitter)
        .map_err(|message| errors.push(fields.path_of("schedule"), message))
        .ok()?;
    if !jitter.is_zero()
        && let Some(gap) = parsed.shortest_gap().filter(|gap| jitter > *gap)
    {
        errors.push(
            fields.path_of("jitter"),
            format!(
                "{} is longer than the {} between two ticks of {expression:?}: a run would be pushed past the next tick",
                humantime::format_duration(jitter),
                humantime::format_duration(gap)
            ),
        );
        return None;
    }
    Some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_field_cron_lines_get_a_zero_seconds_field() {
        let s = Schedule::parse("*/5 * * * *", Duration::ZERO).unwrap();
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:01:30Z")
            .unwrap()
            .to_utc();
        assert_eq!(
            s.next_after(t0).unwrap().to_rfc3339(),
            "2026-01-01T00:05:00+00:00"
        );
        let every_2s = Schedule::parse("*/2 * * * * *", Duration::ZERO).unwrap();
        assert_eq!(
            every_2s.next_after(t0).unwrap().to_rfc3339(),
            "2026-01-01T00:01:32+00:00"
        );
    }

    #[test]
    fn bad_lines_are_one_line_naming_the_field() {
        for (line, want) in [
            (
                "61 * * * *",
                "\"61 * * * *\" is not a cron expression: the minute field \"61\": Minutes must be at most 59. ('61' specified.)",
            ),
            (
                "*/0 * * * *",
                "\"*/0 * * * *\" is not a cron expression: the minute field \"*/0\": range step cannot be zero",
            ),
            (
                "0 0 * * * 1999",
                "\"0 0 * * * 1999\" is not a cron expression: the day-of-week field \"1999\": Days of Week must be at most 7. ('1999' specified.)",
            ),
            (
                "0 0 * * * * 2030",
                "\"0 0 * * * * 2030\" has 7 fields; a year field is not supported: write 5 (min hour day month weekday) or 6 with seconds first",
            ),
            ("0 0 30 2 *", "\"0 0 30 2 *\" never fires"),
        ] {
            let e = Schedule::parse(line, Duration::ZERO).unwrap_err();
            assert_eq!(e, want);
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_shortest_gap_is_found_in_an_uneven_schedule() {
        let gap = |line: &str| {
            Schedule::parse(line, Duration::ZERO)
                .unwrap()
                .shortest_gap()
        };
        assert_eq!(gap("*/10 * * * *"), Some(Duration::from_secs(600)));
        assert_eq!(gap("* * * * * *"), Some(Duration::from_secs(1)));
        // On the hour and five past: 5 minutes, then 55.
        assert_eq!(gap("0,5 * * * *"), Some(Duration::from_secs(300)));
        assert_eq!(gap("0 3 * * 1"), Some(Duration::from_secs(7 * 86_400)));
    }
}
