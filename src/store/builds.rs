//! Server builds and version changes. A build is what a target served at
//! one time: `/version`, the model's `root`, the `system_fingerprint` and
//! the image (its digest, from Kubernetes or a build header). Each build
//! gets a readable label (the version, with `+2`, `+3` when the same
//! version comes back with different weights, fingerprint or image), and
//! a change of build is recorded as an event with its time.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::fleet::FleetScope;
use super::{Store, StoreError, from_ts, ts};
use crate::vocabulary::records::ServerIdentity;

/// One row of a target's version history.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VersionChange {
    pub at: DateTime<Utc>,
    /// `None` the first time the target was seen.
    pub from_build: Option<String>,
    pub to_build: String,
}

/// The build an identity belongs to, the change it caused if any, and,
/// for a stored run, the fleet after it and the rollout it ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observed {
    pub build: String,
    pub change: Option<VersionChange>,
    pub fleet: Vec<super::fleet::FleetBuild>,
    pub rollout_ended: Option<super::fleet::Rollout>,
    /// The identity would have been a new build, but the target already
    /// filed its bound of new builds in the last hour.
    pub limited: bool,
}

/// The target's current build: where its latest change led.
pub fn current(conn: &Connection, target: &str, model: &str) -> Result<Option<String>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT to_build FROM version_changes WHERE target = ?1 AND model = ?2
             ORDER BY id DESC LIMIT 1",
            params![target, model],
            |r| r.get(0),
        )
        .optional()?)
}

/// How an identity's image narrows the builds it can be: a build of
/// another image is another build, and a build filed before its image was
/// known (no digest yet) learns it.
fn image_condition(identity: &ServerIdentity) -> &'static str {
    match identity.image_digest {
        Some(_) => "AND (image_digest IS ?9 OR image_digest IS NULL)",
        // An identity that does not know its image (a run through the
        // Service while the pods run several) is any image's.
        None => "AND ?9 IS NULL",
    }
}

/// The build already filed with this fingerprint (and image), if any.
fn with_fingerprint(
    conn: &Connection,
    target: &str,
    model: &str,
    fingerprint: &str,
    identity: &ServerIdentity,
    serving: &[String],
) -> Result<Option<String>, StoreError> {
    if identity.image_digest.is_none() {
        // Several images of one fingerprint serve (a rollout seen through
        // the Service): a run that cannot tell which served it goes with
        // the build that served first, so the new image's baseline holds
        // only its own runs.
        let mut stmt = conn.prepare(
            "SELECT label FROM builds WHERE target = ?1 AND model = ?2
             AND system_fingerprint = ?3 ORDER BY first_seen LIMIT 64",
        )?;
        let labels: Vec<String> = stmt
            .query_map(params![target, model, fingerprint], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        if let Some(label) = labels.iter().find(|l| serving.contains(l)) {
            return Ok(Some(label.clone()));
        }
    }
    // A build of this very image first, else one that does not know its
    // image yet.
    Ok(conn
        .query_row(
            &format!(
                "SELECT label FROM builds WHERE target = ?1 AND model = ?2
                 AND system_fingerprint = ?3 {}
                 ORDER BY image_digest IS NULL, first_seen DESC LIMIT 1",
                image_condition(identity).replace("?9", "?4")
            ),
            params![target, model, fingerprint, identity.image_digest],
            |r| r.get(0),
        )
        .optional()?)
}

/// A build filed with the identity's version, model root and image (with
/// `unfingerprinted`, only one that has no fingerprint yet): the current
/// build if it is one, else the newest. Index reads only, however many
/// builds of that version are stored.
fn same_build(
    conn: &Connection,
    target: &str,
    model: &str,
    identity: &ServerIdentity,
    current: Option<&str>,
    unfingerprinted: bool,
) -> Result<Option<String>, StoreError> {
    let fingerprint = if unfingerprinted {
        "AND system_fingerprint IS NULL"
    } else {
        ""
    };
    let image = image_condition(identity);
    if let Some(current) = current {
        let is_current: Option<i64> = conn
            .query_row(
                &format!(
                    "SELECT 1 FROM builds WHERE target = ?1 AND model = ?2 AND label = ?5
                     AND server_version IS ?3 AND model_root IS ?4 {fingerprint}
                     {}",
                    image.replace("?9", "?6")
                ),
                params![
                    target,
                    model,
                    identity.version,
                    identity.model_root,
                    current,
                    identity.image_digest
                ],
                |r| r.get(0),
            )
            .optional()?;
        if is_current.is_some() {
            return Ok(Some(current.to_owned()));
        }
    }
    Ok(conn
        .query_row(
            &format!(
                "SELECT label FROM builds WHERE target = ?1 AND model = ?2
                 AND server_version IS ?3 AND model_root IS ?4 {fingerprint}
                 {}
                 ORDER BY first_seen DESC LIMIT 1",
                image.replace("?9", "?5")
            ),
            params![
                target,
                model,
                identity.version,
                identity.model_root,
                identity.image_digest
            ],
            |r| r.get(0),
        )
        .optional()?)
}

/// A build found for an identity learns what it did not know yet: the
/// fingerprint (a build the watcher filed), the image (a build filed
/// before Kubernetes or the build header named it).
fn learn(
    conn: &Connection,
    target: &str,
    model: &str,
    label: &str,
    identity: &ServerIdentity,
) -> Result<(), StoreError> {
    if identity.system_fingerprint.is_none() && identity.image_digest.is_none() {
        return Ok(());
    }
    conn.execute(
        "UPDATE builds SET system_fingerprint = COALESCE(system_fingerprint, ?4),
            image = COALESCE(image, ?5), image_digest = COALESCE(image_digest, ?6)
         WHERE target = ?1 AND model = ?2 AND label = ?3
           AND (system_fingerprint IS NULL OR image_digest IS NULL)",
        params![
            target,
            model,
            label,
            identity.system_fingerprint,
            identity
                .image
                .as_deref()
                .filter(|_| identity.image_digest.is_some()),
            identity.image_digest
        ],
    )?;
    Ok(())
}

/// What an identity resolves to.
enum Resolved {
    Build(String),
    /// A new build, refused: the target filed its bound of new builds in
    /// the last hour.
    Limited,
}

fn resolve(
    conn: &Connection,
    target: &str,
    model: &str,
    identity: &ServerIdentity,
    at: DateTime<Utc>,
    (current, serving): (Option<&str>, &[String]),
    scope: &FleetScope,
) -> Result<Resolved, StoreError> {
    // The fingerprint names a build whatever `/version` said: through a
    // load balancer that may have come from another replica.
    let found = match &identity.system_fingerprint {
        Some(fp) => match with_fingerprint(conn, target, model, fp, identity, serving)? {
            Some(label) => Some(label),
            // A build first seen by the watcher (which sees no
            // fingerprint) learns it from the first run.
            None => same_build(conn, target, model, identity, current, true)?,
        },
        None => same_build(conn, target, model, identity, current, false)?,
    };
    if let Some(label) = found {
        learn(conn, target, model, &label, identity)?;
        return Ok(Resolved::Build(label));
    }
    if let Some(per_hour) = scope.new_builds_per_hour
        && first_seen_since(conn, target, model, at - chrono::Duration::hours(1))? >= per_hour
    {
        return Ok(Resolved::Limited);
    }
    file_new(conn, target, model, identity, at).map(Resolved::Build)
}

/// The labels that start with a version: a range of the label index.
pub(super) const LABELS_OF_VERSION: &str =
    "SELECT label FROM builds WHERE target = ?1 AND model = ?2
         AND label >= ?3 AND label < ?4";

/// The label a new build of version `base` gets: `base`, else `base+N`
/// with N one past the highest taken. One range read of the label index,
/// however many builds of that version are stored.
fn free_label(
    conn: &Connection,
    target: &str,
    model: &str,
    base: &str,
) -> Result<String, StoreError> {
    let mut stmt = conn.prepare(LABELS_OF_VERSION)?;
    // Every label starting with `base` sorts in [base, base + U+10FFFF).
    let labels = stmt.query_map(
        params![target, model, base, format!("{base}\u{10FFFF}")],
        |r| r.get::<_, String>(0),
    )?;
    let mut base_taken = false;
    let mut highest = 1u64;
    for label in labels {
        let label = label?;
        match label.strip_prefix(base) {
            Some("") => base_taken = true,
            Some(rest) => {
                if let Some(n) = rest.strip_prefix('+').and_then(|n| n.parse::<u64>().ok()) {
                    highest = highest.max(n);
                }
            }
            None => {}
        }
    }
    Ok(if base_taken {
        format!("{base}+{}", highest + 1)
    } else {
        base.to_owned()
    })
}

/// Builds of a target first seen since `since`.
fn first_seen_since(
    conn: &Connection,
    target: &str,
    model: &str,
    since: DateTime<Utc>,
) -> Result<u32, StoreError> {
    let n: i64 = conn.query_row(
        "SELECT COUNT(*) FROM builds WHERE target = ?1 AND model = ?2 AND first_seen >= ?3",
        params![target, model, ts(since)],
        |r| r.get(0),
    )?;
    Ok(n.clamp(0, u32::MAX as i64) as u32)
}

/// Files a build first seen: labelled by its version, `+2`, `+3` when
/// that label is taken. Its image is kept only with a digest: a
/// reference alone (a tag) does not say what the image is.
fn file_new(
    conn: &Connection,
    target: &str,
    model: &str,
    identity: &ServerIdentity,
    at: DateTime<Utc>,
) -> Result<String, StoreError> {
    let base = identity.version.clone().unwrap_or_else(|| "unknown".into());
    let label = free_label(conn, target, model, &base)?;
    conn.execute(
        "INSERT INTO builds (target, model, label, server_version, model_root,
            system_fingerprint, first_seen, image, image_digest)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            target,
            model,
            label,
            identity.version,
            identity.model_root,
            identity.system_fingerprint,
            ts(at),
            identity
                .image
                .as_deref()
                .filter(|_| identity.image_digest.is_some()),
            identity.image_digest
        ],
    )?;
    Ok(label)
}

/// Files an identity under its build. A build the fleet is not already
/// serving (within `scope`, besides the current build) is a change of build:
/// recorded with its time, and, when another build served before, the
/// start of a rollout from it.
pub fn observe(
    conn: &Connection,
    target: &str,
    model: &str,
    identity: &ServerIdentity,
    at: DateTime<Utc>,
    scope: &FleetScope,
) -> Result<Observed, StoreError> {
    let serving = super::fleet::serving_names(conn, target, model, scope)?;
    let current = current(conn, target, model)?;
    let known = (current.as_deref(), serving.as_slice());
    let build = match resolve(conn, target, model, identity, at, known, scope)? {
        Resolved::Build(build) => build,
        Resolved::Limited => {
            // Filed under the build the target serves now; the caller
            // names the condition.
            return Ok(Observed {
                build: current.unwrap_or_else(|| "unknown".into()),
                limited: true,
                ..Observed::default()
            });
        }
    };
    if current.as_deref() == Some(build.as_str()) || serving.contains(&build) {
        return Ok(Observed {
            build,
            ..Observed::default()
        });
    }
    conn.execute(
        "INSERT INTO version_changes (target, model, at, from_build, to_build)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![target, model, ts(at), current, build],
    )?;
    if let Some(from) = &current {
        super::fleet::start_rollout(conn, target, model, from, &build, at)?;
    }
    Ok(Observed {
        change: Some(VersionChange {
            at,
            from_build: current,
            to_build: build.clone(),
        }),
        build,
        ..Observed::default()
    })
}

/// Where a build was last named among a target's version changes: the
/// change's id, and 1 for a change to the build (0 for one away), so that
/// within one change the build changed to is the newer. Ids are the order
/// the changes were filed in, which is the target's history: their times
/// need not be (a run filed after it ends dates its change by its start).
pub(super) type Named = (i64, u8);

/// Where `build` was last named among the target's version changes; each
/// half is one step down an index (`version_changes_to_in_order`,
/// `version_changes_from_in_order`), however long the history.
pub(super) fn last_named(
    conn: &Connection,
    target: &str,
    model: &str,
    build: &str,
) -> Result<Option<Named>, StoreError> {
    let mut newest: Option<Named> = None;
    for (column, role) in [("to_build", 1), ("from_build", 0)] {
        let id: Option<i64> = conn
            .query_row(
                &last_named_sql(column),
                params![target, model, build],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = id
            && newest.is_none_or(|n| n < (id, role))
        {
            newest = Some((id, role));
        }
    }
    Ok(newest)
}

/// The newest change naming a build in `column` (`to_build` or
/// `from_build`), on parameters target, model, build.
pub(super) fn last_named_sql(column: &str) -> String {
    format!(
        "SELECT id FROM version_changes WHERE target = ?1 AND model = ?2 AND {column} = ?3
         ORDER BY id DESC LIMIT 1"
    )
}

impl Store {
    /// Files what the server says it is; see [`observe`].
    pub fn observe_identity(
        &self,
        target: &str,
        model: &str,
        identity: &ServerIdentity,
        at: DateTime<Utc>,
        scope: &FleetScope,
    ) -> Result<Observed, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let observed = observe(&tx, target, model, identity, at, scope)?;
        tx.commit()?;
        Ok(observed)
    }

    pub fn current_build(&self, target: &str, model: &str) -> Result<Option<String>, StoreError> {
        current(&self.lock(), target, model)
    }

    /// The target's version history, newest first.
    pub fn version_changes(
        &self,
        target: &str,
        model: &str,
    ) -> Result<Vec<VersionChange>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT at, from_build, to_build FROM version_changes
             WHERE target = ?1 AND model = ?2 ORDER BY id DESC",
        )?;
        let rows = stmt.query_map(params![target, model], |r| {
            Ok(VersionChange {
                at: from_ts(r.get(0)?),
                from_build: r.get(1)?,
                to_build: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The target's latest version change, if it ever had one.
    pub fn latest_version_change(
        &self,
        target: &str,
        model: &str,
    ) -> Result<Option<VersionChange>, StoreError> {
        self.latest_change(target, model, "")
    }

    /// The target's latest change from one build to another (a rollout
    /// started), if it ever had one.
    pub fn latest_upgrade(
        &self,
        target: &str,
        model: &str,
    ) -> Result<Option<VersionChange>, StoreError> {
        self.latest_change(target, model, "AND from_build IS NOT NULL")
    }

    /// The newest version change matching `condition` (SQL, a constant).
    fn latest_change(
        &self,
        target: &str,
        model: &str,
        condition: &str,
    ) -> Result<Option<VersionChange>, StoreError> {
        Ok(self
            .lock()
            .query_row(
                &format!(
                    "SELECT at, from_build, to_build FROM version_changes
                     WHERE target = ?1 AND model = ?2 {condition} ORDER BY id DESC LIMIT 1"
                ),
                params![target, model],
                |r| {
                    Ok(VersionChange {
                        at: from_ts(r.get(0)?),
                        from_build: r.get(1)?,
                        to_build: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// The scenarios a target has runs of.
    pub fn scenarios_of(&self, target: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare("SELECT DISTINCT scenario FROM runs WHERE target = ?1 ORDER BY scenario")?;
        let rows = stmt.query_map([target], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The builds of one target and model that have completed runs.
    pub fn builds_with_runs(&self, target: &str, model: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT DISTINCT build FROM runs WHERE target = ?1 AND model = ?2 AND outcome = 'ok'
             ORDER BY build",
        )?;
        let rows = stmt.query_map([target, model], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The models a target has been probed with, for commands that are
    /// given only the target.
    pub fn models_of(&self, target: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT model FROM version_changes WHERE target = ?1
             GROUP BY model ORDER BY MAX(id) DESC",
        )?;
        let rows = stmt.query_map([target], |r| r.get(0))?;
        let models: Vec<String> = rows.collect::<Result<_, _>>()?;
        if !models.is_empty() {
            return Ok(models);
        }
        // A store from before version changes were kept (migrated with
        // none): the models its runs name, newest first.
        let mut stmt = conn.prepare(
            "SELECT model FROM runs WHERE target = ?1
             GROUP BY model ORDER BY MAX(started_at) DESC",
        )?;
        let rows = stmt.query_map([target], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
