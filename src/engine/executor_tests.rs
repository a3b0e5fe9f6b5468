//! The step executors against fakes: a simulated host in this process (its compose-manager
//! and its engines on loopback ports, faults set per test), a store on a temp file and one
//! rollout of r2. Each test runs one step as the runner does (started, then executed with its
//! persisted deadline) and asserts how it ended and the evidence it kept.

use std::collections::BTreeMap;
use std::time::Duration;

use canaryd_sim::{SimConfig, SimHost};
use chrono::Utc;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::step_run::{StepEnd, StepRun};
use super::steps::timeout_of;
use super::Engine;
use crate::config::sim::{dev_config, DEV_FILE, DEV_HOST, R2};
use crate::domain::runbook;
use crate::domain::state::StepEvent;
use crate::store::{NewStep, Rollout, Store};

mod analyze;
mod left_down;
mod logs;
mod observe;
mod rollback;
mod smoke;

/// A simulated host, an engine configured for it, and rollout `ro_1` of r2 to v0.0.452 with
/// the steps of `steps_yaml` (a runbook's `steps:` list).
struct Bench {
    sim: SimHost,
    engine: Engine,
    runbook: runbook::Runbook,
    _dir: tempfile::TempDir,
}

impl Bench {
    async fn new(steps_yaml: &str) -> Bench {
        let mut sim_config = SimConfig::example();
        sim_config.cold_start = Duration::from_millis(300);
        let env = sim_config.initial_env.clone();
        let sim = SimHost::start(sim_config).await.expect("sim starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let addr = "127.0.0.1:0".parse().expect("addr");
        let config = dev_config(&sim, addr, dir.path().join("canaryd.db"), env);
        let runbook = runbook::parse("t", "t.yaml", &format!("steps:\n{steps_yaml}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let store = Store::open(&config.database).await.expect("store");
        let mut rollout = crate::store::tests::rollout("ro_1", DEV_HOST, R2, 0);
        rollout.file = DEV_FILE.to_owned();
        rollout.tag = "v0.0.452".to_owned();
        rollout.env_overrides = BTreeMap::new();
        let steps: Vec<NewStep> = runbook
            .steps
            .iter()
            .map(|s| NewStep {
                name: s.name.clone(),
                kind: s.kind.kind_name(),
            })
            .collect();
        store
            .create_rollout(&rollout, &steps)
            .await
            .expect("rollout created");
        let engine = Engine::new(store, &config, BTreeMap::new()).expect("engine");
        Bench {
            sim,
            engine,
            runbook,
            _dir: dir,
        }
    }

    fn store(&self) -> &Store {
        &self.engine.inner.store
    }

    fn host(&self) -> &super::HostRuntime {
        self.engine.host(DEV_HOST).expect("configured")
    }

    async fn rollout(&self) -> Rollout {
        self.engine.get("ro_1").await.expect("rollout")
    }

    /// Moves the engine's clock `by` ahead once `after` has passed (on the real clock): what a
    /// step sees when its end or deadline passes while it waits.
    fn clock_ahead_after(&self, after: Duration, by: Duration) {
        let clock = self.engine.inner.clock.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            clock.advance(by);
        });
    }

    /// Starts step `index` and runs it to its end, as the runner does; with `abort`, the
    /// rollout's abort signal fires after that long.
    async fn run(&self, index: usize, abort: Option<Duration>) -> StepEnd {
        let steps = self.store().steps("ro_1").await.expect("steps");
        let step = &steps[index];
        let kind = &self.runbook.steps[index].kind;
        let now = Utc::now();
        let deadline = timeout_of(kind).map(|t| now + t);
        self.store()
            .transition_step(step, StepEvent::Start, &json!({}), deadline, now)
            .await
            .expect("step started");
        let step = self.store().steps("ro_1").await.expect("steps")[index].clone();
        let rollout = self.rollout().await;
        let mut run = StepRun::new(&self.engine, &rollout).expect("host configured");
        let token = CancellationToken::new();
        if let Some(after) = abort {
            let token = token.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                token.cancel();
            });
        }
        // Bounded: every step here has a budget of seconds.
        tokio::time::timeout(Duration::from_secs(30), run.execute(&step, kind, &token))
            .await
            .expect("the step ends within its budget")
    }
}

/// The evidence of a step's end, and its code when it failed.
fn ended(end: &StepEnd) -> (&'static str, Option<String>, &Value) {
    match end {
        StepEnd::Succeeded(d) => ("succeeded", None, d),
        StepEnd::Failed { code, detail, .. } => ("failed", Some(code.as_str().to_owned()), detail),
        StepEnd::Aborted(d) => ("aborted", None, d),
    }
}

/// The message of a failed step.
fn message(end: &StepEnd) -> &str {
    match end {
        StepEnd::Failed { message, .. } => message,
        _ => "",
    }
}
