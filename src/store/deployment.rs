//! Deployment history per replica.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::audit::append;
use super::record::{AuditEntry, Deployment, Rollout};
use super::rollout::RolloutChange;
use super::write::Tx;
use super::{fmt_time, new_id, parse_time, Store, StoreError};
use crate::domain::audit::AuditKind;
use crate::domain::names::{ComposeFile, ServiceName, Tag};
use crate::domain::state::DeploymentSource;
use crate::store::rollout::corrupt;

/// A deployment to record.
#[derive(Debug, Clone)]
pub struct NewDeployment {
    pub host: String,
    pub service: ServiceName,
    pub file: ComposeFile,
    pub tag: Tag,
    pub env_overrides: BTreeMap<String, String>,
    pub env_sha256: Option<String>,
    pub commit: Option<String>,
    pub file_sha256: Option<String>,
    pub image: Option<String>,
    pub source: DeploymentSource,
    pub rollout_id: Option<String>,
    pub deployed_at: DateTime<Utc>,
    /// The compose service it runs under, when not `service` (the replica's slot): a former
    /// name (docs/reference.md#renamed-replicas).
    pub deployed_as: Option<ServiceName>,
}

/// What a replica runs, as far as a rollback cares: compared with each recorded deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningState {
    pub file: ComposeFile,
    pub tag: Tag,
    /// The overrides of the plan that deployed it (never the host's env file).
    pub env_overrides: BTreeMap<String, String>,
}

impl RunningState {
    /// What a rollout deploys.
    pub fn of_rollout(r: &Rollout) -> Self {
        Self {
            file: r.file.clone(),
            tag: r.tag.clone(),
            env_overrides: r.env_overrides.clone(),
        }
    }

    /// What a recorded deployment ran.
    pub fn of_deployment(d: &Deployment) -> Self {
        Self {
            file: d.file.clone(),
            tag: d.tag.clone(),
            env_overrides: d.env_overrides.clone(),
        }
    }
}

impl std::fmt::Display for RunningState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tag {}, file {}", self.tag, self.file)?;
        if self.env_overrides.is_empty() {
            f.write_str(", no env overrides")
        } else {
            let keys: Vec<&str> = self.env_overrides.keys().map(String::as_str).collect();
            write!(f, ", env overrides of {}", keys.join(", "))
        }
    }
}

#[derive(sqlx::FromRow)]
struct DeploymentRow {
    deployment_id: String,
    host: String,
    service: String,
    file: String,
    tag: String,
    env_overrides: String,
    env_sha256: Option<String>,
    commit_sha: Option<String>,
    file_sha256: Option<String>,
    image: Option<String>,
    source: String,
    rollout_id: Option<String>,
    deployed_at: String,
    deployed_as: Option<String>,
}

impl TryFrom<DeploymentRow> for Deployment {
    type Error = StoreError;
    fn try_from(r: DeploymentRow) -> Result<Self, StoreError> {
        Ok(Deployment {
            env_overrides: serde_json::from_str(&r.env_overrides).map_err(|e| {
                StoreError::Corrupt {
                    table: "deployment",
                    message: e.to_string(),
                }
            })?,
            deployed_at: parse_time("deployment", &r.deployed_at)?,
            id: r.deployment_id,
            host: r.host,
            service: r.service.parse().map_err(corrupt)?,
            file: r.file.parse().map_err(corrupt)?,
            tag: r.tag.parse().map_err(corrupt)?,
            env_sha256: r.env_sha256,
            commit: r.commit_sha,
            file_sha256: r.file_sha256,
            image: r.image,
            source: r.source.parse().map_err(|message| StoreError::Corrupt {
                table: "deployment",
                message,
            })?,
            rollout_id: r.rollout_id,
            deployed_as: r
                .deployed_as
                .map(|s| s.parse())
                .transpose()
                .map_err(corrupt)?,
        })
    }
}

const SELECT_DEPLOYMENT: &str =
    "select deployment_id, host, service, file, tag, env_overrides, env_sha256, \
    commit_sha, file_sha256, image, source, rollout_id, deployed_at, deployed_as from deployment";

impl Store {
    /// Finishes a rollout successfully and records the deployment it produced, atomically.
    pub async fn succeed_rollout(
        &self,
        id: &str,
        change: &RolloutChange,
        deployment: &NewDeployment,
    ) -> Result<Rollout, StoreError> {
        self.write(|mut db| async move {
            insert(&mut db, deployment).await?;
            super::rollout::transition(&mut db, id, change).await?;
            let rollout = super::rollout::get_in(&mut db, id).await?;
            db.commit(rollout).await
        })
        .await
    }

    /// Records the host's current deployment of each replica canaryd never deployed (one
    /// that has no deployment row yet), in one transaction. Replicas that have one are
    /// found on the engine's reader first, so a host whose baselines are all recorded (every
    /// rollout but its first) costs no write; the write checks again, so a race keeps one row.
    pub async fn record_baselines(&self, ds: &[NewDeployment]) -> Result<(), StoreError> {
        let any_missing = {
            let mut db = self.read().await?;
            let mut any = false;
            for d in ds {
                let (n,): (i64,) = sqlx::query_as(
                    "select count(*) from deployment where host = ? and service = ?",
                )
                .bind(&d.host)
                .bind(d.service.as_str())
                .fetch_one(&mut *db)
                .await?;
                if n == 0 {
                    any = true;
                    break;
                }
            }
            any
        };
        if !any_missing {
            return Ok(());
        }
        self.write(|mut db| async move {
            for d in ds {
                if missing(&mut db, d).await? {
                    insert(&mut db, d).await?;
                }
            }
            db.commit(()).await
        })
        .await
    }

    /// The replica's deployments, newest first.
    pub async fn deployments(
        &self,
        host: &str,
        service: &str,
    ) -> Result<Vec<Deployment>, StoreError> {
        // A negative limit is no limit to SQLite.
        self.newest_deployments(host, service, -1).await
    }

    /// The replica's newest `limit` deployments, newest first (what a rollback chooses from).
    pub async fn recent_deployments(
        &self,
        host: &str,
        service: &str,
        limit: u32,
    ) -> Result<Vec<Deployment>, StoreError> {
        self.newest_deployments(host, service, i64::from(limit))
            .await
    }

    async fn newest_deployments(
        &self,
        host: &str,
        service: &str,
        limit: i64,
    ) -> Result<Vec<Deployment>, StoreError> {
        let rows: Vec<DeploymentRow> = sqlx::query_as(&format!(
            "{SELECT_DEPLOYMENT} where host = ? and service = ? \
             order by deployed_at desc, deployment_id desc limit ?"
        ))
        .bind(host)
        .bind(service)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(Deployment::try_from).collect()
    }

    /// The replica's newest deployment whose file, tag or env overrides differ from what it
    /// runs now (`running`), only of `tag` when one is given: what a rollback redeploys. The
    /// host's env file is not compared: a rollback sends today's, whatever it was then. One
    /// indexed read, newest first, `limit 1`; it never loads the replica's history.
    pub async fn prior_deployment(
        &self,
        host: &str,
        service: &str,
        running: &RunningState,
        tag: Option<&str>,
    ) -> Result<Option<Deployment>, StoreError> {
        let env =
            serde_json::to_string(&running.env_overrides).map_err(|e| StoreError::Corrupt {
                table: "deployment",
                message: e.to_string(),
            })?;
        let only_tag = if tag.is_some() { "and tag = ? " } else { "" };
        let query = format!(
            "{SELECT_DEPLOYMENT} where host = ? and service = ? {only_tag}\
             and not (file = ? and tag = ? and env_overrides = ?) \
             order by deployed_at desc, deployment_id desc limit 1"
        );
        let mut q = sqlx::query_as::<_, DeploymentRow>(&query)
            .bind(host)
            .bind(service);
        if let Some(tag) = tag {
            q = q.bind(tag);
        }
        let row = q
            .bind(running.file.as_str())
            .bind(running.tag.as_str())
            .bind(env)
            .fetch_optional(self.pool())
            .await?;
        row.map(Deployment::try_from).transpose()
    }

    /// The replica's newest deployment under the compose service `name` (its key or a
    /// former name): where a rename's `replaces` takes its file and tag from.
    pub async fn deployment_named(
        &self,
        host: &str,
        service: &str,
        name: &str,
    ) -> Result<Option<Deployment>, StoreError> {
        let row: Option<DeploymentRow> = sqlx::query_as(&format!(
            "{SELECT_DEPLOYMENT} where host = ? and service = ? and coalesce(deployed_as, service) = ? \
             order by deployed_at desc, deployment_id desc limit 1"
        ))
        .bind(host)
        .bind(service)
        .bind(name)
        .fetch_optional(self.pool())
        .await?;
        row.map(Deployment::try_from).transpose()
    }

    /// The replica's newest deployment of `tag`, if it ever ran that tag.
    pub async fn deployment_with_tag(
        &self,
        host: &str,
        service: &str,
        tag: &str,
    ) -> Result<Option<Deployment>, StoreError> {
        let row: Option<DeploymentRow> = sqlx::query_as(&format!(
            "{SELECT_DEPLOYMENT} where host = ? and service = ? and tag = ? \
             order by deployed_at desc, deployment_id desc limit 1"
        ))
        .bind(host)
        .bind(service)
        .bind(tag)
        .fetch_optional(self.pool())
        .await?;
        row.map(Deployment::try_from).transpose()
    }

    /// Whether a deployment row for this rollout exists (recovery of a half-finished success).
    pub async fn deployment_of(&self, rollout_id: &str) -> Result<Option<Deployment>, StoreError> {
        let row: Option<DeploymentRow> =
            sqlx::query_as(&format!("{SELECT_DEPLOYMENT} where rollout_id = ?"))
                .bind(rollout_id)
                .fetch_optional(self.pool())
                .await?;
        row.map(Deployment::try_from).transpose()
    }
}

/// Whether the replica of `d` has no deployment recorded.
async fn missing(db: &mut Tx, d: &NewDeployment) -> Result<bool, StoreError> {
    let (n,): (i64,) = db
        .query("select count(*) from deployment where host = ? and service = ?")
        .bind(&d.host)
        .bind(d.service.as_str())
        .fetch_one()
        .await?;
    Ok(n == 0)
}

async fn insert(db: &mut Tx, d: &NewDeployment) -> Result<(), StoreError> {
    let env = serde_json::to_string(&d.env_overrides).map_err(|e| StoreError::Corrupt {
        table: "deployment",
        message: e.to_string(),
    })?;
    db.query(
        "insert into deployment (deployment_id, host, service, file, tag, env_overrides, env_sha256, commit_sha, \
         file_sha256, image, source, rollout_id, deployed_at, deployed_as) \
         values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(new_id("dep"))
    .bind(&d.host)
    .bind(d.service.as_str())
    .bind(d.file.as_str())
    .bind(d.tag.as_str())
    .bind(env)
    .bind(&d.env_sha256)
    .bind(&d.commit)
    .bind(&d.file_sha256)
    .bind(&d.image)
    .bind(d.source.as_str())
    .bind(&d.rollout_id)
    .bind(fmt_time(d.deployed_at))
    .bind(d.deployed_as.as_deref());
    let entry = AuditEntry::new(d.deployed_at, "canaryd", AuditKind::DeploymentRecorded).detail(
        serde_json::json!({
            "host": d.host, "service": d.service, "deployed_as": d.deployed_as, "tag": d.tag, "file": d.file,
            "source": d.source, "rollout_id": d.rollout_id,
        }),
    );
    let entry = match &d.rollout_id {
        Some(id) => entry.rollout(id),
        None => entry,
    };
    append(db, &entry).await
}
