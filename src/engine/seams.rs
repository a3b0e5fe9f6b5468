//! The seams of a step executor: what it asks of the host ([`HostCalls`], compose-manager's
//! calls), of the store ([`StepStore`], its step's writes and the few reads it needs) and of
//! the engines ([`Probe`], one `/health` sample). The daemon's own types implement them here;
//! the executor unit tests give in-memory fakes instead (`executor_tests/fakes.rs`), so a step
//! kind is tested without SQLite or a simulated host.
//!
//! Each method hands back a boxed future, so that a [`StepCtx`](super::step_run::StepCtx)
//! holds the seams as trait objects and no executor is generic over them.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use crate::compose::{
    ComposeClient, ComposeError, ComposeRequest, DryRunResult, HostCache, HostStatus, LogsRequest,
    PsEntry, StageResult, StreamResult, VersionInfo,
};
use crate::domain::state::AttemptOutcome;
use crate::probe::{HealthProber, HealthSample, HealthUrl};
use crate::store::{Approval, Deployment, NewDeployment, Step, StepAttempt, Store, StoreError};

/// compose-manager's calls, as a step makes them.
pub(crate) trait HostCalls: Send + Sync {
    fn up<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StreamResult, ComposeError>>;
    fn dry_run<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<DryRunResult, ComposeError>>;
    fn down<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StreamResult, ComposeError>>;
    /// `compose/up` with `materialize_only` (probe [`Self::supports_dry_run`] first).
    fn stage<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StageResult, ComposeError>>;
    fn logs<'a>(&'a self, req: &'a LogsRequest) -> BoxFuture<'a, Result<String, ComposeError>>;
    fn ps(&self) -> BoxFuture<'_, Result<Vec<PsEntry>, ComposeError>>;
    /// `docker ps`'s entry of one compose service, if it has a container (a soak reads it at
    /// every probe: the daemon's client copies only that entry out of the answer).
    fn ps_service<'a>(
        &'a self,
        service: &'a str,
    ) -> BoxFuture<'a, Result<Option<PsEntry>, ComposeError>>;
    fn status(&self) -> BoxFuture<'_, Result<HostStatus, ComposeError>>;
    fn version(&self) -> BoxFuture<'_, Result<VersionInfo, ComposeError>>;
    /// The model cache: each volume's used bytes and the cached weight repos.
    fn host_cache(&self) -> BoxFuture<'_, Result<HostCache, ComposeError>>;
    /// Whether the server honours `dry_run` and `materialize_only` (docs/safety.md), probed
    /// without side effects.
    fn supports_dry_run(&self) -> BoxFuture<'_, Result<bool, ComposeError>>;
}

impl HostCalls for ComposeClient {
    fn up<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StreamResult, ComposeError>> {
        Box::pin(ComposeClient::up(self, req))
    }
    fn dry_run<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<DryRunResult, ComposeError>> {
        Box::pin(ComposeClient::dry_run(self, req))
    }
    fn down<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StreamResult, ComposeError>> {
        Box::pin(ComposeClient::down(self, req))
    }
    fn stage<'a>(
        &'a self,
        req: &'a ComposeRequest,
    ) -> BoxFuture<'a, Result<StageResult, ComposeError>> {
        Box::pin(ComposeClient::stage(self, req))
    }
    fn logs<'a>(&'a self, req: &'a LogsRequest) -> BoxFuture<'a, Result<String, ComposeError>> {
        Box::pin(ComposeClient::logs(self, req))
    }
    fn ps(&self) -> BoxFuture<'_, Result<Vec<PsEntry>, ComposeError>> {
        Box::pin(ComposeClient::ps(self))
    }
    fn ps_service<'a>(
        &'a self,
        service: &'a str,
    ) -> BoxFuture<'a, Result<Option<PsEntry>, ComposeError>> {
        Box::pin(ComposeClient::ps_service(self, service))
    }
    fn status(&self) -> BoxFuture<'_, Result<HostStatus, ComposeError>> {
        Box::pin(ComposeClient::status(self))
    }
    fn version(&self) -> BoxFuture<'_, Result<VersionInfo, ComposeError>> {
        Box::pin(ComposeClient::version(self))
    }
    fn host_cache(&self) -> BoxFuture<'_, Result<HostCache, ComposeError>> {
        Box::pin(ComposeClient::host_cache(self))
    }
    fn supports_dry_run(&self) -> BoxFuture<'_, Result<bool, ComposeError>> {
        Box::pin(ComposeClient::supports_dry_run(self))
    }
}

/// What a step writes to the store, and the few reads it needs.
pub(crate) trait StepStore: Send + Sync {
    /// The write-ahead row of a compose call, before it is sent (docs/safety.md); `touches`
    /// also records the rollout as having touched its replica.
    fn begin_attempt<'a>(
        &'a self,
        step: &'a Step,
        endpoint: &'a str,
        at: DateTime<Utc>,
        touches: bool,
    ) -> BoxFuture<'a, Result<String, StoreError>>;
    fn finish_attempt<'a>(
        &'a self,
        attempt_id: &'a str,
        outcome: AttemptOutcome,
        detail: &'a serde_json::Value,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn attempts<'a>(
        &'a self,
        rollout_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<StepAttempt>, StoreError>>;
    /// A running step's evidence so far.
    fn update_step_detail<'a>(
        &'a self,
        step_id: &'a str,
        detail: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn extend_step_deadline<'a>(
        &'a self,
        step_id: &'a str,
        deadline: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn recent_deployments<'a>(
        &'a self,
        host: &'a str,
        service: &'a str,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Deployment>, StoreError>>;
    /// What the snapshot saw running on replicas with no deployment recorded yet.
    fn record_baselines<'a>(
        &'a self,
        ds: &'a [NewDeployment],
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    /// The newest deployment of `service` recorded under `name` (a replica deployed as another).
    fn deployment_named<'a>(
        &'a self,
        host: &'a str,
        service: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Deployment>, StoreError>>;
    /// That the step waits for an operator's approval (`detail`: what it shows them).
    fn request_approval<'a>(
        &'a self,
        step: &'a Step,
        detail: &'a serde_json::Value,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn approval_of<'a>(
        &'a self,
        rollout_id: &'a str,
        step_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>>;
}

impl StepStore for Store {
    fn begin_attempt<'a>(
        &'a self,
        step: &'a Step,
        endpoint: &'a str,
        at: DateTime<Utc>,
        touches: bool,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(Store::begin_attempt(self, step, endpoint, at, touches))
    }
    fn finish_attempt<'a>(
        &'a self,
        attempt_id: &'a str,
        outcome: AttemptOutcome,
        detail: &'a serde_json::Value,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::finish_attempt(self, attempt_id, outcome, detail, at))
    }
    fn attempts<'a>(
        &'a self,
        rollout_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<StepAttempt>, StoreError>> {
        Box::pin(Store::attempts(self, rollout_id))
    }
    fn update_step_detail<'a>(
        &'a self,
        step_id: &'a str,
        detail: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::update_step_detail(self, step_id, detail))
    }
    fn extend_step_deadline<'a>(
        &'a self,
        step_id: &'a str,
        deadline: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::extend_step_deadline(self, step_id, deadline))
    }
    fn recent_deployments<'a>(
        &'a self,
        host: &'a str,
        service: &'a str,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Deployment>, StoreError>> {
        Box::pin(Store::recent_deployments(self, host, service, limit))
    }
    fn record_baselines<'a>(
        &'a self,
        ds: &'a [NewDeployment],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::record_baselines(self, ds))
    }
    fn approval_of<'a>(
        &'a self,
        rollout_id: &'a str,
        step_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        Box::pin(Store::approval_of(self, rollout_id, step_name))
    }
    fn deployment_named<'a>(
        &'a self,
        host: &'a str,
        service: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Deployment>, StoreError>> {
        Box::pin(Store::deployment_named(self, host, service, name))
    }
    fn request_approval<'a>(
        &'a self,
        step: &'a Step,
        detail: &'a serde_json::Value,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::request_approval(
            self,
            &step.rollout_id,
            &step.id,
            &step.name,
            detail,
            at,
        ))
    }
}

/// One `/health` sample of an engine.
pub(crate) trait Probe: Send + Sync {
    fn sample<'a>(&'a self, url: &'a HealthUrl) -> BoxFuture<'a, HealthSample>;
}

impl Probe for HealthProber {
    fn sample<'a>(&'a self, url: &'a HealthUrl) -> BoxFuture<'a, HealthSample> {
        Box::pin(HealthProber::sample_url(self, url))
    }
}
