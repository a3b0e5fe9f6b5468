//! The store's own connections: the one that writes and the engine's reader, each a sqlx
//! connection behind an async lock handed out in arrival order.
//!
//! [`Store::write`] runs one transaction on the writer: `BEGIN IMMEDIATE`, the caller's
//! statements (prepared once per connection and kept in sqlx's statement cache), `COMMIT`.
//! Between them it awaits nothing but the database, so a transaction is never held across a
//! network call. Its [`Tx`] owns the writer's lock for as long as the transaction is open:
//! dropped without [`Tx::commit`] (an error, a panic, or the caller's future cancelled at any
//! await), it issues `ROLLBACK` from a task of its own that still holds the lock, so no other
//! writer ever sees a half-done transaction, and none starts before the rollback ran.

use std::future::Future;
use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Mutex, MutexGuard, OwnedMutexGuard};

use super::{Store, StoreError};

/// One connection of the store's own; `None` once the store is closed.
type Slot = Arc<Mutex<Option<SqliteConnection>>>;

/// A sqlx connection of the store's own behind an async lock handed out in arrival order
/// (tokio's `Mutex` is fair). The store has two: the one that writes, and one that reads for
/// the engine (`query_only`), so a rollout's own small reads (its row, its steps, its
/// attempts) never queue behind the API's.
#[derive(Debug)]
pub(super) struct OwnedConn {
    conn: Slot,
}

fn closed() -> StoreError {
    StoreError::Sqlx(sqlx::Error::PoolClosed)
}

impl OwnedConn {
    /// Opens a connection with `options` (the store's: WAL, `synchronous = NORMAL`, foreign
    /// keys, a 5 s busy timeout; `query_only` for the reader).
    pub(super) async fn open(options: &SqliteConnectOptions) -> Result<Self, StoreError> {
        let conn = options.connect().await?;
        Ok(Self {
            conn: Arc::new(Mutex::new(Some(conn))),
        })
    }

    /// Closes the connection once the caller using it, if any, is done; every later use
    /// fails.
    pub(super) async fn close(&self) {
        let conn = self.conn.lock().await.take();
        if let Some(conn) = conn {
            let _ = conn.close().await;
        }
    }
}

/// A write transaction on the writer connection ([`Store::write`]); it derefs to sqlx's
/// `SqliteConnection`, so statements run on it with `&mut **db` (or [`Tx::conn`]). It also
/// remembers whether the transaction wrote an audit event ([`Tx::audited`], called by
/// `audit::append`): only then is there something to publish after the commit, so a
/// transaction that wrote none (notification routing, a retention batch) does not wake the
/// publisher for a read that finds nothing.
pub(crate) struct Tx {
    /// The writer's lock, held until the transaction is committed or rolled back.
    guard: Option<OwnedMutexGuard<Option<SqliteConnection>>>,
    /// Until `COMMIT` succeeded: dropping rolls back.
    open: bool,
    audited: bool,
}

/// A transaction's result once committed: only [`Tx::commit`] makes one, so a closure given
/// to [`Store::write`] cannot end without committing or failing.
pub(crate) struct Committed<T> {
    out: T,
    audited: bool,
}

impl Tx {
    /// Takes the writer's lock (in arrival order) and begins `IMMEDIATE`: the write lock of
    /// the database is taken up front, so read-then-write transactions never hit a stale
    /// snapshot.
    async fn begin(slot: &Slot) -> Result<Self, StoreError> {
        let guard = Arc::clone(slot).lock_owned().await;
        if guard.is_none() {
            return Err(closed());
        }
        // Made before `BEGIN` is sent: a cancelled `BEGIN` is rolled back too.
        let mut tx = Self {
            guard: Some(guard),
            open: true,
            audited: false,
        };
        sqlx::query("BEGIN IMMEDIATE").execute(tx.conn()).await?;
        Ok(tx)
    }

    /// The writer connection, inside the transaction.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        self.guard
            .as_mut()
            .and_then(|g| g.as_mut())
            .expect("a transaction holds an open connection")
    }

    /// Marks this transaction as one that wrote audit events.
    pub(super) fn audited(&mut self) {
        self.audited = true;
    }

    /// Commits, and hands `out` back as the transaction's result.
    pub(crate) async fn commit<T>(mut self, out: T) -> Result<Committed<T>, StoreError> {
        sqlx::query("COMMIT").execute(self.conn()).await?;
        self.open = false;
        Ok(Committed {
            out,
            audited: self.audited,
        })
    }
}

impl std::ops::Deref for Tx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.guard
            .as_ref()
            .and_then(|g| g.as_ref())
            .expect("a transaction holds an open connection")
    }
}

impl std::ops::DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn()
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        if !self.open {
            return;
        }
        // Rolled back from a task that holds the writer's lock until it is done. `ROLLBACK`
        // also answers (with an error, ignored) when `BEGIN` never ran or `COMMIT` already
        // went through. Without a runtime (the process ending), the connection is closed,
        // which rolls back too.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Some(conn) = guard.as_mut() {
                        let _ = sqlx::query("ROLLBACK").execute(conn).await;
                    }
                });
            }
            Err(_) => drop(guard.take()),
        }
    }
}

/// The engine's reading connection, this caller's until dropped ([`Store::read`]).
pub(crate) struct Reader<'a> {
    guard: MutexGuard<'a, Option<SqliteConnection>>,
}

impl std::ops::Deref for Reader<'_> {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.guard.as_ref().expect("checked open in Store::read")
    }
}

impl std::ops::DerefMut for Reader<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.guard.as_mut().expect("checked open in Store::read")
    }
}

impl Store {
    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer connection; `f` ends with
    /// [`Tx::commit`]. An error from `f` (or a panic, or this future dropped) rolls it back
    /// and nothing of it is kept. When `f` wrote audit events, subscribers are told after the
    /// commit (`publish`). Writers wait for the connection in arrival order.
    ///
    /// `f` is called again for each try (see `health::Retry`), so it captures references:
    /// `self.write(|mut db| async move { ...; db.commit(out).await })`.
    pub(crate) async fn write<T, F, Fut>(&self, mut f: F) -> Result<T, StoreError>
    where
        F: FnMut(Tx) -> Fut,
        Fut: Future<Output = Result<Committed<T>, StoreError>>,
    {
        // Inside a rollout's task a write that fails on the storage is waited out
        // (`health::Retry`): `f` runs again on each try, in a new transaction.
        let mut retry = super::health::Retry::new(&self.health);
        let done = loop {
            let tried = async {
                let tx = Tx::begin(&self.writer.conn).await?;
                #[cfg(feature = "testing")]
                if self.health.fault.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(super::health::injected_fault());
                }
                f(tx).await
            }
            .await;
            match retry.after(tried) {
                super::health::Then::Return(done) => break done?,
                super::health::Then::RetryIn(wait) => tokio::time::sleep(wait).await,
            }
        };
        if done.audited {
            self.publish().await;
        }
        Ok(done.out)
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

    /// The writer connection, once it is this caller's turn, outside any transaction: the
    /// benches' bulk fill runs its own transactions and pragmas there. It publishes nothing.
    #[cfg(feature = "testing")]
    pub(crate) async fn writer(
        &self,
    ) -> Result<OwnedMutexGuard<Option<SqliteConnection>>, StoreError> {
        let guard = Arc::clone(&self.writer.conn).lock_owned().await;
        if guard.is_none() {
            return Err(closed());
        }
        Ok(guard)
    }

    /// The engine's reading connection, once it is this caller's turn: a rollout's own small
    /// reads. Each statement reads one consistent snapshot of what is committed.
    pub(crate) async fn read(&self) -> Result<Reader<'_>, StoreError> {
        let guard = self.reader.conn.lock().await;
        if guard.is_none() {
            return Err(closed());
        }
        Ok(Reader { guard })
    }

    /// Runs one statement that changes rows on its own (no audit event), in a transaction
    /// of its own; the rows it changed. `bind` adds the statement's arguments.
    pub(crate) async fn write_one<'q>(
        &self,
        sql: &'q str,
        bind: impl Fn(
            sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        )
            -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<u64, StoreError> {
        self.write(|mut db| {
            let q = bind(sqlx::query(sql));
            async move {
                let n = q.execute(&mut *db).await?.rows_affected();
                db.commit(n).await
            }
        })
        .await
    }
}
