//! Targets that end without a rollout of their own: `already_current` (the replica already
//! runs what the release would deploy) and `not_started` (the release ended first).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::{corrupt, event};
use crate::domain::release::{ReleaseEventKind, TargetOutcome, SYSTEM_ACTOR};
use crate::store::rollout::NewRollout;
use crate::store::write::Tx;
use crate::store::{Store, StoreError};

/// The replica's newest recorded deployment, as far as "already current" cares.
#[derive(sqlx::FromRow)]
struct Recorded {
    file: String,
    tag: String,
    env_overrides: String,
    env_sha256: Option<String>,
    deployed_as: Option<String>,
    rollout_id: Option<String>,
}

/// The rollout that recorded the replica's current deployment, when that deployment is what
/// `want` would deploy (file, tag, env overrides, merged env hash, under the slot's own
/// name) and no rollout of the replica has touched it since, nor runs now. A baseline (read
/// from the host, without an env hash) is never current.
async fn current_deployment(db: &mut Tx, want: &NewRollout) -> Result<Option<String>, StoreError> {
    if want.deploy_as.is_some() || want.replaces.is_some() {
        return Ok(None);
    }
    let recorded: Option<Recorded> = db
        .query(
            "select file, tag, env_overrides, env_sha256, deployed_as, rollout_id from deployment \
         where host = ? and service = ? order by deployed_at desc, deployment_id desc limit 1",
        )
        .bind(&want.host)
        .bind(want.service.as_str())
        .fetch_optional()
        .await?;
    let Some(d) = recorded else { return Ok(None) };
    let Some(deployed_by) = d.rollout_id else {
        return Ok(None);
    };
    let env: BTreeMap<String, String> =
        serde_json::from_str(&d.env_overrides).map_err(|e| StoreError::Corrupt {
            table: "deployment",
            message: e.to_string(),
        })?;
    let same = d.file.as_str() == want.file.as_str()
        && d.tag.as_str() == want.tag.as_str()
        && env == want.env_overrides
        && d.env_sha256.as_deref() == Some(want.env_sha256.as_str())
        && d.deployed_as.is_none();
    if !same {
        return Ok(None);
    }
    // A later rollout that sent a down or up (and failed without recording a deployment), or
    // one that runs now, may have changed the replica since.
    let latest: Option<(String,)> = db
        .query(
            "select rollout_id from rollout where host = ? and service = ? \
         and (touched_replica = 1 or status in ('pending', 'running')) \
         order by created_at desc, rollout_id desc limit 1",
        )
        .bind(&want.host)
        .bind(want.service.as_str())
        .fetch_optional()
        .await?;
    let latest = latest.map(|(id,)| id);
    Ok((latest.as_deref() == Some(deployed_by.as_str())).then_some(deployed_by))
}

impl Store {
    /// Ends target `position` `already_current` when its replica already runs what `want` (the
    /// target's rollout, not created) would deploy: in one transaction, only while the release
    /// is `running` and the target has not started, with its `target_already_current` event.
    /// `Some(id)` of the rollout that deployed it when it did; `None` (nothing written)
    /// otherwise.
    pub async fn end_target_if_current(
        &self,
        release_id: &str,
        position: u32,
        want: &NewRollout,
        at: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        self.write(|mut db| async move {
            let open: Option<(i64,)> = db
                .query(
                    "select 1 from release r join release_target t on t.release_id = r.release_id \
                 where r.release_id = ? and r.status = 'running' and t.position = ? \
                 and t.rollout_id is null and t.outcome is null",
                )
                .bind(release_id)
                .bind(i64::from(position))
                .fetch_optional()
                .await?;
            if open.is_none() {
                return db.commit(None).await;
            }
            let Some(deployed_by) = current_deployment(&mut db, want).await? else {
                return db.commit(None).await;
            };
            db.query("update release_target set outcome = ? where release_id = ? and position = ?")
                .bind(TargetOutcome::AlreadyCurrent.as_str())
                .bind(release_id)
                .bind(i64::from(position));
            let detail = serde_json::json!({"position": position, "host": want.host,
                "service": want.service, "tag": want.tag, "rollout_id": deployed_by});
            event(
                &mut db,
                release_id,
                at,
                SYSTEM_ACTOR,
                ReleaseEventKind::TargetAlreadyCurrent,
                (None, None),
                None,
                &detail,
            )
            .await?;
            db.commit(Some(deployed_by)).await
        })
        .await
    }

    /// Ends `not_started` every target of an ended (`failed` or `aborted`) release that has no
    /// rollout and no outcome; the number ended. For a release ended by a daemon that did not
    /// do it in the same transaction.
    pub async fn end_unstarted_targets(&self, release_id: &str) -> Result<usize, StoreError> {
        self.write(|mut db| async move {
            let status: Option<(String,)> = db
                .query("select status from release where release_id = ?")
                .bind(release_id)
                .fetch_optional()
                .await?;
            let ended = match status.as_ref().map(|(s,)| s.as_str()) {
                Some("failed" | "aborted") => not_started(&mut db, release_id).await?,
                Some(_) => 0,
                None => return Err(StoreError::NotFound(release_id.to_owned())),
            };
            db.commit(ended).await
        })
        .await
    }
}

/// Ends `not_started` the targets of `release_id` with neither a rollout nor an outcome.
pub(super) async fn not_started(db: &mut Tx, release_id: &str) -> Result<usize, StoreError> {
    let ended = db
        .query(
            "update release_target set outcome = ? \
         where release_id = ? and rollout_id is null and outcome is null",
        )
        .bind(TargetOutcome::NotStarted.as_str())
        .bind(release_id)
        .execute()
        .await?
        .rows_affected();
    Ok(usize::try_from(ended).unwrap_or(usize::MAX))
}

/// A stored outcome.
pub(super) fn outcome_of(s: Option<String>) -> Result<Option<TargetOutcome>, StoreError> {
    s.map(|s| s.parse().map_err(corrupt)).transpose()
}
