//! The daemon's side of regression detection: files what each server says
//! it is (announcing version changes), judges a pair after each completed
//! run, feeds verdicts to `/metrics`, the status board and the notifier,
//! restores all of it after a restart, and says which scenarios an upgrade
//! still needs runs of.

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{Config, TargetConfig};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::state::{IdentityCondition, TargetStates};
use crate::store::baselines::PairKey;
use crate::store::builds::{Observed, VersionChange};
use crate::store::fleet::FleetBuild;
use crate::store::{AsyncStore, StoreError};
use crate::verdict::State;
use crate::verdict::filed::{self, FiledRun};
use crate::verdict::pair::{self, PairVerdict};
use crate::vocabulary::records::ServerIdentity;

/// Everything judging needs, and nothing else.
#[derive(Clone)]
pub struct Verdicts {
    pub store: AsyncStore,
    pub metrics: Arc<Metrics>,
    pub board: Arc<TargetStates>,
    pub notifier: Notifier,
    /// Bumped when a target's server build changes; workers check whether
    /// an upgrade needs probe rounds.
    pub upgrades: watch::Sender<u64>,
    /// The (pair, build)s whose drift canary last answered differently
    /// from their own earlier answers: said once when it starts, once
    /// when it ends, not on every run.
    pub nondeterministic: Arc<std::sync::Mutex<std::collections::HashSet<(PairKey, String)>>>,
    /// The daemon's clock.
    pub clock: crate::clock::Clock,
}

impl Verdicts {
    /// Files the server's identity, as a build of the fleet that served
    /// the target over the policy's canary window; a new build is
    /// announced.
    pub async fn observe_identity(
        &self,
        target: &str,
        model: &str,
        identity: &ServerIdentity,
        policy: &crate::verdict::policy::VerdictPolicy,
    ) {
        // While `/version` is known to disagree with the fingerprints, the
        // runs' fingerprints name the build; filing `/version` too would
        // flip the build back and forth on every reading.
        if let Some(IdentityCondition::VersionDisagrees { version, .. }) =
            self.board.identity_condition(target)
            && identity.version.as_deref() == Some(version.as_str())
        {
            return;
        }
        let (t, m, id) = (target.to_owned(), model.to_owned(), identity.clone());
        let now = self.clock.now();
        let scope = self
            .board
            .fleet_scope(target, policy.canary_window)
            .under(policy);
        let Some(observed) = self
            .store
            .call_or_none(move |s| s.observe_identity(&t, &m, &id, now, &scope))
            .await
        else {
            return;
        };
        if let Some(change) = observed.change {
            self.announce(target, model, identity, &change);
        }
    }

    /// Logs a build change; a rollout (another build served before) is
    /// also exported and wakes the target's worker for the upgrade rounds.
    pub fn announce(
        &self,
        target: &str,
        model: &str,
        identity: &ServerIdentity,
        change: &VersionChange,
    ) {
        match &change.from_build {
            Some(from) => {
                tracing::warn!(
                    target, model, from = ?from, to = ?change.to_build,
                    version = ?identity.version, model_root = ?identity.model_root,
                    system_fingerprint = ?identity.system_fingerprint,
                    image = ?identity.image, image_digest = ?identity.image_digest,
                    "rollout started: a new server build serves the target"
                );
                self.metrics.server.set_version_change(target, change.at);
                self.metrics.fleet.rollout_started(target);
                self.board
                    .set_rollout(target, Some((from.clone(), change.to_build.clone())));
                self.upgrades.send_modify(|n| *n += 1);
            }
            None => {
                tracing::info!(target, model, build = ?change.to_build, "server build first seen")
            }
        }
    }

    /// Exports the builds serving a target after a run, and announces the
    /// end of a rollout once.
    pub fn fleet_changed(&self, target: &str, observed: &Observed) {
        self.metrics.fleet.set_builds(target, &observed.fleet);
        let names = |fleet: &[FleetBuild]| {
            let mut builds: Vec<String> = fleet.iter().map(|b| b.build.clone()).collect();
            builds.sort();
            builds
        };
        let builds = names(&observed.fleet);
        // Looking for stale series reads the whole page: only when a build
        // left the fleet.
        if names(&self.board.fleet(target)) != builds {
            self.metrics.runs.retain_fleet(target, &builds);
        }
        self.board.set_fleet(target, observed.fleet.clone());
        if let Some(ended) = &observed.rollout_ended {
            let outcome = ended.outcome.as_deref().unwrap_or("finished");
            tracing::warn!(
                target, from = ?ended.from_build, to = ?ended.to_build, outcome,
                "rollout {outcome}: {} serves the target alone",
                if outcome == "finished" { &ended.to_build } else { &ended.from_build }
            );
            self.metrics
                .fleet
                .rollout_ended(target, ended.ended_at.unwrap_or_else(|| self.clock.now()));
            self.board.set_rollout(target, None);
        }
    }

    /// Judges a filed run by the verdict layer's rule (see
    /// [`crate::verdict::filed`]) and publishes what it decided. Its
    /// evaluation is written as the run was, waiting out another process
    /// holding the store: a lost one would hold a regression's page back
    /// by a run, its confirmation counting the stored evaluations.
    pub async fn judge_filed(&self, config: &Config, run: FiledRun) {
        if run.to_judge.is_empty() {
            return;
        }
        let policy = config.verdict_policy.clone();
        let now = self.clock.now();
        // A try the store refused part-way carries on from the pairs it
        // judged; what was judged is published even if the last try fails.
        let judged = Arc::new(std::sync::Mutex::new(Vec::new()));
        let so_far = judged.clone();
        let _ = self
            .store
            .call_until_free(move |s| {
                let mut so_far = so_far.lock().unwrap_or_else(|p| p.into_inner());
                filed::judge_from(s, &policy, &run, now, &mut so_far)
            })
            .await;
        let verdicts = std::mem::take(&mut *judged.lock().unwrap_or_else(|p| p.into_inner()));
        for v in verdicts {
            self.publish(v);
        }
    }

    /// The board, `/metrics`, the log and the notifier learn a verdict.
    fn publish(&self, v: PairVerdict) {
        self.metrics.verdicts.set_verdict(&v, true);
        self.tell(v);
    }

    /// Puts a verdict on the status board, logs a change of state and
    /// hands it to the notifier. A drift canary's verdict comes here
    /// directly: it has series of its own, not the regression state.
    pub(super) fn tell(&self, v: PairVerdict) {
        let previous = self.board.remember_verdict(&v);
        if previous != Some(v.state) {
            log_change(&v, previous);
        }
        self.notifier.verdict(&v);
    }

    /// Puts version changes and the last verdicts back on `/metrics` and
    /// the board, and tells the notifier which regressions were already
    /// announced. Blocking: called once at start.
    pub fn restore(&self, config: &Config) -> Result<(), StoreError> {
        let store = self.store.blocking();
        for t in &config.targets {
            for model in store.models_of(&t.name)? {
                let latest_upgrade = store.latest_upgrade(&t.name, &model)?;
                if let Some(c) = latest_upgrade {
                    self.metrics.server.set_version_change(&t.name, c.at);
                }
                // A restart in a rollout keeps it: the fleet and the open
                // rollout are read back from the store (by request until
                // the replicas are found again).
                let scope = self
                    .board
                    .fleet_scope(&t.name, config.verdict_policy.canary_window);
                let fleet = store.fleet(&t.name, &model, &scope)?;
                self.metrics.fleet.set_builds(&t.name, &fleet);
                self.board.set_fleet(&t.name, fleet);
                let open = store.open_rollout(&t.name, &model)?;
                self.metrics.fleet.set_in_progress(&t.name, open.is_some());
                // The last end keeps its time, so a restart is no new end.
                let last_end = store
                    .rollouts(&t.name, &model)?
                    .into_iter()
                    .filter_map(|r| r.ended_at)
                    .max();
                if let Some(at) = last_end {
                    self.metrics.fleet.set_rollout_end(&t.name, at);
                }
                self.board
                    .set_rollout(&t.name, open.map(|r| (r.from_build, r.to_build)));
            }
        }
        for v in stored_verdicts(store, config)? {
            self.board.remember_verdict(&v);
            self.metrics.verdicts.set_verdict(&v, false);
            self.notifier.restore(&v);
        }
        Ok(())
    }

    /// After a reload: the verdict series of the configured targets only,
    /// so a target removed from the configuration no longer shows (and
    /// pages on) its last verdict. Blocking (reads the store).
    pub fn redeclare(&self, config: &Config) -> Result<(), StoreError> {
        let store = self.store.blocking();
        self.metrics.verdicts.reset();
        for v in stored_verdicts(store, config)? {
            self.metrics.verdicts.set_verdict(&v, false);
        }
        Ok(())
    }

    /// The next scenario an upgrade verdict still needs a run of, if any.
    pub async fn pending_upgrade(&self, config: &Config, target: &TargetConfig) -> Option<String> {
        if !config.verdict_policy.upgrade_rounds {
            return None;
        }
        let cfg = config.verdict_policy.clone();
        let (name, model, scenarios) = (
            target.name.clone(),
            self.board
                .model_label(&target.name, target.model.as_deref()),
            target.scenarios.clone(),
        );
        self.store
            .call_or_none(move |s| pair::pending_upgrade_runs(s, &cfg, &name, &model, &scenarios))
            .await?
            .into_iter()
            .next()
    }
}

/// A regression starting or ending is news (a warning); the rest is routine.
fn log_change(v: &PairVerdict, previous: Option<State>) {
    let (target, scenario, build) = (&v.target, &v.scenario, &v.build);
    let reason = &v.reason;
    if v.state == State::Regression || previous == Some(State::Regression) {
        let slower: Vec<String> = v
            .slower()
            .iter()
            .map(|m| format!("{} {:+.1}%", m.metric, m.relative_change * 100.0))
            .collect();
        tracing::warn!(
            %target, %scenario, %build, reference = ?v.reference_build,
            state = v.state.as_str(), slower = %slower.join(", "), %reason,
            "verdict changed"
        );
    } else {
        tracing::info!(
            %target, %scenario, %build, reference = ?v.reference_build,
            state = v.state.as_str(), %reason,
            "verdict changed"
        );
    }
}

/// The newest stored verdict of each pair of a configured target.
fn stored_verdicts(
    store: &crate::store::Store,
    config: &Config,
) -> Result<Vec<PairVerdict>, StoreError> {
    let mut out = Vec::new();
    for stored in store.latest_evaluations()? {
        if config.target(&stored.key.target).is_none() {
            continue;
        }
        match serde_json::from_str::<PairVerdict>(&stored.detail) {
            Ok(v) => out.push(v),
            Err(e) => tracing::warn!(error = %e, "a stored verdict is unreadable, skipped"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Another process holds the store past SQLite's busy timeout (5 s)
    /// when a run is judged: the judgment waits it out, its evaluation is
    /// stored once and its verdict published, and nothing is counted as a
    /// store failure.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_judgment_refused_while_the_store_is_held_is_made_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = failures.clone();
        let opened = crate::store::Store::open(&path).unwrap();
        crate::verdict::filed::tests::history(&opened, "a");
        let store = AsyncStore::new(
            opened,
            Arc::new(move |_| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        );
        let board = Arc::new(TargetStates::default());
        let verdicts = Verdicts {
            store: store.clone(),
            metrics: Arc::new(Metrics::new().unwrap()),
            board: board.clone(),
            notifier: crate::notify::channel().0,
            upgrades: watch::channel(0).0,
            nondeterministic: Arc::default(),
            clock: crate::clock::Clock::System,
        };
        let config = Config::from_text(
            "[[targets]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9\"\n\
[[scenarios]]\nname = \"s\"\ninput_len = 8\noutput_len = 8\nnum_requests = 1\n",
            "the test configuration",
        )
        .unwrap();
        let (held_tx, held) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(6500));
            conn.execute_batch("COMMIT").unwrap();
        });
        held.recv().unwrap();
        let run = FiledRun {
            to_judge: vec![(crate::verdict::filed::tests::pair_of("a"), "0.32.0".into())],
            ..FiledRun::default()
        };
        verdicts.judge_filed(&config, run).await;
        holder.join().unwrap();
        let published: Vec<String> = board.verdicts().into_iter().map(|v| v.target).collect();
        assert_eq!(published, ["a"], "the verdict made once the store was free");
        let stored = store.blocking().evaluations_after(0, 10).unwrap();
        assert_eq!(stored.len(), 1, "its evaluation, once");
        assert_eq!(failures.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
