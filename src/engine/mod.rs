//! Drives rollouts: one tokio task per rollout runs its steps in order, writing every state
//! change before and after each side effect. Abort is a persisted request plus a signal that
//! interrupts waits. At start, `recover` resumes every unfinished rollout from SQLite.

mod analyze_step;
mod compose_step;
mod doctor;
#[cfg(feature = "testing")]
mod hooks;
mod left_down;
mod log_step;
mod observe_step;
mod release;
mod restart;
mod rollback;
mod runner;
mod smoke_step;
mod step_run;
mod steps;
mod wait;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::compose::{ClientOptions, ComposeClient, ComposeObserver};
use crate::config::{ComposeTuning, HostConfig, ResolvedConfig};
use crate::domain::audit::AuditKind;
use crate::domain::plan::CanaryPlan;
use crate::domain::runbook::Runbook;
use crate::domain::state::RolloutKind;
use crate::probe::engine_api::EngineApi;
use crate::probe::prometheus::Prometheus;
use crate::probe::HealthProber;
use crate::store::{new_id, AuditEntry, NewRollout, NewStep, Rollout, Store, StoreError};

pub use doctor::{DoctorCheck, DoctorReport};
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
    pub prober: HealthProber,
    /// Calls of the engines' OpenAI-compatible APIs (`smoke`).
    pub engine_api: EngineApi,
    /// The config's Prometheus server (`analyze` with `source: prometheus`), if any.
    pub prometheus: Option<Prometheus>,
    /// Abort signals of the rollouts whose task is running.
    pub running: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// The tasks, so shutdown can stop the ones that outlive their grace.
    pub tasks: Mutex<Vec<AbortHandle>>,
    /// Set by `shutdown`: tasks stop at their next step boundary or wait, leaving their
    /// rollout resumable, and no new task starts.
    pub stopping: AtomicBool,
    #[cfg(feature = "testing")]
    pub hooks: hooks::Hooks,
    /// The last doctor report of each host (`canaryd doctor`).
    pub doctor_reports: doctor::LastReports,
    /// The releases whose coordinator task is running.
    pub releases: release::Coordinators,
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
        for (name, host) in &config.hosts {
            let opts = ClientOptions {
                connect_timeout: config.compose.connect_timeout,
                request_timeout: config.compose.request_timeout,
                stream_idle_timeout: config.compose.stream_idle_timeout,
                triggered_by: "canaryd".to_owned(),
                project: host.project.clone(),
            };
            let mut client =
                ComposeClient::new(&host.compose_manager_url, host.token.expose(), opts)?;
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
            prober: HealthProber::new(Duration::from_secs(3)),
            engine_api: EngineApi::new(config.compose.connect_timeout),
            prometheus: config
                .prometheus
                .as_ref()
                .map(|p| Prometheus::new(p, analyze_step::PROMETHEUS_QUERY_TIMEOUT)),
            running: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            #[cfg(feature = "testing")]
            hooks: hooks::Hooks::default(),
            doctor_reports: doctor::LastReports::default(),
            releases: release::Coordinators::default(),
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
        let new = NewRollout {
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
            Some(tx) => {
                let _ = tx.send(true);
            }
            // No task (it gave up on storage errors): one that sees the request finishes it.
            None => self.spawn(id.to_owned()),
        }
        self.get(id).await
    }

    /// Waits (bounded) until a rollout is terminal; used by preempt and tests.
    pub async fn wait_terminal(&self, id: &str, timeout: Duration) -> Result<Rollout, EngineError> {
        wait::poll_until(
            timeout,
            wait::POLL,
            || self.get(id),
            |r| r.status.is_terminal(),
        )
        .await
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
            let detail = match &at {
                Some((name, status)) => serde_json::json!({"step": name, "step_status": status}),
                None => serde_json::json!({"step": null}),
            };
            let status = rollout.status.as_str();
            let entry = AuditEntry::new(Utc::now(), SYSTEM_ACTOR, AuditKind::RolloutResumed)
                .rollout(&rollout.id)
                .states(Some(status), Some(status))
                .detail(detail);
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

    fn signal(&self, id: &str) -> Option<watch::Sender<bool>> {
        self.inner
            .running
            .lock()
            .ok()
            .and_then(|m| m.get(id).cloned())
    }

    /// Starts the task of a rollout (once: a second call for a running rollout does nothing).
    pub(crate) fn spawn(&self, id: String) {
        if self.is_stopping() {
            tracing::info!(rollout.id = %id, "shutting down: rollout {id} starts at next start");
            return;
        }
        let (tx, rx) = watch::channel(false);
        {
            let Ok(mut running) = self.inner.running.lock() else {
                return;
            };
            if running.contains_key(&id) {
                return;
            }
            running.insert(id.clone(), tx);
        }
        let engine = self.clone();
        let task = tokio::spawn(async move {
            runner::run(&engine, &id, rx).await;
            if let Ok(mut running) = engine.inner.running.lock() {
                running.remove(&id);
            }
        });
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task.abort_handle());
        }
    }

    /// Whether `shutdown` was called.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Graceful stop (SIGTERM): no new task starts; running tasks stop at their next step
    /// boundary or wait, or once their current compose call ends, without marking anything
    /// failed; after `grace`, tasks still running are stopped where they are (their compose
    /// call, if any, is reconciled at next start). Returns how many had to be stopped.
    pub async fn shutdown(&self, grace: Duration) -> usize {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let signals: Vec<watch::Sender<bool>> = self
            .inner
            .running
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for tx in signals {
            let _ = tx.send(true);
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.active_tasks() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.active_tasks();
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
        self.inner.stopping.store(true, Ordering::SeqCst);
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            for task in tasks.drain(..) {
                task.abort();
            }
        }
        if let Ok(mut running) = self.inner.running.lock() {
            running.clear();
        }
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
