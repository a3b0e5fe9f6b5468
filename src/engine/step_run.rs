//! What every step executor shares: how a step ends ([`StepEnd`]), the state a rollout carries
//! from step to step ([`StepRun`]), the [`Execute`] trait each kind implements, and the waits'
//! helpers. Step modules import from here; the dispatch (`steps.rs`) imports them, so imports
//! inside `engine/` point one way.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{merged_env, Engine, HostRuntime};
use crate::compose::{LogsRequest, PsEntry};
use crate::config::EngineTuning;
use crate::domain::error_code::ErrorCode;
use crate::store::{Rollout, Step};

/// How a step ended.
#[derive(Debug)]
pub(crate) enum StepEnd {
    Succeeded(serde_json::Value),
    Failed {
        code: ErrorCode,
        message: String,
        detail: serde_json::Value,
    },
    Aborted(serde_json::Value),
}

impl StepEnd {
    pub(crate) fn failed(
        code: ErrorCode,
        message: impl Into<String>,
        detail: serde_json::Value,
    ) -> Self {
        StepEnd::Failed {
            code,
            message: message.into(),
            detail,
        }
    }
}

/// The step being run: its row, its persisted deadline and the rollout's abort signal.
pub(crate) struct Running<'s> {
    pub step: &'s Step,
    pub deadline: DateTime<Utc>,
    pub abort: &'s mut watch::Receiver<bool>,
}

/// How the engine runs one step kind (`crate::domain::runbook::step`): implemented next to
/// the executor, dispatched by `steps.rs` from the kinds' registration list.
pub(crate) trait Execute {
    /// Runs the step until it ends.
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd;

    /// What a succeeded step leaves for the next ones (also rebuilt from its stored detail on
    /// resume). Nothing by default.
    fn carry(_run: &mut StepRun<'_>, _step: &Step, _detail: &serde_json::Value) {}
}

/// State carried from step to step within one rollout (rebuilt from SQLite on resume).
pub(crate) struct StepRun<'a> {
    pub engine: &'a Engine,
    pub rollout: Rollout,
    pub host: &'a HostRuntime,
    pub env: BTreeMap<String, String>,
    /// `docker ps` as the snapshot step saw it.
    pub snapshot: Option<Vec<PsEntry>>,
    /// Whether the first compose call already checked that an unknown outcome before this
    /// rollout has settled (safety rule 13).
    pub settle_checked: std::sync::atomic::AtomicBool,
    /// When the target's `up` ended: its engine has run since (restart detection).
    pub up_done_at: Option<DateTime<Utc>>,
    /// Companion gates passed in this rollout: the step's `services` → what its dry run
    /// planned (what a reconcile `up` applies).
    pub companion_plans: BTreeMap<Vec<String>, Vec<String>>,
}

impl<'a> StepRun<'a> {
    pub(crate) fn new(engine: &'a Engine, rollout: &Rollout) -> Self {
        let host = engine.inner.hosts.get(&rollout.host);
        let host = host.unwrap_or_else(|| {
            // The plan was validated against the config; a host removed from the config since
            // is a configuration error the operator must fix. Fall back to any host so the
            // executors fail cleanly on the first call instead of panicking.
            engine
                .inner
                .hosts
                .values()
                .next()
                .expect("canaryd runs with at least one host")
        });
        let env = merged_env(&host.config, &rollout.env_overrides);
        Self {
            engine,
            rollout: rollout.clone(),
            host,
            env,
            snapshot: None,
            settle_checked: std::sync::atomic::AtomicBool::new(false),
            up_done_at: None,
            companion_plans: BTreeMap::new(),
        }
    }
}

impl StepRun<'_> {
    /// A replica's health URL, when configured.
    pub(super) fn health_url(&self, service: &str) -> Option<&str> {
        self.host
            .config
            .replicas
            .get(service)
            .map(|r| r.health_url.as_str())
    }

    /// The target's health URL, or the step's failure when it has none.
    pub(super) fn target_health_url(&self) -> Result<crate::probe::HealthUrl, StepEnd> {
        self.health_url(&self.rollout.service)
            .map(|url| crate::probe::HealthUrl::new(url.to_owned()))
            .ok_or_else(|| {
                StepEnd::failed(
                    ErrorCode::NoHealthUrl,
                    "the replica has no health_url configured",
                    json!({}),
                )
            })
    }

    /// The last 500 log lines of `service` (the target, or a companion a `wait_logs` names).
    pub(super) async fn fetch_logs(
        &self,
        service: &str,
    ) -> Result<String, crate::compose::ComposeError> {
        let req = LogsRequest {
            file: self.rollout.file.clone(),
            service: service.to_owned(),
            tail: 500,
        };
        self.host.client.logs(&req).await
    }
}

/// Whether a `docker ps` entry is the given compose service's container.
pub(crate) fn is_service(c: &PsEntry, service: &str) -> bool {
    c.is_service(service)
}

tokio::task_local! {
    /// The engine's timings (`engine:` in the config) inside a rollout's task, for the helpers
    /// executors call without the engine at hand (`poll_interval`, `Progress`): so their
    /// signatures, and the executors, stay as they are.
    static TIMINGS: EngineTuning;
}

/// Runs a rollout's task with the engine's timings (`runner::run`).
pub(crate) async fn with_timings<F: Future>(timings: EngineTuning, f: F) -> F::Output {
    TIMINGS.scope(timings, f).await
}

/// The timings of the rollout task running this; the defaults outside one (unit tests).
fn timings() -> EngineTuning {
    TIMINGS.try_with(|t| *t).unwrap_or_default()
}

/// Poll interval for waits without one of their own: a tenth of the time left, between
/// `engine.poll_min` and `engine.poll_max` (50 ms and 1 s by default).
pub(crate) fn poll_interval(deadline: DateTime<Utc>) -> Duration {
    let left = (deadline - Utc::now()).to_std().unwrap_or_default();
    let t = timings();
    (left / 10).clamp(t.poll_min, t.poll_max)
}

/// The rollout's abort signal as executors read it: a watch channel that turns `true` once
/// `token` is cancelled, and the future that feeds it (it never ends: run it alongside the
/// rollout, in the same task, so stopping the task stops it too). A watch rather than the
/// token itself keeps the executors' `abort: &mut watch::Receiver<bool>` unchanged.
pub(crate) fn abort_watch(
    token: CancellationToken,
) -> (watch::Receiver<bool>, impl Future<Output = ()>) {
    let (tx, rx) = watch::channel(false);
    let feed = async move {
        token.cancelled().await;
        let _ = tx.send(true);
        // The sender lives as long as the drives: `pause` takes a gone sender for no abort.
        std::future::pending::<()>().await;
    };
    (rx, feed)
}

/// Sleeps for `d`, or less if an abort arrives; true when aborted. A pause of 500 ms or more
/// ends on the next point of the wake grid ([`on_grid`]), never before `d`.
pub(crate) async fn pause(d: Duration, abort: &mut watch::Receiver<bool>) -> bool {
    pause_on_grid(d, Round::Up, abort).await
}

/// Sleeps until a wait's next probe ([`until_next_probe`]), or less if an abort arrives; true
/// when aborted. A pause that waits out the rest of an interval ends on the *nearest* grid
/// point, up to half a step early: the next probe then falls on the grid point one interval
/// after this one, however late this probe's wake-up was. Rounded up instead, the few
/// milliseconds a wake-up is late pushed every next probe to the following grid point: a
/// health wait at 1 s probed every 1.05 s under load, and ten probes drifted by 0.5 s (issue
/// 17). A pause cut to the wait's end still ends after the end, never before it.
pub(crate) async fn pause_until_next_probe(
    began: std::time::Instant,
    interval: Duration,
    end: Option<DateTime<Utc>>,
    abort: &mut watch::Receiver<bool>,
) -> bool {
    let (d, to_end) = until_next_probe(began, interval, end);
    let round = if to_end { Round::Up } else { Round::Nearest };
    pause_on_grid(d, round, abort).await
}

async fn pause_on_grid(d: Duration, round: Round, abort: &mut watch::Receiver<bool>) -> bool {
    if *abort.borrow() {
        return true;
    }
    static BASE: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let now = tokio::time::Instant::now();
    let wake = now + on_grid(now.duration_since(*BASE.get_or_init(|| now)), d, round);
    tokio::select! {
        _ = tokio::time::sleep_until(wake) => *abort.borrow(),
        changed = abort.changed() => match changed {
            Ok(()) => *abort.borrow(),
            Err(_) => { tokio::time::sleep_until(wake).await; false }
        },
    }
}

/// Which grid point a long pause ends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// The next one at or after the pause's end: never early.
    Up,
    /// The nearest one: up to half a step early or late.
    Nearest,
}

/// The grid that long pauses end on: the probes of many rollouts due within the same
/// `WAKE_GRID` run on one wake-up of the runtime instead of one each. 1,000 canaries soaking
/// at 5 s woke it about 600 times a second; on a 50 ms grid their soak cost 10-11 % of a core
/// instead of 14-15 % (docs/performance.md, issue 17).
const WAKE_GRID: Duration = Duration::from_millis(50);

/// How long a pause of `pause` from `since` (the time since a fixed start) lasts: until a
/// multiple of [`WAKE_GRID`] (the next one, or the nearest, as `round` says) when the pause is
/// at least 10 grid steps long (so it moves by 10 % at most: a 5 s soak interval by 1 %); a
/// shorter pause (a test's 10 ms poll) is left as it is.
fn on_grid(since: Duration, pause: Duration, round: Round) -> Duration {
    if pause < WAKE_GRID * 10 {
        return pause;
    }
    let grid = WAKE_GRID.as_nanos();
    let past = (since + pause).as_nanos() % grid;
    let nanos = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(0));
    match round {
        Round::Nearest if past * 2 < grid => pause - nanos(past),
        _ if past == 0 => pause,
        _ => pause + nanos(grid - past),
    }
}

/// The pause before a wait's next probe: what is left of `interval` since this probe `began`,
/// so that probes keep their rhythm however long each takes (a sleep of the whole interval
/// after each probe made a 20 s soak at 1 s last 20.8 s under load); at least a tenth of the
/// interval, so a probe slower than the interval does not turn into back-to-back calls.
/// With `end`, a wait that ends at that instant (a soak) sleeps past it by one millisecond at
/// most (plus [`pause`]'s grid): its last probe is at its deadline, not up to an interval later.
/// That holds too when the end passed while this probe ran (it began before the end, so it
/// was not the last one): the next probe is at once. An end that passed before this probe
/// began (a soak kept on by logs it could not read) keeps the interval's rhythm.
/// True with the pause when it was cut to `end`.
pub(crate) fn until_next_probe(
    began: std::time::Instant,
    interval: Duration,
    end: Option<DateTime<Utc>>,
) -> (Duration, bool) {
    let ran = began.elapsed();
    let rest = interval.saturating_sub(ran).max(interval / 10);
    let to_end = end.and_then(|end| {
        let left = end - Utc::now();
        let ran = chrono::Duration::from_std(ran).unwrap_or(chrono::Duration::MAX);
        // `left + ran` is how long after this probe began the end is (or was).
        left.checked_add(&ran)
            .is_some_and(|after_began| after_began > chrono::Duration::zero())
            .then(|| left.to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(1))
    });
    match to_end {
        Some(d) if d < rest => (d, true),
        _ => (rest, false),
    }
}

/// Saves a wait's evidence at its first probe, then at most every `engine.progress_every` (5 s
/// by default; the final evidence is written when the step ends): bounded so that many
/// concurrent waits do not queue on SQLite's single writer.
///
/// `save_changes` saves less often still while only a wait's counters move (issue 17: a soak
/// at a 5 s interval otherwise writes at every probe): such a save waits `QUIET_SAVES` ×
/// `progress_every`, and any other change is saved at the usual rhythm.
#[derive(Default)]
pub(super) struct Progress {
    last: Option<std::time::Instant>,
    /// What `save_changes` last saved, without its counters.
    saved: Option<serde_json::Value>,
}

/// How many `engine.progress_every` a wait whose evidence only counts up goes unsaved.
pub(super) const QUIET_SAVES: u32 = 6;

impl Progress {
    /// Like `save`, but when `detail` differs from the last save only in its `counters` (top
    /// level keys, e.g. a soak's `probes`), it is saved only once `QUIET_SAVES` ×
    /// `progress_every` have passed. Nothing but the counters' freshness is lost: the final
    /// evidence is written when the step ends, and recovery reads none of it.
    pub(super) async fn save_changes(
        &mut self,
        store: &crate::store::Store,
        step_id: &str,
        detail: &serde_json::Value,
        masked: impl FnOnce() -> serde_json::Value,
        counters: &[&str],
    ) {
        let state = without(detail, counters);
        if !self.due(std::time::Instant::now(), timings().progress_every, &state) {
            return;
        }
        self.saved = Some(state);
        self.last = Some(std::time::Instant::now());
        if let Err(e) = store.update_step_detail(step_id, &masked()).await {
            tracing::warn!(error = %e, "could not save the progress of step {step_id}");
        }
    }

    /// Whether `save_changes` saves `state` (the detail without its counters) at `now`.
    fn due(&self, now: std::time::Instant, every: Duration, state: &serde_json::Value) -> bool {
        let Some(last) = self.last else {
            return true;
        };
        let since = now.saturating_duration_since(last);
        if self.saved.as_ref() == Some(state) {
            since >= every * QUIET_SAVES
        } else {
            since >= every
        }
    }

    pub(super) async fn save(
        &mut self,
        store: &crate::store::Store,
        step_id: &str,
        detail: &serde_json::Value,
    ) {
        let every = timings().progress_every;
        if self.last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last = Some(std::time::Instant::now());
        if let Err(e) = store.update_step_detail(step_id, detail).await {
            tracing::warn!(error = %e, "could not save the progress of step {step_id}");
        }
    }
}

/// `detail` without the top-level `keys`.
fn without(detail: &serde_json::Value, keys: &[&str]) -> serde_json::Value {
    match detail {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_pauses_end_on_the_wake_grid_and_short_ones_are_left_alone() {
        let ms = Duration::from_millis;
        // (time since the start, pause asked) -> pause taken, rounded up / to the nearest
        let table = [
            ((0, 10), (10, 10)),    // a test's poll: as asked
            ((7, 499), (499, 499)), // under 10 grid steps: as asked
            ((0, 500), (500, 500)), // already on the grid
            ((0, 5_000), (5_000, 5_000)),
            ((1, 5_000), (5_049, 4_999)), // to the next 50 ms / back to the one just passed
            ((24, 5_000), (5_026, 4_976)),
            ((25, 5_000), (5_025, 5_025)), // half a step: up
            ((49, 5_000), (5_001, 5_001)),
            ((50, 5_000), (5_000, 5_000)),
            ((1_234, 1_000), (1_016, 1_016)), // ends at 2,250
        ];
        for ((since, pause), (up, nearest)) in table {
            for (round, taken) in [(Round::Up, up), (Round::Nearest, nearest)] {
                let got = on_grid(ms(since), ms(pause), round);
                assert_eq!(
                    got,
                    ms(taken),
                    "since {since} ms, pause {pause} ms, {round:?}"
                );
                if pause < 500 {
                    continue;
                }
                assert_eq!((since + got.as_millis() as u64) % 50, 0, "on the grid");
                match round {
                    Round::Up => assert!(got >= ms(pause) && got - ms(pause) < WAKE_GRID),
                    Round::Nearest => assert!(got.abs_diff(ms(pause)) <= WAKE_GRID / 2),
                }
            }
        }
    }

    #[test]
    fn probes_keep_their_rhythm_on_the_grid_however_late_each_wake_up_is() {
        let ms = Duration::from_millis;
        // A 1 s wait: each probe starts `late` ms after the grid point it was woken for and
        // takes `took` ms, then pauses for the rest of its interval from its start. Rounded to the nearest
        // point, every next probe is due exactly one interval after the previous grid point;
        // rounded up, each one slipped a whole grid step.
        for late in [0u64, 1, 7, 24] {
            // (A probe that leaves less than 500 ms of its interval pauses off the grid.)
            for took in [0u64, 3, 120, 450] {
                let mut wake = 0u64;
                for _ in 0..10 {
                    let asked = ms(1_000 - took);
                    let since = ms(wake + late + took);
                    let got = on_grid(since, asked, Round::Nearest);
                    wake = (since + got).as_millis() as u64;
                }
                assert_eq!(wake, 10_000, "late {late} ms, took {took} ms");
            }
        }
        let drifted = on_grid(ms(1_000 + 3), ms(1_000), Round::Up);
        assert_eq!(
            ms(1_000 + 3) + drifted,
            ms(2_050),
            "rounded up, a late wake-up slips"
        );
    }

    #[test]
    fn a_detail_whose_counters_alone_move_is_saved_six_times_less_often() {
        let every = Duration::from_secs(5);
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let healthy = serde_json::json!({"misses_in_a_row": 0, "last": {"status": 200}});
        let missed = serde_json::json!({"misses_in_a_row": 1, "last": {"status": 503}});
        let mut p = Progress::default();
        // The first probe is always saved.
        assert!(p.due(t0, every, &healthy));
        p.last = Some(t0);
        p.saved = Some(healthy.clone());
        // Unchanged (but for counters): not at 5 s, not at 29 s, at 30 s.
        assert!(!p.due(at(5), every, &healthy));
        assert!(!p.due(at(29), every, &healthy));
        assert!(p.due(at(30), every, &healthy));
        // A change is saved at the usual rhythm: not before 5 s, at 5 s.
        assert!(!p.due(at(4), every, &missed));
        assert!(p.due(at(5), every, &missed));
        // Counters are left out of the comparison, other keys are not.
        let a = serde_json::json!({"probes": 1, "misses_in_a_row": 0});
        let b = serde_json::json!({"probes": 7, "misses_in_a_row": 0});
        assert_eq!(without(&a, &["probes"]), without(&b, &["probes"]));
        assert_ne!(without(&a, &["probes"]), without(&b, &[]));
    }

    #[tokio::test]
    async fn the_wait_helpers_read_the_timings_of_their_rollout_task() {
        let timings = EngineTuning {
            poll_min: Duration::from_secs(2),
            poll_max: Duration::from_secs(3),
            ..EngineTuning::default()
        };
        let now = Utc::now();
        let far = now + chrono::Duration::hours(1);
        let (low, high) =
            with_timings(timings, async { (poll_interval(now), poll_interval(far)) }).await;
        assert_eq!((low, high), (timings.poll_min, timings.poll_max));
        // Outside a rollout task: the defaults, 50 ms to 1 s.
        assert_eq!(poll_interval(now), Duration::from_millis(50));
        assert_eq!(poll_interval(far), Duration::from_secs(1));
    }

    #[test]
    fn a_probe_waits_out_the_rest_of_its_interval_and_never_sleeps_past_the_end() {
        let second = Duration::from_secs(1);
        let began = std::time::Instant::now();
        // A probe that took no time waits (almost) the whole interval.
        let (rest, cut) = until_next_probe(began, second, None);
        assert!(!cut);
        assert!(
            rest > Duration::from_millis(900) && rest <= second,
            "{rest:?}"
        );
        // One that took 600 ms waits the 400 ms left.
        let late = began - Duration::from_millis(600);
        let (rest, _) = until_next_probe(late, second, None);
        assert!(rest <= Duration::from_millis(400), "{rest:?}");
        // One slower than the interval still waits a tenth of it.
        let slow = began - Duration::from_secs(3);
        assert_eq!(until_next_probe(slow, second, None), (second / 10, false));
        // An end 300 ms away cuts the wait to it (plus 1 ms); an end passed before the probe
        // began does not.
        let end = Utc::now() + chrono::Duration::milliseconds(300);
        let (rest, cut) = until_next_probe(began, second, Some(end));
        assert!(rest <= Duration::from_millis(301) && cut, "{rest:?}");
        let passed = Utc::now() - chrono::Duration::milliseconds(300);
        let (rest, cut) = until_next_probe(began, second, Some(passed));
        assert!(rest > Duration::from_millis(900) && !cut, "{rest:?}");
        // An end that passed while the probe ran (it began 600 ms ago, the end was 50 ms
        // ago): the probe was not the last; the next one is at once, not 400 ms later.
        let ran_past = Utc::now() - chrono::Duration::milliseconds(50);
        let (rest, cut) = until_next_probe(late, second, Some(ran_past));
        assert!(rest <= Duration::from_millis(1) && cut, "{rest:?}");
    }
}
