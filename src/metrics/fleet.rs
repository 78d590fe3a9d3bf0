//! Fleets: the builds serving each target with their shares, build changes
//! (rollouts started), rollouts in progress and when the last one ended,
//! for dashboards' build panels and annotations.

use chrono::{DateTime, Utc};

use super::MetricsError;
use super::page::{Counters, Gauges, Page};
use crate::store::fleet::FleetBuild;

pub struct FleetMetrics {
    builds: Gauges,
    build_images: Gauges,
    image_pods: Gauges,
    changes_total: Counters,
    in_progress: Gauges,
    ended_ts: Gauges,
    replicas: Gauges,
    dropped: Gauges,
    discovery_failures: Counters,
}

impl FleetMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        Ok(FleetMetrics {
            builds: page.gauges(
                "sentinel_fleet_builds",
                "Share of the target served by each build: replicas per build, or requests per build over the last rounds through the service.",
                &["target", "build"],
            )?,
            build_images: page.gauges(
                "sentinel_build_image_info",
                "1 for each build serving the target that runs a known image: its reference and digest (from Kubernetes, or the digest a build header named).",
                &["target", "build", "image", "digest"],
            )?,
            image_pods: page.gauges(
                "sentinel_fleet_image_pods",
                "Ready pods of the target's Service running each image, as the Kubernetes API lists them.",
                &["target", "image", "digest"],
            )?,
            changes_total: page.counters(
                "sentinel_build_changes_total",
                "Builds first seen serving the target (a rollout started).",
                &["target"],
            )?,
            in_progress: page.gauges(
                "sentinel_rollout_in_progress",
                "1 while two builds serve the target in a rollout.",
                &["target"],
            )?,
            ended_ts: page.gauges(
                "sentinel_rollout_end_timestamp_seconds",
                "When the target's last rollout ended (its old build gone, or the new one abandoned); 0 before the first.",
                &["target"],
            )?,
            replicas: page.gauges(
                "sentinel_replicas",
                "Replicas of the target found by its last successful discovery read.",
                &["target"],
            )?,
            dropped: page.gauges(
                "sentinel_replicas_dropped",
                "Entries of the target's last successful discovery read not probed: replicas beyond max_replicas (over_limit), or entries that are not host:port addresses (invalid).",
                &["target", "reason"],
            )?,
            discovery_failures: page.counters(
                "sentinel_replica_discovery_failures_total",
                "Failed reads or watches of the target's replica list (Kubernetes, DNS or file_sd); the last list is kept.",
                &["target"],
            )?,
        })
    }

    /// The replicas found by the last successful read, and the entries
    /// it listed that are not probed: beyond the cap, or invalid.
    pub fn set_replicas(&self, target: &str, count: usize, over_limit: usize, invalid: usize) {
        self.replicas.set(&[target], count as f64);
        self.dropped.set(&[target, "over_limit"], over_limit as f64);
        self.dropped.set(&[target, "invalid"], invalid as f64);
    }

    /// A failed read of the replica list.
    pub fn discovery_failed(&self, target: &str) {
        self.discovery_failures.inc(&[target]);
    }

    /// Creates the target's series; `in_progress` is what the daemon
    /// knows (a reload in a rollout keeps it).
    pub fn declare(&self, target: &str, in_progress: bool) {
        self.changes_total.declare(&[target]);
        // 0 until a rollout ends, so its first end is a change the
        // dashboards' annotations see.
        self.ended_ts.declare(&[target]);
        self.set_in_progress(target, in_progress);
    }

    /// The builds serving the target now.
    pub fn set_builds(&self, target: &str, fleet: &[FleetBuild]) {
        let labels: Vec<[&str; 2]> = fleet.iter().map(|b| [target, &b.build]).collect();
        let rows: Vec<(&[&str], f64)> = labels
            .iter()
            .zip(fleet)
            .map(|(l, b)| (&l[..], b.share))
            .collect();
        self.builds.replace_target(target, &rows);
        let images: Vec<[&str; 4]> = fleet
            .iter()
            .filter_map(|b| {
                let digest = b.image_digest.as_deref()?;
                Some([target, &b.build, b.image.as_deref().unwrap_or(""), digest])
            })
            .collect();
        let rows: Vec<(&[&str], f64)> = images.iter().map(|l| (&l[..], 1.0)).collect();
        self.build_images.replace_target(target, &rows);
    }

    /// The ready pods per image, as the API lists them: `(image,
    /// digest, pods)`.
    pub fn set_image_pods(&self, target: &str, images: &[(String, String, usize)]) {
        let labels: Vec<[&str; 3]> = images
            .iter()
            .map(|(image, digest, _)| [target, image.as_str(), digest.as_str()])
            .collect();
        let rows: Vec<(&[&str], f64)> = labels
            .iter()
            .zip(images)
            .map(|(l, (_, _, pods))| (&l[..], *pods as f64))
            .collect();
        self.image_pods.replace_target(target, &rows);
    }

    /// A build first seen serving the target.
    pub fn rollout_started(&self, target: &str) {
        self.changes_total.inc(&[target]);
        self.in_progress.set(&[target], 1.0);
    }

    /// Whether a rollout is in progress (also restored after a restart).
    pub fn set_in_progress(&self, target: &str, in_progress: bool) {
        self.in_progress
            .set(&[target], if in_progress { 1.0 } else { 0.0 });
    }

    pub fn rollout_ended(&self, target: &str, at: DateTime<Utc>) {
        self.in_progress.set(&[target], 0.0);
        self.set_rollout_end(target, at);
    }

    /// When the last rollout ended (also restored after a restart).
    pub fn set_rollout_end(&self, target: &str, at: DateTime<Utc>) {
        self.ended_ts
            .set(&[target], at.timestamp_millis() as f64 / 1000.0);
    }
}
