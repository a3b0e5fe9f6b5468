//! The steps that observe rather than act: `snapshot`, `peers_healthy`, `verify_neighbours`
//! and `wait_health`. The compose steps (plan, down, up) live in `compose.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::compose::PsEntry;
use crate::domain::error_code::ErrorCode;
use crate::domain::names::{ComposeFile, ServiceName, Tag};
use crate::domain::runbook::step::peers_healthy::PeersHealthyEvidence;
use crate::domain::runbook::step::snapshot::SnapshotEvidence;
use crate::domain::runbook::step::verify_neighbours::{
    ContainerIdentity, NeighbourChange, VerifyNeighboursEvidence,
};
use crate::domain::runbook::step::wait_health::WaitHealthEvidence;
use crate::domain::runbook::step::{PeersHealthy, Snapshot, VerifyNeighbours, WaitHealth};
use crate::engine::step_run::{
    is_service, pause, pause_until_next_probe, Evidence, Execute, Progress, Rhythm, Running,
    StepEnd, StepRun,
};
use crate::probe::HealthSample;
use crate::store::{NewDeployment, Step};

impl Execute for Snapshot {
    async fn execute(&self, run: &mut StepRun<'_>, _: &mut Running<'_>) -> StepEnd {
        run.snapshot_host().await
    }

    /// `docker ps` as the snapshot saw it, for `verify_neighbours` and the evidence of an
    /// unknown compose outcome.
    fn carry(run: &mut StepRun<'_>, _step: &Step, detail: &serde_json::Value) {
        run.snapshot = SnapshotEvidence::<PsEntry>::deserialize(detail)
            .ok()
            .and_then(|d| d.ps);
    }
}

impl Execute for PeersHealthy {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        run.peers_healthy(at.deadline, at.abort).await
    }
}

impl Execute for VerifyNeighbours {
    async fn execute(&self, run: &mut StepRun<'_>, _: &mut Running<'_>) -> StepEnd {
        run.verify_neighbours().await
    }
}

impl Execute for WaitHealth {
    async fn execute(&self, run: &mut StepRun<'_>, at: &mut Running<'_>) -> StepEnd {
        let (interval, consecutive) = (self.interval, self.consecutive);
        run.wait_health(at.step, at.deadline, interval, consecutive, at.abort)
            .await
    }
}

impl StepRun<'_> {
    async fn snapshot_host(&mut self) -> StepEnd {
        let client = self.ctx.calls;
        let ps = match client.ps().await {
            Ok(ps) => ps,
            Err(e) => return StepEnd::failed(e.code(), e.to_string(), Evidence::none()),
        };
        let version = match client.version().await {
            Ok(v) => v,
            Err(e) => {
                let detail = SnapshotEvidence {
                    ps: Some(ps),
                    version: None,
                };
                return StepEnd::failed(e.code(), e.to_string(), Evidence::of(&detail));
            }
        };
        self.record_baselines(&ps, &version).await;
        self.snapshot = Some(ps.clone());
        let detail = SnapshotEvidence {
            ps: Some(ps),
            version: Some(serde_json::to_value(&version).unwrap_or_default()),
        };
        StepEnd::Succeeded(Evidence::of(&detail))
    }

    /// The first rollout on a host records what the host runs now as the baseline of every
    /// configured replica that has none (docs/reference.md#rollback): a later rollout of a
    /// sibling (the second replica of a release) must not take as its baseline the version
    /// the first one just deployed.
    async fn record_baselines(&self, ps: &[PsEntry], version: &crate::compose::VersionInfo) {
        let store = self.ctx.store;
        let current = version
            .projects
            .get(&self.ctx.host.project)
            .and_then(|p| p.current.clone());
        let Some(current) = current else { return };
        // What the host says it runs, as the names canaryd records: a value that breaks their
        // rules is recorded as nothing (a rollback never goes back to it).
        let Some(Ok(tag)) = current.tag.clone().map(Tag::parse) else {
            return;
        };
        let file = match current.file.clone().map(ComposeFile::parse) {
            Some(Ok(file)) => file,
            Some(Err(_)) => return,
            None => self.rollout.file.clone(),
        };
        let mut baselines = Vec::with_capacity(self.ctx.host.replicas.len());
        for (name, replica) in &self.ctx.host.replicas {
            let Ok(service) = ServiceName::parse(name.as_str()) else {
                continue;
            };
            // The name the replica runs under now: its key, or a former name (`aliases`).
            let running = std::iter::once(name)
                .chain(&replica.aliases)
                .find_map(|name| ps.iter().find(|c| is_service(c, name)));
            baselines.push(NewDeployment {
                deployed_as: running
                    .filter(|c| c.names != *name)
                    .and_then(|c| ServiceName::parse(c.names.as_str()).ok()),
                host: self.rollout.host.clone(),
                service,
                file: file.clone(),
                tag: tag.clone(),
                env_overrides: BTreeMap::new(),
                env_sha256: None,
                commit: current.commit.clone(),
                file_sha256: current.file_sha256.clone(),
                image: running.map(|c| c.image.clone()),
                source: crate::domain::state::DeploymentSource::Baseline,
                rollout_id: None,
                deployed_at: self.ctx.now(),
            });
        }
        if let Err(e) = store.record_baselines(&baselines).await {
            tracing::warn!(rollout.id = %self.rollout.id, host = %self.rollout.host, error = %e, "could not record the baseline deployments of {}'s replicas", self.rollout.host);
        }
    }

    async fn peers_healthy(&self, deadline: DateTime<Utc>, abort: &CancellationToken) -> StepEnd {
        let peers: Vec<String> = self
            .ctx
            .host
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
            let detail = PeersHealthyEvidence {
                peers: Some(Vec::new()),
                unhealthy: None,
            };
            return StepEnd::failed(ErrorCode::NoPeers, msg, Evidence::of(&detail));
        }
        let interval = self.ctx.poll_interval(deadline);
        loop {
            let mut unhealthy = BTreeMap::new();
            for peer in &peers {
                let sample = match self.health_url(peer) {
                    Some(url) => {
                        let url = crate::probe::HealthUrl::new(url.to_owned());
                        self.ctx.prober.sample(&url).await
                    }
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
                let detail = PeersHealthyEvidence {
                    peers: Some(peers),
                    unhealthy: None,
                };
                return StepEnd::Succeeded(Evidence::of(&detail));
            }
            let unhealthy: BTreeMap<String, serde_json::Value> = unhealthy
                .into_iter()
                .map(|(peer, sample)| (peer, serde_json::to_value(&sample).unwrap_or_default()))
                .collect();
            if self.ctx.now() >= deadline {
                let names: Vec<&String> = unhealthy.keys().collect();
                let msg = format!("peers not healthy before the deadline: {names:?}");
                let detail = PeersHealthyEvidence {
                    peers: Some(peers),
                    unhealthy: Some(unhealthy),
                };
                return StepEnd::failed(ErrorCode::PeersUnhealthy, msg, Evidence::of(&detail));
            }
            if pause(interval, abort).await {
                let detail = PeersHealthyEvidence {
                    peers: None,
                    unhealthy: Some(unhealthy),
                };
                return StepEnd::Aborted(Evidence::of(&detail));
            }
        }
    }

    async fn verify_neighbours(&self) -> StepEnd {
        let Some(before) = &self.snapshot else {
            return StepEnd::failed(
                ErrorCode::NoSnapshot,
                "verify_neighbours needs a snapshot step before it",
                Evidence::none(),
            );
        };
        let now = match self.ctx.calls.ps().await {
            Ok(ps) => ps,
            Err(e) => return StepEnd::failed(e.code(), e.to_string(), Evidence::none()),
        };
        let mut changed = Vec::new();
        let identity = |c: &PsEntry| ContainerIdentity {
            id: c.id.clone(),
            image: c.image.clone(),
        };
        // The target, in a rename the former service it replaces, and the companion services
        // this rollout planned (and so may have brought up) are expected to change.
        let own = |c: &PsEntry| {
            is_service(c, self.rollout.target())
                || self
                    .rollout
                    .replaced()
                    .is_some_and(|old| is_service(c, old))
                || self
                    .companion_plans
                    .keys()
                    .flatten()
                    .any(|s| is_service(c, s))
        };
        for old in before.iter().filter(|c| !own(c)) {
            match now.iter().find(|c| c.names == old.names) {
                Some(new) if new.id == old.id && new.image == old.image => {}
                found => changed.push(NeighbourChange {
                    container: old.names.clone(),
                    before: identity(old),
                    after: found.map(identity),
                }),
            }
        }
        let checked = before.iter().filter(|c| !own(c)).count();
        let mut detail = VerifyNeighboursEvidence {
            checked: Some(checked),
            changed: None,
        };
        if changed.is_empty() {
            StepEnd::Succeeded(Evidence::of(&detail))
        } else {
            let msg = format!("{} neighbouring container(s) changed", changed.len());
            detail.changed = Some(changed);
            StepEnd::failed(ErrorCode::NeighbourChanged, msg, Evidence::of(&detail))
        }
    }

    async fn wait_health(
        &self,
        step: &Step,
        deadline: DateTime<Utc>,
        interval: Duration,
        consecutive: u32,
        abort: &CancellationToken,
    ) -> StepEnd {
        let url = match self.target_health_url() {
            Ok(url) => url,
            Err(end) => return end,
        };
        let (mut ok, mut bad, mut streak) = (0u64, 0u64, 0u32);
        let mut healthy_since = None;
        let mut progress = Progress::new(self.ctx.timings.progress_every);
        let mut rhythm = Rhythm::new(interval);
        loop {
            rhythm.begin();
            let sample = self.ctx.prober.sample(&url).await;
            if sample.is_healthy() {
                ok += 1;
                streak += 1;
                healthy_since = healthy_since.or(Some(self.ctx.now()));
            } else {
                bad += 1;
                streak = 0;
                healthy_since = None;
            }
            let detail = Evidence::of(&WaitHealthEvidence {
                healthy_samples: ok,
                unhealthy_samples: bad,
                streak,
                last: serde_json::to_value(&sample).unwrap_or_default(),
                healthy_since,
            });
            if streak >= consecutive {
                return StepEnd::Succeeded(detail);
            }
            if self.ctx.now() >= deadline {
                let msg = format!(
                    "{url} did not answer 200 {consecutive} times in a row before the deadline"
                );
                return StepEnd::failed(ErrorCode::HealthTimeout, msg, detail);
            }
            progress.save(self.ctx.store, &step.id, &detail).await;
            if pause_until_next_probe(&mut rhythm, None, abort).await {
                return StepEnd::Aborted(detail);
            }
        }
    }
}
