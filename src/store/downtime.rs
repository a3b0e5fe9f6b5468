//! A rollout's replica downtime from its stored steps and compose calls: the rows read into
//! [`crate::domain::downtime`]'s step times.

use crate::domain::downtime::{Downtime, StepTimes};
use serde::Deserialize;

use crate::domain::runbook::step::call::CallDetail;
use crate::domain::runbook::step::{evidence, Up, WaitHealth};
use crate::domain::runbook::Runbook;

use super::{Step, StepAttempt};

/// The replica's downtime in a rollout of `steps` with these compose `attempts`
/// ([`crate::domain::downtime`]). A `down` or `up` acts on the replica unless its runbook
/// step names companion `services` (`runbook`, when loaded; else its evidence says so).
pub fn of_rollout(
    steps: &[Step],
    attempts: &[StepAttempt],
    runbook: Option<&Runbook>,
) -> Option<Downtime> {
    let times: Vec<StepTimes> = steps
        .iter()
        .map(|s| {
            let companion = match runbook.and_then(|r| r.steps.get(s.position as usize)) {
                Some(spec) => spec.kind.scope().is_some_and(|scope| scope.is_companion()),
                None => evidence::<Up>(&s.detail)
                    .is_some_and(|e| e.services.is_some() && e.replaces.is_none()),
            };
            StepTimes {
                kind: s.kind,
                on_replica: !companion,
                calls: attempts
                    .iter()
                    .filter(|a| a.step_id == s.id)
                    .map(|a| (a.endpoint.clone(), a.started_at, a.finished_at))
                    .collect(),
                healthy_since: evidence::<WaitHealth>(&s.detail).and_then(|e| e.healthy_since),
                pulled_at: attempts
                    .iter()
                    .filter(|a| a.step_id == s.id && a.endpoint == "compose/up")
                    .find_map(|a| CallDetail::deserialize(&a.detail).ok()?.pulled_at),
            }
        })
        .collect();
    crate::domain::downtime::of(&times)
}
