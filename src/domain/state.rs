//! Rollout and step state machines, and the small enums stored next to them.
//!
//! Every status change goes through `apply`, which is the only place that knows which
//! transitions exist; the store writes the result and its audit event in one transaction.
//! The database stores `as_str()` in TEXT columns whose CHECK lists `ALL`.

/// Declares a fieldless enum with `as_str`, `ALL`, `Display`, `FromStr` and snake_case serde.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable snake_case name (API, database, metrics labels).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| {
                        let all: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                        format!("unknown {} `{}` (expected one of: {})", stringify!($name), s, all.join(", "))
                    })
            }
        }
    };
}
pub(crate) use string_enum;

string_enum!(
    /// Where a rollout is in its life.
    RolloutStatus {
        /// Accepted and stored, not started yet.
        Pending => "pending",
        /// Steps are executing.
        Running => "running",
        /// Every step passed.
        Succeeded => "succeeded",
        /// A step failed (or the rollout could not start).
        Failed => "failed",
        /// Stopped by an operator.
        Aborted => "aborted",
    }
);

string_enum!(
    /// Where one step of a rollout is.
    StepStatus {
        /// Not reached yet.
        Pending => "pending",
        /// Executing (one or more attempts).
        Running => "running",
        /// Passed.
        Succeeded => "succeeded",
        /// Failed; the rollout fails with it.
        Failed => "failed",
        /// Never ran because an earlier step failed or the rollout ended.
        Skipped => "skipped",
        /// Interrupted by an abort.
        Aborted => "aborted",
    }
);

string_enum!(
    /// What a rollout does.
    RolloutKind {
        /// Deploys a new file/tag/env to one replica.
        Canary => "canary",
        /// Redeploys a replica's prior deployment.
        Rollback => "rollback",
    }
);

string_enum!(
    /// What a canary does when a step fails after it touched the replica.
    OnFailure {
        /// Start a rollback to the prior deployment (the default).
        Rollback => "rollback",
        /// Stop and leave the replica as it is, for an operator to inspect.
        Halt => "halt",
    }
);

string_enum!(
    /// Where a recorded deployment comes from (`deployment.source`).
    DeploymentSource {
        /// A rollout that succeeded deployed it.
        Rollout => "rollout",
        /// The host's `GET /version` reported it before canaryd first deployed the replica.
        Baseline => "baseline",
    }
);

string_enum!(
    /// How one compose-manager call of a step ended (`step_attempt.outcome`; a row without
    /// one is a call that may be in flight).
    AttemptOutcome {
        /// The stream ended `done` `success: true`.
        Succeeded => "succeeded",
        /// The stream ended `done` `success: false`.
        Failed => "failed",
        /// The request went out and its outcome is not known (no `done`, a timeout).
        Unknown => "unknown",
        /// Refused before any effect (a 4xx, a refused connection); retried when transient.
        Error => "error",
        /// `409`: the host's one-operation lock was taken; retried.
        Busy => "busy",
        /// An abort landed while the attempt row was written: the call was never sent.
        NotSent => "not_sent",
    }
);

impl AttemptOutcome {
    /// Whether a compose stream of the call started (the tag resolved on the host).
    pub fn reached_the_stream(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Unknown)
    }
}

string_enum!(
    /// Something that happens to a rollout.
    RolloutEvent {
        /// The engine picks it up.
        Start => "start",
        /// The last step passed.
        Succeed => "succeed",
        /// A step failed, or it could not start at all.
        Fail => "fail",
        /// An operator aborted it.
        Abort => "abort",
    }
);

string_enum!(
    /// Something that happens to a step.
    StepEvent {
        /// The first attempt begins.
        Start => "start",
        /// It passed.
        Succeed => "succeed",
        /// It failed.
        Fail => "fail",
        /// It will not run.
        Skip => "skip",
        /// An abort interrupted or preceded it.
        Abort => "abort",
    }
);

/// An event that the state machine does not accept in the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid {machine} transition: cannot {event} a {machine} that is {from}")]
pub struct InvalidTransition {
    /// `rollout` or `step`.
    pub machine: &'static str,
    /// The current state.
    pub from: &'static str,
    /// The refused event.
    pub event: &'static str,
}

impl RolloutStatus {
    /// Whether nothing can happen to the rollout any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Aborted)
    }

    /// The one transition function: pending → running → succeeded/failed/aborted; a pending
    /// rollout may also be aborted or fail before it starts; terminal states accept nothing.
    pub fn apply(self, event: RolloutEvent) -> Result<RolloutStatus, InvalidTransition> {
        use RolloutEvent as E;
        use RolloutStatus as S;
        match (self, event) {
            (S::Pending, E::Start) => Ok(S::Running),
            (S::Pending | S::Running, E::Fail) => Ok(S::Failed),
            (S::Pending | S::Running, E::Abort) => Ok(S::Aborted),
            (S::Running, E::Succeed) => Ok(S::Succeeded),
            (S::Pending, E::Succeed)
            | (S::Running, E::Start)
            | (S::Succeeded | S::Failed | S::Aborted, _) => Err(InvalidTransition {
                machine: "rollout",
                from: self.as_str(),
                event: event.as_str(),
            }),
        }
    }
}

impl StepStatus {
    /// Whether nothing can happen to the step any more.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Pending | Self::Running)
    }

    /// The one transition function: pending → running → succeeded/failed/aborted; a pending
    /// step may be skipped, aborted, or fail before its first attempt (e.g. restart recovery
    /// finds it cannot run); terminal states accept nothing. A running step is never skipped.
    pub fn apply(self, event: StepEvent) -> Result<StepStatus, InvalidTransition> {
        use StepEvent as E;
        use StepStatus as S;
        match (self, event) {
            (S::Pending, E::Start) => Ok(S::Running),
            (S::Pending, E::Skip) => Ok(S::Skipped),
            (S::Pending | S::Running, E::Fail) => Ok(S::Failed),
            (S::Pending | S::Running, E::Abort) => Ok(S::Aborted),
            (S::Running, E::Succeed) => Ok(S::Succeeded),
            (S::Pending, E::Succeed)
            | (S::Running, E::Start | E::Skip)
            | (S::Succeeded | S::Failed | S::Skipped | S::Aborted, _) => Err(InvalidTransition {
                machine: "step",
                from: self.as_str(),
                event: event.as_str(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    fn render<S: Copy + fmt::Display, E: Copy + fmt::Display, X: fmt::Display>(
        states: &[S],
        events: &[E],
        apply: impl Fn(S, E) -> Result<X, InvalidTransition>,
    ) -> String {
        let mut out = String::new();
        for &state in states {
            for &event in events {
                let to = match apply(state, event) {
                    Ok(next) => next.to_string(),
                    Err(_) => "-".to_string(),
                };
                out.push_str(&format!("{state} + {event} = {to}\n"));
            }
        }
        out
    }

    #[test]
    fn every_rollout_state_and_event_pair_has_the_documented_outcome() {
        let table = render(RolloutStatus::ALL, RolloutEvent::ALL, RolloutStatus::apply);
        let expected = "\
pending + start = running
pending + succeed = -
pending + fail = failed
pending + abort = aborted
running + start = -
running + succeed = succeeded
running + fail = failed
running + abort = aborted
succeeded + start = -
succeeded + succeed = -
succeeded + fail = -
succeeded + abort = -
failed + start = -
failed + succeed = -
failed + fail = -
failed + abort = -
aborted + start = -
aborted + succeed = -
aborted + fail = -
aborted + abort = -
";
        assert_eq!(table, expected);
    }

    #[test]
    fn every_step_state_and_event_pair_has_the_documented_outcome() {
        let table = render(StepStatus::ALL, StepEvent::ALL, StepStatus::apply);
        let mut expected = String::from(
            "\
pending + start = running
pending + succeed = -
pending + fail = failed
pending + skip = skipped
pending + abort = aborted
running + start = -
running + succeed = succeeded
running + fail = failed
running + skip = -
running + abort = aborted
",
        );
        for terminal in ["succeeded", "failed", "skipped", "aborted"] {
            for event in ["start", "succeed", "fail", "skip", "abort"] {
                expected.push_str(&format!("{terminal} + {event} = -\n"));
            }
        }
        assert_eq!(table, expected);
    }

    #[test]
    fn a_state_is_terminal_exactly_when_it_accepts_no_event() {
        for &s in RolloutStatus::ALL {
            let accepts = RolloutEvent::ALL.iter().any(|&e| s.apply(e).is_ok());
            assert_eq!(s.is_terminal(), !accepts, "{s}");
        }
        for &s in StepStatus::ALL {
            let accepts = StepEvent::ALL.iter().any(|&e| s.apply(e).is_ok());
            assert_eq!(s.is_terminal(), !accepts, "{s}");
        }
    }

    #[test]
    fn a_refused_transition_names_the_machine_the_state_and_the_event() {
        let err = RolloutStatus::Succeeded
            .apply(RolloutEvent::Abort)
            .expect_err("terminal");
        assert_eq!(
            err.to_string(),
            "invalid rollout transition: cannot abort a rollout that is succeeded"
        );
        let err = StepStatus::Running
            .apply(StepEvent::Skip)
            .expect_err("running");
        assert_eq!(
            err.to_string(),
            "invalid step transition: cannot skip a step that is running"
        );
    }

    #[test]
    fn names_round_trip_through_text_and_serde() {
        for &s in RolloutStatus::ALL {
            assert_eq!(s.as_str().parse::<RolloutStatus>(), Ok(s));
            let json = serde_json::to_string(&s).expect("serialises");
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
        for &s in StepStatus::ALL {
            assert_eq!(s.as_str().parse::<StepStatus>(), Ok(s));
        }
        assert_eq!("halt".parse::<OnFailure>(), Ok(OnFailure::Halt));
        assert_eq!("rollback".parse::<RolloutKind>(), Ok(RolloutKind::Rollback));
        let err = "done".parse::<RolloutStatus>().expect_err("unknown");
        assert!(
            err.contains("`done`") && err.contains("pending, running"),
            "{err}"
        );
        let kind: OnFailure = serde_json::from_str("\"rollback\"").expect("valid");
        assert_eq!(kind, OnFailure::Rollback);
    }
}
