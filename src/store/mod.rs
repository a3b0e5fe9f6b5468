//! SQLite persistence. SQL lives only here. Every state change is written together with its
//! audit event in one transaction, and no transaction is ever held across a network call.

mod audit;
mod deployment;
mod record;
mod rollout;
mod step;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use audit::AuditEntry;
pub use deployment::NewDeployment;
pub use record::{AuditEvent, Deployment, Rollout, RolloutFilter, Step, StepAttempt};
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
    #[error("corrupt row in {table}: {message}")]
    Corrupt {
        table: &'static str,
        message: String,
    },
}

/// The database handle: a small pool over one SQLite file in WAL mode.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Opens (creating if missing) and migrates the database at `path`.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self { pool })
    }

    /// True when the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        sqlx::query("select 1").execute(&self.pool).await.is_ok()
    }

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
