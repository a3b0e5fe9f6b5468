//! The step executors, one module per kind family, mirroring `domain/runbook/step/`:
//! `observe.rs` (snapshot, peers, neighbours, health), `compose.rs` (plan, stage, down, up),
//! `logs.rs` (wait_logs, soak), `smoke.rs`, `analyze.rs`, `approve.rs`, `window.rs`. Each implements
//! [`Execute`](super::step_run::Execute); the dispatch from a step kind to its executor is
//! generated here from the kinds' registration list (`for_each_step_kind!`), naming no kind.

pub(crate) mod analyze;
pub(crate) mod approve;
pub(crate) mod compose;
pub(crate) mod free_space;
pub(crate) mod logs;
pub(crate) mod observe;
pub(crate) mod smoke;
pub(crate) mod window;

use tokio_util::sync::CancellationToken;

use super::step_run::{Execute, Running, StepEnd, StepRun};
use crate::domain::runbook::step::for_each_step_kind;
use crate::domain::runbook::{StepKind, StepKindName};
use crate::store::Step;

/// The budget of a step, fixed when it starts and persisted as its deadline.
pub(crate) fn timeout_of(kind: &StepKind) -> Option<chrono::Duration> {
    chrono::Duration::from_std(kind.budget()).ok()
}

macro_rules! executor_dispatch {
    ($($variant:ident => $module:ident :: $ty:ident),+ $(,)?) => {
        impl StepRun<'_> {
            /// Runs one step with its settings from the runbook.
            pub(crate) async fn execute(
                &mut self,
                step: &Step,
                kind: &StepKind,
                abort: &CancellationToken,
            ) -> StepEnd {
                let deadline = step
                    .deadline_at
                    .unwrap_or_else(|| self.ctx.now() + chrono::Duration::minutes(5));
                let mut at = Running {
                    step,
                    deadline,
                    abort,
                };
                match kind {
                    $(StepKind::$variant(k) => k.execute(self, &mut at).await,)+
                }
            }

            /// Keeps what a succeeded step leaves for the next ones ([`Execute::carry`]).
            pub(crate) fn after_success(&mut self, step: &Step, detail: &serde_json::Value) {
                match step.kind {
                    $(StepKindName::$variant => {
                        <crate::domain::runbook::step::$ty as Execute>::carry(self, step, detail)
                    })+
                }
            }
        }
    };
}

for_each_step_kind!(executor_dispatch);

impl StepRun<'_> {
    /// Rebuilds carried state from a step that finished before a restart.
    pub(crate) fn restore(&mut self, step: &Step) {
        self.after_success(step, &step.detail);
    }
}
