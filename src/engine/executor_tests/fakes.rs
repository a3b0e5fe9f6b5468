//! In-memory fakes of a step's seams (`engine/seams.rs`): a host that keeps its containers and
//! a journal of the calls it was sent, a store of attempts, saves and approvals, a prober of
//! scripted `/health` answers. Each answers at once, so an executor test is as fast as the
//! step's own pauses.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde_json::json;

use super::super::seams::{HostCalls, Probe, StepStore};
use crate::compose::{
    ComposeError, ComposeRequest, DryRunResult, HostCache, HostStatus, LogsRequest, PsEntry,
    StageResult, StreamOutcome, StreamResult, VersionInfo,
};
use crate::domain::plan_gate::DryRunPlan;
use crate::domain::runbook::step::up::Staged;
use crate::domain::state::AttemptOutcome;
use crate::probe::{HealthSample, HealthUrl};
use crate::store::{Approval, Deployment, NewDeployment, Step, StepAttempt, StoreError};

/// Locks a fake's state; a test that panicked while holding it has failed already.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A stream that ended `done` with `success: true`.
pub(super) fn done() -> StreamResult {
    StreamResult {
        outcome: StreamOutcome::Succeeded,
        transcript_tail: vec!["stdout: done".to_owned()],
        n_lines: 1,
        pulled_at: None,
    }
}

/// A stream cut before its `done`: the host may have acted on it.
pub(super) fn cut() -> StreamResult {
    StreamResult {
        outcome: StreamOutcome::Unknown,
        transcript_tail: vec!["canaryd: the stream ended without `done`".to_owned()],
        n_lines: 0,
        pulled_at: None,
    }
}

/// A dry run that succeeded with `plan`.
pub(super) fn planned(plan: DryRunPlan) -> DryRunResult {
    let raw = serde_json::to_value(&plan).unwrap_or_default();
    DryRunResult {
        stream: done(),
        plan: Some(plan),
        raw_plan: Some(raw),
    }
}

/// A running container of `service`.
pub(super) fn container(id: &str, service: &str, image: &str) -> PsEntry {
    PsEntry {
        id: id.to_owned(),
        names: service.to_owned(),
        image: image.to_owned(),
        state: "running".to_owned(),
        status: "Up 3 hours (healthy)".to_owned(),
        labels: format!("com.docker.compose.service={service}"),
    }
}

/// A call the fake host was sent: its endpoint (`compose/up`, `compose/up?dry_run`,
/// `compose/down`, `docker/ps`, `compose/logs`, `version`, `status`), and for compose calls
/// the services and the tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sent {
    pub endpoint: &'static str,
    pub services: Vec<String>,
    pub tag: String,
}

/// compose-manager with its containers. An `up` that succeeds gives each of its services a new
/// running container, a `down` removes theirs; scripted answers (`plans`, `streams`) come
/// first, in order, then every call succeeds.
#[derive(Default)]
pub(super) struct FakeHost {
    pub ps: Mutex<Vec<PsEntry>>,
    journal: Mutex<Vec<Sent>>,
    /// The next dry runs' answers; by default a dry run plans its services' recreation.
    pub plans: Mutex<VecDeque<Result<DryRunResult, ComposeError>>>,
    /// The next `up`s' and `down`s' answers; by default a stream ends `done`.
    pub streams: Mutex<VecDeque<Result<StreamResult, ComposeError>>>,
    /// Each service's log, as `compose/logs` answers it.
    pub logs: Mutex<BTreeMap<String, String>>,
    /// `GET /docker/ps` answers this error instead, while set.
    pub ps_error: Mutex<Option<ComposeError>>,
    /// Whether the server honours `dry_run` (an old one does not).
    pub no_dry_run: AtomicBool,
    pub version: Mutex<VersionInfo>,
    /// What `GET /host/cache` answers.
    pub cache: Mutex<HostCache>,
    containers_made: AtomicU64,
}

impl FakeHost {
    /// A host running `containers`.
    pub fn running(containers: Vec<PsEntry>) -> Self {
        let host = FakeHost::default();
        *lock(&host.ps) = containers;
        host
    }

    /// Every call sent so far, in order.
    pub fn journal(&self) -> Vec<Sent> {
        lock(&self.journal).clone()
    }

    /// The compose calls sent so far (reads left out).
    pub fn compose_calls(&self) -> Vec<Sent> {
        self.journal()
            .into_iter()
            .filter(|s| s.endpoint.starts_with("compose/") && s.endpoint != "compose/logs")
            .collect()
    }

    /// The container id of `service`, if it has one.
    pub fn id_of(&self, service: &str) -> Option<String> {
        lock(&self.ps)
            .iter()
            .find(|c| c.is_service(service))
            .map(|c| c.id.clone())
    }

    /// Appends `line` to `service`'s log.
    pub fn log(&self, service: &str, line: &str) {
        let mut logs = lock(&self.logs);
        let log = logs.entry(service.to_owned()).or_default();
        log.push_str(line);
        log.push('\n');
    }

    fn record(&self, endpoint: &'static str, req: Option<&ComposeRequest>) {
        lock(&self.journal).push(Sent {
            endpoint,
            services: req
                .map(|r| r.services.names().iter().map(|s| s.to_string()).collect())
                .unwrap_or_default(),
            tag: req.map(|r| r.tag.to_string()).unwrap_or_default(),
        });
    }

    fn stream(&self) -> Result<StreamResult, ComposeError> {
        lock(&self.streams)
            .pop_front()
            .unwrap_or_else(|| Ok(done()))
    }
}

impl HostCalls for FakeHost {
    fn up<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StreamResult, ComposeError>> {
        self.record("compose/up", Some(req));
        let answer = self.stream();
        if answer.as_ref().is_ok_and(StreamResult::succeeded) {
            let mut ps = lock(&self.ps);
            for service in req.services.names() {
                ps.retain(|c| !c.is_service(service));
                let n = self.containers_made.fetch_add(1, Ordering::Relaxed);
                let image = format!("engine:{}", req.tag);
                ps.push(container(&format!("new{n}"), service, &image));
            }
        }
        Box::pin(async move { answer })
    }

    fn dry_run<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<DryRunResult, ComposeError>> {
        self.record("compose/up?dry_run", Some(req));
        let answer = lock(&self.plans).pop_front().unwrap_or_else(|| {
            Ok(planned(DryRunPlan {
                recreate: req.services.names().iter().map(|s| s.to_string()).collect(),
                ..DryRunPlan::default()
            }))
        });
        Box::pin(async move { answer })
    }

    fn down<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StreamResult, ComposeError>> {
        self.record("compose/down", Some(req));
        let answer = self.stream();
        if answer.as_ref().is_ok_and(StreamResult::succeeded) {
            let mut ps = lock(&self.ps);
            for service in req.services.names() {
                ps.retain(|c| !c.is_service(service));
            }
        }
        Box::pin(async move { answer })
    }

    fn stage<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StageResult, ComposeError>> {
        self.record("compose/up?materialize_only", Some(req));
        let answer = self.stream().map(|stream| StageResult {
            staged: stream.succeeded().then(|| Staged {
                file: req.file.to_string(),
                file_sha256: "9df5".to_owned(),
                tag: req.tag.to_string(),
            }),
            stream,
        });
        Box::pin(async move { answer })
    }

    fn logs<'a>(&'a self, req: &'a LogsRequest) -> BoxFuture<'a, Result<String, ComposeError>> {
        self.record("compose/logs", None);
        let log = lock(&self.logs)
            .get(req.service.as_str())
            .cloned()
            .unwrap_or_default();
        Box::pin(async move { Ok(log) })
    }

    fn ps(&self) -> BoxFuture<'_, Result<Vec<PsEntry>, ComposeError>> {
        self.record("docker/ps", None);
        let answer = match lock(&self.ps_error).clone() {
            Some(e) => Err(e),
            None => Ok(lock(&self.ps).clone()),
        };
        Box::pin(async move { answer })
    }

    fn ps_service<'a>(
        &'a self,
        service: &'a str,
    ) -> BoxFuture<'a, Result<Option<PsEntry>, ComposeError>> {
        let ps = self.ps();
        Box::pin(async move { Ok(ps.await?.into_iter().find(|c| c.is_service(service))) })
    }

    fn status(&self) -> BoxFuture<'_, Result<HostStatus, ComposeError>> {
        self.record("status", None);
        Box::pin(async { Ok(HostStatus::default()) })
    }

    fn version(&self) -> BoxFuture<'_, Result<VersionInfo, ComposeError>> {
        self.record("version", None);
        let v = lock(&self.version).clone();
        Box::pin(async move { Ok(v) })
    }

    fn host_cache(&self) -> BoxFuture<'_, Result<HostCache, ComposeError>> {
        self.record("host/cache", None);
        let cache = lock(&self.cache).clone();
        Box::pin(async move { Ok(cache) })
    }

    fn supports_dry_run(&self) -> BoxFuture<'_, Result<bool, ComposeError>> {
        let yes = !self.no_dry_run.load(Ordering::Relaxed);
        Box::pin(async move { Ok(yes) })
    }
}

/// The store as a step sees it, in memory.
#[derive(Default)]
pub(super) struct FakeStore {
    pub attempts: Mutex<Vec<StepAttempt>>,
    /// Each progress save of a step's evidence, in order.
    pub saves: Mutex<Vec<serde_json::Value>>,
    pub deadlines: Mutex<Vec<DateTime<Utc>>>,
    pub deployments: Mutex<Vec<Deployment>>,
    pub baselines: Mutex<Vec<NewDeployment>>,
    /// Steps that asked for an approval.
    pub approval_requests: Mutex<Vec<String>>,
    /// Approvals given, by step name.
    pub approvals: Mutex<BTreeMap<String, Approval>>,
    /// Whether an attempt's write fails (a full disk).
    pub refuse_attempts: AtomicBool,
}

/// Hands back `value` as a ready future.
fn ready<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, T> {
    Box::pin(async move { value })
}

impl StepStore for FakeStore {
    fn begin_attempt<'a>(
        &'a self,
        step: &'a Step,
        endpoint: &'a str,
        at: DateTime<Utc>,
        _touches: bool,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        if self.refuse_attempts.load(Ordering::Relaxed) {
            return ready(Err(StoreError::Lock("disk full".to_owned())));
        }
        let mut attempts = lock(&self.attempts);
        let id = format!("att_{}", attempts.len() + 1);
        let n = attempts.iter().filter(|a| a.step_id == step.id).count() as i64 + 1;
        attempts.push(StepAttempt {
            id: id.clone(),
            step_id: step.id.clone(),
            rollout_id: step.rollout_id.clone(),
            n,
            endpoint: endpoint.to_owned(),
            started_at: at,
            finished_at: None,
            outcome: None,
            detail: json!({}),
        });
        ready(Ok(id))
    }

    fn finish_attempt<'a>(
        &'a self,
        attempt_id: &'a str,
        outcome: AttemptOutcome,
        detail: &'a serde_json::Value,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if let Some(a) = lock(&self.attempts).iter_mut().find(|a| a.id == attempt_id) {
            a.outcome = Some(outcome);
            a.detail = detail.clone();
            a.finished_at = Some(at);
        }
        ready(Ok(()))
    }

    fn attempts<'a>(
        &'a self,
        rollout_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<StepAttempt>, StoreError>> {
        let of: Vec<StepAttempt> = lock(&self.attempts)
            .iter()
            .filter(|a| a.rollout_id == rollout_id)
            .cloned()
            .collect();
        ready(Ok(of))
    }

    fn update_step_detail<'a>(
        &'a self,
        _step_id: &'a str,
        detail: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        lock(&self.saves).push(detail.clone());
        ready(Ok(()))
    }

    fn extend_step_deadline<'a>(
        &'a self,
        _step_id: &'a str,
        deadline: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        lock(&self.deadlines).push(deadline);
        ready(Ok(()))
    }

    fn recent_deployments<'a>(
        &'a self,
        host: &'a str,
        service: &'a str,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Deployment>, StoreError>> {
        let mut of: Vec<Deployment> = lock(&self.deployments)
            .iter()
            .filter(|d| d.host == host && d.service == service)
            .cloned()
            .collect();
        of.sort_by_key(|d| std::cmp::Reverse(d.deployed_at));
        of.truncate(limit as usize);
        ready(Ok(of))
    }

    fn record_baselines<'a>(
        &'a self,
        ds: &'a [NewDeployment],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        lock(&self.baselines).extend(ds.iter().cloned());
        ready(Ok(()))
    }

    fn deployment_named<'a>(
        &'a self,
        host: &'a str,
        service: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Deployment>, StoreError>> {
        let found = lock(&self.deployments)
            .iter()
            .filter(|d| d.host == host && d.service == service && d.name() == name)
            .max_by_key(|d| d.deployed_at)
            .cloned();
        ready(Ok(found))
    }

    fn request_approval<'a>(
        &'a self,
        step: &'a Step,
        detail: &'a serde_json::Value,
        _at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        lock(&self.approval_requests).push(step.name.clone());
        // The store writes the waiting step's evidence with the request.
        lock(&self.saves).push(detail.clone());
        ready(Ok(()))
    }

    fn approval_of<'a>(
        &'a self,
        _rollout_id: &'a str,
        step_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        ready(Ok(lock(&self.approvals).get(step_name).cloned()))
    }
}

/// `/health` answers by URL: each URL's scripted answers in order, its last one repeated;
/// 200 for a URL with none.
#[derive(Default)]
pub(super) struct FakeProbe {
    answers: Mutex<BTreeMap<String, VecDeque<HealthSample>>>,
    /// How many samples each URL was asked for.
    pub asked: Mutex<BTreeMap<String, u64>>,
}

/// An answer of `status`.
pub(super) fn answered(status: u16) -> HealthSample {
    HealthSample {
        status: Some(status),
        error: None,
    }
}

impl FakeProbe {
    /// `url` answers `samples` in order, then its last one.
    pub fn script(&self, url: &str, samples: Vec<HealthSample>) {
        lock(&self.answers).insert(url.to_owned(), samples.into());
    }

    pub fn asked(&self, url: &str) -> u64 {
        lock(&self.asked).get(url).copied().unwrap_or(0)
    }
}

impl Probe for FakeProbe {
    fn sample<'a>(&'a self, url: &'a HealthUrl) -> BoxFuture<'a, HealthSample> {
        let url = url.to_string();
        *lock(&self.asked).entry(url.clone()).or_default() += 1;
        let mut answers = lock(&self.answers);
        let sample = match answers.get_mut(&url) {
            Some(q) if q.len() > 1 => q.pop_front().unwrap_or_else(|| answered(200)),
            Some(q) => q.front().cloned().unwrap_or_else(|| answered(200)),
            None => answered(200),
        };
        ready(sample)
    }
}
