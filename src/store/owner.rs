//! One daemon per database file (safety rule 17).
//!
//! The process that opens a database holds an exclusive OS lock (`flock`, through
//! `std::fs::File::try_lock`) on `<database>.lock` beside it for the store's whole life, and
//! writes its pid and start time there. A second process finds the lock taken and is refused
//! before it opens SQLite, so it migrates nothing, recovers nothing and drives nothing. The OS
//! drops the lock with the process, however it ends (a `kill -9` included), so a stale file
//! never blocks a restart.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::StoreError;

/// How often a start that waits for the owner tries the lock again.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// The held lock; dropping it (or closing the store) releases the database.
#[derive(Debug)]
pub(super) struct Owner {
    _file: File,
}

/// The lock file of the database at `db`.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

impl Owner {
    /// Takes the database at `db` for this process. When another process owns it, tries
    /// again every 100 ms for `wait` (zero: once), then fails `InUse` naming the owner.
    pub(super) async fn acquire(db: &Path, wait: Duration) -> Result<Owner, StoreError> {
        let path = lock_path(db);
        let deadline = tokio::time::Instant::now() + wait;
        let mut told = false;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| lock_error(&path, e))?;
            match file.try_lock() {
                Ok(()) => return Owner::record(file, &path),
                Err(TryLockError::Error(e)) => return Err(lock_error(&path, e)),
                Err(TryLockError::WouldBlock) => {}
            }
            let owner = read_owner(file);
            if tokio::time::Instant::now() + RETRY_EVERY > deadline {
                return Err(StoreError::InUse {
                    path: db.display().to_string(),
                    owner,
                });
            }
            if !told {
                tracing::warn!(database = %db.display(), "database {} is in use by {owner}; waiting up to {} s for it to exit", db.display(), wait.as_secs());
                told = true;
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }

    /// Writes who owns the database now, over what a previous owner left.
    fn record(mut file: File, path: &Path) -> Result<Owner, StoreError> {
        let since = super::fmt_time(chrono::Utc::now());
        let text = format!("pid {} (since {since})\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(text.as_bytes()))
            .map_err(|e| lock_error(path, e))?;
        Ok(Owner { _file: file })
    }
}

/// What the owner wrote: `pid N (since T)`, or a placeholder while it has not written yet.
fn read_owner(mut file: File) -> String {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    match text.trim() {
        "" => "canaryd (pid not recorded yet)".to_owned(),
        owner => format!("canaryd {owner}"),
    }
}

fn lock_error(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Lock(format!("cannot lock {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_owner_is_refused_naming_the_first_then_takes_over_once_it_is_gone() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("canaryd.db");
        let first = Owner::acquire(&db, Duration::ZERO).await.expect("first");
        let refused = Owner::acquire(&db, Duration::ZERO).await;
        let Err(StoreError::InUse { path, owner }) = refused else {
            panic!("a second owner is refused: {refused:?}");
        };
        assert_eq!(path, db.display().to_string());
        assert!(
            owner.starts_with(&format!("canaryd pid {} (since 20", std::process::id())),
            "{owner}"
        );
        drop(first);
        Owner::acquire(&db, Duration::ZERO)
            .await
            .expect("the database is free once its owner is gone");
    }

    #[tokio::test]
    async fn a_start_that_waits_gets_the_database_when_the_owner_lets_go() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("canaryd.db");
        let first = Owner::acquire(&db, Duration::ZERO).await.expect("first");
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(first);
        });
        Owner::acquire(&db, Duration::from_secs(10))
            .await
            .expect("taken once the owner exits");
        release.await.expect("released");
    }

    #[tokio::test]
    async fn a_start_that_waits_too_little_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("canaryd.db");
        let _first = Owner::acquire(&db, Duration::ZERO).await.expect("first");
        let refused = Owner::acquire(&db, Duration::from_millis(250)).await;
        assert!(
            matches!(refused, Err(StoreError::InUse { .. })),
            "{refused:?}"
        );
    }
}
