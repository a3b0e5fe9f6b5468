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

use rusqlite::{Connection, TransactionBehavior};

use super::{Store, StoreError};

impl Store {
    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer connection and commits;
    /// an error from `f` (or a panic) rolls it back and nothing of it is kept. Subscribers are
    /// told after the commit (`publish`), so the audit events `f` wrote reach them.
    pub(crate) async fn write<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
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
        if out.is_ok() {
            self.publish().await;
        }
        out
    }
}

fn in_transaction<T>(
    db: &mut Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    // A `Transaction` that is dropped without `commit` (an error, a panic) rolls back.
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}
