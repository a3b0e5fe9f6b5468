//! What the store knows of its own writes failing (safety rule 18), kept in memory because
//! the database is what cannot be written.
//!
//! A write made inside a rollout's task (`for_rollout`) that fails on the storage itself (a
//! full disk, an I/O error, a read-only file) is retried by `Store::write` with capped backoff
//! for as long as it fails: the task waits in that write, so it sends nothing more to its host,
//! and records what it knows once the write goes through. Meanwhile this registry says so:
//! `/readyz` answers 503 naming the error, `/metrics` counts the errors and the rollouts
//! waiting, `/v1/replicas` shows a replica left down when a waiting rollout's last call was a
//! successful `down` of it, and the notifier sends one alert per waiting rollout from here. A
//! write outside a rollout's task (an API request) fails at once, and is counted.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::StoreError;

/// The last compose call of a rollout whose outcome its task knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastCall {
    /// `compose/down`, `compose/up`, `compose/up (dry run)`.
    pub endpoint: String,
    /// The services the call named.
    pub services: Vec<String>,
    /// `succeeded`, `failed`, `unknown`, `busy`, `error`, `not_sent`.
    pub outcome: String,
    pub at: DateTime<Utc>,
}

impl LastCall {
    /// A `down` of `service` alone that succeeded: the replica is down.
    pub fn took_down(&self, service: &str) -> bool {
        self.endpoint == "compose/down" && self.outcome == "succeeded" && self.services == [service]
    }
}

/// A rollout whose task waits for a write to go through.
#[derive(Debug, Clone)]
pub struct WaitingRollout {
    pub rollout_id: String,
    pub host: String,
    /// The replica (its slot in the config).
    pub service: String,
    /// The compose name the rollout acts on (the slot's, or a former or new name).
    pub target: String,
    pub last_call: Option<LastCall>,
    /// The first failure of this wait, and the latest error.
    pub since: DateTime<Utc>,
    pub error: String,
    /// Whether the notifier has sent its alert.
    pub announced: bool,
}

/// The storage's state as `/readyz` tells it.
#[derive(Debug, Clone)]
pub struct Failing {
    pub error: String,
    pub since: DateTime<Utc>,
    pub waiting: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Set by a failed write, cleared by a write that succeeds while no rollout waits.
    failing: Option<(String, DateTime<Utc>)>,
    waiting: BTreeMap<String, WaitingRollout>,
}

/// The registry, one per store (shared by its clones).
#[derive(Debug, Default)]
pub struct StorageHealth {
    state: Mutex<State>,
    /// True while `state` has anything to clear: a healthy write checks only this.
    troubled: AtomicBool,
    errors_total: AtomicU64,
    /// Rung when a rollout starts waiting (the notifier's alert).
    pub(crate) alerts: tokio::sync::Notify,
    #[cfg(feature = "testing")]
    pub(super) fault: AtomicBool,
}

impl StorageHealth {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes that failed on the storage since start.
    pub fn errors_total(&self) -> u64 {
        self.errors_total.load(Ordering::Relaxed)
    }

    /// `Some` while writes fail.
    pub fn failing(&self) -> Option<Failing> {
        let state = self.state();
        state.failing.as_ref().map(|(error, since)| Failing {
            error: error.clone(),
            since: *since,
            waiting: state.waiting.len(),
        })
    }

    /// The rollouts waiting for a write, oldest wait first.
    pub fn waiting(&self) -> Vec<WaitingRollout> {
        let mut all: Vec<_> = self.state().waiting.values().cloned().collect();
        all.sort_by_key(|w| w.since);
        all
    }

    /// (host, service) of each replica a waiting rollout took down with its last call.
    pub fn unrecorded_downs(&self) -> Vec<(String, String)> {
        self.state()
            .waiting
            .values()
            .filter(|w| w.last_call.as_ref().is_some_and(|c| c.took_down(&w.target)))
            .map(|w| (w.host.clone(), w.service.clone()))
            .collect()
    }

    /// The waiting rollouts not announced yet, marked announced.
    pub fn take_unannounced(&self) -> Vec<WaitingRollout> {
        let mut state = self.state();
        state
            .waiting
            .values_mut()
            .filter(|w| !w.announced)
            .map(|w| {
                w.announced = true;
                w.clone()
            })
            .collect()
    }

    /// A write failed on the storage; `rollout` is the task's own context when it will retry.
    fn failed(&self, error: &StoreError, rollout: Option<&RolloutWrites>) {
        self.errors_total.fetch_add(1, Ordering::Relaxed);
        self.troubled.store(true, Ordering::Release);
        let now = Utc::now();
        let error = error.to_string();
        let mut state = self.state();
        match &mut state.failing {
            Some((latest, _)) => latest.clone_from(&error),
            None => state.failing = Some((error.clone(), now)),
        }
        let Some(rollout) = rollout else { return };
        let known = rollout.known();
        let first = !state.waiting.contains_key(&*rollout.id);
        let entry = state
            .waiting
            .entry(rollout.id.to_string())
            .or_insert_with(|| WaitingRollout {
                rollout_id: rollout.id.to_string(),
                host: String::new(),
                service: String::new(),
                target: String::new(),
                last_call: None,
                since: now,
                error: error.clone(),
                announced: false,
            });
        entry.host = known.host;
        entry.service = known.service;
        entry.target = known.target;
        entry.last_call = known.last_call;
        entry.error = error;
        drop(state);
        if first {
            self.alerts.notify_one();
        }
    }

    /// A write succeeded; `rollout` when it was that task's (its wait is over).
    pub(super) fn succeeded(&self, rollout: Option<&str>) {
        if !self.troubled.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state();
        if let Some(id) = rollout {
            state.waiting.remove(id);
        }
        if state.waiting.is_empty() {
            state.failing = None;
            self.troubled.store(false, Ordering::Release);
        }
    }

    /// A task stopped waiting without its write going through (killed, or the store closed).
    fn gave_up(&self, rollout: &str) {
        self.state().waiting.remove(rollout);
    }
}

/// Whether `e` is the storage failing (worth waiting out) rather than a refused change: an
/// SQLite error whose primary result code is `SQLITE_FULL`, `IOERR`, `READONLY`, `CANTOPEN`,
/// `BUSY`, `LOCKED` or `NOMEM` (sqlx gives the extended code, whose low byte is the primary).
pub(super) fn is_storage_fault(e: &StoreError) -> bool {
    const FAULTS: [i64; 7] = [
        13, // SQLITE_FULL
        10, // SQLITE_IOERR
        8,  // SQLITE_READONLY
        14, // SQLITE_CANTOPEN
        5,  // SQLITE_BUSY
        6,  // SQLITE_LOCKED
        7,  // SQLITE_NOMEM
    ];
    let StoreError::Sqlx(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.code()
        .and_then(|c| c.parse::<i64>().ok())
        .is_some_and(|code| FAULTS.contains(&(code & 0xff)))
}

/// An error as SQLite reports a full disk (`SQLITE_FULL`): what `Store::inject_storage_fault`
/// makes every write fail with.
#[cfg(any(test, feature = "testing"))]
pub(super) fn injected_fault() -> StoreError {
    StoreError::Sqlx(sqlx::Error::Database(Box::new(InjectedFault)))
}

#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
struct InjectedFault;

#[cfg(any(test, feature = "testing"))]
impl std::fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "(code: 13) {}",
            sqlx::error::DatabaseError::message(self)
        )
    }
}

#[cfg(any(test, feature = "testing"))]
impl std::error::Error for InjectedFault {}

#[cfg(any(test, feature = "testing"))]
impl sqlx::error::DatabaseError for InjectedFault {
    fn message(&self) -> &str {
        "database or disk is full (injected)"
    }
    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some("13".into())
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

/// What a rollout's task tells the store of itself, for the writes it makes.
#[derive(Debug)]
pub struct RolloutWrites {
    id: std::sync::Arc<str>,
    retry_initial: Duration,
    retry_max: Duration,
    known: Mutex<Known>,
}

#[derive(Debug, Clone, Default)]
struct Known {
    host: String,
    service: String,
    target: String,
    last_call: Option<LastCall>,
}

impl RolloutWrites {
    fn known(&self) -> Known {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

tokio::task_local! {
    static ROLLOUT: RolloutWrites;
}

/// Runs `f` (a rollout's task) with its writes retried on storage faults, every
/// `retry_initial` doubling up to `retry_max`, for as long as they fail.
pub async fn for_rollout<F: Future>(
    id: &str,
    retry_initial: Duration,
    retry_max: Duration,
    f: F,
) -> F::Output {
    let writes = RolloutWrites {
        id: id.into(),
        retry_initial,
        retry_max,
        known: Mutex::default(),
    };
    ROLLOUT.scope(writes, f).await
}

fn with_known(f: impl FnOnce(&mut Known)) {
    let _ = ROLLOUT.try_with(|w| f(&mut w.known.lock().unwrap_or_else(|e| e.into_inner())));
}

/// Names the current rollout's host, replica and the compose name it acts on.
pub fn note_rollout(host: &str, service: &str, target: &str) {
    with_known(|k| {
        k.host = host.to_owned();
        k.service = service.to_owned();
        k.target = target.to_owned();
    });
}

/// Records, in memory, the outcome of the current rollout's last compose call, before it is
/// written.
pub fn note_call(call: LastCall) {
    with_known(|k| k.last_call = Some(call));
}

/// One write's tries (`Store::write`): inside a rollout's task, storage faults are waited
/// out (see the module's doc); elsewhere they are returned, counted. Dropped while waiting
/// (the task killed), it removes the rollout's wait.
pub(super) struct Retry<'a> {
    health: &'a StorageHealth,
    rollout: Option<(std::sync::Arc<str>, Duration, Duration)>,
    waiting: bool,
    backoff: Option<Duration>,
    logged_at: Option<tokio::time::Instant>,
}

/// What to do after a try.
pub(super) enum Then<T> {
    Return(Result<T, StoreError>),
    RetryIn(Duration),
}

impl<'a> Retry<'a> {
    pub(super) fn new(health: &'a StorageHealth) -> Self {
        let rollout = ROLLOUT
            .try_with(|w| (std::sync::Arc::clone(&w.id), w.retry_initial, w.retry_max))
            .ok();
        Retry {
            health,
            rollout,
            waiting: false,
            backoff: None,
            logged_at: None,
        }
    }

    pub(super) fn after<T>(&mut self, result: Result<T, StoreError>) -> Then<T> {
        let e = match result {
            Ok(out) => {
                let id = self.rollout.as_ref().map(|r| &*r.0);
                self.health.succeeded(id);
                if self.waiting {
                    self.waiting = false;
                    if let Some(id) = id {
                        tracing::warn!(rollout.id = %id, "the database can be written again: rollout {id} records what it knows and goes on");
                    }
                }
                return Then::Return(Ok(out));
            }
            Err(e) if is_storage_fault(&e) => e,
            Err(e) => return Then::Return(Err(e)),
        };
        let Some((id, initial, max)) = &self.rollout else {
            self.health.failed(&e, None);
            tracing::error!(error = %e, "a write to the database failed on the storage");
            return Then::Return(Err(e));
        };
        ROLLOUT.with(|w| self.health.failed(&e, Some(w)));
        self.waiting = true;
        let wait = self.backoff.map_or(*initial, |b| (b * 2).min(*max));
        self.backoff = Some(wait);
        // At least one line a minute while it lasts.
        let due = self
            .logged_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(50) || wait >= *max);
        if due {
            self.logged_at = Some(tokio::time::Instant::now());
            tracing::error!(rollout.id = %id, error = %e, retry_in_ms = wait.as_millis() as u64, "rollout {id} cannot write the database ({e}); it sends nothing more to its host and retries");
        }
        Then::RetryIn(wait)
    }
}

impl Drop for Retry<'_> {
    fn drop(&mut self) {
        if let (true, Some((id, ..))) = (self.waiting, &self.rollout) {
            self.health.gave_up(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn full() -> StoreError {
        injected_fault()
    }

    /// Tries a write that fails `fails` times with `error`; (the result, the waits between tries).
    async fn tried(
        health: &StorageHealth,
        fails: usize,
        error: fn() -> StoreError,
    ) -> (bool, Vec<u128>) {
        let tries = Cell::new(0);
        let mut waits = Vec::new();
        let mut retry = Retry::new(health);
        loop {
            tries.set(tries.get() + 1);
            let result = if tries.get() <= fails {
                Err(error())
            } else {
                Ok(())
            };
            match retry.after(result) {
                Then::Return(r) => return (r.is_ok(), waits),
                Then::RetryIn(wait) => {
                    waits.push(wait.as_millis());
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rollouts_write_that_fails_on_the_storage_is_retried_with_capped_backoff_until_it_goes_through(
    ) {
        let health = StorageHealth::default();
        let ms = Duration::from_millis;
        let (ok, waits) = for_rollout("ro_1", ms(200), ms(1000), tried(&health, 6, full)).await;
        assert!(ok);
        assert_eq!(waits, vec![200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(health.errors_total(), 6);
        assert!(
            health.failing().is_none(),
            "cleared by the write that went through"
        );
        assert!(health.waiting().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_outside_a_rollout_fails_at_once_and_is_counted() {
        let health = StorageHealth::default();
        assert_eq!(tried(&health, 1, full).await, (false, vec![]));
        assert_eq!(health.errors_total(), 1);
        assert!(health.failing().is_some_and(|f| f.waiting == 0));
        assert_eq!(tried(&health, 0, full).await, (true, vec![]));
        assert!(health.failing().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_change_is_not_the_storage_and_is_returned_at_once() {
        let health = StorageHealth::default();
        let refused = || StoreError::NotFound("ro_1".into());
        let ms = Duration::from_millis;
        let out = for_rollout("ro_1", ms(200), ms(1000), tried(&health, 1, refused)).await;
        assert_eq!(out, (false, vec![]));
        assert_eq!(health.errors_total(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_rollout_whose_last_call_took_its_replica_down_shows_it_down() {
        let health = StorageHealth::default();
        let ms = Duration::from_millis;
        let waiting = for_rollout("ro_1", ms(200), ms(200), async {
            note_rollout("gpu02", "r2", "r2");
            note_call(LastCall {
                endpoint: "compose/down".into(),
                services: vec!["r2".into()],
                outcome: "succeeded".into(),
                at: Utc::now(),
            });
            let mut retry = Retry::new(&health);
            assert!(matches!(retry.after::<()>(Err(full())), Then::RetryIn(_)));
            let seen = (health.unrecorded_downs(), health.take_unannounced().len());
            assert!(health.take_unannounced().is_empty(), "announced once");
            seen
        })
        .await;
        assert_eq!(waiting, (vec![("gpu02".into(), "r2".into())], 1));
        assert!(
            health.waiting().is_empty(),
            "a task dropped while waiting leaves no wait"
        );
    }
}
