//! The before/after report between two server versions of one target, as
//! engine comparisons and scenario tables are laid out in benchmark
//! reports: per scenario, pooled request statistics on each side,
//! throughput, the detector's change with its interval and p-value, the
//! verdict (the daemon's rule, from the verdict policy), and the load each
//! side was measured under. Rendered as Markdown or as HTML with inline SVG
//! charts.

use chrono::{DateTime, Utc};

use crate::stats;
use crate::store::answers::AnswersOf;
use crate::store::baselines::PairKey;
use crate::store::fleet::Rollout;
use crate::store::starts::NoWarmup;
use crate::store::{Store, StoreError};
use crate::verdict::drift::{self, DriftReport};
use crate::verdict::pair::PairVerdict;
use crate::verdict::policy::VerdictPolicy;
use crate::verdict::policy::run_point;
use crate::verdict::{self, MetricResult, RunPoint};
use crate::vocabulary::records::RunRecord;

mod render;
pub use render::{html, markdown};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("target {0:?} has had no upgrade yet; name the builds with from= and to=")]
    NoUpgrade(String),
    #[error(
        "target {target:?} has no completed runs at version {version:?}; versions with runs: {known}"
    )]
    NoRuns {
        target: String,
        version: String,
        known: String,
    },
    #[error(
        "target {target:?} has no completed runs at version {version:?} since it was rolled back at {since} UTC and deployed again; its {earlier} run(s) from before the rollback are not judged; wait for more runs"
    )]
    NoRunsSinceReturn {
        target: String,
        version: String,
        since: String,
        earlier: usize,
    },
    #[error(
        "target {target:?} has {runs} completed run(s) at version {version:?}, all of them warm-up (the first {warmup} of the version, of each deployment and of each server start, which verdicts and reports leave out: [detector] warmup_runs; a version deployed again is judged on its runs since); wait for more runs"
    )]
    OnlyWarmup {
        target: String,
        version: String,
        runs: usize,
        warmup: usize,
    },
}

/// Pooled statistics of one latency over every request of one side.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Pooled {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Pooled {
    fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Pooled::default();
        }
        let s = stats::sorted(values);
        Pooled {
            mean: stats::mean(values),
            p50: stats::percentile_sorted(&s, 50.0),
            p90: stats::percentile_sorted(&s, 90.0),
            p99: stats::percentile_sorted(&s, 99.0),
        }
    }
}

/// One version's side of a scenario.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct Side {
    pub version: String,
    pub runs: usize,
    pub requests: usize,
    pub first: Option<DateTime<Utc>>,
    pub last: Option<DateTime<Utc>>,
    /// ttft, tpot, itl, e2el in that order, seconds.
    pub latency: [Pooled; 4],
    pub output_throughput: f64,
    pub request_throughput: f64,
    /// Mean running + waiting requests around the runs.
    pub load: Option<f64>,
    pub kv_cache_usage: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScenarioReport {
    pub scenario: String,
    pub before: Side,
    pub after: Side,
    pub metrics: Vec<MetricResult>,
    /// The verdict policy's rule on these two sides.
    pub state: verdict::State,
    pub reason: String,
    /// The daemon's last confirmed verdict for this comparison, if any.
    pub confirmed: Option<verdict::State>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UpgradeReport {
    pub target: String,
    pub model: String,
    pub from: String,
    pub to: String,
    pub generated_at: DateTime<Utc>,
    pub confidence: f64,
    pub threshold: f64,
    pub scenarios: Vec<ScenarioReport>,
    /// The rollout from `from` to `to`, when it came as one.
    pub rollout: Option<Rollout>,
    /// Drift canaries that answered on both versions: how `to`'s latest
    /// answers compare with `from`'s.
    pub drift: Vec<DriftSection>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DriftSection {
    pub scenario: String,
    pub sentence: String,
    pub report: DriftReport,
}

/// The drift canary of `key` between the latest answers of two builds.
fn drift_section(
    store: &Store,
    cfg: &VerdictPolicy,
    key: &PairKey,
    from: &str,
    to: &str,
) -> Result<Option<DriftSection>, StoreError> {
    let latest = |build| store.answers(key, AnswersOf::Build(build), i64::MAX);
    let (Some((_, before)), Some((_, after))) = (latest(from)?, latest(to)?) else {
        return Ok(None);
    };
    let report = drift::compare(&before, &after, &cfg.drift);
    Ok(Some(DriftSection {
        scenario: key.scenario.clone(),
        sentence: report.sentence(to),
        report,
    }))
}

const LATENCIES: [&str; 4] = ["TTFT", "TPOT", "ITL", "E2EL"];

impl UpgradeReport {
    /// The verdict over all scenarios: regression if any regressed, else
    /// inconclusive if any could not be judged, else ok.
    pub fn overall(&self) -> (verdict::State, String) {
        let count = |state| self.scenarios.iter().filter(|s| s.state == state).count();
        let n = self.scenarios.len();
        let (regressed, unsure) = (
            count(verdict::State::Regression),
            count(verdict::State::Inconclusive),
        );
        if regressed > 0 {
            (
                verdict::State::Regression,
                format!("{regressed} of {n} scenario(s) slower"),
            )
        } else if unsure > 0 || n == 0 {
            (
                verdict::State::Inconclusive,
                format!("{unsure} of {n} scenario(s) could not be judged"),
            )
        } else {
            (
                verdict::State::Ok,
                format!("none of {n} scenario(s) slower"),
            )
        }
    }
}

fn side(store: &Store, version: &str, runs: &[RunRecord]) -> Result<Side, StoreError> {
    let mut pooled: [Vec<f64>; 4] = Default::default();
    let mut requests = 0;
    for run in runs {
        let Some(id) = run.id else { continue };
        for s in store.samples(id)? {
            if !s.outcome.is_ok() {
                continue;
            }
            requests += 1;
            pooled[0].extend(s.ttft_s);
            pooled[1].extend(s.tpot_s);
            pooled[2].extend(s.itls_s.iter().copied());
            pooled[3].extend(s.e2el_s);
        }
    }
    let mean_of = |f: &dyn Fn(&RunRecord) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| stats::mean(&v))
    };
    let points: Vec<RunPoint> = runs.iter().map(run_point).collect();
    let loads: Vec<f64> = points.iter().filter_map(|p| p.load).collect();
    Ok(Side {
        version: version.to_owned(),
        runs: runs.len(),
        requests,
        first: runs.first().map(|r| r.started_at),
        last: runs.last().map(|r| r.started_at),
        latency: pooled.map(|v| Pooled::of(&v)),
        output_throughput: mean_of(&|r| Some(r.summary.output_throughput)).unwrap_or(0.0),
        request_throughput: mean_of(&|r| Some(r.summary.request_throughput)).unwrap_or(0.0),
        load: (!loads.is_empty()).then(|| stats::mean(&loads)),
        kv_cache_usage: mean_of(&|r| {
            let v: Vec<f64> = [r.load_before, r.load_after]
                .iter()
                .flatten()
                .filter_map(|l| l.kv_cache_usage)
                .collect();
            (!v.is_empty()).then(|| stats::mean(&v))
        }),
    })
}

/// Builds the report from the store.
pub fn build(
    store: &Store,
    cfg: &VerdictPolicy,
    target: &str,
    model: Option<&str>,
    from: &str,
    to: &str,
    now: DateTime<Utc>,
) -> Result<UpgradeReport, ReportError> {
    let models = store.models_of(target)?;
    let model = model
        .map(str::to_owned)
        .or_else(|| models.first().cloned())
        .unwrap_or_else(|| "unknown".into());
    let scenarios = store.scenarios_of(target)?;
    let latest: Vec<PairVerdict> = store
        .latest_evaluations()?
        .into_iter()
        .filter_map(|e| serde_json::from_str::<PairVerdict>(&e.detail).ok())
        .collect();
    let mut out = Vec::new();
    let mut drift = Vec::new();
    let mut any = [false, false];
    // Completed runs per side, warm-up included, to say why a side is empty;
    // of the new side, those since it was last deployed (as it is judged)
    // and those before.
    let mut all_runs = [0usize, 0usize];
    let mut before_return = 0;
    let since = match from == to {
        true => None,
        false => store.redeployed_since(target, &model, to)?,
    };
    for scenario in scenarios {
        let key = PairKey {
            target: target.to_owned(),
            model: model.clone(),
            scenario: scenario.clone(),
        };
        drift.extend(drift_section(store, cfg, &key, from, to)?);
        let comparison = cfg.across_since(store, &key, from, to, since)?;
        let (before_runs, after_runs) = (&comparison.baseline, &comparison.candidate);
        any[0] |= !before_runs.is_empty();
        any[1] |= !after_runs.is_empty();
        all_runs[0] += store.count_ok_runs(&key, from)?;
        let since_return = store.count_ok_runs_after_warmup(&key, to, &NoWarmup, since)?;
        all_runs[1] += since_return;
        before_return += store.count_ok_runs(&key, to)?.saturating_sub(since_return);
        if before_runs.is_empty() || after_runs.is_empty() {
            continue;
        }
        let base = comparison.baseline_points();
        let cand = comparison.candidate_points();
        // The table: every run of each side in one evaluation. The verdict:
        // the daemon's rule replayed over the same runs.
        let history = comparison.history_points();
        let detector =
            comparison.settings(&cfg.detector_for(comparison.judged, comparison.runs_since_warmup));
        let evaluation = verdict::evaluate_with_noise(&base, &cand, &history, &detector);
        // Replayed, each evaluation takes its own settings by how far past
        // the warm-up it was, from the comparison's.
        let policy = VerdictPolicy {
            detector: comparison.settings(&cfg.detector),
            ..cfg.clone()
        };
        let verdict = policy.replay(
            &base,
            &cand,
            &history,
            comparison.judged,
            comparison.runs_since_warmup,
        );
        let confirmed = latest
            .iter()
            .find(|v| v.key() == key && v.build == to && v.reference_build.as_deref() == Some(from))
            .map(|v| v.state);
        out.push(ScenarioReport {
            scenario,
            before: side(store, from, before_runs)?,
            after: side(store, to, after_runs)?,
            metrics: evaluation.metrics,
            state: verdict.state,
            reason: verdict.reason,
            confirmed,
        });
    }
    if !any[0] {
        return Err(empty_side(store, cfg, target, &model, from, all_runs[0]));
    }
    if !any[1] {
        return Err(match since {
            Some(since) if all_runs[1] == 0 && before_return > 0 => {
                ReportError::NoRunsSinceReturn {
                    target: target.to_owned(),
                    version: to.to_owned(),
                    since: since.format("%Y-%m-%d %H:%M").to_string(),
                    earlier: before_return,
                }
            }
            _ => empty_side(store, cfg, target, &model, to, all_runs[1]),
        });
    }
    let rollout = store
        .rollouts(target, &model)?
        .into_iter()
        .filter(|r| r.from_build == from && r.to_build == to)
        .max_by_key(|r| r.started_at);
    Ok(UpgradeReport {
        target: target.to_owned(),
        model,
        from: from.to_owned(),
        to: to.to_owned(),
        generated_at: now,
        confidence: cfg.detector.confidence,
        threshold: cfg.detector.threshold,
        scenarios: out,
        rollout,
        drift,
    })
}

/// `(from, to)` of the target's latest upgrade: its newest version change
/// from one build to another.
pub fn latest_upgrade(
    store: &Store,
    target: &str,
    model: Option<&str>,
) -> Result<Option<(String, String)>, StoreError> {
    let models = match model {
        Some(m) => vec![m.to_owned()],
        None => store.models_of(target)?,
    };
    let mut latest: Option<crate::store::builds::VersionChange> = None;
    for m in models {
        if let Some(c) = store.latest_upgrade(target, &m)?
            && latest.as_ref().is_none_or(|l| c.at > l.at)
        {
            latest = Some(c);
        }
    }
    Ok(latest.and_then(|c| Some((c.from_build?, c.to_build))))
}

/// Why one side of a report has no runs to compare: only warm-up runs,
/// or none at all (naming the builds the store knows).
fn empty_side(
    store: &Store,
    cfg: &VerdictPolicy,
    target: &str,
    model: &str,
    version: &str,
    runs: usize,
) -> ReportError {
    if runs > 0 {
        return ReportError::OnlyWarmup {
            target: target.to_owned(),
            version: version.to_owned(),
            runs,
            warmup: cfg.warmup_runs,
        };
    }
    let builds = match store.builds_with_runs(target, model) {
        Ok(builds) => builds,
        Err(e) => return e.into(),
    };
    ReportError::NoRuns {
        target: target.to_owned(),
        version: version.to_owned(),
        known: if builds.is_empty() {
            "none".into()
        } else {
            builds.join(", ")
        },
    }
}

#[cfg(test)]
mod tests;
