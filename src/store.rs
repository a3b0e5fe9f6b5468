//! SQLite persistence. SQL lives only here. Every state change is written together with its
//! audit event in one transaction, and no transaction is ever held across a network call.

mod approval;
mod audit;
#[cfg(feature = "testing")]
mod bulk;
#[cfg(test)]
mod checks;
mod deployment;
pub mod downtime;
mod health;
mod history;
mod outbox;
mod owner;
mod page;
mod record;
mod release;
mod retention;
mod rollout;
mod step;
#[cfg(test)]
pub(crate) mod tests;
mod write;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use approval::{Approval, AWAITING_APPROVAL};
pub use audit::AUDIT_BATCH;
#[doc(hidden)]
#[cfg(feature = "testing")]
pub use bulk::BulkSpec;
pub use deployment::{NewDeployment, RunningState};
pub use health::{
    for_rollout, note_call, note_rollout, Failing, LastCall, StorageHealth, WaitingRollout,
};
pub use history::{CsvPage, CSV_COLUMNS};
pub use outbox::{DueDelivery, Unrouted};
pub use record::{
    AuditEntry, AuditEvent, Deployment, Rollout, RolloutFilter, Step, StepAttempt, StepTiming,
};
pub use release::{
    NewRelease, NewReleaseTarget, Release, ReleaseEvent, ReleaseFilter, ReleaseTarget, TargetEnd,
    TargetStateKey,
};
pub use retention::{spawn_retention, Purged};
pub use rollout::{NewRollout, NewStep, RolloutChange};

/// The embedded migrations (`migrations/NNNN_name.sql`), run when the database is opened.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("host {host} already has an active rollout {rollout_id}")]
    HostBusy { host: String, rollout_id: String },
    #[error("rollout {0} not found")]
    NotFound(String),
    #[error("invalid transition of {id}: {message}")]
    InvalidTransition { id: String, message: String },
    #[error("rollout {0} is not waiting for an approval")]
    NotAwaitingApproval(String),
    #[error("database {path} is in use by {owner}")]
    InUse { path: String, owner: String },
    #[error("{0}")]
    Lock(String),
    #[error("corrupt row in {table}: {message}")]
    Corrupt {
        table: &'static str,
        message: String,
    },
}

/// The database handle over one SQLite file in WAL mode, every connection sqlx's: one that
/// writes (`writer`, used only through [`Store::write`]), one that reads for the engine
/// (`reader`, [`Store::read`]) and a small pool that reads for the API (`pool`). The readers
/// are `query_only`, so a write sent there by mistake fails instead of contending. Every
/// audit event is also handed, when its transaction commits, to subscribers (`subscribe`):
/// the live event stream, metrics and releases listen there.
///
/// One writer because SQLite has one write lock: with several writing connections, a
/// transaction that finds the lock taken sleeps in SQLite's busy handler (1, 2, 5, 10 ... ms)
/// and retries. At 200 canaries starting at once those sleeps were seconds of the start burst
/// (docs/performance-notes.md); waiting for the one writer connection instead is a queue in
/// this process, served in turn with no sleep.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    writer: std::sync::Arc<write::OwnedConn>,
    /// The engine's reading connection ([`Store::read`]).
    reader: std::sync::Arc<write::OwnedConn>,
    bus: std::sync::Arc<EventBus>,
    /// This process's hold on the database file (`owner.rs`), released by `close`.
    owner: std::sync::Arc<std::sync::Mutex<Option<owner::Owner>>>,
    /// Writes failing on the storage (`health.rs`), in memory.
    health: std::sync::Arc<StorageHealth>,
}

/// Where a commit hands what it wrote (`write::Tx::commit`), under the writer's lock.
#[derive(Debug)]
struct EventBus {
    /// The committed audit events, in sequence order.
    tx: tokio::sync::broadcast::Sender<AuditEvent>,
    /// Counts the commits that wrote a notification to the outbox: the notifier waits for
    /// it to change.
    outbox: tokio::sync::watch::Sender<u64>,
}

/// Makes `step_kind` (what the triggers on `step.kind` accept, migration 0011) the registered
/// step kinds: each inserted if missing; a name no longer registered removed unless a step row
/// still uses it (that row stays readable and resumable). Read first: a start whose table is
/// already right writes nothing (a restart may find the previous process still writing).
async fn register_step_kinds(pool: &SqlitePool) -> Result<(), StoreError> {
    let registered: Vec<&str> = crate::domain::runbook::StepKindName::ALL
        .iter()
        .map(|k| k.as_str())
        .collect();
    let registered_json = serde_json::to_string(&registered).unwrap_or_default();
    let stored: Vec<(String,)> = sqlx::query_as("select name from step_kind")
        .fetch_all(pool)
        .await?;
    let missing = registered
        .iter()
        .any(|k| !stored.iter().any(|(name,)| name == k));
    const UNUSED: &str = "from step_kind where name not in (select value from json_each(?)) \
         and not exists (select 1 from step where step.kind = step_kind.name)";
    let (unused,): (i64,) = sqlx::query_as(&format!("select count(*) {UNUSED}"))
        .bind(&registered_json)
        .fetch_one(pool)
        .await?;
    if !missing && unused == 0 {
        return Ok(());
    }
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    for kind in &registered {
        sqlx::query("insert or ignore into step_kind (name) values (?)")
            .bind(kind)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(&format!("delete {UNUSED}"))
        .bind(&registered_json)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

impl Store {
    /// Opens (creating if missing) and migrates the database at `path`, and registers the step
    /// kinds (`register_step_kinds`). Fails `InUse` when another process owns it.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_waiting(path, Duration::ZERO).await
    }

    /// `open`, first taking the database for this process (`owner.rs`): when another process
    /// owns it, waits up to `wait` for it to exit, then fails `InUse` naming it. Nothing of
    /// the database is read or written before the lock is held.
    pub async fn open_waiting(path: &Path, wait: Duration) -> Result<Self, StoreError> {
        let owner = owner::Owner::acquire(path, wait).await?;
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        // Migrations and the step kinds through sqlx, on a connection of their own that is
        // closed before the store opens its writer: never two writing connections at once.
        let migrating = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        let migrated = async {
            MIGRATOR.run(&migrating).await?;
            register_step_kinds(&migrating).await
        }
        .await;
        migrating.close().await;
        migrated?;
        // The writer stays open for the store's life, so the readers always share its
        // write-ahead log. Every statement the store runs on its own two stays prepared.
        let own = options.clone().statement_cache_capacity(128);
        let writer = write::OwnedConn::open_writer(&own).await?;
        let reader = write::OwnedConn::open(&own.pragma("query_only", "true")).await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.pragma("query_only", "true"))
            .await?;
        let (tx, _) = tokio::sync::broadcast::channel(1024);
        let bus = EventBus {
            tx,
            outbox: tokio::sync::watch::Sender::new(0),
        };
        let store = Self {
            pool,
            writer: std::sync::Arc::new(writer),
            reader: std::sync::Arc::new(reader),
            bus: std::sync::Arc::new(bus),
            owner: std::sync::Arc::new(std::sync::Mutex::new(Some(owner))),
            health: Default::default(),
        };
        Ok(store)
    }

    /// Audit events as they are committed, in sequence order, each handed over by the
    /// transaction that wrote it (a slow subscriber may miss some: `Lagged`, and reads them
    /// back with `audit_events_after`).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<AuditEvent> {
        self.bus.tx.subscribe()
    }

    /// Changes after each commit that wrote a notification to the outbox (what the notifier
    /// waits for); it is marked seen from the start.
    pub(crate) fn outbox_writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.bus.outbox.subscribe()
    }

    /// How many rollouts are not terminal.
    pub async fn count_active_rollouts(&self) -> Result<i64, StoreError> {
        let (n,): (i64,) =
            sqlx::query_as("select count(*) from rollout where active_host is not null")
                .fetch_one(&self.pool)
                .await?;
        Ok(n)
    }

    /// True when the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        sqlx::query("select 1").execute(&self.pool).await.is_ok()
    }

    /// Closes every connection (waiting for those in use): an unfinished transaction is
    /// rolled back, as when the process dies. Later calls fail.
    pub async fn close(&self) {
        self.pool.close().await;
        self.reader.close().await;
        self.writer.close().await;
        if let Ok(mut owner) = self.owner.lock() {
            owner.take();
        }
    }

    /// What is known of writes failing on the storage (safety rule 18).
    pub fn health(&self) -> &StorageHealth {
        &self.health
    }

    /// The connections that read (`query_only`).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Formats a time the way every column stores it: RFC 3339 UTC with milliseconds.
pub fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub(crate) fn parse_time(table: &'static str, s: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| StoreError::Corrupt {
            table,
            message: format!("bad time {s:?}: {e}"),
        })
}

pub(crate) fn parse_opt_time(
    table: &'static str,
    s: Option<String>,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    s.map(|s| parse_time(table, &s)).transpose()
}

/// A new prefixed id (`ro_01J...`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", ulid::Ulid::new().to_string().to_lowercase())
}
