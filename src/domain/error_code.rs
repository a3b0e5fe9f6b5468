//! The codes a step or a rollout fails with: stored as their string in the step's
//! detail and `rollout.error_code`, shown by the API, the CLI and notifications, and explained
//! to on-call in docs/oncall.md.

use crate::domain::state::string_enum;

string_enum!(
    /// Why a step or a rollout failed.
    ErrorCode {
        // The compose-manager client (`compose::ComposeError::code`).
        /// compose-manager refused the token (401).
        ComposeUnauthorized => "compose_unauthorized",
        /// compose-manager is busy with another call (409), after the retries.
        HostBusy => "host_busy",
        /// The tag is unknown to the host.
        TagNotFound => "tag_not_found",
        /// The tag is younger than compose-manager accepts.
        TagTooRecent => "tag_too_recent",
        /// The compose file is unknown to the host.
        FileNotFound => "file_not_found",
        /// compose-manager refused the request (4xx).
        ComposeBadRequest => "compose_bad_request",
        /// The endpoint does not exist on this compose-manager (404).
        ComposeNotFound => "compose_not_found",
        /// compose-manager answered 5xx.
        ComposeServerError => "compose_server_error",
        /// No answer in time.
        ComposeTimeout => "compose_timeout",
        /// compose-manager could not be reached.
        ComposeUnreachable => "compose_unreachable",
        /// An answer canaryd could not read.
        ComposeProtocol => "compose_protocol",
        /// The client refused to send the request.
        InvalidRequest => "invalid_request",
        /// The compose-manager URL is not usable.
        InvalidUrl => "invalid_url",
        // The compose steps.
        /// compose-manager cannot do a dry run (safety rule 4).
        ComposeManagerUnsupported => "compose_manager_unsupported",
        /// The dry run did not succeed.
        DryRunFailed => "dry_run_failed",
        /// The dry run answered without a plan.
        DryRunNoPlan => "dry_run_no_plan",
        /// The plan touches more than the target, or removes something.
        PlanGateFailed => "plan_gate_failed",
        /// `done` with `success: false`.
        ComposeFailed => "compose_failed",
        /// A stream ended without `done`; nothing was resent.
        ComposeOutcomeUnknown => "compose_outcome_unknown",
        /// The host did not settle after an unknown outcome; nothing was sent.
        HostUnsettled => "host_unsettled",
        /// A rollback's tag now points at other content.
        TagMoved => "tag_moved",
        /// A call could not be sent before the step's deadline.
        StepTimeout => "step_timeout",
        /// The database could not be read or written.
        StorageError => "storage_error",
        // The observing steps.
        /// The target has no peer in its group (safety rule 7).
        NoPeers => "no_peers",
        /// A peer did not answer 200 in time.
        PeersUnhealthy => "peers_unhealthy",
        /// `verify_neighbours` without a `snapshot`.
        NoSnapshot => "no_snapshot",
        /// Another container changed during the rollout.
        NeighbourChanged => "neighbour_changed",
        /// The replica has no `health_url`.
        NoHealthUrl => "no_health_url",
        /// `/health` never gave the 200s in a row.
        HealthTimeout => "health_timeout",
        // The log steps.
        /// A forbidden line appeared.
        ForbiddenLogLine => "forbidden_log_line",
        /// A required line never appeared.
        LogsTimeout => "logs_timeout",
        /// `max_log_failures` failed log reads in a row.
        LogsUnavailable => "logs_unavailable",
        /// `/health` missed `max_misses` probes in a row during a soak.
        SoakHealth => "soak_health",
        /// The target's engine restarted during `soak` or `analyze`.
        EngineRestarted => "engine_restarted",
        // `smoke`.
        /// The target is not a configured replica.
        ReplicaNotConfigured => "replica_not_configured",
        /// `/v1/models` does not list the model.
        SmokeModelMissing => "smoke_model_missing",
        /// A call answered other than 200, or not an OpenAI answer.
        SmokeHttpStatus => "smoke_http_status",
        /// A generation answered empty content.
        SmokeEmptyOutput => "smoke_empty_output",
        /// An output does not match an `expect` pattern.
        SmokeMismatch => "smoke_mismatch",
        /// Two generations at temperature 0 differ.
        SmokeNondeterministic => "smoke_nondeterministic",
        /// The calls did not all answer within the step's timeout.
        SmokeTimeout => "smoke_timeout",
        // `analyze`.
        /// The target has no metrics URL.
        NoMetricsUrl => "no_metrics_url",
        /// A check failed or was inconclusive.
        AnalysisFailed => "analysis_failed",
        /// `source: prometheus` without a `prometheus:` server in the config.
        PrometheusNotConfigured => "prometheus_not_configured",
        /// Prometheus refused the query (`status: error`).
        PrometheusQueryError => "prometheus_query_error",
        /// Prometheus answered an unexpected HTTP status.
        PrometheusHttpStatus => "prometheus_http_status",
        /// Prometheus did not answer in time.
        PrometheusTimeout => "prometheus_timeout",
        /// Prometheus could not be reached.
        PrometheusUnreachable => "prometheus_unreachable",
        /// Prometheus's answer is not an instant vector canaryd can read.
        PrometheusBadAnswer => "prometheus_bad_answer",
        /// A query gave more than one series.
        PrometheusManySeries => "prometheus_many_series",
        // `approve`.
        /// Nobody approved before the step's timeout.
        NotApproved => "not_approved",
        // `soak`'s `watch`.
        /// More of a watched companion's lines naming the target than the soak allows.
        CompanionLogLimit => "companion_log_limit",
        // `free_space`.
        /// Too little free space on the host's model cache for the weights.
        InsufficientSpace => "insufficient_space",
        /// canaryd cannot tell the model cache's free space (no `model_cache` configured, or
        /// the host does not report that volume).
        ModelCacheUnknown => "model_cache_unknown",
        /// The rollout's file is not the one the host runs.
        FileNotDeployed => "file_not_deployed",
        // `window`.
        /// No low-traffic window opened (and nobody started the rollout) before the timeout.
        WindowClosed => "window_closed",
        // The rollout's own (the runner's).
        /// A failed step whose stored detail lost its code.
        StepFailed => "step_failed",
        /// A resumed rollout's runbook is no longer loaded.
        RunbookNotLoaded => "runbook_not_loaded",
        /// A resumed rollout's host is no longer configured.
        HostNotConfigured => "host_not_configured",
        /// A resumed rollout's step is no longer in its runbook.
        RunbookChanged => "runbook_changed",
        /// An operator aborted the rollout.
        Aborted => "aborted",
        /// The rollout ended with its target taken down and not brought back (safety rule 14).
        ReplicaLeftDown => "replica_left_down",
        // Before the first call that touches the target (`engine/preflight.rs`).
        /// A signal a later step needs could not be read; nothing was sent (safety rule 20).
        SignalUnavailable => "signal_unavailable",
    }
);

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// How a step failed, as the runner adds it to any kind's evidence (`error` in the step's
/// `detail`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct StepFailure {
    /// The step code ([`ErrorCode`]).
    #[serde(default)]
    pub code: Option<String>,
    /// What happened.
    #[serde(default)]
    pub message: Option<String>,
}

impl StepFailure {
    /// The failure a step's stored `detail` carries, if it failed.
    pub fn of(detail: &serde_json::Value) -> Option<StepFailure> {
        #[derive(serde::Deserialize)]
        struct Failed {
            error: Option<StepFailure>,
        }
        <Failed as serde::Deserialize>::deserialize(detail)
            .ok()?
            .error
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn every_code_parses_back_and_serialises_as_its_string() {
        for code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(*code));
            let json = serde_json::to_value(code).expect("serialises");
            assert_eq!(json, code.as_str(), "serde's name is the declared one");
        }
    }

    /// Every code of on-call's failure table (docs/oncall.md, "Reading a failure") is one the
    /// engine can write, but for the gate's reasons.
    #[test]
    fn the_codes_on_call_looks_up_are_codes_a_step_fails_with() {
        let doc = include_str!("../../docs/oncall.md");
        let section = doc
            .split("\n## ")
            .find(|s| s.starts_with("Reading a failure"))
            .expect("docs/oncall.md has \"Reading a failure\"");
        let not_step_codes = ["target_not_planned"];
        let mut checked = 0;
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let first = line.split('|').nth(1).unwrap_or_default();
            for code in first.split('`').skip(1).step_by(2) {
                if not_step_codes.contains(&code) {
                    continue;
                }
                checked += 1;
                assert!(code.parse::<ErrorCode>().is_ok(), "docs/oncall.md: {code}");
            }
        }
        assert!(checked > 10, "the table was read ({checked} codes)");
    }
}
