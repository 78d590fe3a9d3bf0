//! The detection table's cells as text, both ways: written from a
//! [`Score`] by the benchmark and read back as numbers by the bars, in one
//! place so that the form written and the form read cannot come apart.

use std::fmt::Write as _;

use super::harness::AFTER;
use super::score::Score;

/// One change's cell: the shares of trials caught within 3 and within 10
/// evaluations, and the median delay of the trials caught.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Catches {
    pub within_3: f64,
    pub within_10: f64,
    pub median_delay: Option<f64>,
}

fn percent(n: usize, of: usize) -> String {
    format!("{:.0}%", Score::rate(n, of) * 100.0)
}

/// "12% / 40% / 4": caught within 3, within the horizon, the median delay
/// ("-" when none was caught); at another horizon than [`AFTER`] a fourth
/// field, the evaluation by which half of all trials were caught (">40"
/// when half were not).
pub fn catches(score: &Score) -> String {
    let delay = score
        .median_delay()
        .map(|d| format!("{d:.0}"))
        .unwrap_or_else(|| "-".into());
    let mut cell = format!(
        "{} / {} / {delay}",
        percent(score.within_3, score.trials),
        percent(score.within_horizon, score.trials),
    );
    if score.horizon != AFTER {
        match score.half_caught_by() {
            Some(by) => write!(cell, " / {by}").unwrap(),
            None => write!(cell, " / >{}", score.horizon).unwrap(),
        }
    }
    cell
}

/// "0.7 (13800)": false regressions per 10,000 untouched evaluations, and
/// how many evaluations that rests on.
pub fn false_regressions(score: &Score) -> String {
    format!("{:.1} ({})", score.false_per_10k(), score.evaluations)
}

/// "5% / 12%": how often untouched series alarm within 3 and within the
/// horizon of a run where a change could have come; "- / -" when no such
/// stretch fits (a horizon past the untouched series' length).
pub fn untouched(score: &Score) -> String {
    let share = |n| match score.untouched_windows {
        0 => "-".to_owned(),
        of => percent(n, of),
    };
    format!(
        "{} / {}",
        share(score.untouched_within_3),
        share(score.untouched_within_horizon)
    )
}

fn share(text: &str) -> Option<f64> {
    let percent: f64 = text.trim().strip_suffix('%')?.parse().ok()?;
    (0.0..=100.0).contains(&percent).then_some(percent / 100.0)
}

/// A cell of [`catches`]' form at the horizon [`AFTER`]; a fourth field,
/// another horizon's, is no cell of the table's.
pub fn read_catches(cell: &str) -> Option<Catches> {
    let fields: Vec<&str> = cell.split('/').map(str::trim).collect();
    let [within_3, within_10, delay] = fields[..] else {
        return None;
    };
    let median_delay = match delay {
        "-" => None,
        d => Some(d.parse().ok()?),
    };
    Some(Catches {
        within_3: share(within_3)?,
        within_10: share(within_10)?,
        median_delay,
    })
}

/// A cell of [`false_regressions`]' form: the rate and the evaluations.
pub fn read_false_regressions(cell: &str) -> Option<(f64, usize)> {
    let (rate, rest) = cell.split_once(' ')?;
    let evaluations = rest
        .trim()
        .strip_prefix('(')?
        .strip_suffix(')')?
        .parse()
        .ok()?;
    Some((rate.parse().ok()?, evaluations))
}

/// A cell of [`untouched`]' form: the two shares.
pub fn read_untouched(cell: &str) -> Option<(f64, f64)> {
    let (within_3, within_10) = cell.split_once('/')?;
    Some((share(within_3)?, share(within_10)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(horizon: usize) -> Score {
        Score {
            trials: 60,
            within_3: 7,
            within_horizon: 31,
            delays: vec![1, 2, 2, 5, 9],
            evaluations: 13_800,
            false_alerts: 1,
            untouched_windows: 230,
            untouched_within_3: 2,
            untouched_within_horizon: 23,
            ..Score::with_horizon(horizon)
        }
    }

    #[test]
    fn every_cell_written_reads_back_as_its_numbers() {
        let score = score(AFTER);
        assert_eq!(catches(&score), "12% / 52% / 2");
        assert_eq!(
            read_catches(&catches(&score)),
            Some(Catches {
                within_3: 0.12,
                within_10: 0.52,
                median_delay: Some(2.0),
            })
        );
        assert_eq!(false_regressions(&score), "0.7 (13800)");
        assert_eq!(
            read_false_regressions(&false_regressions(&score)),
            Some((0.7, 13_800))
        );
        assert_eq!(untouched(&score), "1% / 10%");
        assert_eq!(read_untouched(&untouched(&score)), Some((0.01, 0.10)));
        let none_caught = Score {
            within_3: 0,
            within_horizon: 0,
            delays: Vec::new(),
            ..score
        };
        assert_eq!(
            read_catches(&catches(&none_caught)),
            Some(Catches {
                within_3: 0.0,
                within_10: 0.0,
                median_delay: None,
            })
        );
    }

    #[test]
    fn another_horizons_cells_are_written_but_not_read_as_the_tables() {
        let longer = score(40);
        assert_eq!(catches(&longer), "12% / 52% / 2 / >40");
        assert_eq!(read_catches(&catches(&longer)), None);
        let past_the_series = Score {
            untouched_windows: 0,
            ..longer
        };
        assert_eq!(untouched(&past_the_series), "- / -");
        assert_eq!(read_untouched(&untouched(&past_the_series)), None);
    }
}
