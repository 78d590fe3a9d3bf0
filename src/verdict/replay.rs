//! Replay: runs as the daemon filed them, oldest first, passed through the
//! daemon's own filing and judging code (an in-memory store, the
//! [`super::filed`] rule) to give the verdicts the daemon gave, or would
//! give under another `[detector]` section.

use std::collections::{HashMap, HashSet};

use chrono::Duration as ChronoDuration;

use super::filed::{self, FiledRun};
use super::pair::PairVerdict;
use super::policy::VerdictPolicy;
use crate::store::baselines::PairKey;
use crate::store::fleet::{FleetBuild, FleetScope};
use crate::store::{Store, StoreError};
use crate::vocabulary::records::{RunOutcome, RunRecord};

/// One verdict replay gave, and the run it followed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Replayed {
    /// The id the run had where it came from (its store or its JSON).
    pub after_run: Option<i64>,
    pub replica: String,
    pub verdict: PairVerdict,
}

/// Where one target stands, as the daemon's target states keep it.
#[derive(Default)]
struct TargetView {
    rollout: Option<(String, String)>,
    fleet: Vec<FleetBuild>,
    /// Replicas by the index of the target's run that last probed them.
    replicas: HashMap<String, u64>,
    runs: u64,
}

/// Files runs one by one and judges them as the daemon does.
pub struct Replayer {
    store: Store,
    policy: VerdictPolicy,
    /// Scenarios judged by their answers, not their latency.
    drift_scenarios: HashSet<String>,
    targets: HashMap<String, TargetView>,
    /// The records of one run (one per build that served it) wait here
    /// until a record of another run arrives: they are filed together.
    pending: Vec<RunRecord>,
}

impl Replayer {
    pub fn new(
        policy: VerdictPolicy,
        drift_scenarios: HashSet<String>,
    ) -> Result<Self, StoreError> {
        Ok(Replayer {
            store: Store::in_memory()?,
            policy,
            drift_scenarios,
            targets: HashMap::new(),
            pending: Vec::new(),
        })
    }

    /// Takes the next run (oldest first); returns the verdicts of the run
    /// before it once it is complete.
    pub fn push(&mut self, run: RunRecord) -> Result<Vec<Replayed>, StoreError> {
        let same_run = self.pending.first().is_some_and(|first| {
            first.target == run.target
                && first.replica == run.replica
                && first.scenario == run.scenario
                && first.started_at == run.started_at
        });
        let done = if same_run { Vec::new() } else { self.flush()? };
        self.pending.push(run);
        Ok(done)
    }

    /// Files and judges the run still waiting, if any.
    pub fn flush(&mut self) -> Result<Vec<Replayed>, StoreError> {
        let records = std::mem::take(&mut self.pending);
        let Some(first) = records.first() else {
            return Ok(Vec::new());
        };
        let (target, replica) = (first.target.clone(), first.replica.clone());
        let after_run = records.iter().filter_map(|r| r.id).max();
        let ended = records
            .iter()
            .map(|r| r.started_at + ChronoDuration::milliseconds((r.duration_s * 1e3) as i64))
            .max()
            .unwrap_or(first.started_at);
        let view = self.targets.entry(target.clone()).or_default();
        view.runs += 1;
        if !replica.is_empty() {
            view.replicas.insert(replica.clone(), view.runs);
        }
        // The replicas "discovered now": those probed within the last
        // rounds of every replica the window spans.
        let horizon = (self.policy.canary_window.max(1) * view.replicas.len().max(1)) as u64;
        let now_runs = view.runs;
        view.replicas
            .retain(|_, last| now_runs.saturating_sub(*last) <= horizon);
        let scope = FleetScope {
            window: self.policy.canary_window,
            replicas: view.replicas.keys().cloned().collect(),
            ..FleetScope::default()
        }
        .under(&self.policy);
        let mut to_judge = Vec::new();
        for record in &records {
            let (_, observed) = self.store.insert_run_filed(record, &scope)?;
            if let Some(change) = &observed.change
                && let Some(from) = &change.from_build
            {
                view.rollout = Some((from.clone(), change.to_build.clone()));
            }
            if record.summary.completed > 0 {
                view.fleet = observed.fleet.clone();
                if observed.rollout_ended.is_some() {
                    view.rollout = None;
                }
            }
            if record.outcome == RunOutcome::Ok && !self.drift_scenarios.contains(&record.scenario)
            {
                to_judge.push((
                    PairKey {
                        target: record.target.clone(),
                        model: record.model.clone(),
                        scenario: record.scenario.clone(),
                    },
                    observed.build.clone(),
                ));
            }
        }
        let run = FiledRun {
            to_judge,
            replica_run: !replica.is_empty(),
            by_replica: !scope.replicas.is_empty(),
            rollout: view.rollout.clone(),
            fleet: view.fleet.clone(),
        };
        let verdicts = filed::judge(&self.store, &self.policy, run, ended)?;
        Ok(verdicts
            .into_iter()
            .map(|verdict| Replayed {
                after_run,
                replica: replica.clone(),
                verdict,
            })
            .collect())
    }
}

/// One line of a runs file: a run object as `/api/v1/runs` gives it, with
/// its requests when the file was written by `export` (a rollout's canary
/// compares requests; without them it has none to compare).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunLine {
    #[serde(flatten)]
    pub run: RunRecord,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<crate::vocabulary::records::SampleRow>,
}

impl RunLine {
    pub fn into_record(self) -> RunRecord {
        RunRecord {
            samples: self.samples,
            ..self.run
        }
    }
}

/// What replay prints for one evaluation: the verdict in a flat form.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayLine {
    pub after_run: Option<i64>,
    pub at: chrono::DateTime<chrono::Utc>,
    pub target: String,
    pub model: String,
    pub scenario: String,
    pub replica: String,
    pub build: String,
    pub reference_build: Option<String>,
    pub state: super::State,
    pub reason: String,
    pub changes: Vec<MetricChange>,
}

/// One metric's change with its interval, relative to the reference.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MetricChange {
    pub metric: String,
    pub change: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_adjusted: f64,
    pub flagged: bool,
}

impl From<&Replayed> for ReplayLine {
    fn from(r: &Replayed) -> Self {
        let v = &r.verdict;
        ReplayLine {
            after_run: r.after_run,
            at: v.at,
            target: v.target.clone(),
            model: v.model.clone(),
            scenario: v.scenario.clone(),
            replica: r.replica.clone(),
            build: v.build.clone(),
            reference_build: v.reference_build.clone(),
            state: v.state,
            reason: v.reason.clone(),
            changes: v
                .evaluation
                .metrics
                .iter()
                .map(|m| MetricChange {
                    metric: m.metric.clone(),
                    change: m.relative_change,
                    ci_low: m.ci_low,
                    ci_high: m.ci_high,
                    p_adjusted: m.p_adjusted,
                    flagged: m.flagged && m.alerting,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::records::LatencySummary;
    use chrono::TimeZone;

    /// A completed run of build 0.32.0 at minute `i`, TTFT `ttft` seconds
    /// with a little deterministic noise.
    fn run(i: usize, ttft: f64) -> RunRecord {
        let at = Utc.with_ymd_and_hms(2026, 11, 25, 12, 0, 0).unwrap()
            + chrono::Duration::minutes(i as i64);
        let mut r = RunRecord::failed("t", "s", "m", at, 1.0, RunOutcome::Ok, String::new());
        r.id = Some(i as i64 + 1);
        r.server.version = Some("0.32.0".into());
        r.summary.completed = 8;
        let noise = 1.0 + 0.03 * ((i * 7919) % 13) as f64 / 13.0;
        for (summary, v) in [
            (&mut r.summary.ttft, ttft * noise),
            (&mut r.summary.tpot, 0.004 * noise),
            (&mut r.summary.itl, 0.004 * noise),
            (&mut r.summary.e2el, (ttft + 0.06) * noise),
        ] {
            *summary = LatencySummary {
                count: 8,
                mean: v,
                std: 0.0,
                p50: v,
                p90: v * 1.2,
                p95: v * 1.3,
                p99: v * 1.5,
            };
        }
        r
    }

    use chrono::Utc;

    /// Every verdict replay gives on `runs` (oldest first).
    fn replay_all(policy: VerdictPolicy, runs: impl Iterator<Item = RunRecord>) -> Vec<Replayed> {
        let mut replayer = Replayer::new(policy, HashSet::new()).unwrap();
        let mut verdicts = Vec::new();
        for r in runs {
            verdicts.extend(replayer.push(r).unwrap());
        }
        verdicts.extend(replayer.flush().unwrap());
        verdicts
    }

    /// The verdicts on one build whose TTFT is 30% slower from run `at`
    /// of `runs` on.
    fn step_within_one_build(runs: usize, at: usize) -> Vec<Replayed> {
        let ttft = move |i: usize| if i >= at { 0.026 } else { 0.020 };
        replay_all(VerdictPolicy::default(), (0..runs).map(|i| run(i, ttft(i))))
    }

    #[test]
    fn a_change_within_one_build_says_so_and_since_when() {
        let verdicts = step_within_one_build(260, 200);
        let regression = verdicts
            .iter()
            .find(|r| r.verdict.state == super::super::State::Regression)
            .expect("the +30% step within the build is found");
        assert!(
            regression
                .verdict
                .reason
                .ends_with("since 15:20 UTC, same build 0.32.0 (not an upgrade)"),
            "{}",
            regression.verdict.reason
        );
        // Nothing before the change, and caught within the window.
        let after = regression.after_run.unwrap();
        assert!(after > 200 && after < 212, "{after}");
    }

    #[test]
    fn a_young_build_waits_for_a_slowdown_to_outlast_a_spell() {
        // 60 runs of history: a slow stretch is judged once it has lasted
        // `spell_runs` runs; before that it is named and not flagged.
        let spell_runs = VerdictPolicy::default().spell_runs;
        let verdicts = step_within_one_build(110, 60);
        let regression = verdicts
            .iter()
            .find(|r| r.verdict.state == super::super::State::Regression)
            .expect("the lasting step is found");
        let after = regression.after_run.unwrap() as usize;
        assert!(
            (60 + spell_runs - 2..60 + spell_runs + 4).contains(&after),
            "{after}"
        );
        assert!(
            regression
                .verdict
                .reason
                .ends_with("since 13:00 UTC, same build 0.32.0 (not an upgrade)"),
            "{}",
            regression.verdict.reason
        );
        let waiting = verdicts
            .iter()
            .find(|r| r.after_run.is_some_and(|id| (66..80).contains(&id)))
            .expect("a verdict while the stretch is short");
        assert_eq!(waiting.verdict.state, super::super::State::Ok);
        assert!(
            waiting.verdict.reason.contains("not yet a regression")
                && waiting
                    .verdict
                    .reason
                    .contains(&format!("must last {spell_runs} runs")),
            "{}",
            waiting.verdict.reason
        );
    }

    #[test]
    fn a_young_build_takes_its_runs_as_long_memory() {
        use rand::SeedableRng;
        use rand_distr::Distribution;
        // Runs that stray by 8% (log-normal), 15% slower from run 40 on:
        // in a young build, a stretch as a long-memory machine's may be.
        let verdicts = |young_hurst: f64| {
            let policy = VerdictPolicy {
                young_hurst,
                ..VerdictPolicy::default()
            };
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let noise = rand_distr::LogNormal::new(0.0, 0.08).unwrap();
            let runs = (0..76).map(move |i| {
                let step = if i >= 40 { 1.15 } else { 1.0 };
                run(i, 0.020 * noise.sample(&mut rng) * step)
            });
            replay_all(policy, runs)
        };
        let flagged = |verdicts: &[Replayed]| {
            verdicts
                .iter()
                .filter(|r| r.verdict.evaluation.flagged())
                .count()
        };
        // The young build's verdicts are told the assumption: the same
        // runs flag less often with it.
        let independent = flagged(&verdicts(0.5));
        let assumed = flagged(&verdicts(VerdictPolicy::default().young_hurst));
        assert!(independent > 0, "independent runs: a step");
        assert!(assumed < independent, "{assumed} {independent}");
    }

    #[test]
    fn assumed_tails_are_for_a_settled_history_and_long_memory_for_a_young_one() {
        let policy = VerdictPolicy {
            settled_tail_df: 7.0,
            ..VerdictPolicy::default()
        };
        let mut replayer = Replayer::new(policy, HashSet::new()).unwrap();
        let key = PairKey {
            target: "t".into(),
            model: "m".into(),
            scenario: "s".into(),
        };
        let mut told = Vec::new();
        for i in 0..200 {
            replayer.push(run(i, 0.020)).unwrap();
            let comparison = replayer
                .policy
                .latest(&replayer.store, &key, "0.32.0")
                .unwrap();
            told.push((
                comparison.history.len(),
                comparison.hurst,
                comparison.tail_df,
            ));
        }
        // Fewer than half of `noise_runs` (300) runs of history: long
        // memory and no tails assumed; from 150 on, the tails and no more.
        let (young, settled) = (told[100], told[199]);
        assert!(young.0 < 150 && settled.0 >= 150, "{young:?} {settled:?}");
        assert_eq!((young.1, young.2), (0.75, f64::INFINITY));
        assert_eq!((settled.1, settled.2), (0.5, 7.0));
    }

    #[test]
    fn an_upgrade_from_a_young_build_is_judged_by_the_new_builds_spells_once_shown() {
        use rand::SeedableRng;
        use rand_distr::Distribution;
        // 50 runs of 0.32.0, too few to show the machine's spells, then
        // 0.33.0 30% slower, and 30% slower again within itself from run
        // 320 on; runs stray by 8% (log-normal).
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let noise = rand_distr::LogNormal::new(0.0, 0.08).unwrap();
        let mut replayer = Replayer::new(VerdictPolicy::default(), HashSet::new()).unwrap();
        let key = PairKey {
            target: "t".into(),
            model: "m".into(),
            scenario: "s".into(),
        };
        let mut verdicts = Vec::new();
        let mut told = Vec::new();
        for i in 0..360 {
            let step = match i {
                _ if i >= 320 => 1.69,
                _ if i >= 50 => 1.3,
                _ => 1.0,
            };
            let mut r = run(i, 0.020 * step * noise.sample(&mut rng));
            if i >= 50 {
                r.server.version = Some("0.33.0".into());
            }
            verdicts.extend(replayer.push(r).unwrap());
            let told_now = replayer
                .policy
                .latest(&replayer.store, &key, "0.33.0")
                .unwrap();
            let from = told_now
                .history
                .first()
                .and_then(|r| r.server.version.clone());
            let newest = told_now.history.iter().filter_map(|r| r.id).max();
            told.push((i, from, told_now.hurst, newest));
        }
        verdicts.extend(replayer.flush().unwrap());
        let old = Some("0.32.0".to_owned());
        let new = Some("0.33.0".to_owned());
        // While the new build is young too: the old build's 48 runs, taken
        // as long-memory; once it has 150 runs outside the candidate, its
        // own, as they are.
        assert!(
            told.iter()
                .any(|(i, from, h, _)| *i == 100 && *from == old && *h == 0.75)
        );
        assert!(
            told.iter()
                .any(|(i, from, h, _)| *i == 300 && *from == new && *h == 0.5)
        );
        // The slowdown within the new build never becomes its noise: the
        // history stops where it began.
        let (_, from, _, newest) = told.last().unwrap();
        assert_eq!(*from, new);
        assert!(newest.is_some_and(|id| id <= 321), "{newest:?}");
        // A report of the upgrade is told what the daemon was.
        let report = replayer
            .policy
            .across(&replayer.store, &key, "0.32.0", "0.33.0")
            .unwrap();
        assert_eq!(report.hurst, 0.5);
        assert_eq!(
            report
                .history
                .first()
                .and_then(|r| r.server.version.clone()),
            new
        );
        // Judged against spells it cannot rule out, the step is a
        // regression now and then; knowing the spells, in every evaluation.
        let share = |runs: std::ops::Range<i64>| {
            let judged: Vec<bool> = verdicts
                .iter()
                .filter(|r| r.verdict.build == "0.33.0")
                .filter(|r| r.after_run.is_some_and(|id| runs.contains(&id)))
                .map(|r| r.verdict.state == super::super::State::Regression)
                .collect();
            judged.iter().filter(|r| **r).count() as f64 / judged.len() as f64
        };
        let (young, shown) = (share(60..200), share(230..321));
        assert!(young < shown, "{young}");
        assert_eq!(shown, 1.0);
    }

    /// The verdicts on a new build that starts with `first` runs `slower`
    /// (0.028 for 40% slower) and then serves as the old one did, after
    /// 120 runs of the old build: its baseline calm, then a slow spell of
    /// 6 runs in every 20, 40% slower.
    fn upgrade_after_spells(noise_runs: usize, first: usize, slower: f64) -> Vec<Replayed> {
        let policy = VerdictPolicy {
            noise_runs,
            ..VerdictPolicy::default()
        };
        let runs = (0..160).map(|i| {
            let ttft = match i {
                _ if (40..120).contains(&i) && i % 20 >= 14 => 0.028,
                _ if i >= 120 && i - 120 < first => slower,
                _ => 0.020,
            };
            let mut r = run(i, ttft);
            if i >= 120 {
                r.server.version = Some("0.33.0".into());
            }
            r
        });
        replay_all(policy, runs)
    }

    /// Regression verdicts on the new build.
    fn regressions(verdicts: &[Replayed]) -> usize {
        verdicts
            .iter()
            .filter(|r| r.verdict.build == "0.33.0")
            .filter(|r| r.verdict.state == super::super::State::Regression)
            .count()
    }

    #[test]
    fn an_upgrade_is_judged_knowing_the_old_builds_slow_spells() {
        // A new build's first runs in a spell like the old build's: the
        // old build's history says it is one; without it, a regression.
        assert_eq!(regressions(&upgrade_after_spells(300, 8, 0.028)), 0);
        assert!(regressions(&upgrade_after_spells(0, 8, 0.028)) > 0);
        // A new build that stays slower than any spell is a regression
        // either way. (One that stays exactly as slow as the old build
        // was 30% of the time looks, in 12 runs, like one of its spells.)
        assert!(regressions(&upgrade_after_spells(300, 40, 0.036)) > 0);
        assert!(regressions(&upgrade_after_spells(0, 40, 0.036)) > 0);
    }
}
