//! Write transactions without a thread hop.
//!
//! sqlx runs every statement of a connection on that connection's own thread: a statement,
//! a `BEGIN` and a `COMMIT` are each a message to that thread and a wake-up back, about
//! 190 µs apiece when 200 canaries start at once, and while one waits for its thread the one
//! writer is held. The writer is therefore not a sqlx connection: it is a rusqlite
//! [`Connection`] of the store's own ([`OwnedConn`]), behind an async lock handed out in arrival
//! order, and [`Store::write`] runs a whole transaction on the calling thread: `BEGIN
//! IMMEDIATE`, the caller's statements (prepared once and cached), `COMMIT`. A transaction
//! never awaits, so it is never held across a network call and a cancelled future cannot
//! leave one half-done. The engine's own reads go the same way, on a second connection of the
//! store's own ([`Store::read`]); the API's wider reads stay on sqlx's pool of `query_only`
//! connections.

use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::{Store, StoreError};

/// What a [`Store::write`] closure writes through: the writer connection, inside the
/// transaction (it derefs to rusqlite's `Connection`). It also remembers whether the
/// transaction wrote an audit event ([`Tx::audited`], called by `audit::append`): only then is
/// there something to publish after the commit, so a transaction that wrote none (notification
/// routing, a retention batch) does not wake the publisher for a read that finds nothing.
pub(crate) struct Tx<'c> {
    db: &'c Connection,
    audited: Cell<bool>,
}

impl Tx<'_> {
    /// Marks this transaction as one that wrote audit events.
    pub(super) fn audited(&self) {
        self.audited.set(true);
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.db
    }
}

/// A rusqlite connection of the store's own, used on the calling thread behind an async lock
/// handed out in arrival order; `None` once the store is closed. The store has two: the one
/// that writes, and one that reads for the engine (`query_only`), so that a rollout's own
/// small reads (its row, its steps, its attempts) take no thread hop either.
#[derive(Debug)]
pub(super) struct OwnedConn {
    conn: tokio::sync::Mutex<Option<Connection>>,
}

impl OwnedConn {
    /// Opens a connection to the (migrated) database at `path`, with the settings sqlx gives
    /// its own: WAL, `synchronous = NORMAL`, foreign keys, a 5 s busy timeout; `query_only`
    /// for a reader, so that a write sent there by mistake fails.
    pub(super) fn open(path: &Path, query_only: bool) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        if query_only {
            conn.pragma_update(None, "query_only", true)?;
        } else {
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        conn.pragma_update(None, "foreign_keys", true)?;
        // Every statement the store runs here stays prepared.
        conn.set_prepared_statement_cache_capacity(128);
        Ok(Self {
            conn: tokio::sync::Mutex::new(Some(conn)),
        })
    }

    /// Runs `f` on the connection, once it is this caller's turn.
    pub(super) async fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock().await;
        let db = conn
            .as_mut()
            .ok_or(StoreError::Sqlx(sqlx::Error::PoolClosed))?;
        f(db)
    }

    /// Closes the connection once the caller using it, if any, is done; every later use
    /// fails.
    pub(super) async fn close(&self) {
        let conn = self.conn.lock().await.take();
        drop(conn);
    }
}

impl Store {
    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer connection and commits;
    /// an error from `f` (or a panic) rolls it back and nothing of it is kept. When `f` wrote
    /// audit events, subscribers are told after the commit (`publish`). Writers wait for the
    /// connection in arrival order.
    pub(crate) async fn write<T>(
        &self,
        mut f: impl FnMut(&Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // Inside a rollout's task a write that fails on the storage is waited out
        // (`health::Retry`): `f` runs again on each try, in a new transaction.
        let mut retry = super::health::Retry::new(&self.health);
        let (out, audited) = loop {
            let tried = self
                .with_writer(|db| {
                    #[cfg(feature = "testing")]
                    if self.health.fault.load(std::sync::atomic::Ordering::Relaxed) {
                        return Err(injected_fault());
                    }
                    in_transaction(db, &mut f)
                })
                .await;
            match retry.after(tried) {
                super::health::Then::Return(done) => break done?,
                super::health::Then::RetryIn(wait) => tokio::time::sleep(wait).await,
            }
        };
        if audited {
            self.publish().await;
        }
        Ok(out)
    }

    /// Test hook: while `on`, every write fails as on a full disk (`SQLITE_FULL`), before
    /// anything of it is kept.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn inject_storage_fault(&self, on: bool) {
        self.health
            .fault
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f` on the writer connection, once it is this caller's turn, outside any
    /// transaction: `write` opens its own there, the benches' bulk fill runs its own
    /// transactions and pragmas. It publishes nothing.
    pub(crate) async fn with_writer<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.writer.with(f).await
    }

    /// Runs `f` on the engine's reading connection: a rollout's own small reads, without a
    /// thread hop. Each statement reads one consistent snapshot of what is committed.
    pub(crate) async fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.reader.with(|db| f(db)).await
    }

    /// Runs the query `sql` with `params` on the engine's reader: every row of its answer, in
    /// order, each mapped by `row`.
    pub(super) async fn read_rows<T>(
        &self,
        sql: &str,
        params: impl rusqlite::Params + Send,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T> + Send,
    ) -> Result<Vec<T>, StoreError> {
        self.read(|db| {
            let mut select = db.prepare_cached(sql)?;
            let rows = select.query_map(params, row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// Runs one statement that changes rows on its own (no audit event), in a transaction
    /// of its own; the rows it changed.
    pub(crate) async fn write_one(
        &self,
        sql: &str,
        params: impl rusqlite::Params + Clone + Send,
    ) -> Result<usize, StoreError> {
        self.write(|db| Ok(db.prepare_cached(sql)?.execute(params.clone())?))
            .await
    }
}

#[cfg(feature = "testing")]
fn injected_fault() -> StoreError {
    let full = rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL);
    StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        full,
        Some("database or disk is full (injected)".to_owned()),
    ))
}

/// The result of `f` once committed, and whether it wrote audit events.
fn in_transaction<T>(
    db: &mut Connection,
    f: &mut impl FnMut(&Tx<'_>) -> Result<T, StoreError>,
) -> Result<(T, bool), StoreError> {
    // A `Transaction` that is dropped without `commit` (an error, a panic) rolls back.
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let w = Tx {
        db: &tx,
        audited: Cell::new(false),
    };
    let out = f(&w)?;
    let audited = w.audited.get();
    tx.commit()?;
    Ok((out, audited))
}
