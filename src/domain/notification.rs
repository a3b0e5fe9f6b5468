//! Which audit events are notified, under which name, and the text a human reads. Pure: the
//! config names these events, the store writes them to the outbox, `notify` delivers them.

use std::fmt;
use std::str::FromStr;

use super::audit::AuditKind;
use super::state::{string_enum, RolloutKind};

string_enum!(
    /// Where one notification stands for one webhook (`outbox_delivery.status`).
    DeliveryStatus {
        /// Not confirmed yet: sent again at its next attempt time.
        Pending => "pending",
        /// The webhook answered 2xx.
        Delivered => "delivered",
        /// Given up (a permanent refusal or the attempts spent).
        Failed => "failed",
    }
);

/// A notification a webhook may subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotifyEvent {
    /// A rollout (canary or rollback) left `pending` and began its first step.
    Started,
    /// A step failed (the rollout fails next, and may roll back).
    StepFailed,
    /// A canary succeeded.
    Succeeded,
    /// A rollout (canary or rollback) failed.
    Failed,
    /// A rollout was aborted.
    Aborted,
    /// A rollback succeeded: the replica runs its prior deployment again.
    RolledBack,
    /// A rollout ended with its replica taken down and not brought back (safety rule 14).
    ReplicaLeftDown,
    /// A rollout waits for an operator's approval (an `approve` step, or an inconclusive
    /// analysis check that asks).
    ApprovalRequested,
}

impl NotifyEvent {
    /// Every event, in the order of a rollout's life.
    pub const ALL: [NotifyEvent; 8] = [
        Self::Started,
        Self::StepFailed,
        Self::Succeeded,
        Self::Failed,
        Self::Aborted,
        Self::RolledBack,
        Self::ReplicaLeftDown,
        Self::ApprovalRequested,
    ];

    /// The name in the config file, the outbox and the payload.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::StepFailed => "step_failed",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
            Self::RolledBack => "rolled_back",
            Self::ReplicaLeftDown => "replica_left_down",
            Self::ApprovalRequested => "approval_requested",
        }
    }

    /// The notification an audit event causes, if any: a rollback that succeeds is
    /// `rolled_back`, not `succeeded`.
    pub fn from_audit(audit_kind: AuditKind, rollout_kind: RolloutKind) -> Option<NotifyEvent> {
        match audit_kind {
            AuditKind::RolloutRunning => Some(Self::Started),
            AuditKind::StepFailed => Some(Self::StepFailed),
            AuditKind::RolloutSucceeded => Some(match rollout_kind {
                RolloutKind::Rollback => Self::RolledBack,
                RolloutKind::Canary => Self::Succeeded,
            }),
            AuditKind::RolloutFailed => Some(Self::Failed),
            AuditKind::RolloutAborted => Some(Self::Aborted),
            AuditKind::ReplicaLeftDown => Some(Self::ReplicaLeftDown),
            AuditKind::ApprovalRequested => Some(Self::ApprovalRequested),
            AuditKind::RolloutCreated
            | AuditKind::RolloutPending
            | AuditKind::RolloutResumed
            | AuditKind::StepPending
            | AuditKind::StepRunning
            | AuditKind::StepSucceeded
            | AuditKind::StepSkipped
            | AuditKind::StepAborted
            | AuditKind::AbortRequested
            | AuditKind::RollbackLinked
            | AuditKind::Approved
            | AuditKind::DeploymentRecorded
            | AuditKind::RetentionPurged => None,
        }
    }
}

impl fmt::Display for NotifyEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NotifyEvent {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|e| e.as_str()).collect();
                format!("unknown event `{s}` (one of: {})", names.join(", "))
            })
    }
}

/// What a notification is about, as the human-readable line says it.
#[derive(Debug, Clone, Default)]
pub struct Subject<'a> {
    pub rollout_id: &'a str,
    pub kind: &'a str,
    pub host: &'a str,
    pub service: &'a str,
    pub tag: &'a str,
    pub actor: &'a str,
    pub reason: &'a str,
    pub step: Option<&'a str>,
    pub error: Option<&'a str>,
    /// What a waiting step waits for, besides an approval (a `window` step's window).
    pub waiting_for: Option<&'a str>,
}

/// One line for chat: `canaryd: canary ro_… of r2 on gpu02 to v0.0.452 failed at step up: …`.
pub fn text(event: NotifyEvent, s: &Subject<'_>) -> String {
    let what = format!(
        "{} {} of {} on {} to {}",
        s.kind, s.rollout_id, s.service, s.host, s.tag
    );
    let step = s.step.unwrap_or("?");
    let error = s.error.map(|e| format!(": {e}")).unwrap_or_default();
    match event {
        NotifyEvent::Started => format!("canaryd: {what} started (by {}: {})", s.actor, s.reason),
        NotifyEvent::StepFailed => format!("canaryd: {what}: step {step} failed{error}"),
        NotifyEvent::Succeeded => format!("canaryd: {what} succeeded"),
        NotifyEvent::Failed => format!("canaryd: {what} failed{error}"),
        NotifyEvent::Aborted => format!("canaryd: {what} aborted{error}"),
        NotifyEvent::RolledBack => format!(
            "canaryd: {} rolled back to {} ({what} succeeded)",
            s.service, s.tag
        ),
        NotifyEvent::ReplicaLeftDown => format!(
            "canaryd: REPLICA LEFT DOWN: {} on {} has no running container after {what}{error}",
            s.service, s.host
        ),
        NotifyEvent::ApprovalRequested => match s.waiting_for {
            Some(window) => format!(
                "canaryd: {what} waits at step {step} for {window}; to start it now: canaryd rollout approve {} --reason ...",
                s.rollout_id
            ),
            None => format!(
                "canaryd: {what} waits for an approval at step {step} (canaryd rollout approve {} --reason ...)",
                s.rollout_id
            ),
        },
    }
}

/// `text` as Slack's `text` field takes it: `&`, `<` and `>` escaped (`&amp;`, `&lt;`,
/// `&gt;`), so that nothing a user wrote (a reason, a tag, an error quoting the host) reaches
/// the channel as a mention (`<!channel>`, `<@U…>`) or a disguised link (`<http://…|text>`).
/// canaryd's own lines carry no Slack markup (a page link is a plain URL), so the whole line
/// is escaped.
pub fn slack_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_text_escapes_mentions_and_disguised_links() {
        let cases = [
            ("<!channel> wake up", "&lt;!channel&gt; wake up"),
            ("<!here>", "&lt;!here&gt;"),
            ("ping <@U024BE7LH>", "ping &lt;@U024BE7LH&gt;"),
            (
                "<http://evil.example|the runbook>",
                "&lt;http://evil.example|the runbook&gt;",
            ),
            ("a &amp; b", "a &amp;amp; b"),
            (
                "plain https://canaryd.example.com/rollouts/ro_1",
                "plain https://canaryd.example.com/rollouts/ro_1",
            ),
        ];
        for (raw, sent) in cases {
            assert_eq!(slack_text(raw), sent, "{raw}");
        }
    }

    #[test]
    fn audit_events_map_to_notifications_and_a_successful_rollback_is_rolled_back() {
        use AuditKind as A;
        use RolloutKind::{Canary, Rollback};
        let cases = [
            (A::RolloutCreated, Canary, None),
            (A::RolloutRunning, Canary, Some(NotifyEvent::Started)),
            (A::RolloutRunning, Rollback, Some(NotifyEvent::Started)),
            (A::StepRunning, Canary, None),
            (A::StepSucceeded, Canary, None),
            (A::StepFailed, Canary, Some(NotifyEvent::StepFailed)),
            (A::RolloutSucceeded, Canary, Some(NotifyEvent::Succeeded)),
            (A::RolloutSucceeded, Rollback, Some(NotifyEvent::RolledBack)),
            (A::RolloutFailed, Rollback, Some(NotifyEvent::Failed)),
            (A::RolloutAborted, Canary, Some(NotifyEvent::Aborted)),
            (
                A::ReplicaLeftDown,
                Rollback,
                Some(NotifyEvent::ReplicaLeftDown),
            ),
            (A::AbortRequested, Canary, None),
            (
                A::ApprovalRequested,
                Canary,
                Some(NotifyEvent::ApprovalRequested),
            ),
            (A::Approved, Canary, None),
        ];
        for (audit, kind, expected) in cases {
            assert_eq!(
                NotifyEvent::from_audit(audit, kind),
                expected,
                "{audit} {kind}"
            );
        }
    }

    #[test]
    fn event_names_round_trip_and_unknown_names_list_the_known_ones() {
        for e in NotifyEvent::ALL {
            assert_eq!(e.as_str().parse::<NotifyEvent>(), Ok(e));
        }
        let err = "deployed".parse::<NotifyEvent>().expect_err("unknown");
        assert!(err.contains("rolled_back"), "{err}");
    }

    #[test]
    fn a_wait_for_a_window_says_what_it_waits_for_and_how_to_start_it_now() {
        let s = Subject {
            rollout_id: "ro_1",
            kind: "canary",
            host: "gpu02",
            service: "r2",
            tag: "v0.0.452",
            step: Some("window"),
            waiting_for: Some("the low-traffic window (daily 02:00-06:00 UTC) opening at T"),
            ..Subject::default()
        };
        assert_eq!(
            text(NotifyEvent::ApprovalRequested, &s),
            "canaryd: canary ro_1 of r2 on gpu02 to v0.0.452 waits at step window for the \
             low-traffic window (daily 02:00-06:00 UTC) opening at T; to start it now: canaryd \
             rollout approve ro_1 --reason ..."
        );
    }

    #[test]
    fn the_chat_line_names_the_rollout_the_replica_and_the_error() {
        let s = Subject {
            rollout_id: "ro_1",
            kind: "canary",
            host: "gpu02",
            service: "r2",
            tag: "v0.0.452",
            step: Some("up"),
            error: Some("compose_failed: exit 1"),
            ..Subject::default()
        };
        assert_eq!(
            text(NotifyEvent::StepFailed, &s),
            "canaryd: canary ro_1 of r2 on gpu02 to v0.0.452: step up failed: compose_failed: exit 1"
        );
    }
}
