//! Drives rollouts: one tokio task per rollout runs its steps in order, writing every state
//! change before and after each side effect. Abort is a persisted request plus a signal that
//! interrupts waits. At start, `recover` resumes every unfinished rollout from SQLite.

mod admission;
mod clock;
#[cfg(test)]
mod executor_tests;
#[cfg(feature = "testing")]
mod hooks;
mod left_down;
mod preflight;
mod release;
mod restart;
mod rollback;
mod runner;
mod seams;
mod step_run;
mod steps;
mod wait;
mod watched;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::task::AbortHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

use crate::compose::{ClientOptions, ComposeClient, ComposeHttp, ComposeObserver};
use crate::config::{ComposeTuning, EngineTuning, HostConfig, ResolvedConfig};
use crate::domain::audit::{AuditKind, Resumed};
use crate::domain::plan::CanaryPlan;
use crate::domain::runbook::{Runbook, StepKind};
use crate::domain::state::RolloutKind;
use crate::probe::engine_api::EngineApi;
use crate::probe::prometheus::Prometheus;
use crate::probe::HealthProber;
use crate::store::{new_id, AuditEntry, NewRollout, NewStep, Rollout, Store, StoreError};

#[cfg(feature = "testing")]
#[doc(hidden)]
pub use hooks::PauseHandle;

/// A point in a rollout's task where the crash-matrix tests can freeze it (feature
/// `testing`; without it a checkpoint is nothing). Names: `rollout:start`,
/// `step:<name>:before|started|attempt_written|attempt_done|failed`.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) enum Checkpoint<'a> {
    /// Before the rollout is marked running.
    RolloutStart,
    /// Before the step is marked running.
    Before(&'a str),
    /// After the step is marked running.
    Started(&'a str),
    /// A compose call's attempt row is written, the call not sent.
    AttemptWritten(&'a str),
    /// A compose call's outcome is written, the step's is not.
    AttemptDone(&'a str),
    /// The step is marked failed, its rollout not yet.
    Failed(&'a str),
}
pub use rollback::RollbackRequest;

/// The runbook a one-click (or automatic) rollback runs.
pub const ROLLBACK_RUNBOOK: &str = "single-replica-rollback";
/// The actor recorded for what canaryd does by itself.
pub const SYSTEM_ACTOR: &str = "canaryd";

/// Errors callers of the engine can see.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("host {host} already has an active rollout {rollout_id}")]
    HostBusy { host: String, rollout_id: String },
    #[error("rollout {0} not found")]
    NotFound(String),
    #[error("rollout {0} is already terminal")]
    Terminal(String),
    #[error("no prior deployment of {service} on {host} is recorded{detail}")]
    NoPriorDeployment {
        host: String,
        service: String,
        detail: String,
    },
    #[error("{0}")]
    UnknownTarget(String),
    #[error("runbook {0} is not loaded")]
    UnknownRunbook(String),
    #[error("rollout {0} is not waiting for an approval (no running approve step, no analysis check asking)")]
    NotAwaitingApproval(String),
    /// A companion step of the runbook names the target or another replica of the host
    /// (safety rule 15).
    #[error("{0}")]
    CompanionIsReplica(String),
    /// A plan's `replaces` that this runbook cannot carry out.
    #[error("{0}")]
    InvalidReplaces(String),
    #[error("release {0} not found")]
    ReleaseNotFound(String),
    #[error("{0}")]
    ReleaseState(String),
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::HostBusy { host, rollout_id } => EngineError::HostBusy { host, rollout_id },
            StoreError::NotFound(id) => EngineError::NotFound(id),
            StoreError::NotAwaitingApproval(id) => EngineError::NotAwaitingApproval(id),
            other => EngineError::Store(other),
        }
    }
}

/// A host as the engine sees it: its configuration and a client for its compose-manager.
pub(crate) struct HostRuntime {
    pub config: HostConfig,
    pub client: ComposeClient,
}

pub(crate) struct Inner {
    pub store: Store,
    pub hosts: BTreeMap<String, HostRuntime>,
    pub runbooks: BTreeMap<String, Runbook>,
    pub tuning: ComposeTuning,
    /// The engine's own timings (`engine:` in the config).
    pub timings: EngineTuning,
    /// The wall clock the step executors read.
    pub clock: clock::Clock,
    pub prober: HealthProber,
    /// Calls of the engines' OpenAI-compatible APIs (`smoke`).
    pub engine_api: EngineApi,
    /// The config's Prometheus server (`analyze` with `source: prometheus`), if any.
    pub prometheus: Option<Prometheus>,
    /// The rollouts whose task is running, by id.
    pub running: Mutex<HashMap<String, RolloutTask>>,
    /// Every rollout task, so `shutdown` can wait for them (bounded by its grace).
    pub tasks: TaskTracker,
    /// Cancelled by `shutdown` (and `kill`): every rollout's abort signal, a child of it, fires
    /// (tasks stop at their next step boundary or wait, leaving their rollout resumable) and no
    /// new task starts.
    pub stop: CancellationToken,
    #[cfg(feature = "testing")]
    pub hooks: hooks::Hooks,
    /// The releases whose coordinator task is running.
    pub releases: release::Coordinators,
    /// The order in which canaries started together take their first steps.
    pub start_gate: admission::StartGate,
}

/// A running rollout task.
pub(crate) struct RolloutTask {
    /// Its abort signal: a child of `Inner::stop`, cancelled by `Engine::abort` too.
    abort: CancellationToken,
    /// Cancelled when the task ends, however it ends (`Engine::wait_terminal`).
    ended: CancellationToken,
    /// To stop it dead (`Engine::kill`).
    handle: AbortHandle,
}

/// Safety rule 15 at submission: a runbook whose companion step names the plan's target or
/// another replica of the host is refused before anything is written (the config's runbook
/// check refuses it at load too; this covers a runbook set loaded without it).
fn companions_are_not_replicas(
    runbook: &Runbook,
    target: &str,
    host: &crate::config::HostConfig,
) -> Result<(), EngineError> {
    for (i, step) in runbook.steps.iter().enumerate() {
        let companions = step.kind.companions();
        if let Some(replica) = companions
            .iter()
            .find(|s| *s == target || host.is_replica_name(s))
        {
            return Err(EngineError::CompanionIsReplica(format!(
                "runbook {} step {} \"{}\" names `{replica}` in `services`, a replica of host {}: a replica is only ever touched as the rollout's target",
                runbook.name,
                i + 1,
                step.name,
                host.name
            )));
        }
    }
    Ok(())
}

/// A rename takes the former service down itself (`down` acts on it) before the new one is
/// brought up: an `up` alone would leave compose's orphan removal to stop it in about 10 s
/// instead of its stop grace (docs/reference.md#renamed-replicas). A runbook without a `down`
/// of the target before its `up` cannot run a plan with `replaces`.
fn rename_is_a_down_then_up(runbook: &Runbook, replaced: &str) -> Result<(), EngineError> {
    let target_step = |want: fn(&StepKind) -> bool| {
        runbook.steps.iter().position(|s| {
            want(&s.kind) && s.kind.scope().is_some_and(|scope| !scope.is_companion())
        })
    };
    let down = target_step(|k| matches!(k, StepKind::Down(_)));
    let up = target_step(|k| matches!(k, StepKind::Up(_)));
    match (down, up) {
        (Some(down), Some(up)) if down < up => Ok(()),
        _ => Err(EngineError::InvalidReplaces(format!(
            "replaces.service: runbook {} has no `down` of the target before its `up`, so it cannot take `{replaced}` down first (compose's orphan removal would stop it in 10 s): use a runbook with a down, such as single-replica-canary or long-context-rollout",
            runbook.name
        ))),
    }
}

/// The rollout engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Builds the engine: one compose-manager client per configured host.
    pub fn new(
        store: Store,
        config: &ResolvedConfig,
        runbooks: BTreeMap<String, Runbook>,
    ) -> Result<Self, crate::compose::ComposeError> {
        Self::with_observers(store, config, runbooks, None)
    }

    /// Like `new`, with every compose-manager request of host `h` reported to
    /// `observer(h)` (the metrics count them).
    pub fn with_observers(
        store: Store,
        config: &ResolvedConfig,
        runbooks: BTreeMap<String, Runbook>,
        observer: Option<&dyn Fn(&str) -> ComposeObserver>,
    ) -> Result<Self, crate::compose::ComposeError> {
        let mut hosts = BTreeMap::new();
        // One HTTP client for every host's compose-manager (each still has its own
        // connections): a client per host held 25 MB at 1,000 hosts before any request.
        let http = ComposeHttp::new(config.compose.connect_timeout)?;
        for (name, host) in &config.hosts {
            let opts = ClientOptions {
                connect_timeout: config.compose.connect_timeout,
                request_timeout: config.compose.request_timeout,
                stream_idle_timeout: config.compose.stream_idle_timeout,
                triggered_by: "canaryd".to_owned(),
                token_source: Some(host.token_source()),
                project: host.project.clone(),
            };
            let mut client = ComposeClient::with_http(
                &http,
                &host.compose_manager_url,
                host.token.expose(),
                opts,
            )?;
            if let Some(observer) = observer {
                client = client.with_observer(observer(name));
            }
            hosts.insert(
                name.clone(),
                HostRuntime {
                    config: host.clone(),
                    client,
                },
            );
        }
        let inner = Inner {
            store,
            hosts,
            runbooks,
            tuning: config.compose.clone(),
            timings: config.engine,
            clock: clock::Clock::default(),
            prober: HealthProber::new(config.engine.health_timeout),
            engine_api: EngineApi::new(config.compose.connect_timeout),
            prometheus: config
                .prometheus
                .as_ref()
                .map(|p| Prometheus::new(p, steps::analyze::PROMETHEUS_QUERY_TIMEOUT)),
            running: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            #[cfg(feature = "testing")]
            hooks: hooks::Hooks::default(),
            releases: release::Coordinators::default(),
            start_gate: admission::StartGate::new(
                config.engine.start_concurrency as usize,
                config.engine.start_hold,
            ),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The store the engine writes to.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Names of the loaded runbooks.
    pub fn runbook_names(&self) -> std::collections::BTreeSet<String> {
        self.inner.runbooks.keys().cloned().collect()
    }

    /// Creates a canary rollout from a validated plan and starts it.
    pub async fn submit_canary(
        &self,
        plan: CanaryPlan,
        actor: &str,
    ) -> Result<Rollout, EngineError> {
        let (new, steps) = self.canary_rollout(plan, actor)?;
        self.inner.store.create_rollout(&new, &steps).await?;
        tracing::info!(rollout.id = %new.id, host = %new.host, service = %new.service, tag = %new.tag, "canary {} created", new.id);
        self.spawn(new.id.clone());
        self.get(&new.id).await
    }

    /// The rollout row and steps of a canary plan (not stored).
    pub(crate) fn canary_rollout(
        &self,
        plan: CanaryPlan,
        actor: &str,
    ) -> Result<(NewRollout, Vec<NewStep>), EngineError> {
        let host = self.host(&plan.host)?;
        let runbook = self.runbook(&plan.runbook)?;
        companions_are_not_replicas(runbook, &plan.service, &host.config)?;
        if let Some(replaced) = &plan.replaces {
            rename_is_a_down_then_up(runbook, &replaced.service)?;
        }
        let new = NewRollout {
            deploy_as: None,
            replaces: plan.replaces,
            windows: plan.windows,
            required_free: plan.required_free,
            id: new_id("ro"),
            kind: RolloutKind::Canary,
            env_sha256: merged_env_sha256(&host.config, &plan.env),
            host: plan.host,
            file: plan.file,
            service: plan.service,
            tag: plan.tag,
            runbook: plan.runbook,
            actor: actor.to_owned(),
            reason: plan.reason,
            env_overrides: plan.env,
            require_logs: plan
                .require_logs
                .iter()
                .map(|p| p.as_str().to_owned())
                .collect(),
            on_failure: plan.on_failure,
            rollback_of: None,
            expect_commit: None,
            expect_file_sha256: None,
            created_at: Utc::now(),
        };
        Ok((new, steps_of(runbook)))
    }

    /// Creates a rollback rollout (docs/reference.md#rollback) and starts it; with `preempt`,
    /// aborts the active rollout of the host first.
    pub async fn submit_rollback(
        &self,
        req: RollbackRequest,
        actor: &str,
    ) -> Result<Rollout, EngineError> {
        rollback::submit(self, req, actor).await
    }

    /// Requests an abort: persisted first, then the rollout's task is signalled.
    pub async fn abort(&self, id: &str, actor: &str, reason: &str) -> Result<Rollout, EngineError> {
        let rollout = self.get(id).await?;
        if rollout.status.is_terminal() {
            return Err(EngineError::Terminal(id.to_owned()));
        }
        match self
            .inner
            .store
            .request_abort(id, actor, reason, Utc::now())
            .await
        {
            Ok(()) => {}
            Err(StoreError::InvalidTransition { .. }) => {
                return Err(EngineError::Terminal(id.to_owned()))
            }
            Err(e) => return Err(e.into()),
        }
        tracing::info!(rollout.id = %id, actor, "abort of {id} requested");
        match self.signal(id) {
            Some(abort) => abort.cancel(),
            // No task (it gave up on storage errors): one that sees the request finishes it.
            None => self.spawn(id.to_owned()),
        }
        self.get(id).await
    }

    /// Approves the step a rollout waits on (docs/reference.md#approve): recorded with actor
    /// and reason; the waiting step sees it at its next poll (within a second).
    pub async fn approve(
        &self,
        id: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Rollout, EngineError> {
        let rollout = self.get(id).await?;
        if rollout.status.is_terminal() {
            return Err(EngineError::Terminal(id.to_owned()));
        }
        let approval = self
            .inner
            .store
            .approve(id, actor, reason, Utc::now())
            .await?;
        tracing::info!(rollout.id = %id, actor, step = %approval.step, "step {} of {id} approved", approval.step);
        self.get(id).await
    }

    /// Waits (bounded) until a rollout is terminal; used by preempt and tests. Reads it, then
    /// waits for its task to end, no polling; returns it as last read (not terminal when the
    /// timeout passed, or when no task runs it: then it resumes at next start).
    pub async fn wait_terminal(&self, id: &str, timeout: Duration) -> Result<Rollout, EngineError> {
        wait::until_done(
            timeout,
            || self.task_ended(id),
            || self.get(id),
            |r| r.status.is_terminal(),
        )
        .await
    }

    /// Resolves when the running task of rollout `id` ends; `None` when none runs.
    fn task_ended(&self, id: &str) -> Option<WaitForCancellationFutureOwned> {
        let running = self.inner.running.lock().ok()?;
        running.get(id).map(|t| t.ended.clone().cancelled_owned())
    }

    /// Resumes every unfinished rollout (safety rule 9, docs/safety.md). Call before accepting new
    /// work.
    pub async fn recover(&self) -> Result<usize, EngineError> {
        let unfinished = self.inner.store.unfinished_rollouts().await?;
        let n = unfinished.len();
        for rollout in unfinished {
            let steps = self.inner.store.steps(&rollout.id).await?;
            let at = steps
                .iter()
                .find(|s| !s.status.is_terminal())
                .map(|s| (s.name.clone(), s.status.as_str()));
            tracing::info!(rollout.id = %rollout.id, status = rollout.status.as_str(), step.name = ?at.as_ref().map(|a| &a.0), "resuming rollout {} after restart", rollout.id);
            let detail = Resumed {
                step: at.as_ref().map(|a| a.0.clone()),
                step_status: at.as_ref().map(|a| a.1.to_owned()),
            };
            let status = rollout.status.as_str();
            let entry = AuditEntry::new(Utc::now(), SYSTEM_ACTOR, AuditKind::RolloutResumed)
                .rollout(&rollout.id)
                .states(Some(status), Some(status))
                .detail(serde_json::to_value(&detail).unwrap_or_default());
            self.inner.store.audit(&entry).await?;
            self.spawn(rollout.id);
        }
        Ok(n)
    }

    /// Reads a rollout.
    pub async fn get(&self, id: &str) -> Result<Rollout, EngineError> {
        self.inner
            .store
            .get_rollout(id)
            .await?
            .ok_or_else(|| EngineError::NotFound(id.to_owned()))
    }

    /// Number of rollouts whose task is running now.
    pub fn active_tasks(&self) -> usize {
        self.inner.running.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// How long the host doctor waits for one call: `engine.doctor_call_timeout`, or
    /// `compose.request_timeout` if shorter.
    pub(crate) fn doctor_call_limit(&self) -> std::time::Duration {
        self.inner
            .tuning
            .request_timeout
            .min(self.inner.timings.doctor_call_timeout)
    }

    /// The `/health` prober the engine's waits use.
    pub(crate) fn prober(&self) -> &HealthProber {
        &self.inner.prober
    }

    pub(crate) fn host(&self, name: &str) -> Result<&HostRuntime, EngineError> {
        self.inner
            .hosts
            .get(name)
            .ok_or_else(|| EngineError::UnknownTarget(format!("unknown host {name}")))
    }

    pub(crate) fn runbook(&self, name: &str) -> Result<&Runbook, EngineError> {
        self.inner
            .runbooks
            .get(name)
            .ok_or_else(|| EngineError::UnknownRunbook(name.to_owned()))
    }

    fn signal(&self, id: &str) -> Option<CancellationToken> {
        self.inner
            .running
            .lock()
            .ok()
            .and_then(|m| m.get(id).map(|t| t.abort.clone()))
    }

    /// Starts the task of a rollout (once: a second call for a running rollout does nothing).
    pub(crate) fn spawn(&self, id: String) {
        // Under the lock, so `kill` cannot miss a task started while it runs.
        let Ok(mut running) = self.inner.running.lock() else {
            return;
        };
        if self.is_stopping() {
            tracing::info!(rollout.id = %id, "shutting down: rollout {id} starts at next start");
            return;
        }
        if running.contains_key(&id) {
            return;
        }
        let abort = self.inner.stop.child_token();
        let ended = CancellationToken::new();
        let engine = self.clone();
        let (task_abort, task_ended) = (abort.clone(), ended.clone());
        let task_id = id.clone();
        let handle = self.inner.tasks.spawn(async move {
            // Fires when the task ends, aborted by `kill` too (the future is dropped).
            let _ended = task_ended.drop_guard();
            runner::run(&engine, &task_id, task_abort).await;
            if let Ok(mut running) = engine.inner.running.lock() {
                running.remove(&task_id);
            }
        });
        let handle = handle.abort_handle();
        running.insert(
            id,
            RolloutTask {
                abort,
                ended,
                handle,
            },
        );
    }

    /// Whether `shutdown` (or `kill`) was called.
    pub fn is_stopping(&self) -> bool {
        self.inner.stop.is_cancelled()
    }

    /// Graceful stop (SIGTERM): no new task starts; running tasks stop at their next step
    /// boundary or wait, or once their current compose call ends, without marking anything
    /// failed; after `grace`, tasks still running are stopped where they are (their compose
    /// call, if any, is reconciled at next start). Returns how many had to be stopped.
    pub async fn shutdown(&self, grace: Duration) -> usize {
        // Every rollout's abort signal is a child of `stop`: one cancel reaches them all.
        self.inner.stop.cancel();
        self.inner.tasks.close();
        let left = match tokio::time::timeout(grace, self.inner.tasks.wait()).await {
            Ok(()) => 0,
            Err(_) => self.inner.tasks.len(),
        };
        if left > 0 {
            tracing::warn!(
                rollouts = left,
                "{left} rollout task(s) still busy after the shutdown grace; stopping them, they resume at next start"
            );
        }
        self.kill();
        left
    }

    /// Stops every rollout task at once, wherever it is, as if the process died (crash tests;
    /// the end of a graceful shutdown). Nothing is written.
    #[doc(hidden)]
    pub fn kill(&self) {
        // Under the lock no task starts; each is stopped before the abort signals fire, so
        // none runs on to see them.
        let running = self.inner.running.lock();
        if let Ok(mut running) = running {
            for (_, task) in running.drain() {
                task.handle.abort();
            }
        }
        self.inner.releases.kill();
        self.inner.stop.cancel();
    }

    /// Test hook: the next rollout task that reaches checkpoint `point` freezes there (see
    /// [`Checkpoint`] for the names).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn pause_at(&self, point: &str) -> PauseHandle {
        self.inner.hooks.arm(point)
    }

    #[cfg(feature = "testing")]
    pub(crate) async fn checkpoint(&self, rollout_id: &str, point: Checkpoint<'_>) {
        self.inner.hooks.checkpoint(rollout_id, point).await;
    }

    /// Without the `testing` feature a checkpoint is nothing.
    #[cfg(not(feature = "testing"))]
    pub(crate) async fn checkpoint(&self, _rollout_id: &str, _point: Checkpoint<'_>) {}
}

/// Every step of a runbook as a pending step row.
pub(crate) fn steps_of(runbook: &Runbook) -> Vec<NewStep> {
    runbook
        .steps
        .iter()
        .map(|s| NewStep {
            name: s.name.clone(),
            kind: s.kind.kind_name(),
        })
        .collect()
}

/// The host's full env map with the plan's overrides on top (safety rule 3, docs/safety.md).
pub(crate) fn merged_env(
    host: &HostConfig,
    overrides: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = host.env.to_map();
    env.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// SHA-256 (hex) of the merged env map, as `KEY=VALUE\n` lines in key order.
pub(crate) fn merged_env_sha256(host: &HostConfig, overrides: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (k, v) in merged_env(host, overrides) {
        hasher.update(k.as_bytes());
        hasher.update(b"=");
        hasher.update(v.as_bytes());
        hasher.update(b"\n");
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod task_size_tests {
    use tokio_util::sync::CancellationToken;

    /// The most a rollout task's future may take: it lives as long as the rollout runs, so
    /// with 1,000 rollouts in flight each KB here is a MB of the daemon. `runner::run` boxes
    /// its drive (about 7 KB, on the heap once); inline, the wrappers around it (the storage
    /// retries, the `select!` with the abort feed, the timings' scope) each held a copy of it,
    /// 31 KB in all.
    const MAX_TASK_BYTES: usize = 4 * 1024;

    #[tokio::test]
    async fn a_rollout_task_holds_its_drive_on_the_heap() {
        let dir = tempfile::tempdir().expect("temp dir");
        let engine = super::steps::compose::tests::engine(dir.path()).await;
        let task = super::runner::run(&engine, "ro_1", CancellationToken::new());
        let size = std::mem::size_of_val(&task);
        assert!(
            size <= MAX_TASK_BYTES,
            "a rollout task's future is {size} bytes, more than {MAX_TASK_BYTES}: box the \
             largest future it awaits"
        );
    }
}
