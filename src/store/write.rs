//! Write transactions in one hop (issue 17).
//!
//! sqlx runs every statement of a connection on that connection's own thread: a statement,
//! a `BEGIN` and a `COMMIT` are each a message to that thread and a wake-up back, about
//! 190 µs apiece when 200 canaries start at once, and the one writer connection serialises
//! them all. [`Store::write`] instead borrows the writer's SQLite handle from sqlx
//! (`lock_handle`: one message) and runs the whole transaction on the calling thread through
//! rusqlite: `BEGIN IMMEDIATE`, the caller's statements, `COMMIT`, with no hop between them.
//! A transaction never awaits, so it is never held across a network call and a cancelled
//! future cannot leave one half-done.

use std::cell::Cell;

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

impl Store {
    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer connection and commits;
    /// an error from `f` (or a panic) rolls it back and nothing of it is kept. When `f` wrote
    /// audit events, subscribers are told after the commit (`publish`).
    pub(crate) async fn write<T>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.writer().acquire().await?;
        let out = {
            let mut handle = conn.lock_handle().await?;
            // SAFETY: while `handle` lives, sqlx's worker thread makes no call on this
            // connection or its statements (`LockedSqliteHandle`'s contract). `db` is dropped
            // at the end of this block, before `handle`; a connection made by `from_handle`
            // never closes the handle, and it registers no hook on it (rusqlite's `hooks`
            // feature is off). The transaction is over (committed or rolled back) when `db`
            // drops, so sqlx gets the connection back as it lent it.
            let mut db = unsafe { Connection::from_handle(handle.as_raw_handle().as_ptr()) }?;
            in_transaction(&mut db, f)
        };
        drop(conn);
        let (out, audited) = out?;
        if audited {
            self.publish().await;
        }
        Ok(out)
    }
}

/// The result of `f` once committed, and whether it wrote audit events.
fn in_transaction<T>(
    db: &mut Connection,
    f: impl FnOnce(&Tx<'_>) -> Result<T, StoreError>,
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
