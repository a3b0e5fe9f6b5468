//! Retention (`retention_days` in the config; default: keep everything).
//!
//! A terminal rollout that finished more than N days ago is deleted with its steps, step
//! attempts and audit events. Deployments are never deleted: they are the replica's rollback
//! history (`POST /v1/rollbacks` chooses its target among them), so a purged rollout only
//! loses the link (`deployment.rollout_id` becomes NULL; tag, file, env overrides, commit and
//! time stay). Links between rollouts (`rollback_of`, `rolled_back_by`) that point at a purged
//! rollout are cleared the same way. Active rollouts are never touched. Each run appends one
//! `retention_purged` audit event (no rollout) saying what it deleted.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::audit::append;
use super::record::AuditEntry;
use super::{fmt_time, Store, StoreError};
use crate::domain::audit::AuditKind;

/// Rollouts deleted per transaction: short transactions keep the engine's writes flowing.
/// Each takes the write lock up front (`BEGIN IMMEDIATE`): it reads, then deletes.
const BATCH: i64 = 500;

/// What one retention run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub rollouts: u64,
    pub steps: u64,
    pub attempts: u64,
    pub audit_events: u64,
}

impl Store {
    /// Deletes every terminal rollout that finished before `now - days` (see the module doc).
    pub async fn purge_finished(
        &self,
        now: DateTime<Utc>,
        days: u32,
    ) -> Result<Purged, StoreError> {
        let cutoff = fmt_time(now - chrono::Duration::days(i64::from(days)));
        let mut total = Purged::default();
        loop {
            let batch = "(select value from json_each(?))";
            let statements = [
                format!("update deployment set rollout_id = null where rollout_id in {batch}"),
                format!("update rollout set rollback_of = null where rollback_of in {batch}"),
                format!("update rollout set rolled_back_by = null where rolled_back_by in {batch}"),
                format!("delete from step_attempt where rollout_id in {batch}"),
                format!("delete from step where rollout_id in {batch}"),
                format!("delete from audit_event where rollout_id in {batch}"),
                format!("delete from rollout where rollout_id in {batch}"),
            ];
            let (cutoff, statements) = (&cutoff, &statements);
            let counts = self
                .write(|mut db| async move {
                    let ids: Vec<(String,)> = db.query(
                        "select rollout_id from rollout where active_host is null and finished_at < ? limit ?",
                    )
                    .bind(cutoff)
                    .bind(BATCH)
                    .fetch_all()
                    .await?;
                    let mut counts = [0u64; 7];
                    if ids.is_empty() {
                        return db.commit(counts).await;
                    }
                    let ids: Vec<String> = ids.into_iter().map(|(id,)| id).collect();
                    let ids = serde_json::Value::from(ids).to_string();
                    for (i, sql) in statements.iter().enumerate() {
                        counts[i] = db.query(sql)
                            .bind(&ids)
                            .execute()
                            .await?
                            .rows_affected();
                    }
                    db.commit(counts).await
                })
                .await?;
            if counts[6] == 0 {
                break;
            }
            total.attempts += counts[3];
            total.steps += counts[4];
            total.audit_events += counts[5];
            total.rollouts += counts[6];
        }
        if total.rollouts > 0 {
            let entry = AuditEntry::new(now, "canaryd", AuditKind::RetentionPurged).detail(serde_json::json!({
                "finished_before": cutoff, "retention_days": days, "rollouts": total.rollouts,
                "steps": total.steps, "attempts": total.attempts, "audit_events": total.audit_events,
            }));
            let entry = &entry;
            self.write(|mut db| async move {
                append(&mut db, entry).await?;
                db.commit(()).await
            })
            .await?;
        }
        Ok(total)
    }
}

/// How often retention runs.
const PERIOD: Duration = Duration::from_secs(24 * 3600);

/// Runs retention once now and then daily, when `retention_days` is set.
pub fn spawn_retention(store: Store, days: Option<u32>) -> Option<tokio::task::JoinHandle<()>> {
    let days = days?;
    Some(tokio::spawn(every(PERIOD, move || {
        let store = store.clone();
        async move {
            match store.purge_finished(Utc::now(), days).await {
                Ok(p) if p.rollouts > 0 => tracing::info!(
                    rollouts = p.rollouts,
                    audit_events = p.audit_events,
                    retention_days = days,
                    "retention deleted {} rollout(s) finished more than {days} day(s) ago",
                    p.rollouts
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "retention run failed; retrying tomorrow"),
            }
        }
    })))
}

/// Runs `job` now, then `period` after each run ends, for ever.
async fn every<Fut: std::future::Future<Output = ()>>(
    period: Duration,
    mut job: impl FnMut() -> Fut,
) {
    loop {
        job().await;
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retention_runs_at_once_and_then_every_24_hours() {
        let start = Instant::now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let seen = runs.clone();
        let task = tokio::spawn(every(PERIOD, move || {
            seen.lock()
                .expect("lock")
                .push(start.elapsed().as_secs() / 3600);
            async {}
        }));
        tokio::time::sleep(Duration::from_secs(49 * 3600)).await;
        task.abort();
        assert_eq!(*runs.lock().expect("lock"), [0, 24, 48]);
    }
}
