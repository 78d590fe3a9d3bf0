//! What a detector did over a set of trials: the changes it caught within
//! 3 evaluations and within the horizon, how soon, its false alarms on
//! untouched series, and how often it alarms on untouched series right
//! where a trial's change could have come (the catches chance gives it).

use super::harness::{AFTER, Alerts, LATEST_CHANGE, Series};

/// What a detector did over a set of trials.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// Evaluations after a change a trial counts (the series' length
    /// after it): [`AFTER`] unless [`Score::with_horizon`].
    pub horizon: usize,
    pub trials: usize,
    pub within_3: usize,
    pub within_horizon: usize,
    /// Delays (evaluations after the change, 1 = the first changed run)
    /// of the trials caught within the horizon.
    pub delays: Vec<usize>,
    /// Untouched evaluations, and alerts among them.
    pub evaluations: usize,
    pub false_alerts: usize,
    /// Stretches of untouched series scored as a trial is: from a run
    /// where a trial's change could have come, `horizon` runs long. A
    /// detector that alarms on a tenth of all evaluations "catches" most
    /// changes within 10 without seeing them; these say how many.
    pub untouched_windows: usize,
    /// Of those, the ones with an alert within their first 3 runs...
    pub untouched_within_3: usize,
    /// ...and within the whole stretch.
    pub untouched_within_horizon: usize,
}

impl Default for Score {
    fn default() -> Self {
        Score::with_horizon(AFTER)
    }
}

impl Score {
    pub fn with_horizon(horizon: usize) -> Self {
        Score {
            horizon,
            trials: 0,
            within_3: 0,
            within_horizon: 0,
            delays: Vec::new(),
            evaluations: 0,
            false_alerts: 0,
            untouched_windows: 0,
            untouched_within_3: 0,
            untouched_within_horizon: 0,
        }
    }

    /// Adds a series' alerts to the score.
    pub fn add(&mut self, series: &Series, alerts: &Alerts) {
        self.add_scored_from(series, alerts, series.first_evaluation);
    }

    /// Adds a series' alerts, an untouched one's scored from run `from`.
    /// Scored from its first evaluation, a change could have come at any
    /// run a trial's can ([`LATEST_CHANGE`]); from a later run (a no-op
    /// upgrade), at that run.
    pub fn add_scored_from(&mut self, series: &Series, alerts: &Alerts, from: usize) {
        match series.change_at {
            Some(at) => {
                self.trials += 1;
                if let Some(delay) = alerts[at..].iter().position(|a| *a).map(|p| p + 1) {
                    if delay <= 3 {
                        self.within_3 += 1;
                    }
                    if delay <= self.horizon {
                        self.within_horizon += 1;
                        self.delays.push(delay);
                    }
                }
            }
            None => {
                let scored = &alerts[from.min(alerts.len())..];
                self.evaluations += scored.len();
                self.false_alerts += scored.iter().filter(|a| **a).count();
                let latest = match from == series.first_evaluation {
                    true => from + LATEST_CHANGE,
                    false => from,
                };
                self.add_untouched_windows(alerts, from..=latest);
            }
        }
    }

    /// Counts the untouched stretches from each of `starts` that fit in
    /// the series, and those alerted within 3 runs and within all of it.
    fn add_untouched_windows(&mut self, alerts: &Alerts, starts: std::ops::RangeInclusive<usize>) {
        for start in starts {
            let Some(stretch) = alerts.get(start..start + self.horizon) else {
                break;
            };
            self.untouched_windows += 1;
            if stretch.iter().take(3).any(|a| *a) {
                self.untouched_within_3 += 1;
            }
            if stretch.iter().any(|a| *a) {
                self.untouched_within_horizon += 1;
            }
        }
    }

    /// The delay by which half of all trials were caught (a trial not
    /// caught counts as later than any): `None` when half were not
    /// caught within the horizon.
    pub fn half_caught_by(&self) -> Option<usize> {
        let half = self.trials.div_ceil(2).max(1);
        let mut delays = self.delays.clone();
        delays.sort_unstable();
        delays.get(half - 1).copied()
    }

    pub fn median_delay(&self) -> Option<f64> {
        if self.delays.is_empty() {
            return None;
        }
        let d: Vec<f64> = self.delays.iter().map(|d| *d as f64).collect();
        Some(crate::stats::percentile_sorted(
            &crate::stats::sorted(&d),
            50.0,
        ))
    }

    pub fn rate(n: usize, of: usize) -> f64 {
        if of == 0 { 0.0 } else { n as f64 / of as f64 }
    }

    pub fn false_per_10k(&self) -> f64 {
        Self::rate(self.false_alerts, self.evaluations) * 10_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series of `len` runs, changed from run 10 (or untouched), first
    /// evaluated at run 5, with alerts at the given runs.
    fn series(len: usize, change_at: Option<usize>, alerts_at: &[usize]) -> (Series, Alerts) {
        let series = Series {
            runs: Vec::new(),
            change_at,
            first_evaluation: 5,
            recorded_ids: Vec::new(),
        };
        let alerts = (0..len).map(|i| alerts_at.contains(&i)).collect();
        (series, alerts)
    }

    fn trial(len: usize, alerts_at: &[usize]) -> (Series, Alerts) {
        series(len, Some(10), alerts_at)
    }

    #[test]
    fn a_longer_horizon_counts_later_catches_and_says_when_half_were_caught() {
        let mut table = Score::default();
        let mut long = Score::with_horizon(30);
        // Caught at delays 2, 15 and 25; one never; an alert before the
        // change is no catch.
        for alerts_at in [&[11][..], &[24], &[3, 34], &[]] {
            let (series, alerts) = trial(40, alerts_at);
            table.add(&series, &alerts);
            long.add(&series, &alerts);
        }
        assert_eq!(
            (table.trials, table.within_horizon, table.within_3),
            (4, 1, 1)
        );
        assert_eq!(table.half_caught_by(), None, "1 of 4 within 10");
        assert_eq!(
            (long.within_horizon, long.delays.clone()),
            (3, vec![2, 15, 25])
        );
        // Half of 4 trials: the 2nd catch; the median of the catches is 15.
        assert_eq!(long.half_caught_by(), Some(15));
        assert_eq!(long.median_delay(), Some(15.0));
        let mut few = Score::with_horizon(30);
        let (series, alerts) = trial(40, &[]);
        few.add(&series, &alerts);
        assert_eq!(few.half_caught_by(), None);
        assert_eq!(long.untouched_windows, 0, "no untouched series");
    }

    #[test]
    fn untouched_series_say_how_often_an_alarm_falls_where_a_change_could_have_come() {
        // One alarm, at run 20, in 60 runs first evaluated at run 5: a
        // change at runs 5-35 could have come; the stretch of 10 from
        // runs 11-20 holds the alarm, the first 3 runs of those from
        // 18-20.
        let (untouched, alerts) = series(60, None, &[20]);
        let mut score = Score::default();
        score.add(&untouched, &alerts);
        assert_eq!((score.evaluations, score.false_alerts), (55, 1));
        assert_eq!(
            (
                score.untouched_windows,
                score.untouched_within_horizon,
                score.untouched_within_3
            ),
            (31, 10, 3)
        );
        // A no-op upgrade at run 20: its stretch alone, alarmed at once.
        let mut upgrade = Score::default();
        upgrade.add_scored_from(&untouched, &alerts, 20);
        assert_eq!(
            (
                upgrade.untouched_windows,
                upgrade.untouched_within_3,
                upgrade.untouched_within_horizon,
                upgrade.false_alerts
            ),
            (1, 1, 1, 1)
        );
        // Stretches that would run past the series' end are not scored:
        // 30 runs hold those from runs 5-20.
        let (short, alerts) = series(30, None, &[]);
        let mut score = Score::default();
        score.add(&short, &alerts);
        assert_eq!(
            (score.untouched_windows, score.untouched_within_horizon),
            (16, 0)
        );
        // A changed series adds none.
        let (changed, alerts) = trial(40, &[12]);
        score.add(&changed, &alerts);
        assert_eq!((score.untouched_windows, score.within_3), (16, 1));
    }
}
