//! The store's own connections: the one that writes and the engine's reader, each a sqlx
//! connection behind an async lock handed out in arrival order.
//!
//! [`Store::write`] runs one transaction on the writer: `BEGIN IMMEDIATE`, the caller's
//! statements (prepared once per connection and kept in sqlx's statement cache), `COMMIT`,
//! sent to sqlx's worker thread together as far as the caller's reads allow ([`Tx`]).
//! Between them it awaits nothing but the database, so a transaction is never held across a
//! network call. Its [`Tx`] owns the writer's lock for as long as the transaction is open:
//! dropped without [`Tx::commit`] (an error, a panic, or the caller's future cancelled at any
//! await), it issues `ROLLBACK` from a task of its own that still holds the lock, so no other
//! writer ever sees a half-done transaction, and none starts before the rollback ran.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use std::borrow::Cow;

use futures_util::TryStreamExt;
use sqlx::encode::{Encode, IsNull};
use sqlx::sqlite::{
    SqliteArgumentValue, SqliteArguments, SqliteConnectOptions, SqliteConnection,
    SqliteQueryResult, SqliteRow,
};
use sqlx::{Arguments, ConnectOptions, Connection, Either, Executor, FromRow, Row, Sqlite};
use tokio::sync::{Mutex, MutexGuard, OwnedMutexGuard};

use super::record::{AuditEntry, AuditEvent};
use super::{EventBus, Store, StoreError};

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

    /// Opens the writer: as [`OwnedConn::open`], with the table [`Tx::expect_one_changed`]
    /// writes (temporary: this connection's alone, never in the database file).
    pub(super) async fn open_writer(options: &SqliteConnectOptions) -> Result<Self, StoreError> {
        let mut conn = options.connect().await?;
        sqlx::query(&format!(
            "create temp table {GUARD} (id integer primary key, \
             changed integer not null constraint {GUARD} check (changed = 1))"
        ))
        .execute(&mut conn)
        .await?;
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

/// The writer's own temporary table behind [`Tx::expect_one_changed`]: one row, whose
/// check fails for anything but one row changed.
const GUARD: &str = "expected_change";

/// Whether `e` is a failed [`Tx::expect_one_changed`].
fn is_unexpected_change(e: &StoreError) -> bool {
    matches!(e, StoreError::Sqlx(sqlx::Error::Database(d)) if d.message().contains(GUARD))
}

/// A write transaction on the writer connection ([`Store::write`]), run in as few trips to
/// sqlx's worker thread as its reads allow.
///
/// [`Tx::query`] queues a statement with its arguments; nothing is sent yet. A statement
/// whose answer the caller needs ([`Stmt::execute`], [`Stmt::fetch_one`],
/// [`Stmt::fetch_optional`], [`Stmt::fetch_all`]) is sent together with everything queued
/// before it, as one multi-statement query (the first one opened by `BEGIN IMMEDIATE`), and
/// [`Tx::commit`] sends what is left with `COMMIT`: a transaction that reads nothing in the
/// middle is one round trip. An error from a queued statement surfaces at the next send.
///
/// It also keeps the audit events the transaction wrote ([`Tx::audited`], called by
/// `audit::append`), each with the sequence number SQLite gave it (the insert's `returning
/// seq`, read from the same send), and whether it wrote a notification to the outbox
/// ([`Tx::notified`]). Once `COMMIT` succeeded, still holding the writer's lock, it hands the
/// events to subscribers (`Store::subscribe`) and wakes the notifier: commits are in the
/// writer's order, so subscribers get every event once, in sequence order, with no read.
pub(crate) struct Tx {
    /// The writer's lock, held until the transaction is committed or rolled back.
    guard: Option<OwnedMutexGuard<Option<SqliteConnection>>>,
    /// Until `COMMIT` succeeded: dropping rolls back.
    open: bool,
    /// `BEGIN IMMEDIATE` was sent (it opens the first send).
    begun: bool,
    /// Not the transaction's first try: see [`Tx::careful`].
    careful: bool,
    /// Where committed audit events go, and the notifier's wake.
    bus: Arc<EventBus>,
    /// The audit events written so far, in order; the first `numbered` have their `seq`.
    events: Vec<AuditEvent>,
    numbered: usize,
    /// The queued statements (by position in the queue) whose rows are audit sequence
    /// numbers.
    returning: Vec<usize>,
    /// An outbox row was written.
    notified: bool,
    /// Statements queued and not yet sent, each ended by `;`, and how many.
    sql: String,
    queued: usize,
    /// Their arguments, in order (`?` placeholders only: sqlx binds a multi-statement
    /// query's arguments statement after statement).
    args: Vec<SqliteArgumentValue<'static>>,
}

/// A transaction's result once committed: only [`Tx::commit`] makes one, so a closure given
/// to [`Store::write`] cannot end without committing or failing.
pub(crate) struct Committed<T> {
    out: T,
}

/// One statement queued in a [`Tx`]: its arguments are added with [`Stmt::bind`]; left as
/// it is, it is sent with the transaction's next send.
pub(crate) struct Stmt<'t> {
    tx: &'t mut Tx,
}

impl Stmt<'_> {
    /// Adds the next `?`'s value (copied: the statement outlives the caller's borrow).
    pub(crate) fn bind<'q, V: Encode<'q, Sqlite>>(self, value: V) -> Self {
        let mut buf: Vec<SqliteArgumentValue<'q>> = Vec::with_capacity(1);
        match value.encode(&mut buf) {
            Ok(IsNull::No) => self.tx.args.extend(buf.into_iter().map(owned)),
            // Encoding into a buffer of values does not fail for the types the store binds;
            // a value that did would read as NULL.
            Ok(IsNull::Yes) | Err(_) => self.tx.args.push(SqliteArgumentValue::Null),
        }
        self
    }

    /// Sends it (with what is queued before it); its result: the rows it changed.
    pub(crate) async fn execute(self) -> Result<SqliteQueryResult, StoreError> {
        let (done, _) = self.tx.send(None).await?;
        Ok(done)
    }

    /// Sends it (with what is queued before it); all its rows.
    pub(crate) async fn fetch_all<R>(self) -> Result<Vec<R>, StoreError>
    where
        R: for<'r> FromRow<'r, SqliteRow>,
    {
        let (_, rows) = self.tx.send(None).await?;
        rows.iter()
            .map(|r| R::from_row(r).map_err(StoreError::from))
            .collect()
    }

    /// Sends it (with what is queued before it); its first row, if any.
    pub(crate) async fn fetch_optional<R>(self) -> Result<Option<R>, StoreError>
    where
        R: for<'r> FromRow<'r, SqliteRow>,
    {
        let (_, rows) = self.tx.send(None).await?;
        rows.first()
            .map(|r| R::from_row(r).map_err(StoreError::from))
            .transpose()
    }

    /// Sends it (with what is queued before it); its first row, which must exist.
    pub(crate) async fn fetch_one<R>(self) -> Result<R, StoreError>
    where
        R: for<'r> FromRow<'r, SqliteRow>,
    {
        self.fetch_optional()
            .await?
            .ok_or(StoreError::Sqlx(sqlx::Error::RowNotFound))
    }
}

/// `v` with its own copy of any borrowed text or bytes.
fn owned(v: SqliteArgumentValue<'_>) -> SqliteArgumentValue<'static> {
    match v {
        SqliteArgumentValue::Null => SqliteArgumentValue::Null,
        SqliteArgumentValue::Text(t) => SqliteArgumentValue::Text(Cow::Owned(t.into_owned())),
        SqliteArgumentValue::Blob(b) => SqliteArgumentValue::Blob(Cow::Owned(b.into_owned())),
        SqliteArgumentValue::Double(d) => SqliteArgumentValue::Double(d),
        SqliteArgumentValue::Int(i) => SqliteArgumentValue::Int(i),
        SqliteArgumentValue::Int64(i) => SqliteArgumentValue::Int64(i),
    }
}

/// `values` as sqlx's arguments of one query.
fn arguments(values: Vec<SqliteArgumentValue<'static>>) -> SqliteArguments<'static> {
    let mut args = SqliteArguments::default();
    args.reserve(values.len(), 0);
    for v in values {
        // Adding a plain value to SQLite's arguments does not fail.
        let _ = match v {
            SqliteArgumentValue::Null => args.add(None::<i64>),
            SqliteArgumentValue::Text(t) => args.add(t),
            SqliteArgumentValue::Blob(b) => args.add(b.into_owned()),
            SqliteArgumentValue::Double(d) => args.add(d),
            SqliteArgumentValue::Int(i) => args.add(i),
            SqliteArgumentValue::Int64(i) => args.add(i),
        };
    }
    args
}

impl Tx {
    /// Takes the writer's lock (in arrival order). `BEGIN IMMEDIATE` opens the first send:
    /// the write lock of the database is taken before the transaction's first statement, so
    /// read-then-write transactions never hit a stale snapshot.
    async fn begin(slot: &Slot, bus: &Arc<EventBus>) -> Result<Self, StoreError> {
        let guard = Arc::clone(slot).lock_owned().await;
        if guard.is_none() {
            return Err(closed());
        }
        Ok(Self {
            guard: Some(guard),
            open: true,
            begun: false,
            careful: false,
            bus: Arc::clone(bus),
            events: Vec::new(),
            numbered: 0,
            returning: Vec::new(),
            notified: false,
            sql: String::new(),
            queued: 0,
            args: Vec::new(),
        })
    }

    /// Queues statement `sql` (one statement, `?` placeholders); see [`Stmt`].
    pub(crate) fn query(&mut self, sql: &str) -> Stmt<'_> {
        self.push(sql);
        Stmt { tx: self }
    }

    fn push(&mut self, sql: &str) {
        self.sql.push_str(sql);
        self.sql.push_str(";\n");
        self.queued += 1;
    }

    /// Sends every queued statement (and `tail`, if any) as one query; the result and the
    /// rows of the last statement before `tail`.
    async fn send(
        &mut self,
        tail: Option<&str>,
    ) -> Result<(SqliteQueryResult, Vec<SqliteRow>), StoreError> {
        let mut sql = String::with_capacity(self.sql.len() + 20);
        // Statements whose result is not the caller's: `BEGIN IMMEDIATE` and all queued
        // before the last.
        let mut skip = self.queued.saturating_sub(1);
        // Statements sent before the first queued one.
        let mut first = 0;
        if !self.begun {
            sql.push_str("BEGIN IMMEDIATE;\n");
            skip += 1;
            first = 1;
        }
        let returning = std::mem::take(&mut self.returning);
        sql.push_str(&self.sql);
        if let Some(tail) = tail {
            sql.push_str(tail);
        }
        let args = arguments(std::mem::take(&mut self.args));
        self.sql.clear();
        self.queued = 0;
        // Set before it is sent: a send cancelled half-way is rolled back too.
        self.begun = true;
        let conn = self.conn();
        let mut stream = conn.fetch_many(sqlx::query_with(&sql, args));
        let mut done = SqliteQueryResult::default();
        let mut rows = Vec::new();
        let mut ended = 0;
        let mut seqs = Vec::new();
        while let Some(item) = stream.try_next().await? {
            match item {
                Either::Left(r) => {
                    if ended == skip {
                        done = r;
                    }
                    ended += 1;
                }
                Either::Right(row) => {
                    if ended >= first && returning.contains(&(ended - first)) {
                        seqs.push(row.try_get::<i64, _>(0)?);
                    }
                    if ended == skip {
                        rows.push(row);
                    }
                }
            }
        }
        drop(stream);
        for seq in seqs {
            if let Some(e) = self.events.get_mut(self.numbered) {
                e.seq = seq;
                self.numbered += 1;
            }
        }
        Ok((done, rows))
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        self.guard
            .as_mut()
            .and_then(|g| g.as_mut())
            .expect("a transaction holds an open connection")
    }

    /// Whether this is a try after a failed [`Tx::expect_one_changed`]: the caller then
    /// awaits each update's answer instead of expecting it.
    pub(super) fn careful(&self) -> bool {
        self.careful
    }

    /// Queues a check that the statement queued last changed exactly one row; when it did
    /// not, the transaction fails at its next send, is rolled back, and [`Store::write`]
    /// runs it again at once with [`Tx::careful`] set.
    pub(super) fn expect_one_changed(&mut self) {
        self.push(&format!(
            "insert or replace into temp.{GUARD} (id, changed) values (1, changes())"
        ));
    }

    /// Records `e` as the audit event the statement queued last inserts (its rows: the
    /// event's sequence number).
    pub(super) fn audited(&mut self, e: &AuditEntry) {
        self.returning.push(self.queued.saturating_sub(1));
        self.events.push(e.stored(0));
    }

    /// Records that the transaction wrote a notification to the outbox.
    pub(super) fn notified(&mut self) {
        self.notified = true;
    }

    /// Sends what is queued and `COMMIT` (one round trip; none for a transaction that
    /// wrote nothing), and hands `out` back as the transaction's result.
    pub(crate) async fn commit<T>(mut self, out: T) -> Result<Committed<T>, StoreError> {
        if self.begun || self.queued > 0 {
            self.send(Some("COMMIT;")).await?;
        }
        self.committed();
        Ok(Committed { out })
    }

    /// [`Tx::commit`] answering the rows changed by the last statement queued.
    async fn commit_changes(mut self) -> Result<Committed<u64>, StoreError> {
        let (done, _) = self.send(Some("COMMIT;")).await?;
        self.committed();
        Ok(Committed {
            out: done.rows_affected(),
        })
    }

    /// After `COMMIT` succeeded, with the writer's lock still held: the audit events go to
    /// subscribers in the order they were written, and the notifier is woken when there is
    /// a new notification.
    fn committed(&mut self) {
        self.open = false;
        if self.numbered != self.events.len() {
            // Never expected (each insert answers its number); the events are not sent
            // without one, and subscribers that need every event catch up on the
            // database from their last number when they see a gap.
            tracing::error!(
                written = self.events.len(),
                numbered = self.numbered,
                "audit events committed without their sequence number"
            );
        }
        for e in self.events.drain(..self.numbered) {
            // No subscriber is not an error.
            let _ = self.bus.tx.send(e);
        }
        if self.notified {
            self.bus.outbox.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        if !self.open || !self.begun {
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
    /// and nothing of it is kept. The audit events `f` wrote go to subscribers at the commit
    /// ([`Tx::commit`]). Writers wait for the connection in arrival order.
    ///
    /// `f` is called again for each try (see `health::Retry`, and [`Tx::careful`] after an
    /// expected change that did not happen), so it captures references:
    /// `self.write(|mut db| async move { ...; db.commit(out).await })`.
    pub(crate) async fn write<T, F, Fut>(&self, mut f: F) -> Result<T, StoreError>
    where
        F: FnMut(Tx) -> Fut,
        Fut: Future<Output = Result<Committed<T>, StoreError>>,
    {
        // Inside a rollout's task a write that fails on the storage is waited out
        // (`health::Retry`): `f` runs again on each try, in a new transaction.
        let mut retry = super::health::Retry::new(&self.health);
        let mut careful = false;
        let done = loop {
            let tried = async {
                let mut tx = Tx::begin(&self.writer.conn, &self.bus).await?;
                tx.careful = careful;
                #[cfg(feature = "testing")]
                if self.health.fault.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(super::health::injected_fault());
                }
                f(tx).await
            }
            .await;
            if !careful && tried.as_ref().is_err_and(is_unexpected_change) {
                careful = true;
                continue;
            }
            match retry.after(tried) {
                super::health::Then::Return(done) => break done?,
                super::health::Then::RetryIn(wait) => tokio::time::sleep(wait).await,
            }
        };
        Ok(done.out)
    }

    /// While a write has failed on the storage and no rollout waits to retry one of its own,
    /// rewrites the probe row every `every`: the first one that goes through clears the
    /// failure, so `/readyz` comes back by itself once the disk has room, with no other write
    /// (safety rule 18). A probe that fails is neither counted nor logged above debug.
    pub async fn watch_storage_recovery(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.health.failing().is_none_or(|f| f.waiting != 0) {
                continue;
            }
            match self.probe_write().await {
                Ok(()) => {
                    self.health.succeeded(None);
                    tracing::warn!("the database can be written again");
                }
                Err(e) => tracing::debug!(error = %e, "the database still cannot be written"),
            }
        }
    }

    async fn probe_write(&self) -> Result<(), StoreError> {
        let mut tx = Tx::begin(&self.writer.conn, &self.bus).await?;
        #[cfg(feature = "testing")]
        if self.health.fault.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(super::health::injected_fault());
        }
        tx.query(
            "insert into storage_probe (id, at) values (1, ?) \
             on conflict (id) do update set at = excluded.at",
        )
        .bind(super::fmt_time(chrono::Utc::now()));
        tx.commit(()).await.map(|_| ())
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
    /// of its own (one round trip); the rows it changed. `bind` adds the statement's
    /// arguments.
    pub(crate) async fn write_one(
        &self,
        sql: &str,
        bind: impl for<'t> Fn(Stmt<'t>) -> Stmt<'t>,
    ) -> Result<u64, StoreError> {
        self.write(|mut db| {
            bind(db.query(sql));
            db.commit_changes()
        })
        .await
    }
}
