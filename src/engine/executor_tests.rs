//! The step executors against in-memory fakes of their seams (`fakes.rs`: the host's compose
//! calls, the store's step writes, the `/health` prober) and, for the kinds that read an
//! engine over HTTP (`smoke`, `analyze`), a fake engine on a loopback port (`engine.rs`). No
//! SQLite, no simulated host: each test runs one step as the runner does (with its deadline)
//! and asserts how it ended, the evidence it kept and the calls it sent.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::step_run::{Parts, StepCtx, StepEnd, StepRun};
use super::steps::timeout_of;
use crate::config::{ComposeTuning, EngineTuning, EnvMap, HostConfig, ReplicaConfig, Secret};
use crate::domain::runbook;
use crate::domain::state::{OnFailure, RolloutKind, RolloutStatus, StepStatus};
use crate::probe::engine_api::EngineApi;
use crate::store::{Rollout, Step};
use fakes::{container, FakeHost, FakeProbe, FakeStore};

mod analyze;
mod approve;
mod compose;
mod engine;
mod fakes;
mod free_space;
mod left_down;
mod logs;
mod observe;

mod smoke;
mod stage;
mod window;

const HOST: &str = "gpu02";
const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";
const R1: &str = "model-sg-glm53-w4afp8-tp4-r1";
const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";
/// A service of the same file that is no replica canaryd rolls.
const PROXY: &str = "proxy";
const TAG: &str = "v0.0.452";

/// The `/health` URL of a replica, as the fake prober knows it.
fn health_url(service: &str) -> String {
    format!("http://{service}.test:8000/health")
}

/// A rollout `ro_1` of r2 to v0.0.452 on a host running r1, r2 (at v0.0.450) and a proxy,
/// with the steps of `steps_yaml` (a runbook's `steps:` list).
struct Bench {
    host: FakeHost,
    store: FakeStore,
    probe: FakeProbe,
    config: HostConfig,
    engine_api: EngineApi,
    compose: ComposeTuning,
    timings: EngineTuning,
    clock: Clock,
    runbook: runbook::Runbook,
    rollout: Rollout,
}

impl Bench {
    fn new(steps_yaml: &str) -> Bench {
        let runbook = runbook::parse("t", "t.yaml", &format!("steps:\n{steps_yaml}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let replica = |service: &str| ReplicaConfig {
            group: "glm53-long".to_owned(),
            health_url: health_url(service),
            api_url: format!("http://{service}.test:8000"),
            api_token: None,
            metrics_url: None,
            aliases: Vec::new(),
        };
        let config = HostConfig {
            name: HOST.to_owned(),
            compose_manager_url: "http://gpu02.test:8080".to_owned(),
            token: Secret::new("t"),
            token_env: None,
            env: EnvMap::new(BTreeMap::from([("MODEL_DIR".to_owned(), "/m".to_owned())])),
            project: "work".to_owned(),
            replicas: BTreeMap::from([(R1.to_owned(), replica(R1)), (R2.to_owned(), replica(R2))]),
            windows: Vec::new(),
            model_cache: None,
        };
        let old = "engine:v0.0.450";
        let host = FakeHost::running(vec![
            container("c1", R1, old),
            container("c2", R2, old),
            container("c3", PROXY, "proxy:1"),
        ]);
        let compose = ComposeTuning {
            busy_retry_initial: Duration::from_millis(20),
            busy_retry_max: Duration::from_millis(100),
            settle_interval: Duration::from_millis(20),
            ..ComposeTuning::default()
        };
        Bench {
            host,
            store: FakeStore::default(),
            probe: FakeProbe::default(),
            config,
            engine_api: EngineApi::new(Duration::from_secs(2)),
            compose,
            timings: EngineTuning::default(),
            clock: Clock::default(),
            runbook,
            rollout: rollout(),
        }
    }

    /// The bench with its replicas' APIs and Prometheus pages on `engines`.
    fn on_engines(mut self, engines: &engine::FakeEngines) -> Bench {
        for (service, replica) in &mut self.config.replicas {
            replica.api_url = engines.api_url(service);
            replica.metrics_url = Some(engines.metrics_url(service));
        }
        self
    }

    /// Moves the clock `by` ahead once `after` has passed (on the real clock): what a step
    /// sees when its end or deadline passes while it waits.
    fn clock_ahead_after(&self, after: Duration, by: Duration) {
        let clock = self.clock.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            clock.advance(by);
        });
    }

    /// Step `index`, started now with its budget's deadline.
    fn step(&self, index: usize) -> Step {
        let def = &self.runbook.steps[index];
        let now = Utc::now();
        Step {
            id: format!("st_{index}"),
            rollout_id: self.rollout.id.clone(),
            position: index as i64,
            name: def.name.clone(),
            kind: def.kind.kind_name(),
            status: StepStatus::Running,
            attempts: 1,
            started_at: Some(now),
            finished_at: None,
            deadline_at: timeout_of(&def.kind).map(|t| self.clock.now() + t),
            detail: Value::Null,
        }
    }

    /// The run of the rollout's steps on the fakes.
    fn step_run(&self) -> StepRun<'_> {
        let ctx = StepCtx::from_parts(Parts {
            store: &self.store,
            host: &self.config,
            calls: &self.host,
            prober: &self.probe,
            engine_api: &self.engine_api,
            prometheus: None,
            compose: &self.compose,
            timings: self.timings,
            clock: &self.clock,
        });
        StepRun::with_ctx(ctx, &self.rollout)
    }

    /// Runs step `index` to its end, as the runner does; with `abort`, the rollout's abort
    /// signal fires after that long.
    async fn run(&self, index: usize, abort: Option<Duration>) -> StepEnd {
        self.run_in(&mut self.step_run(), index, abort).await
    }

    /// Runs step `index` in `run` (which carries what earlier steps left).
    async fn run_in(
        &self,
        run: &mut StepRun<'_>,
        index: usize,
        abort: Option<Duration>,
    ) -> StepEnd {
        let step = self.step(index);
        let kind = &self.runbook.steps[index].kind;
        let token = CancellationToken::new();
        if let Some(after) = abort {
            let token = token.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                token.cancel();
            });
        }
        // Bounded: every step here has a budget of seconds.
        let end = tokio::time::timeout(Duration::from_secs(30), run.execute(&step, kind, &token))
            .await
            .expect("the step ends within its budget");
        if let StepEnd::Succeeded(detail) = &end {
            run.after_success(&step, detail.json());
        }
        end
    }

    /// Runs steps `0..=last` in one run, each to succeed but the last, whose end is returned.
    async fn run_through(&self, last: usize) -> StepEnd {
        let mut run = self.step_run();
        for index in 0..last {
            let end = self.run_in(&mut run, index, None).await;
            let (status, code, detail) = ended(&end);
            assert_eq!(
                (status, code),
                ("succeeded", None),
                "step {index}: {detail}"
            );
        }
        self.run_in(&mut run, last, None).await
    }
}

/// The rollout the bench runs.
fn rollout() -> Rollout {
    Rollout {
        id: "ro_1".to_owned(),
        kind: RolloutKind::Canary,
        status: RolloutStatus::Running,
        host: HOST.to_owned(),
        file: FILE.parse().expect("a valid name"),
        service: R2.parse().expect("a valid name"),
        tag: TAG.parse().expect("a valid name"),
        runbook: "t".to_owned(),
        actor: "alice".to_owned(),
        reason: "test".to_owned(),
        env_overrides: BTreeMap::new(),
        env_sha256: "sha".to_owned(),
        require_logs: Vec::new(),
        on_failure: OnFailure::Rollback,
        created_at: Utc::now(),
        started_at: Some(Utc::now()),
        finished_at: None,
        error_code: None,
        error_message: None,
        rollback_of: None,
        expect_commit: None,
        expect_file_sha256: None,
        rolled_back_by: None,
        touched_replica: false,
        abort_reason: None,
        deploy_as: None,
        replaces: None,
        downtime_ms: None,
        windows: Vec::new(),
        required_free: None,
    }
}

/// The evidence of a step's end, and its code when it failed.
fn ended(end: &StepEnd) -> (&'static str, Option<String>, &Value) {
    match end {
        StepEnd::Succeeded(d) => ("succeeded", None, d.json()),
        StepEnd::Failed { code, detail, .. } => {
            ("failed", Some(code.as_str().to_owned()), detail.json())
        }
        StepEnd::Aborted(d) => ("aborted", None, d.json()),
    }
}

/// The message of a failed step.
fn message(end: &StepEnd) -> &str {
    match end {
        StepEnd::Failed { message, .. } => message,
        _ => "",
    }
}
