//! The verdicts of the doctor's checks: what an answer (or its absence) means for a rollout.
//! No I/O here; `doctor.rs` makes the calls.

use std::collections::BTreeMap;

use super::DoctorCheck;
use crate::compose::{ComposeError, VersionInfo};
use crate::probe::HealthSample;

pub(super) fn dry_run_check(outcome: Result<bool, ComposeError>) -> DoctorCheck {
    const NAME: &str = "dry_run_supported";
    match outcome {
        Ok(true) => pass(
            NAME,
            "POST /docker/evict answered 422: dry_run is supported",
        ),
        Ok(false) => fail(
            NAME,
            "POST /docker/evict answered 404: this compose-manager predates dry_run and would \
             deploy a dry run for real; every rollout fails its plan step \
             (compose_manager_unsupported) until compose-manager is upgraded",
        ),
        Err(e) => fail(NAME, format!("the capability probe failed: {e}")),
    }
}

pub(super) fn health_check(service: &str, url: &str, sample: &HealthSample) -> DoctorCheck {
    let name = format!("health:{service}");
    match (sample.status, &sample.error) {
        (Some(200), _) => pass(&name, format!("GET {url} answered 200")),
        (Some(status), _) => fail(&name, format!("GET {url} answered {status}, not 200")),
        (None, error) => fail(
            &name,
            format!(
                "GET {url} gave no answer: {}",
                error.as_deref().unwrap_or("unknown error")
            ),
        ),
    }
}

/// A group is ready when it has at least two replicas and each answers 200: then any one of
/// them can be taken down while the others serve.
pub(super) fn peers_check(
    group: &str,
    members: &[&str],
    healthy: &BTreeMap<&str, bool>,
) -> DoctorCheck {
    let name = format!("peers_healthy:{group}");
    if members.len() < 2 {
        return fail(
            &name,
            format!(
                "{} is alone in group {group}: a rollout refuses to take down a replica with no \
                 peer (no_peers)",
                members.join(", ")
            ),
        );
    }
    let down: Vec<&str> = members
        .iter()
        .copied()
        .filter(|m| !healthy.get(m).copied().unwrap_or(false))
        .collect();
    if down.is_empty() {
        return pass(
            &name,
            format!(
                "{} all answer 200: any one can be rolled",
                members.join(", ")
            ),
        );
    }
    let rollable: Vec<&str> = members
        .iter()
        .copied()
        .filter(|m| down.iter().all(|d| d == m))
        .collect();
    fail(
        &name,
        format!(
            "not healthy: {}; a rollout of {} fails peers_unhealthy; {}",
            down.join(", "),
            members
                .iter()
                .copied()
                .filter(|m| !rollable.contains(m))
                .collect::<Vec<_>>()
                .join(", "),
            if rollable.is_empty() {
                "no replica of the group can be rolled".to_owned()
            } else {
                format!("{} can be rolled (its peers are up)", rollable.join(", "))
            }
        ),
    )
}

/// Informational: compose-manager's `/version` carries tag, commit and file, no tag time.
pub(super) fn newest_tag_check(version: Option<&VersionInfo>, project: &str) -> DoctorCheck {
    let running = version
        .and_then(|v| v.projects.get(project))
        .and_then(|p| p.current.as_ref())
        .and_then(|c| c.tag.clone());
    let running = match running {
        Some(tag) => format!("the host runs tag {tag}; "),
        None => String::new(),
    };
    pass(
        "newest_tag_time",
        format!(
            "{running}not reported: compose-manager's /version names tags and commits but no \
             tag time, so a tag younger than the host's minimum age is only refused at the dry \
             run (tag_too_recent)"
        ),
    )
}

pub(super) fn pass(name: &str, detail: impl Into<String>) -> DoctorCheck {
    DoctorCheck {
        name: name.to_owned(),
        ok: true,
        detail: detail.into(),
    }
}

pub(super) fn fail(name: &str, detail: impl Into<String>) -> DoctorCheck {
    DoctorCheck {
        name: name.to_owned(),
        ok: false,
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::mask::mask;

    fn health(pairs: &[(&'static str, bool)]) -> BTreeMap<&'static str, bool> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_group_whose_replicas_all_answer_200_is_ready() {
        let check = peers_check("g", &["r1", "r2"], &health(&[("r1", true), ("r2", true)]));
        assert!(check.ok, "{check:?}");
        assert_eq!(check.name, "peers_healthy:g");
    }

    #[test]
    fn one_unhealthy_replica_blocks_its_peers_but_can_itself_be_rolled() {
        let check = peers_check("g", &["r1", "r2"], &health(&[("r1", true), ("r2", false)]));
        assert!(!check.ok);
        assert!(check.detail.contains("not healthy: r2"), "{}", check.detail);
        assert!(
            check.detail.contains("a rollout of r1 fails"),
            "{}",
            check.detail
        );
        assert!(
            check.detail.contains("r2 can be rolled"),
            "{}",
            check.detail
        );
    }

    #[test]
    fn two_unhealthy_replicas_leave_nothing_rollable() {
        let check = peers_check(
            "g",
            &["r1", "r2", "r3"],
            &health(&[("r1", false), ("r2", false), ("r3", true)]),
        );
        assert!(!check.ok);
        assert!(
            check
                .detail
                .contains("no replica of the group can be rolled"),
            "{}",
            check.detail
        );
    }

    #[test]
    fn a_replica_alone_in_its_group_fails_like_the_rollout_would() {
        let check = peers_check("solo", &["r1"], &health(&[("r1", true)]));
        assert!(!check.ok);
        assert!(check.detail.contains("no_peers"), "{}", check.detail);
    }

    #[test]
    fn secrets_of_eight_characters_or_more_are_masked_longest_first() {
        let secrets = vec![
            "short".to_owned(),
            "sim-proxy-token".to_owned(),
            "sim-proxy".to_owned(),
        ];
        let text = "TOKEN=sim-proxy-token short sim-proxy";
        assert_eq!(mask(text, &secrets), "TOKEN=*** short ***");
    }

    #[test]
    fn the_newest_tag_time_is_informational_and_never_fails() {
        let check = newest_tag_check(None, "work");
        assert!(check.ok);
        assert!(check.detail.contains("not reported"), "{}", check.detail);
    }
}
