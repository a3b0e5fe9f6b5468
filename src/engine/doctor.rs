//! Host doctor (SPEC §14): checks, without changing anything on the host, what a rollout will
//! need there: the compose-manager token, dry-run support, the project in `/version`, logs and
//! health of every configured replica, and healthy peers in every group. The daemon keeps the
//! last report per host in memory (the dashboard shows it).
//!
//! Requests sent: `GET /status` (or `GET /docker/ps` on a server without it), `POST
//! /docker/evict {}` (refused with 422 before the handler runs: no lock, no effect), `GET
//! /version`, `POST /compose/logs` per replica, and each replica's health URL. Never an
//! up, down, restart or clean.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};

use super::{Engine, EngineError, HostRuntime};
use crate::compose::{ComposeError, LogsRequest, VersionInfo};
use crate::probe::HealthSample;

/// Log lines asked for by the logs check: enough to prove the call works.
const LOGS_TAIL: u32 = 5;
/// Longest wait for one compose-manager answer (or the config's `request_timeout`, if
/// shorter): the two rounds of calls stay well inside the CLI's 30 s.
const CALL_TIMEOUT_CAP: Duration = Duration::from_secs(10);
/// Env values shorter than this are not masked in details (they would mask ordinary words).
const MASK_MIN_CHARS: usize = 8;

/// One check of a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorCheck {
    /// Stable name; per-replica and per-group checks end in `:<service>` / `:<group>`.
    pub name: String,
    /// Whether a rollout can count on it.
    pub ok: bool,
    /// What was seen (status codes, the server's message) and, on failure, what it means.
    pub detail: String,
}

/// The doctor's answer for one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    /// The host's name in the config.
    pub host: String,
    /// Every check ok.
    pub ok: bool,
    /// When the checks ran.
    pub checked_at: DateTime<Utc>,
    /// In a fixed order: host checks, then per replica, then per group, then informational.
    pub checks: Vec<DoctorCheck>,
}

/// The last report of each host (in memory only: a restart forgets them).
#[derive(Debug, Default)]
pub(crate) struct LastReports(Mutex<HashMap<String, DoctorReport>>);

impl Engine {
    /// Runs every check against `host` and remembers the report.
    pub async fn doctor(&self, host: &str) -> Result<DoctorReport, EngineError> {
        let runtime = self.host(host)?;
        let report = run(self, runtime).await;
        let failed: Vec<&str> = report
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        tracing::info!(
            host,
            ok = report.ok,
            checks = report.checks.len(),
            failed = ?failed,
            "doctor of {host}: {}",
            if report.ok { "every check ok" } else { "some checks failed" }
        );
        if let Ok(mut last) = self.inner.doctor_reports.0.lock() {
            last.insert(host.to_owned(), report.clone());
        }
        Ok(report)
    }

    /// The last doctor report of `host`, if the doctor ran since the daemon started.
    pub fn last_doctor(&self, host: &str) -> Option<DoctorReport> {
        self.inner
            .doctor_reports
            .0
            .lock()
            .ok()
            .and_then(|last| last.get(host).cloned())
    }
}

async fn run(engine: &Engine, host: &HostRuntime) -> DoctorReport {
    let limit = engine.inner.tuning.request_timeout.min(CALL_TIMEOUT_CAP);
    let (token, dry_run, version) = tokio::join!(
        bounded(limit, "GET /status", check_token(host)),
        bounded(limit, "POST /docker/evict", host.client.supports_dry_run()),
        bounded(limit, "GET /version", host.client.version())
    );
    let token_refused = matches!(&token, Err(ComposeError::Unauthorized { .. }));
    let mut checks = vec![
        token_check(host, token),
        dry_run_check(dry_run),
        version_check(host, &version),
    ];

    let version = version.ok();
    let logs = host.config.replicas.keys().map(|service| {
        check_logs(
            engine,
            host,
            service,
            version.as_ref(),
            token_refused,
            limit,
        )
    });
    let probes = host
        .config
        .replicas
        .iter()
        .map(|(service, replica)| async move {
            let sample = engine.inner.prober.sample(&replica.health_url).await;
            (service.as_str(), replica.health_url.as_str(), sample)
        });
    let (logs, samples) = tokio::join!(join_all(logs), join_all(probes));
    checks.extend(logs);
    checks.extend(
        samples
            .iter()
            .map(|(s, url, sample)| health_check(s, url, sample)),
    );
    let healthy: BTreeMap<&str, bool> = samples
        .iter()
        .map(|(s, _, sample)| (*s, sample.is_healthy()))
        .collect();
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (service, replica) in &host.config.replicas {
        groups.entry(&replica.group).or_default().push(service);
    }
    for (group, members) in groups {
        checks.push(peers_check(group, &members, &healthy));
    }
    checks.push(newest_tag_check(version.as_ref(), &host.config.project));

    let masks = secrets_of(host);
    for check in &mut checks {
        check.detail = mask(&check.detail, &masks);
    }
    DoctorReport {
        host: host.config.name.clone(),
        ok: checks.iter().all(|c| c.ok),
        checked_at: Utc::now(),
        checks,
    }
}

/// An authenticated read: `GET /status`, or `GET /docker/ps` on a server without `/status`.
async fn check_token(host: &HostRuntime) -> Result<String, ComposeError> {
    match host.client.status().await {
        Ok(status) => Ok(match status.in_flight {
            None => "GET /status answered 200 (host idle)".to_owned(),
            Some(op) => format!(
                "GET /status answered 200 (busy: {} in flight since {})",
                op.action,
                op.started_at.as_deref().unwrap_or("?")
            ),
        }),
        Err(ComposeError::NotFound { .. }) => {
            let ps = host.client.ps().await?;
            Ok(format!(
                "GET /docker/ps answered 200 ({} containers; this compose-manager has no /status)",
                ps.len()
            ))
        }
        Err(e) => Err(e),
    }
}

fn token_check(host: &HostRuntime, outcome: Result<String, ComposeError>) -> DoctorCheck {
    match outcome {
        Ok(detail) => pass("token_accepted", detail),
        Err(e @ ComposeError::Unauthorized { .. }) => fail(
            "token_accepted",
            format!(
                "{e}: the token in the env var named by hosts.{}.token_env is not the host's \
                 BEARER_TOKEN; every authenticated call (dry run, down, up, logs) would fail",
                host.config.name
            ),
        ),
        Err(e) => fail("token_accepted", format!("could not check the token: {e}")),
    }
}

/// `call`, or a timeout error naming `endpoint` after `limit`.
async fn bounded<T>(
    limit: Duration,
    endpoint: &str,
    call: impl Future<Output = Result<T, ComposeError>>,
) -> Result<T, ComposeError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(ComposeError::Timeout {
            endpoint: format!("{endpoint} (within {} ms)", limit.as_millis()),
        })
    })
}

fn dry_run_check(outcome: Result<bool, ComposeError>) -> DoctorCheck {
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

fn version_check(host: &HostRuntime, version: &Result<VersionInfo, ComposeError>) -> DoctorCheck {
    const NAME: &str = "version_names_project";
    let project = &host.config.project;
    let version = match version {
        Ok(v) => v,
        Err(e) => return fail(NAME, format!("GET /version failed: {e}")),
    };
    match version
        .projects
        .get(project)
        .and_then(|p| p.current.as_ref())
    {
        Some(current) => pass(
            NAME,
            format!(
                "GET /version names project {project}: tag {}, file {}, commit {}",
                current.tag.as_deref().unwrap_or("?"),
                current.file.as_deref().unwrap_or("?"),
                current.commit.as_deref().unwrap_or("?")
            ),
        ),
        None => {
            let known: Vec<&str> = version.projects.keys().map(String::as_str).collect();
            fail(
                NAME,
                format!(
                    "GET /version names no deployment of project {project} (projects: {}): \
                     canaryd cannot record a baseline, so a replica's first rollout has no \
                     rollback target; check hosts.{}.project",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    },
                    host.config.name
                ),
            )
        }
    }
}

/// The file the replica runs: its last recorded deployment, else what `/version` names.
async fn compose_file_of(
    engine: &Engine,
    host: &HostRuntime,
    service: &str,
    version: Option<&VersionInfo>,
) -> Option<String> {
    let recorded = engine
        .inner
        .store
        .recent_deployments(&host.config.name, service, 1)
        .await
        .ok()
        .and_then(|d| d.into_iter().next())
        .map(|d| d.file);
    let from_version = version.and_then(|v| {
        v.projects
            .get(&host.config.project)
            .and_then(|p| p.current.as_ref())
            .and_then(|c| c.file.clone())
            .or_else(|| v.file.clone())
    });
    recorded.or(from_version)
}

async fn check_logs(
    engine: &Engine,
    host: &HostRuntime,
    service: &str,
    version: Option<&VersionInfo>,
    token_refused: bool,
    limit: Duration,
) -> DoctorCheck {
    let name = format!("compose_logs:{service}");
    if token_refused {
        return fail(
            &name,
            "not checked: compose-manager refused the token (see token_accepted)",
        );
    }
    let Some(file) = compose_file_of(engine, host, service, version).await else {
        return fail(
            &name,
            "no compose file known: canaryd has recorded no deployment of this replica and \
             GET /version names no file",
        );
    };
    let req = LogsRequest {
        file: file.clone(),
        service: service.to_owned(),
        tail: LOGS_TAIL,
    };
    match bounded(limit, "POST /compose/logs", host.client.logs(&req)).await {
        Ok(output) => pass(
            &name,
            format!(
                "POST /compose/logs ({file}) answered 200 with {} lines",
                output.lines().count()
            ),
        ),
        Err(e) => fail(
            &name,
            format!(
                "{e} — while logs fail, wait_logs and soak steps fail logs_unavailable (a \
                 compose file variable missing from the host's own env files makes every logs \
                 call fail)"
            ),
        ),
    }
}

fn health_check(service: &str, url: &str, sample: &HealthSample) -> DoctorCheck {
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
fn peers_check(group: &str, members: &[&str], healthy: &BTreeMap<&str, bool>) -> DoctorCheck {
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
fn newest_tag_check(version: Option<&VersionInfo>, project: &str) -> DoctorCheck {
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

fn pass(name: &str, detail: impl Into<String>) -> DoctorCheck {
    DoctorCheck {
        name: name.to_owned(),
        ok: true,
        detail: detail.into(),
    }
}

fn fail(name: &str, detail: impl Into<String>) -> DoctorCheck {
    DoctorCheck {
        name: name.to_owned(),
        ok: false,
        detail: detail.into(),
    }
}

/// Values that must never reach an answer: the host's env values and its token.
fn secrets_of(host: &HostRuntime) -> Vec<String> {
    let mut secrets: Vec<String> = host.config.env.expose().values().cloned().collect();
    secrets.push(host.config.token.expose().to_owned());
    secrets
}

/// `text` with every secret of at least [`MASK_MIN_CHARS`] characters replaced by `***`.
fn mask(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    let mut secrets: Vec<&String> = secrets
        .iter()
        .filter(|s| s.chars().count() >= MASK_MIN_CHARS)
        .collect();
    // Longest first, so a secret containing another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        out = out.replace(secret.as_str(), "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
