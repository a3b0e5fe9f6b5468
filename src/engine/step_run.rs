//! What every step executor shares: how a step ends ([`StepEnd`]), what it may use
//! ([`StepCtx`]), the state a rollout carries from step to step ([`StepRun`]), the [`Execute`]
//! trait each kind implements, and the waits' helpers. Step modules import from here; the dispatch (`steps.rs`) imports them, so imports
//! inside `engine/` point one way.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::seams::{HostCalls, Probe, StepStore};
use super::{merged_env, Checkpoint, Engine};
use crate::compose::{LogsRequest, PsEntry};
use crate::config::{ComposeTuning, EngineTuning, HostConfig};
use crate::domain::error_code::ErrorCode;
use crate::domain::names::ServiceName;
use crate::domain::runbook::step::signals::Signals;
use crate::domain::runbook::step::StepEvidence;
use crate::probe::engine_api::EngineApi;
use crate::probe::prometheus::Prometheus;
use crate::store::{Rollout, Step};

/// How a step ended, with its evidence.
#[derive(Debug)]
pub(crate) enum StepEnd {
    Succeeded(Evidence),
    Failed {
        code: ErrorCode,
        message: String,
        detail: Evidence,
    },
    Aborted(Evidence),
}

impl StepEnd {
    /// The same end, its evidence changed by `f`.
    pub(crate) fn map(self, f: impl FnOnce(Evidence) -> Evidence) -> Self {
        match self {
            StepEnd::Succeeded(d) => StepEnd::Succeeded(f(d)),
            StepEnd::Failed {
                code,
                message,
                detail,
            } => StepEnd::failed(code, message, f(detail)),
            StepEnd::Aborted(d) => StepEnd::Aborted(f(d)),
        }
    }

    pub(crate) fn failed(code: ErrorCode, message: impl Into<String>, detail: Evidence) -> Self {
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
    pub abort: &'s CancellationToken,
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

/// What a step executor uses, and nothing else: the store's step writes, the rollout's host
/// (its configuration and its compose-manager calls), the engines' probes and API client,
/// Prometheus, and the timings. Built from its parts ([`StepCtx::from_parts`]): the daemon
/// gives its own ([`StepRun::new`]), an executor unit test gives fakes.
pub(crate) struct StepCtx<'a> {
    parts: Parts<'a>,
    #[cfg(feature = "testing")]
    hooks: Option<&'a super::hooks::Hooks>,
}

/// The parts of a [`StepCtx`], each reachable through it (`ctx.store`, `ctx.calls`, ...).
pub(crate) struct Parts<'a> {
    pub store: &'a dyn StepStore,
    pub host: &'a HostConfig,
    pub calls: &'a dyn HostCalls,
    pub prober: &'a dyn Probe,
    pub engine_api: &'a EngineApi,
    pub prometheus: Option<&'a Prometheus>,
    pub compose: &'a ComposeTuning,
    pub timings: EngineTuning,
    pub clock: &'a Clock,
}

impl<'a> StepCtx<'a> {
    /// A context of these parts (no crash-matrix checkpoints).
    pub(crate) fn from_parts(parts: Parts<'a>) -> Self {
        StepCtx {
            parts,
            #[cfg(feature = "testing")]
            hooks: None,
        }
    }
}

impl<'a> std::ops::Deref for StepCtx<'a> {
    type Target = Parts<'a>;
    fn deref(&self) -> &Parts<'a> {
        &self.parts
    }
}

impl StepCtx<'_> {
    /// A crash-matrix checkpoint (feature `testing`); nothing in the shipped binary.
    #[cfg(feature = "testing")]
    pub(crate) async fn checkpoint(&self, rollout_id: &str, point: Checkpoint<'_>) {
        if let Some(hooks) = self.hooks {
            hooks.checkpoint(rollout_id, point).await;
        }
    }

    /// A crash-matrix checkpoint (feature `testing`); nothing in the shipped binary.
    #[cfg(not(feature = "testing"))]
    pub(crate) async fn checkpoint(&self, _rollout_id: &str, _point: Checkpoint<'_>) {}

    /// Poll interval for waits without one of their own: a tenth of the time left, between
    /// `engine.poll_min` and `engine.poll_max` (50 ms and 1 s by default).
    pub(crate) fn poll_interval(&self, deadline: DateTime<Utc>) -> Duration {
        poll_interval(self.now(), deadline, &self.timings)
    }

    /// Now, on the engine's clock: what every wait compares with its deadline or its end.
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}

/// A step's evidence, as its `detail` stores it. Only a kind's typed evidence makes one
/// ([`Evidence::of`]; the types are in `crate::domain::runbook::step`), or a detail that was
/// stored so before ([`Evidence::as_stored`]): what a step keeps always has a documented shape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evidence(serde_json::Value);

impl Evidence {
    /// A kind's evidence.
    pub(crate) fn of<E: StepEvidence>(evidence: &E) -> Self {
        Evidence(serde_json::to_value(evidence).unwrap_or_default())
    }

    /// No evidence: `{}` (a step that failed before it gathered any).
    pub(crate) fn none() -> Self {
        Evidence(serde_json::Value::Object(serde_json::Map::new()))
    }

    /// A detail stored before (an attempt's, or a step's before a restart).
    pub(crate) fn as_stored(detail: serde_json::Value) -> Self {
        Evidence(detail)
    }

    /// The signals read before the touch, kept beside the step's own evidence.
    pub(crate) fn with_signals(mut self, signals: &Signals) -> Self {
        if let (Some(map), Ok(signals)) = (self.0.as_object_mut(), serde_json::to_value(signals)) {
            map.insert("signals".to_owned(), signals);
        }
        self
    }

    /// Every text of it masked by `mask` (secrets kept out of evidence).
    pub(crate) fn masked(&self, mask: impl Fn(&serde_json::Value) -> serde_json::Value) -> Self {
        Evidence(mask(&self.0))
    }

    /// As stored.
    pub(crate) fn json(&self) -> &serde_json::Value {
        &self.0
    }

    /// As stored.
    pub(crate) fn into_json(self) -> serde_json::Value {
        self.0
    }
}

/// State carried from step to step within one rollout (rebuilt from SQLite on resume).
pub(crate) struct StepRun<'a> {
    pub ctx: StepCtx<'a>,
    pub rollout: Rollout,
    pub env: BTreeMap<String, String>,
    /// `docker ps` as the snapshot step saw it.
    pub snapshot: Option<Vec<PsEntry>>,
    /// Whether the first compose call already checked that an unknown outcome before this
    /// rollout has settled (safety rule 13).
    pub settle_checked: std::sync::atomic::AtomicBool,
    /// Whether the rollout is recorded as having touched its replica (`touched_replica`): the
    /// row said so when the drive began, or this drive wrote it with the first attempt of a
    /// call of the target (`Store::begin_attempt`).
    /// Once true, the later calls (`up` after `down`) need not write it again.
    pub touched: std::sync::atomic::AtomicBool,
    /// When the target's `up` ended: its engine has run since (restart detection).
    pub up_done_at: Option<DateTime<Utc>>,
    /// Companion gates passed in this rollout: the step's `services` → what its dry run
    /// planned (what a reconcile `up` applies).
    pub companion_plans: BTreeMap<Vec<ServiceName>, Vec<ServiceName>>,
    /// Whether the step being run was already running when this drive took it up: a restart
    /// (or a storage error) interrupted it, and the time since its last saved evidence went
    /// unwatched (`watched.rs`).
    pub resumed: bool,
}

impl<'a> StepRun<'a> {
    /// The run of `rollout`'s steps on its host; fails when the host is not configured (the
    /// runner ends such a rollout `host_not_configured` before it gets here).
    pub(crate) fn new(engine: &'a Engine, rollout: &Rollout) -> Result<Self, super::EngineError> {
        let host = engine.host(&rollout.host)?;
        let inner = &engine.inner;
        let ctx = StepCtx::from_parts(Parts {
            store: &inner.store,
            host: &host.config,
            calls: &host.client,
            prober: &inner.prober,
            engine_api: &inner.engine_api,
            prometheus: inner.prometheus.as_ref(),
            compose: &inner.tuning,
            timings: inner.timings,
            clock: &inner.clock,
        });
        #[cfg(feature = "testing")]
        let ctx = StepCtx {
            hooks: Some(&inner.hooks),
            ..ctx
        };
        Ok(Self::with_ctx(ctx, rollout))
    }

    /// The run of `rollout`'s steps with this context: what the daemon builds from its engine
    /// ([`Self::new`]), and an executor unit test from fakes.
    pub(crate) fn with_ctx(ctx: StepCtx<'a>, rollout: &Rollout) -> Self {
        let env = merged_env(ctx.host, &rollout.env_overrides);
        Self {
            ctx,
            rollout: rollout.clone(),
            env,
            snapshot: None,
            settle_checked: std::sync::atomic::AtomicBool::new(false),
            touched: std::sync::atomic::AtomicBool::new(rollout.touched_replica),
            up_done_at: None,
            companion_plans: BTreeMap::new(),
            resumed: false,
        }
    }
}

impl StepRun<'_> {
    /// A replica's health URL, when configured.
    pub(super) fn health_url(&self, service: &str) -> Option<&str> {
        self.ctx
            .host
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
                    Evidence::none(),
                )
            })
    }

    /// The last 500 log lines of `service` (the target, or a companion a `wait_logs` names).
    pub(super) async fn fetch_logs(
        &self,
        service: &ServiceName,
    ) -> Result<String, crate::compose::ComposeError> {
        let req = LogsRequest {
            file: self.rollout.file.clone(),
            service: service.clone(),
            tail: 500,
        };
        self.ctx.calls.logs(&req).await
    }
}

/// Whether a `docker ps` entry is the given compose service's container.
pub(crate) fn is_service(c: &PsEntry, service: &str) -> bool {
    c.is_service(service)
}

/// Poll interval for waits without one of their own: a tenth of the time left, between
/// `engine.poll_min` and `engine.poll_max` (50 ms and 1 s by default).
pub(crate) fn poll_interval(
    now: DateTime<Utc>,
    deadline: DateTime<Utc>,
    t: &EngineTuning,
) -> Duration {
    let left = (deadline - now).to_std().unwrap_or_default();
    (left / 10).clamp(t.poll_min, t.poll_max)
}

/// Sleeps for `d`, or less if an abort arrives; true when aborted. A pause of 500 ms or more
/// ends on the next point of the wake grid ([`on_grid`]), never before `d`.
pub(crate) async fn pause(d: Duration, abort: &CancellationToken) -> bool {
    pause_on_grid(d, abort).await
}

/// Sleeps until a wait's next probe ([`Rhythm::next_pause`]), or less if an abort arrives;
/// true when aborted. The pause ends on the next point of the wake grid, as [`pause`]'s do,
/// except one cut to the wait's end: a soak ends at its deadline, not up to a grid step
/// later (each soak ends once, so there is no wake-up to share).
pub(crate) async fn pause_until_next_probe(
    rhythm: &mut Rhythm,
    end_in: Option<chrono::Duration>,
    abort: &CancellationToken,
) -> bool {
    let (d, cut) = rhythm.next_pause(std::time::Instant::now(), end_in);
    if cut {
        pause_exactly(d, abort).await
    } else {
        pause_on_grid(d, abort).await
    }
}

async fn pause_on_grid(d: Duration, abort: &CancellationToken) -> bool {
    static BASE: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let now = tokio::time::Instant::now();
    let d = on_grid(now.duration_since(*BASE.get_or_init(|| now)), d);
    pause_exactly(d, abort).await
}

async fn pause_exactly(d: Duration, abort: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        _ = abort.cancelled() => true,
        _ = tokio::time::sleep(d) => abort.is_cancelled(),
    }
}

/// The grid that long pauses end on: the probes of many rollouts due within the same
/// `WAKE_GRID` run on one wake-up of the runtime instead of one each. 1,000 canaries soaking
/// at 5 s woke it about 600 times a second; on a 50 ms grid their soak cost 10-11 % of a core
/// instead of 14-15 % (docs/performance-notes.md).
const WAKE_GRID: Duration = Duration::from_millis(50);

/// How long a pause of `pause` from `since` (the time since a fixed start) lasts: until the
/// next multiple of [`WAKE_GRID`] at or after its end when the pause is at least 10 grid steps
/// long (so it grows by 10 % at most: a 5 s soak interval by 1 %); a shorter pause (a test's
/// 10 ms poll) is left as it is. Never shorter than asked.
fn on_grid(since: Duration, pause: Duration) -> Duration {
    if pause < WAKE_GRID * 10 {
        return pause;
    }
    let grid = WAKE_GRID.as_nanos();
    let past = (since + pause).as_nanos() % grid;
    let nanos = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(0));
    if past == 0 {
        pause
    } else {
        pause + nanos(grid - past)
    }
}

/// When a wait's probes fall: probe `n` is due `n` intervals after the first, so that probes
/// keep their rhythm however long each takes and however late each wake-up is (a sleep of
/// the whole interval after each probe made a 20 s soak at 1 s last 20.8 s under load), and
/// none comes before its time. A probe is never earlier than its interval says: probes
/// rounded to the *nearest* grid point instead came up to 25 ms early, and an engine that
/// turned healthy exactly on time would be seen a whole interval late.
#[derive(Debug)]
pub(crate) struct Rhythm {
    interval: Duration,
    /// The probe the schedule counts from; `None` until the first probe, and after a probe
    /// slower than the interval (the next one starts the count again).
    first: Option<std::time::Instant>,
    /// Probes since `first`.
    n: u32,
    /// When the current probe began.
    began: Option<std::time::Instant>,
}

impl Rhythm {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            first: None,
            n: 0,
            began: None,
        }
    }

    /// Marks the start of a probe.
    pub(crate) fn begin(&mut self) {
        self.begin_at(std::time::Instant::now());
    }

    fn begin_at(&mut self, now: std::time::Instant) {
        if self.first.is_none() {
            self.first = Some(now);
            self.n = 0;
        }
        self.began = Some(now);
    }

    /// The pause before the next probe (at `now`, after the current one): until it is due,
    /// and at least a tenth of the interval, so a probe slower than the interval does not
    /// turn into back-to-back calls (the schedule then starts again from the next probe).
    /// With `end_in` (how far a wait that ends at an instant, a soak, is from its end; negative
    /// once passed), the pause is cut to the end plus one millisecond: the last probe is at
    /// the deadline, not up to an interval later. That holds too when the end passed while
    /// this probe ran (it began before the end, so it was not the last one): the next probe
    /// is at once. An end that passed before this probe began (a soak kept on by logs it
    /// could not read) keeps the interval's rhythm. True with the pause when it was cut to
    /// the end (the next probe is the last).
    pub(crate) fn next_pause(
        &mut self,
        now: std::time::Instant,
        end_in: Option<chrono::Duration>,
    ) -> (Duration, bool) {
        let first = *self.first.get_or_insert(now);
        let began = self.began.unwrap_or(now);
        self.n = self.n.saturating_add(1);
        let due = self
            .interval
            .checked_mul(self.n)
            .and_then(|after| first.checked_add(after))
            .unwrap_or(now);
        let least = self.interval / 10;
        let rest = match due.checked_duration_since(now) {
            Some(rest) if rest >= least => rest,
            _ => {
                self.first = None;
                least
            }
        };
        let ran = chrono::Duration::from_std(now.saturating_duration_since(began))
            .unwrap_or(chrono::Duration::MAX);
        let to_end = end_in.and_then(|left| {
            // `left + ran` is how long after this probe began the end is (or was).
            left.checked_add(&ran)
                .is_some_and(|after_began| after_began > chrono::Duration::zero())
                .then(|| left.to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(1))
        });
        // The end before the next probe is due, or right at it: the next probe is the last.
        match to_end {
            Some(d) if d <= rest + Duration::from_millis(1) => (d, true),
            _ => (rest, false),
        }
    }
}

/// Saves a wait's evidence at its first probe, then at most every `engine.progress_every` (5 s
/// by default; the final evidence is written when the step ends): bounded so that many
/// concurrent waits do not queue on SQLite's single writer.
///
/// `save_changes` saves less often still while only a wait's counters move (a soak at a 5 s
/// interval would otherwise write at every probe): such a save waits `QUIET_SAVES` ×
/// `progress_every`, and any other change is saved at the usual rhythm.
pub(super) struct Progress {
    /// `engine.progress_every`.
    every: Duration,
    last: Option<std::time::Instant>,
    /// What `save_changes` last saved, without its counters.
    saved: Option<serde_json::Value>,
}

/// How many `engine.progress_every` a wait whose evidence only counts up goes unsaved.
pub(super) const QUIET_SAVES: u32 = 6;

impl Progress {
    /// Saves at most once per `every` (`engine.progress_every`).
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            saved: None,
        }
    }

    /// Like `save`, but when `detail` differs from the last save only in its `counters` (top
    /// level keys, e.g. a soak's `probes`), it is saved only once `QUIET_SAVES` ×
    /// `progress_every` have passed. Nothing but the counters' freshness is lost: the final
    /// evidence is written when the step ends, and recovery reads none of it.
    pub(super) async fn save_changes(
        &mut self,
        store: &dyn StepStore,
        step_id: &str,
        detail: &Evidence,
        masked: impl FnOnce() -> Evidence,
        counters: &[&str],
    ) {
        let state = without(detail.json(), counters);
        if !self.due(std::time::Instant::now(), self.every, &state) {
            return;
        }
        self.saved = Some(state);
        self.last = Some(std::time::Instant::now());
        if let Err(e) = store.update_step_detail(step_id, masked().json()).await {
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

    pub(super) async fn save(&mut self, store: &dyn StepStore, step_id: &str, detail: &Evidence) {
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        self.last = Some(std::time::Instant::now());
        if let Err(e) = store.update_step_detail(step_id, detail.json()).await {
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
    fn long_pauses_end_on_the_next_point_of_the_wake_grid_and_short_ones_are_left_alone() {
        let ms = Duration::from_millis;
        // (time since the start, pause asked) -> pause taken
        let table = [
            ((0, 10), 10),   // a test's poll: as asked
            ((7, 499), 499), // under 10 grid steps: as asked
            ((0, 500), 500), // already on the grid
            ((0, 5_000), 5_000),
            ((1, 5_000), 5_049), // to the next 50 ms
            ((24, 5_000), 5_026),
            ((25, 5_000), 5_025),
            ((49, 5_000), 5_001),
            ((50, 5_000), 5_000),
            ((1_234, 1_000), 1_016), // ends at 2,250
        ];
        for ((since, pause), taken) in table {
            let got = on_grid(ms(since), ms(pause));
            assert_eq!(got, ms(taken), "since {since} ms, pause {pause} ms");
            if pause >= 500 {
                assert_eq!((since + got.as_millis() as u64) % 50, 0, "on the grid");
                assert!(got >= ms(pause) && got - ms(pause) < WAKE_GRID);
            }
        }
    }

    /// A 1 s wait whose first probe is at `start` (off the grid): each probe is woken on the
    /// grid point at or after its due time, starts `late` ms after that and takes `took` ms.
    /// Probe n is never before `start + n` s, never more than a grid step (plus the wake-up's
    /// lateness) after it, and the lateness does not add up over ten probes.
    #[test]
    fn probes_keep_their_rhythm_never_early_however_late_each_wake_up_is() {
        let ms = Duration::from_millis;
        let base = std::time::Instant::now();
        for start in [0u64, 3, 26, 49] {
            for late in [0u64, 1, 7, 24] {
                for took in [0u64, 3, 120, 450] {
                    let mut r = Rhythm::new(ms(1_000));
                    let mut t = start;
                    for n in 1..=10u64 {
                        r.begin_at(base + ms(t));
                        let now = t + took;
                        let (pause, cut) = r.next_pause(base + ms(now), None);
                        assert!(!cut);
                        let woken = now + on_grid(ms(now), pause).as_millis() as u64;
                        let due = start + n * 1_000;
                        assert!(
                            woken >= due && woken < due + 50,
                            "start {start}, late {late}, took {took}: probe {n} woken at {woken}, due {due}"
                        );
                        t = woken + late;
                    }
                }
            }
        }
    }

    #[test]
    fn a_detail_whose_counters_alone_move_is_saved_six_times_less_often() {
        let every = Duration::from_secs(5);
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let healthy = serde_json::json!({"misses_in_a_row": 0, "last": {"status": 200}});
        let missed = serde_json::json!({"misses_in_a_row": 1, "last": {"status": 503}});
        let mut p = Progress::new(every);
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

    #[test]
    fn the_poll_interval_is_a_tenth_of_the_time_left_within_the_engines_bounds() {
        let timings = EngineTuning {
            poll_min: Duration::from_secs(2),
            poll_max: Duration::from_secs(3),
            ..EngineTuning::default()
        };
        let now = Utc::now();
        let far = now + chrono::Duration::hours(1);
        let (low, high) = (
            poll_interval(now, now, &timings),
            poll_interval(now, far, &timings),
        );
        assert_eq!((low, high), (timings.poll_min, timings.poll_max));
        let defaults = EngineTuning::default();
        assert_eq!(
            poll_interval(now, now, &defaults),
            Duration::from_millis(50)
        );
        assert_eq!(poll_interval(now, far, &defaults), Duration::from_secs(1));
    }

    #[test]
    fn a_probe_waits_out_the_rest_of_its_interval_and_never_sleeps_past_the_end() {
        let second = Duration::from_secs(1);
        let ms = Duration::from_millis;
        let t0 = std::time::Instant::now();
        let at = |n: u64| t0 + ms(n);
        let cms = chrono::Duration::milliseconds;
        // A probe that took no time waits the whole interval.
        let mut r = Rhythm::new(second);
        r.begin_at(at(0));
        assert_eq!(r.next_pause(at(0), None), (second, false));
        // The next one, woken 30 ms late and taking 570 ms, waits the 400 ms left.
        r.begin_at(at(1_030));
        assert_eq!(r.next_pause(at(1_600), None), (ms(400), false));
        // One slower than its interval still waits a tenth of it, and the count starts again
        // at the next probe.
        r.begin_at(at(2_000));
        assert_eq!(r.next_pause(at(5_000), None), (ms(100), false));
        r.begin_at(at(5_100));
        assert_eq!(r.next_pause(at(5_150), None), (ms(950), false));
        // An end 300 ms away cuts the wait to it (plus 1 ms).
        let mut r = Rhythm::new(second);
        r.begin_at(at(0));
        assert_eq!(r.next_pause(at(0), Some(cms(300))), (ms(301), true));
        // So does an end right at the next probe's due time: that probe is the last.
        let mut r = Rhythm::new(second);
        r.begin_at(at(0));
        assert_eq!(r.next_pause(at(0), Some(cms(1_000))), (ms(1_001), true));
        // An end passed before the probe began does not: the rhythm goes on.
        let mut r = Rhythm::new(second);
        r.begin_at(at(0));
        assert_eq!(r.next_pause(at(0), Some(cms(-300))), (second, false));
        // An end that passed while the probe ran (it began 600 ms ago, the end was 50 ms
        // ago): the probe was not the last; the next one is at once, not 400 ms later.
        let mut r = Rhythm::new(second);
        r.begin_at(at(0));
        assert_eq!(r.next_pause(at(600), Some(cms(-50))), (ms(1), true));
    }
}
