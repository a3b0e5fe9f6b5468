//! Step executors that observe rather than act: snapshot, peers, neighbours and the waits.
//! The compose steps (plan, down, up) live in `compose_step.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::sync::watch;

use super::log_step::LogWait;
use super::smoke_step::Smoke;
use super::{compose_step, merged_env, Engine, HostRuntime};
use crate::compose::{LogsRequest, PsEntry};
use crate::domain::pattern::LogPattern;
use crate::domain::runbook::StepKind;
use crate::probe::HealthSample;
use crate::store::{NewDeployment, Rollout, Step};

/// How a step ended.
#[derive(Debug)]
pub(crate) enum StepEnd {
    Succeeded(serde_json::Value),
    Failed {
        code: String,
        message: String,
        detail: serde_json::Value,
    },
    Aborted(serde_json::Value),
}

impl StepEnd {
    pub(crate) fn failed(
        code: &str,
        message: impl Into<String>,
        detail: serde_json::Value,
    ) -> Self {
        StepEnd::Failed {
            code: code.to_owned(),
            message: message.into(),
            detail,
        }
    }
}

/// The budget of a step, fixed when it starts and persisted as its deadline.
pub(crate) fn timeout_of(kind: &StepKind) -> Option<chrono::Duration> {
    let d = match kind {
        StepKind::PeersHealthy { timeout }
        | StepKind::Down { timeout }
        | StepKind::Up { timeout }
        | StepKind::WaitHealth { timeout, .. }
        | StepKind::WaitLogs { timeout, .. }
        | StepKind::Smoke { timeout, .. } => *timeout,
        StepKind::Soak { duration, .. } => *duration,
        // Scrapes run until warmup + duration; a last slow scrape may end past it.
        StepKind::Analyze(spec) => {
            spec.warmup + spec.duration + spec.interval + Duration::from_secs(60)
        }
        // A dry run, like a snapshot, should take seconds; this bounds 409 retries.
        StepKind::Plan { .. } | StepKind::Snapshot | StepKind::VerifyNeighbours => {
            Duration::from_secs(300)
        }
    };
    chrono::Duration::from_std(d).ok()
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
        }
    }

    /// Rebuilds carried state from a step that finished before a restart.
    pub(crate) fn restore(&mut self, step: &Step) {
        self.after_success(step, &step.detail);
    }

    pub(crate) fn after_success(&mut self, step: &Step, detail: &serde_json::Value) {
        if step.kind == "up" {
            self.up_done_at = Some(step.finished_at.unwrap_or_else(Utc::now));
        }
        if step.kind == "snapshot" {
            self.snapshot = detail
                .get("ps")
                .and_then(|ps| serde_json::from_value(ps.clone()).ok());
        }
    }

    pub(crate) async fn execute(
        &mut self,
        step: &Step,
        kind: &StepKind,
        abort: &mut watch::Receiver<bool>,
    ) -> StepEnd {
        let deadline = step
            .deadline_at
            .unwrap_or_else(|| Utc::now() + chrono::Duration::minutes(5));
        match kind {
            StepKind::Snapshot => self.snapshot_host().await,
            StepKind::PeersHealthy { .. } => self.peers_healthy(deadline, abort).await,
            StepKind::Plan { allow } => {
                compose_step::plan(self, step, allow, deadline, abort).await
            }
            StepKind::Down { .. } => compose_step::down(self, step, deadline, abort).await,
            StepKind::Up { .. } => compose_step::up(self, step, deadline, abort).await,
            StepKind::VerifyNeighbours => self.verify_neighbours().await,
            StepKind::WaitHealth {
                interval,
                consecutive,
                ..
            } => {
                self.wait_health(step, deadline, *interval, *consecutive, abort)
                    .await
            }
            StepKind::WaitLogs {
                interval,
                require,
                forbid,
                max_log_failures,
                ..
            } => {
                let mut require = require.clone();
                require.extend(
                    self.rollout
                        .require_logs
                        .iter()
                        .filter_map(|p| LogPattern::parse(p).ok()),
                );
                let spec = LogWait {
                    interval: *interval,
                    require,
                    forbid: forbid.clone(),
                    max_log_failures: *max_log_failures,
                };
                let end = self.wait_logs(step, deadline, spec, abort).await;
                self.masked(end)
            }
            StepKind::Soak {
                interval,
                max_misses,
                forbid,
                max_log_failures,
                ..
            } => {
                let spec = LogWait {
                    interval: *interval,
                    require: Vec::new(),
                    forbid: forbid.clone(),
                    max_log_failures: *max_log_failures,
                };
                let end = self.soak(step, deadline, *max_misses, spec, abort).await;
                self.masked(end)
            }
            StepKind::Smoke {
                model,
                prompt,
                max_tokens,
                expect,
                repeat,
                ..
            } => {
                let spec = Smoke {
                    model,
                    prompt,
                    max_tokens: *max_tokens,
                    expect,
                    repeat: *repeat,
                };
                self.smoke(deadline, spec, abort).await
            }
            StepKind::Analyze(spec) => self.analyze(step, spec, abort).await,
        }
    }

    fn health_url(&self, service: &str) -> Option<&str> {
        self.host
            .config
            .replicas
            .get(service)
            .map(|r| r.health_url.as_str())
    }

    /// The target's health URL, or the step's failure when it has none.
    pub(super) fn target_health_url(&self) -> Result<String, StepEnd> {
        self.health_url(&self.rollout.service)
            .map(str::to_owned)
            .ok_or_else(|| {
                StepEnd::failed(
                    "no_health_url",
                    "the replica has no health_url configured",
                    json!({}),
                )
            })
    }

    async fn snapshot_host(&mut self) -> StepEnd {
        let client = &self.host.client;
        let ps = match client.ps().await {
            Ok(ps) => ps,
            Err(e) => return StepEnd::failed(e.code(), e.to_string(), json!({})),
        };
        let version = match client.version().await {
            Ok(v) => v,
            Err(e) => return StepEnd::failed(e.code(), e.to_string(), json!({"ps": ps})),
        };
        self.record_baseline(&ps, &version).await;
        self.snapshot = Some(ps.clone());
        StepEnd::Succeeded(json!({"ps": ps, "version": version}))
    }

    /// The first rollout of a replica canaryd never deployed records what the host runs now.
    async fn record_baseline(&self, ps: &[PsEntry], version: &crate::compose::VersionInfo) {
        let store = &self.engine.inner.store;
        let current = version
            .projects
            .get(&self.host.config.project)
            .and_then(|p| p.current.clone());
        let Some(current) = current else { return };
        let Some(tag) = current.tag.clone() else {
            return;
        };
        let baseline = NewDeployment {
            host: self.rollout.host.clone(),
            service: self.rollout.service.clone(),
            file: current
                .file
                .clone()
                .unwrap_or_else(|| self.rollout.file.clone()),
            tag,
            env_overrides: BTreeMap::new(),
            env_sha256: None,
            commit: current.commit.clone(),
            file_sha256: current.file_sha256.clone(),
            image: ps
                .iter()
                .find(|c| is_service(c, &self.rollout.service))
                .map(|c| c.image.clone()),
            source: crate::domain::state::DeploymentSource::Baseline,
            rollout_id: None,
            deployed_at: Utc::now(),
        };
        if let Err(e) = store.record_baseline(&baseline).await {
            tracing::warn!(rollout.id = %self.rollout.id, error = %e, "could not record the baseline deployment");
        }
    }

    async fn peers_healthy(
        &self,
        deadline: DateTime<Utc>,
        abort: &mut watch::Receiver<bool>,
    ) -> StepEnd {
        let peers: Vec<String> = self
            .host
            .config
            .peers(&self.rollout.service)
            .iter()
            .map(|s| s.to_string())
            .collect();
        if peers.is_empty() {
            // Safety rule 7 (docs/safety.md): someone must carry the traffic while the target is down.
            let msg = format!(
                "{} has no other replica in its group on {}: taking it down would leave nothing serving",
                self.rollout.service, self.rollout.host
            );
            return StepEnd::failed("no_peers", msg, json!({"peers": []}));
        }
        let interval = poll_interval(deadline);
        loop {
            let mut unhealthy = BTreeMap::new();
            for peer in &peers {
                let sample = match self.health_url(peer) {
                    Some(url) => self.engine.inner.prober.sample(url).await,
                    None => HealthSample {
                        status: None,
                        error: Some("no health_url configured".into()),
                    },
                };
                if !sample.is_healthy() {
                    unhealthy.insert(peer.clone(), sample);
                }
            }
            if unhealthy.is_empty() {
                return StepEnd::Succeeded(json!({"peers": peers}));
            }
            if Utc::now() >= deadline {
                let names: Vec<&String> = unhealthy.keys().collect();
                let msg = format!("peers not healthy before the deadline: {names:?}");
                return StepEnd::failed(
                    "peers_unhealthy",
                    msg,
                    json!({"peers": peers, "unhealthy": unhealthy}),
                );
            }
            if pause(interval, abort).await {
                return StepEnd::Aborted(json!({"unhealthy": unhealthy}));
            }
        }
    }

    async fn verify_neighbours(&self) -> StepEnd {
        let Some(before) = &self.snapshot else {
            return StepEnd::failed(
                "no_snapshot",
                "verify_neighbours needs a snapshot step before it",
                json!({}),
            );
        };
        let now = match self.host.client.ps().await {
            Ok(ps) => ps,
            Err(e) => return StepEnd::failed(e.code(), e.to_string(), json!({})),
        };
        let mut changed = Vec::new();
        for old in before
            .iter()
            .filter(|c| !is_service(c, &self.rollout.service))
        {
            match now.iter().find(|c| c.names == old.names) {
                Some(new) if new.id == old.id && new.image == old.image => {}
                Some(new) => changed.push(json!({"container": old.names, "before": {"id": old.id, "image": old.image}, "after": {"id": new.id, "image": new.image}})),
                None => changed.push(json!({"container": old.names, "before": {"id": old.id, "image": old.image}, "after": null})),
            }
        }
        let checked = before.len().saturating_sub(1);
        if changed.is_empty() {
            StepEnd::Succeeded(json!({"checked": checked}))
        } else {
            let msg = format!("{} neighbouring container(s) changed", changed.len());
            StepEnd::failed(
                "neighbour_changed",
                msg,
                json!({"checked": checked, "changed": changed}),
            )
        }
    }

    async fn wait_health(
        &self,
        step: &Step,
        deadline: DateTime<Utc>,
        interval: Duration,
        consecutive: u32,
        abort: &mut watch::Receiver<bool>,
    ) -> StepEnd {
        let url = match self.target_health_url() {
            Ok(url) => url,
            Err(end) => return end,
        };
        let (mut ok, mut bad, mut streak) = (0u64, 0u64, 0u32);
        let mut progress = Progress::default();
        loop {
            let sample = self.engine.inner.prober.sample(&url).await;
            if sample.is_healthy() {
                ok += 1;
                streak += 1;
            } else {
                bad += 1;
                streak = 0;
            }
            let detail = json!({"healthy_samples": ok, "unhealthy_samples": bad, "streak": streak, "last": sample});
            if streak >= consecutive {
                return StepEnd::Succeeded(detail);
            }
            if Utc::now() >= deadline {
                let msg = format!(
                    "{url} did not answer 200 {consecutive} times in a row before the deadline"
                );
                return StepEnd::failed("health_timeout", msg, detail);
            }
            progress
                .save(&self.engine.inner.store, &step.id, &detail)
                .await;
            if pause(interval, abort).await {
                return StepEnd::Aborted(detail);
            }
        }
    }

    pub(super) async fn fetch_logs(&self) -> Result<String, crate::compose::ComposeError> {
        let req = LogsRequest {
            file: self.rollout.file.clone(),
            service: self.rollout.service.clone(),
            tail: 500,
        };
        self.host.client.logs(&req).await
    }
}

/// Whether a `docker ps` entry is the given compose service's container.
pub(crate) fn is_service(c: &PsEntry, service: &str) -> bool {
    c.names == service
        || c.labels
            .split(',')
            .any(|l| l == format!("com.docker.compose.service={service}"))
}

/// Poll interval for waits without one of their own: a tenth of the time left, 50 ms to 1 s.
pub(crate) fn poll_interval(deadline: DateTime<Utc>) -> Duration {
    let left = (deadline - Utc::now()).to_std().unwrap_or_default();
    (left / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Sleeps for `d`, or less if an abort arrives; true when aborted.
pub(crate) async fn pause(d: Duration, abort: &mut watch::Receiver<bool>) -> bool {
    if *abort.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => *abort.borrow(),
        changed = abort.changed() => match changed {
            Ok(()) => *abort.borrow(),
            Err(_) => { tokio::time::sleep(d).await; false }
        },
    }
}

/// How often a running wait saves its evidence (the final evidence is written when the step
/// ends). Bounded so that many concurrent waits do not queue on SQLite's single writer.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Saves a wait's evidence at its first probe, then at most every `PROGRESS_EVERY`.
#[derive(Default)]
pub(super) struct Progress {
    last: Option<std::time::Instant>,
}

impl Progress {
    pub(super) async fn save(
        &mut self,
        store: &crate::store::Store,
        step_id: &str,
        detail: &serde_json::Value,
    ) {
        if self.last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(std::time::Instant::now());
        if let Err(e) = store.update_step_detail(step_id, detail).await {
            tracing::warn!(error = %e, "could not save the progress of step {step_id}");
        }
    }
}
