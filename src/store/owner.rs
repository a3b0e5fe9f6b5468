//! One daemon per database file (safety rule 17), whatever path names it.
//!
//! The process that opens a database holds an exclusive OS lock (`flock`, through
//! `std::fs::File::try_lock`) on the database file itself for the store's whole life. The
//! lock belongs to the file, not to a name: a symlink, a hard link or a `..` spelling of the
//! path all reach the same inode and find the same lock, so a second process is refused
//! before it opens SQLite, and migrates, recovers and drives nothing. SQLite's own locks are
//! POSIX record locks, which Linux keeps apart from `flock`, so the two never meet. The OS
//! drops the lock with the process, however it ends (a `kill -9` included), so nothing stale
//! ever blocks a restart, and there is no lock file beside the database to follow or clobber.
//! The owner's pid is read from the kernel's table of locks (`/proc/locks`), keyed by the
//! file's device and inode.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::Duration;

use super::StoreError;

/// How often a start that waits for the owner tries the lock again.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// The held lock; dropping it (or closing the store) releases the database.
#[derive(Debug)]
pub(super) struct Owner {
    _file: File,
}

impl Owner {
    /// Takes the database at `db` (created empty when missing, as SQLite would) for this
    /// process. When another process owns it, tries again every 100 ms for `wait` (zero:
    /// once), then fails `InUse` naming the owner.
    pub(super) async fn acquire(db: &Path, wait: Duration) -> Result<Owner, StoreError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut told = false;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(db)
                .map_err(|e| lock_error(db, e))?;
            match file.try_lock() {
                Ok(()) => return Ok(Owner { _file: file }),
                Err(TryLockError::Error(e)) => return Err(lock_error(db, e)),
                Err(TryLockError::WouldBlock) => {}
            }
            let owner = owner_of(&file);
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
}

/// Who holds the `flock` on `file`: `canaryd pid N`, read from `/proc/locks` by the file's
/// device and inode (a placeholder where the kernel does not say).
fn owner_of(file: &File) -> String {
    let pid = file.metadata().ok().and_then(|m| {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(
            &locks,
            std::os::unix::fs::MetadataExt::dev(&m),
            std::os::unix::fs::MetadataExt::ino(&m),
        )
    });
    match pid {
        Some(pid) => format!("canaryd pid {pid}"),
        None => "another canaryd (its pid is not known)".to_owned(),
    }
}

/// The pid of the exclusive `flock` on the file `dev`/`ino` in `/proc/locks`'s text, whose
/// lines read `1: FLOCK  ADVISORY  WRITE 1869 fe:00:5308843 0 EOF` (major and minor in hex,
/// the inode in decimal).
fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    // Linux's encoding of a device number (glibc's `gnu_dev_major` / `gnu_dev_minor`).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "FLOCK", _, "WRITE", pid, id, ..] if *id == want => pid.parse().ok(),
            _ => None,
        }
    })
}

fn lock_error(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Lock(format!("cannot lock the database {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_owner(refused: Result<Owner, StoreError>) -> (String, String) {
        match refused {
            Err(StoreError::InUse { path, owner }) => (path, owner),
            other => panic!("a second owner is refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_second_owner_is_refused_naming_the_first_then_takes_over_once_it_is_gone() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("canaryd.db");
        let first = Owner::acquire(&db, Duration::ZERO).await.expect("first");
        let (path, owner) = refused_owner(Owner::acquire(&db, Duration::ZERO).await);
        assert_eq!(path, db.display().to_string());
        assert_eq!(owner, format!("canaryd pid {}", std::process::id()));
        drop(first);
        Owner::acquire(&db, Duration::ZERO)
            .await
            .expect("the database is free once its owner is gone");
    }

    #[tokio::test]
    async fn every_alias_of_the_file_is_refused_like_the_file_itself() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("canaryd.db");
        let _first = Owner::acquire(&db, Duration::ZERO).await.expect("first");
        let other = dir.path().join("other");
        std::fs::create_dir(&other).expect("other dir");
        let symlink = other.join("via-symlink.db");
        std::os::unix::fs::symlink(&db, &symlink).expect("symlink");
        let hard = other.join("via-hard-link.db");
        std::fs::hard_link(&db, &hard).expect("hard link");
        let dotted = other.join("..").join("canaryd.db");
        for alias in [&symlink, &hard, &dotted] {
            let (path, owner) = refused_owner(Owner::acquire(alias, Duration::ZERO).await);
            assert_eq!(path, alias.display().to_string());
            assert_eq!(
                owner,
                format!("canaryd pid {}", std::process::id()),
                "{alias:?}"
            );
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("list").count(),
            2,
            "no lock file was written beside the database"
        );
    }

    #[test]
    fn the_holder_is_read_by_device_and_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 fe:00:77 0 EOF\n\
                     2: FLOCK  ADVISORY  READ 11 fe:00:77 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 12 fe:00:78 0 EOF\n\
                     4: FLOCK  ADVISORY  WRITE 13 fe:00:77 0 EOF\n";
        let dev = 0xfe << 8;
        assert_eq!(flock_holder(locks, dev, 77), Some(13));
        assert_eq!(flock_holder(locks, dev, 79), None);
        // A large major and minor: 259:65536.
        let dev = (259 << 8) | ((65536 & !0xff) << 12);
        let locks = "1: FLOCK  ADVISORY  WRITE 14 103:10000:5 0 EOF";
        assert_eq!(flock_holder(locks, dev, 5), Some(14));
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
