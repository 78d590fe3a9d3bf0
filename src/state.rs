//! The status board: what the daemon knows now about each target (up or
//! down, model, build, what runs, back-off, next runs) and the last verdict
//! of each pair. Workers and watchers write it; the status page and the
//! verdict API read it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::client::server_api::ServerKind;
use crate::discovery::kubernetes::ImagePods;
use crate::discovery::{Placement, Replica};
use crate::store::baselines::PairKey;
use crate::store::fleet::{FleetBuild, FleetScope};
use crate::telemetry::Identified;
use crate::verdict::State;
use crate::verdict::liveness::{Generating, LiveState};
use crate::verdict::pair::PairVerdict;
use crate::vocabulary::records::ServerIdentity;

/// The model label of a target whose model is not known yet.
const UNKNOWN_MODEL: &str = "unknown";

/// What the status page shows about one target.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TargetStatus {
    pub up: Option<bool>,
    pub model: Option<String>,
    pub identity: Option<ServerIdentity>,
    /// vllm, sglang or openai, as the server's endpoints say.
    pub kind: Option<ServerKind>,
    pub running: Option<String>,
    pub backoff_until: Option<DateTime<Utc>>,
    pub next_due: BTreeMap<String, DateTime<Utc>>,
    /// The builds serving the target, largest share first.
    pub fleet: Vec<FleetBuild>,
    /// `(from, to)` of the rollout in progress.
    pub rollout: Option<(String, String)>,
    /// The replicas found now, by label (`host:port`, or the pod's name
    /// when Kubernetes lists them); empty without replicas.
    pub replicas: BTreeMap<String, ReplicaStatus>,
    /// The ready pods per image of a Service found through Kubernetes.
    pub images: Vec<ImagePods>,
    /// Each telemetry source read (`server`, `dcgm`): `None` when its
    /// last read worked, else why it failed.
    pub telemetry: BTreeMap<String, Option<String>>,
    /// Set while the server's identity is not stable enough to name builds
    /// by, and builds are named by its stable part instead.
    pub build_identity: Option<IdentityCondition>,
    /// Runs in a row that showed no identity condition, toward clearing it.
    #[serde(skip)]
    pub stable_runs: u32,
    /// Whether the service generates (heartbeats, runs' requests).
    pub liveness: Option<LiveState>,
    /// A run's fingerprint version that `/version` did not say, and how
    /// many `/version` readings since kept saying the other one.
    #[serde(skip)]
    pub disagreement: Option<Disagreement>,
    /// Requests through the service by the endpoint the gateway named as
    /// serving them (`[targets.gateway] endpoint_header`).
    pub served_by: BTreeMap<String, EndpointTally>,
}

/// Requests a gateway attributed to one endpoint.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EndpointTally {
    pub requests: u64,
    pub ok: u64,
    pub shed: u64,
    pub last_seen: Option<DateTime<Utc>>,
}

/// The most endpoints kept per target; requests attributed to others are
/// counted under [`OTHER_ENDPOINTS`] (a header a gateway fills with
/// anything must not grow the board or the series without bound).
pub const MAX_ENDPOINTS: usize = 64;
pub const OTHER_ENDPOINTS: &str = "other";

/// A disagreement between `/version` and the runs' fingerprints, not yet a
/// condition: a real upgrade's first run may see the new fingerprint
/// before the watcher reads the new `/version`, and through a balancer in
/// a rollout the two come from different replicas. Only when `/version`
/// goes on saying the same other version is it one.
#[derive(Debug, Clone, Default)]
pub struct Disagreement {
    pub watched: String,
    pub fingerprint: String,
    pub readings_since: u32,
}

/// `/version` readings that must keep disagreeing with the runs'
/// fingerprints before that is named a condition.
pub const DISAGREEING_READINGS: u32 = 2;

/// Why a target's builds are named by a stable identity instead of what
/// its server says.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum IdentityCondition {
    /// `system_fingerprint` is new on nearly every request, or more builds
    /// appeared in an hour than the detector allows.
    FingerprintChurn,
    /// `/version` names another version than the stream's fingerprints
    /// (a half-finished image change, or a proxy in front).
    VersionDisagrees {
        version: String,
        fingerprint_version: String,
    },
}

impl IdentityCondition {
    /// The `reason` label of `sentinel_build_identity_unstable`.
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityCondition::FingerprintChurn => "fingerprint_churn",
            IdentityCondition::VersionDisagrees { .. } => "version_disagrees",
        }
    }

    /// For the log and the status page.
    pub fn sentence(&self) -> String {
        match self {
            IdentityCondition::FingerprintChurn => "system_fingerprint changes on nearly every request: builds are named by version and model, not fingerprint".into(),
            IdentityCondition::VersionDisagrees { version, fingerprint_version } => format!(
                "/version says {version} but the stream's fingerprints say {fingerprint_version}: builds are named by the fingerprints"
            ),
        }
    }
}

/// What the status page shows about one replica.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReplicaStatus {
    /// The build its last successful run found.
    pub build: Option<String>,
    pub last_outcome: Option<String>,
    pub last_run_at: Option<DateTime<Utc>>,
    pub backoff_until: Option<DateTime<Utc>>,
    /// Whether the replica generates (heartbeats, runs' requests).
    pub liveness: Option<LiveState>,
    /// Its pod's address, node, zone and image, when Kubernetes lists it.
    pub pod: Option<Placement>,
}

#[derive(Default)]
pub struct TargetStates {
    targets: Mutex<BTreeMap<String, TargetStatus>>,
    verdicts: Mutex<HashMap<PairKey, PairVerdict>>,
}

impl TargetStates {
    fn with_target(&self, target: &str, f: impl FnOnce(&mut TargetStatus)) {
        let mut map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(target.to_owned()).or_default());
    }

    pub fn targets(&self) -> BTreeMap<String, TargetStatus> {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forgets targets no longer configured, and their verdicts (the
    /// status page shows what is watched now; the store keeps history).
    pub fn keep_targets(&self, names: &[String]) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| names.contains(k));
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| names.contains(&k.target));
    }

    /// Forgets one target no longer configured, and its verdicts.
    pub fn forget_target(&self, name: &str) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| k.target != name);
    }

    pub fn set_next_due(&self, target: &str, due: Vec<(String, DateTime<Utc>)>) {
        self.with_target(target, |s| s.next_due = due.into_iter().collect());
    }

    pub fn set_running(&self, target: &str, scenario: Option<&str>) {
        self.with_target(target, |s| s.running = scenario.map(str::to_owned));
    }

    pub fn set_backoff(&self, target: &str, until: Option<DateTime<Utc>>) {
        self.with_target(target, |s| s.backoff_until = until);
    }

    pub fn set_up(&self, target: &str, up: bool) {
        self.with_target(target, |s| s.up = Some(up));
    }

    pub fn set_identity(&self, target: &str, server: &Identified) {
        self.with_target(target, |s| {
            s.model = Some(server.model.clone());
            s.kind = Some(server.kind);
            s.identity = Some(server.identity.clone());
            // A reading that says another version than the disagreement's
            // ends it; one that says the same counts toward it.
            let same = s
                .disagreement
                .as_ref()
                .is_some_and(|d| server.identity.version.as_deref() == Some(d.watched.as_str()));
            match (&mut s.disagreement, same) {
                (Some(d), true) => d.readings_since += 1,
                _ => s.disagreement = None,
            }
        });
    }

    /// What a run's fingerprint version says against `/version`: `Some`
    /// (the `/version` and the fingerprint's) once the disagreement has
    /// lasted [`DISAGREEING_READINGS`] readings; a run that agrees ends it.
    pub fn version_disagreement(
        &self,
        target: &str,
        fingerprint: &str,
    ) -> Option<(String, String)> {
        let mut out = None;
        self.with_target(target, |s| {
            let Some(watched) = s.identity.as_ref().and_then(|i| i.version.clone()) else {
                return;
            };
            if watched == fingerprint {
                s.disagreement = None;
                return;
            }
            match &s.disagreement {
                Some(d) if d.watched == watched && d.fingerprint == fingerprint => {
                    if d.readings_since >= DISAGREEING_READINGS {
                        out = Some((watched, fingerprint.to_owned()));
                    }
                }
                _ => {
                    s.disagreement = Some(Disagreement {
                        watched,
                        fingerprint: fingerprint.to_owned(),
                        readings_since: 0,
                    })
                }
            }
        });
        out
    }

    /// Whether the target's service (`replica` `None`) or one replica
    /// generates, as last seen.
    /// A service's liveness (`replica` None) or a replica's. A service not
    /// generating is attributed to the replicas not generating now,
    /// whichever of the two was seen first.
    pub fn set_liveness(&self, target: &str, replica: Option<&str>, state: &LiveState) {
        self.with_target(target, |s| {
            match replica {
                None => s.liveness = Some(state.clone()),
                // Only replicas still listed: a late heartbeat of a replica
                // gone must not bring its line back.
                Some(r) => {
                    if let Some(line) = s.replicas.get_mut(r) {
                        line.liveness = Some(state.clone());
                    }
                }
            }
            let culprits = not_generating(s);
            if let Some(service) = s
                .liveness
                .as_mut()
                .filter(|l| l.state == Some(Generating::NotGenerating))
            {
                service.attributed_to = culprits;
            }
        });
    }

    /// The target's replicas last seen not generating.
    /// How many replicas of `target` are known (found by discovery).
    pub fn replica_count(&self, target: &str) -> usize {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.get(target).map_or(0, |s| s.replicas.len())
    }

    pub fn replicas_not_generating(&self, target: &str) -> Vec<String> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.get(target).map(not_generating).unwrap_or_default()
    }

    /// The target's identity condition now.
    pub fn identity_condition(&self, target: &str) -> Option<IdentityCondition> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.get(target).and_then(|s| s.build_identity.clone())
    }

    /// What a run showed of the target's identity: `Some` a condition
    /// (kept, or replacing another), `None` a stable identity. A condition
    /// clears after `clear_after` stable runs in a row. Returns the
    /// condition before and after, when they differ.
    pub fn note_identity(
        &self,
        target: &str,
        seen: Option<IdentityCondition>,
        clear_after: u32,
    ) -> Option<(Option<IdentityCondition>, Option<IdentityCondition>)> {
        let mut change = None;
        self.with_target(target, |s| {
            let before = s.build_identity.clone();
            match seen {
                Some(c) => {
                    s.stable_runs = 0;
                    // A churning fingerprint outranks a disagreeing one: it
                    // names no build at all.
                    if before.as_ref().is_none_or(|b| {
                        *b != IdentityCondition::FingerprintChurn
                            || c == IdentityCondition::FingerprintChurn
                    }) {
                        s.build_identity = Some(c);
                    }
                }
                None if before.is_some() => {
                    s.stable_runs += 1;
                    if s.stable_runs >= clear_after {
                        s.build_identity = None;
                        s.stable_runs = 0;
                    }
                }
                None => {}
            }
            if s.build_identity != before {
                change = Some((before, s.build_identity.clone()));
            }
        });
        change
    }

    pub fn set_fleet(&self, target: &str, fleet: Vec<FleetBuild>) {
        self.with_target(target, |s| s.fleet = fleet);
    }

    /// `(from, to)` of the target's rollout in progress.
    pub fn rollout(&self, target: &str) -> Option<(String, String)> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.get(target).and_then(|s| s.rollout.clone())
    }

    /// The builds serving the target, largest share first.
    pub fn fleet(&self, target: &str) -> Vec<FleetBuild> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.get(target).map(|s| s.fleet.clone()).unwrap_or_default()
    }

    /// The builds the target is known to serve: those of its fleet, and
    /// the version its watcher last read.
    pub fn known_builds(&self, target: &str) -> Vec<String> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = map.get(target) else {
            return Vec::new();
        };
        let watched = s.identity.as_ref().and_then(|i| i.version.clone());
        s.fleet
            .iter()
            .map(|b| b.build.clone())
            .chain(watched)
            .collect()
    }

    /// The replicas found now; those kept keep what is known of them.
    pub fn set_replicas(&self, target: &str, replicas: &[Replica]) {
        self.with_target(target, |s| {
            s.replicas
                .retain(|l, _| replicas.iter().any(|r| &r.label == l));
            for r in replicas {
                s.replicas.entry(r.label.clone()).or_default().pod = r.placement.clone();
            }
        });
    }

    /// The ready pods per image, as the Kubernetes API lists them.
    pub fn set_images(&self, target: &str, images: Vec<ImagePods>) {
        self.with_target(target, |s| s.images = images);
    }

    /// The image every ready pod of the target runs, `(image, digest)`,
    /// when they all run one: what a run through the Service ran. `None`
    /// without Kubernetes, or while the pods run several images (a run
    /// cannot tell which of them served it).
    pub fn service_image(&self, target: &str) -> Option<(String, String)> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(target)?.images.as_slice() {
            [only] => Some((only.image.clone(), only.digest.clone())),
            _ => None,
        }
    }

    /// What the target's fleet is computed over: with replicas found, each
    /// replica's build (a share is replicas per build), else the service's
    /// last `window` rounds (a share is requests per build).
    pub fn fleet_scope(&self, target: &str, window: usize) -> FleetScope {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        FleetScope {
            window,
            replicas: map
                .get(target)
                .map(|s| s.replicas.keys().cloned().collect())
                .unwrap_or_default(),
            new_builds_per_hour: None,
            rollout_timeout: None,
        }
    }

    /// A replica's run ended; `build` when it reached the server. Returns
    /// the build the replica served before, if another.
    pub fn set_replica_run(
        &self,
        target: &str,
        replica: &str,
        build: Option<&str>,
        outcome: &str,
        at: DateTime<Utc>,
    ) -> Option<String> {
        let mut previous = None;
        self.with_target(target, |s| {
            if let Some(r) = s.replicas.get_mut(replica) {
                if let Some(build) = build {
                    previous = r.build.replace(build.to_owned()).filter(|p| p != build);
                }
                r.last_outcome = Some(outcome.to_owned());
                r.last_run_at = Some(at);
            }
        });
        previous
    }

    /// Counts requests the gateway attributed to endpoints, as
    /// `(endpoint, outcome)`; returns the label each was counted under.
    pub fn note_served<'a>(
        &self,
        target: &str,
        served: impl IntoIterator<Item = (&'a str, crate::vocabulary::Outcome)>,
        at: DateTime<Utc>,
    ) -> Vec<(String, crate::vocabulary::Outcome)> {
        let mut labels = Vec::new();
        self.with_target(target, |s| {
            for (endpoint, outcome) in served {
                let known = s.served_by.contains_key(endpoint);
                let label = if known || s.served_by.len() < MAX_ENDPOINTS {
                    endpoint
                } else {
                    OTHER_ENDPOINTS
                };
                let tally = s.served_by.entry(label.to_owned()).or_default();
                tally.requests += 1;
                tally.ok += u64::from(outcome.is_ok());
                tally.shed += u64::from(outcome == crate::vocabulary::Outcome::Shed);
                tally.last_seen = Some(at);
                labels.push((label.to_owned(), outcome));
            }
        });
        labels
    }

    pub fn set_replica_backoff(&self, target: &str, replica: &str, until: Option<DateTime<Utc>>) {
        self.with_target(target, |s| {
            if let Some(r) = s.replicas.get_mut(replica) {
                r.backoff_until = until;
            }
        });
    }

    /// Notes how a telemetry source's last read went (`None`: it worked);
    /// returns how the one before went, `None` for the first.
    pub fn set_telemetry(
        &self,
        target: &str,
        source: &str,
        failure: Option<String>,
    ) -> Option<Option<String>> {
        let mut before = None;
        self.with_target(target, |s| {
            before = s.telemetry.insert(source.to_owned(), failure);
        });
        before
    }

    /// Forgets the telemetry sources no longer configured (a reload took
    /// them away), so the page shows no reason of a source not read.
    pub fn keep_telemetry(&self, target: &str, sources: &[&str]) {
        self.with_target(target, |s| {
            s.telemetry
                .retain(|source, _| sources.contains(&source.as_str()))
        });
    }

    pub fn set_rollout(&self, target: &str, rollout: Option<(String, String)>) {
        self.with_target(target, |s| s.rollout = rollout);
    }

    /// Notes the model a run saw, unless the watcher already knows one.
    pub fn remember_model(&self, target: &str, model: &str) {
        self.with_target(target, |s| {
            if s.model.is_none() {
                s.model = Some(model.to_owned());
            }
        });
    }

    /// The model label for runs that never learnt the model: the last one
    /// seen, else the configured one, else "unknown".
    pub fn model_label(&self, target: &str, configured: Option<&str>) -> String {
        self.known_model(target, configured)
            .unwrap_or_else(|| UNKNOWN_MODEL.to_owned())
    }

    /// The model the target was last seen serving, else the configured
    /// one; None before either is known.
    pub fn known_model(&self, target: &str, configured: Option<&str>) -> Option<String> {
        let map = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        map.get(target)
            .and_then(|s| s.model.clone())
            .or_else(|| configured.map(str::to_owned))
    }

    /// Records a pair's verdict; returns the state before.
    pub fn remember_verdict(&self, v: &PairVerdict) -> Option<State> {
        self.verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(v.key(), v.clone())
            .map(|old| old.state)
    }

    /// The last verdict of every pair, sorted by target and scenario.
    pub fn verdicts(&self) -> Vec<PairVerdict> {
        let mut all: Vec<PairVerdict> = self
            .verdicts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.target, &a.scenario).cmp(&(&b.target, &b.scenario)));
        all
    }
}

/// The replicas of a target found not generating.
fn not_generating(target: &TargetStatus) -> Vec<String> {
    target
        .replicas
        .iter()
        .filter(|(_, r)| {
            r.liveness.as_ref().and_then(|l| l.state) == Some(Generating::NotGenerating)
        })
        .map(|(label, _)| label.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::TargetStates;

    #[test]
    fn telemetry_sources_say_how_they_went_and_unconfigured_ones_go() {
        let board = TargetStates::default();
        assert_eq!(board.set_telemetry("t", "server", None), None);
        let before = board.set_telemetry("t", "server", Some("HTTP 503".into()));
        assert_eq!(before, Some(None));
        board.set_telemetry("t", "dcgm", Some("refused".into()));
        board.keep_telemetry("t", &["server"]);
        let sources = board.targets()["t"].telemetry.clone();
        assert_eq!(sources.len(), 1);
        assert_eq!(sources["server"].as_deref(), Some("HTTP 503"));
    }
}
