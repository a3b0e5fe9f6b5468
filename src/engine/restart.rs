//! Restart detection during `soak` and `analyze`: the target's container must keep the ID
//! and the start it had after its `up` (rule: `engine_restarted` at once otherwise). Reads
//! `GET /docker/ps`; a read that fails is counted and judged nothing (the step's other
//! probes still watch the engine). A step resumed after a restart holds the target to the
//! container its saved evidence names: one replaced while the daemon was down fails it.

use super::step_run::{Evidence, StepEnd, StepRun};
use crate::domain::error_code::ErrorCode;
use crate::domain::runbook::step::soak::RestartEvidence;
use crate::domain::uptime::{judge_restart, ContainerRead};

/// The target restarted under a watching step: why, and the reads (`now`, the one that saw it).
pub(super) struct Restarted {
    pub message: String,
    pub reads: RestartEvidence,
}

impl Restarted {
    /// The step's failure, `evidence` its detail.
    pub(super) fn failed(self, evidence: Evidence) -> StepEnd {
        StepEnd::failed(ErrorCode::EngineRestarted, self.message, evidence)
    }
}

/// What a watching step knows about the target's container.
#[derive(Debug, Default)]
pub(super) struct RestartWatch {
    baseline: Option<ContainerRead>,
    /// The container an earlier drive of the step saw first (from its saved evidence): a
    /// resumed step fails when the target is another one now.
    saved: Option<String>,
    previous: Option<ContainerRead>,
    reads: u64,
    failed_reads: u64,
    last_error: Option<String>,
}

impl RestartWatch {
    /// A watch for a step whose saved evidence may name the container an earlier drive saw
    /// first (`saved`; `None` for a new step).
    pub(super) fn resuming(saved: Option<String>) -> Self {
        Self {
            saved,
            ..Self::default()
        }
    }

    /// The container this watch holds the target to: the first it read, or the saved one.
    pub(super) fn container_id(&self) -> Option<&str> {
        self.baseline
            .as_ref()
            .map(|b| b.id.as_str())
            .or(self.saved.as_deref())
    }

    /// Reads `docker ps` once; what it saw when the target restarted.
    pub(super) async fn check(&mut self, run: &StepRun<'_>) -> Option<Restarted> {
        // The system clock, not the engine's: it is compared with the container's uptime,
        // which docker reports on the system clock.
        let at = chrono::Utc::now();
        let target = match run.ctx.calls.ps_service(run.rollout.target()).await {
            Ok(target) => target,
            Err(e) => {
                self.failed_reads += 1;
                self.last_error = Some(e.to_string());
                return None;
            }
        };
        self.reads += 1;
        let current = target.map(|c| ContainerRead {
            id: c.id,
            status: c.status,
            at,
        });
        let verdict = judge_restart(
            self.container_id(),
            run.up_done_at,
            self.previous.as_ref(),
            current.as_ref(),
        );
        if let Err(why) = verdict {
            let mut reads = self.evidence();
            reads.now = Some(current);
            let message = format!("{}: {why}", run.rollout.service);
            return Some(Restarted { message, reads });
        }
        if self.baseline.is_none() {
            self.baseline.clone_from(&current);
        }
        self.previous = current;
        None
    }

    /// The evidence: the first and last reads, and how many reads failed (`restart` in the
    /// step's evidence).
    pub(super) fn evidence(&self) -> RestartEvidence {
        RestartEvidence {
            first: self.baseline.clone(),
            last: self.previous.clone(),
            ps_reads: self.reads,
            ps_read_errors: self.failed_reads,
            last_ps_error: self.last_error.clone(),
            now: None,
        }
    }
}
