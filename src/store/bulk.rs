//! Bulk fill for the audit benchmark (`benches/audit.rs`): realistic rows generated inside
//! SQLite (recursive CTEs, one transaction per table), so 100k rollouts take seconds. Not part
//! of the product; hidden from the docs.

use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;

use super::{Store, StoreError};

/// What to generate.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct BulkSpec {
    pub rollouts: i64,
    /// Steps per rollout; each step gets one attempt.
    pub steps_per_rollout: i64,
    /// Hosts (`host00`...), each with `services_per_host` replicas.
    pub hosts: i64,
    pub services_per_host: i64,
    /// Unix seconds of the first rollout; they follow every `spacing_secs`.
    pub start_unix: i64,
    pub spacing_secs: i64,
}

#[doc(hidden)]
impl Store {
    /// Fills the database: rollouts (the newest `hosts` of them still running, so the recovery
    /// scan has work), `steps_per_rollout` steps and attempts each, and the audit events a
    /// real rollout writes (created, running, two per step, terminal).
    pub async fn bulk_fill(&self, spec: BulkSpec) -> Result<(), StoreError> {
        let last = spec.rollouts - 1;
        // The writer with a big page cache: index maintenance of millions of rows is what
        // takes the time. Reset afterwards.
        let mut guard = self.writer().await?;
        let db = guard
            .as_mut()
            .ok_or(StoreError::Sqlx(sqlx::Error::PoolClosed))?;
        sqlx::query("pragma cache_size = -524288")
            .execute(&mut *db)
            .await?;
        let filled = fill(db, spec, last).await;
        sqlx::query("pragma cache_size = -2000")
            .execute(&mut *db)
            .await?;
        filled
    }

    /// Moves the write-ahead log into the database file, so its size can be measured.
    pub async fn bulk_checkpoint(&self) -> Result<(), StoreError> {
        let mut guard = self.writer().await?;
        let db = guard
            .as_mut()
            .ok_or(StoreError::Sqlx(sqlx::Error::PoolClosed))?;
        sqlx::query("pragma wal_checkpoint(truncate)")
            .execute(db)
            .await?;
        Ok(())
    }
}

/// The four tables, one transaction each.
async fn fill(db: &mut SqliteConnection, spec: BulkSpec, last: i64) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    sqlx::query(
            "with recursive n(i) as (select 0 union all select i + 1 from n where i < ?1) \
             insert into rollout (rollout_id, kind, status, host, file, service, tag, runbook, actor, \
               reason, env_overrides, env_sha256, require_logs, on_failure, created_at, started_at, \
               finished_at, error_code, error_message, touched_replica, active_host) \
             select printf('ro_%026d', i), \
               case when i % 10 = 3 then 'rollback' else 'canary' end, \
               case when i > ?1 - ?2 then 'running' when i % 17 = 5 then 'failed' \
                    when i % 29 = 7 then 'aborted' else 'succeeded' end, \
               printf('host%02d', i % ?2), \
               'prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml', \
               printf('model-sg-glm53-w4afp8-tp4-h%02d-r%d', i % ?2, (i / ?2) % ?3 + 1), \
               printf('v0.%d.%d', i / 1000, i % 1000), \
               'single-replica-canary', \
               case i % 5 when 0 then 'ops-alice' when 1 then 'ops-bob' when 2 then 'oncall' \
                    when 3 then 'canaryd' else 'ops-carol' end, \
               printf('pin glm53-hicache-w4afp8-v%d on r2, see INC-%d', i % 7, i), \
               '{\"GLM53_HICACHE_RAM_BUDGET\":\"406GiB\"}', \
               '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', \
               '[\"event-loop stall dump armed\"]', 'rollback', \
               strftime('%Y-%m-%dT%H:%M:%fZ', ?4 + i * ?5, 'unixepoch'), \
               strftime('%Y-%m-%dT%H:%M:%fZ', ?4 + i * ?5 + 1, 'unixepoch'), \
               case when i > ?1 - ?2 then null \
                    else strftime('%Y-%m-%dT%H:%M:%fZ', ?4 + i * ?5 + 1200, 'unixepoch') end, \
               case when i % 17 = 5 then 'health_timeout' end, \
               case when i % 17 = 5 then 'no healthy answer within 60m' end, \
               1, \
               case when i > ?1 - ?2 then printf('host%02d', i % ?2) end \
             from n",
        )
        .bind(last)
        .bind(spec.hosts)
        .bind(spec.services_per_host)
        .bind(spec.start_unix)
        .bind(spec.spacing_secs)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;

    let mut tx = db.begin().await?;
    sqlx::query(
            "with recursive p(k) as (select 0 union all select k + 1 from p where k < ?1 - 1) \
             insert into step (step_id, rollout_id, position, name, kind, status, attempts, \
               started_at, finished_at, detail) \
             select printf('st_%s_%02d', substr(r.rollout_id, 4), p.k), r.rollout_id, p.k, \
               printf('step-%d', p.k), 'wait_health', \
               case when r.status = 'running' then 'pending' else 'succeeded' end, 1, \
               r.started_at, r.finished_at, \
               '{\"healthy_samples\":3,\"unhealthy_samples\":41,\"last\":{\"status\":200,\"ms\":12}}' \
             from rollout r, p",
        )
        .bind(spec.steps_per_rollout)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;

    let mut tx = db.begin().await?;
    sqlx::query(
        "insert into step_attempt (attempt_id, step_id, rollout_id, n, endpoint, started_at, \
               finished_at, outcome, detail) \
             select printf('att_%s', substr(step_id, 4)), step_id, rollout_id, 1, '/compose/up', \
               coalesce(started_at, '2024-01-01T00:00:00.000Z'), finished_at, \
               case when finished_at is null then null else 'succeeded' end, \
               '{\"lines\":118,\"done\":{\"success\":true}}' \
             from step",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut tx = db.begin().await?;
    sqlx::query(
            "insert into audit_event (occurred_at, rollout_id, step_name, actor, kind, from_state, \
               to_state, detail) \
             select created_at, rollout_id, null, actor, 'rollout_created', null, 'pending', \
               json_object('kind', kind, 'host', host, 'service', service, 'tag', tag, 'reason', reason) \
             from rollout order by created_at",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "insert into audit_event (occurred_at, rollout_id, step_name, actor, kind, from_state, \
               to_state, detail) \
             select s.started_at, s.rollout_id, s.name, 'canaryd', e.kind, e.f, e.t, '{}' \
             from step s, (select 'step_running' as kind, 'pending' as f, 'running' as t \
                           union all select 'step_succeeded', 'running', 'succeeded') e \
             where s.status = 'succeeded'",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "insert into audit_event (occurred_at, rollout_id, step_name, actor, kind, from_state, \
               to_state, detail) \
             select finished_at, rollout_id, null, 'canaryd', 'rollout_' || status, 'running', \
               status, '{}' from rollout where finished_at is not null",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
