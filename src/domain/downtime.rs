//! What a rollout cost its replica: the time it was out of service, from the `down` sent to
//! the target to its first healthy answer after the `up`, and the parts of that time. The
//! physical floor is the engine's own cold start; the rest (the down's stream, the wait between
//! the calls, the up's pull, build and create) is what preparation and the orchestrator pay.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::runbook::StepKindName;

/// One step of a rollout as the downtime reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimes {
    pub kind: StepKindName,
    /// Whether it acts on the replica's slot: the target, or in a rename the former service
    /// (a companion step does not).
    pub on_replica: bool,
    /// Its compose calls: endpoint, sent, ended.
    pub calls: Vec<(String, DateTime<Utc>, Option<DateTime<Utc>>)>,
    /// A `wait_health`'s first healthy answer of the streak that passed it.
    pub healthy_since: Option<DateTime<Utc>>,
    /// An `up`'s last image pull or build line (of its call's stream).
    pub pulled_at: Option<DateTime<Utc>>,
}

/// A replica's time out of service in one rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downtime {
    /// When the `down` of the replica was sent.
    pub down_at: DateTime<Utc>,
    /// When it answered healthy again; absent while it has not (or the rollout did not wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_at: Option<DateTime<Utc>>,
    /// `back_at - down_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<i64>,
    /// The parts, each when known; they add up to `total_ms`.
    pub parts: DowntimeParts,
}

/// The parts of a [`Downtime`], in the order they happen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DowntimeParts {
    /// The down's stream: sent → ended (containers stopped and removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_ms: Option<i64>,
    /// Down ended → up sent (the steps between the two calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between_ms: Option<i64>,
    /// The up's stream: image pull, build, create and start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_ms: Option<i64>,
    /// Of `up_ms`, the image pull and build: from the up sent to its stream's last pull or
    /// build line (the rest is create and start); absent when the stream had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_ms: Option<i64>,
    /// Up ended → the first healthy answer: the engine's cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start_ms: Option<i64>,
}

/// The downtime of the rollout of `steps` (in runbook order): from its first `down` of the
/// replica. `None` when no such down was sent.
pub fn of(steps: &[StepTimes]) -> Option<Downtime> {
    let first_call = |kind: StepKindName, endpoint: &str, from: usize| {
        steps.iter().enumerate().skip(from).find_map(|(i, s)| {
            let on = s.kind == kind && s.on_replica;
            let call = s.calls.iter().find(|(e, _, _)| e == endpoint);
            on.then_some(call).flatten().map(|c| (i, c.1, c.2))
        })
    };
    let (down_step, down_at, down_end) = first_call(StepKindName::Down, "compose/down", 0)?;
    let up = first_call(StepKindName::Up, "compose/up", down_step);
    let up_step = up.map_or(down_step, |(i, _, _)| i);
    let back_at = up.and_then(|_| {
        steps[up_step..]
            .iter()
            .find(|s| s.kind == StepKindName::WaitHealth)
            .and_then(|s| s.healthy_since)
    });
    let ms = |from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>| {
        Some((to? - from?).num_milliseconds().max(0))
    };
    let (up_at, up_end) = (up.map(|u| u.1), up.and_then(|u| u.2));
    let pulled_at = up.and_then(|(i, _, _)| steps[i].pulled_at);
    Some(Downtime {
        down_at,
        back_at,
        total_ms: ms(Some(down_at), back_at),
        parts: DowntimeParts {
            down_ms: ms(Some(down_at), down_end),
            between_ms: ms(down_end, up_at),
            up_ms: ms(up_at, up_end),
            pull_ms: ms(up_at, pulled_at),
            cold_start_ms: ms(up_end, back_at),
        },
    })
}

#[cfg(test)]
mod tests;
