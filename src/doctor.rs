//! Host doctor (docs/oncall.md): checks, without changing anything on the host, what a rollout will
//! need there: the compose-manager token, dry-run support, the project in `/version`, logs and
//! health of every configured replica, and healthy peers in every group. The daemon keeps the
//! last report per host in memory (the dashboard shows it).
//!
//! Requests sent: `GET /status` (or `GET /docker/ps` on a server without it), `POST
//! /docker/evict {}` (refused with 422 before the handler runs: no lock, no effect), `GET
//! /version`, `POST /compose/logs` per replica, and each replica's health URL. Never an
//! up, down, restart or clean.

mod verdict;

use crate::domain::names::{ComposeFile, ServiceName};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};

use crate::compose::{ComposeError, LogsRequest, VersionInfo};
use crate::engine::{Engine, EngineError, HostRuntime};

/// Masks secrets of 8 characters or more in text taken from a host (also used by `smoke`).
use crate::domain::mask::mask;
use verdict::{dry_run_check, fail, health_check, newest_tag_check, pass, peers_check};

/// Log lines asked for by the logs check: enough to prove the call works.
const LOGS_TAIL: u32 = 5;

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

/// The host doctor of a daemon: runs the checks and keeps the last report of each host (in
/// memory only: a restart forgets them).
pub struct Doctor {
    engine: Engine,
    last: Mutex<HashMap<String, DoctorReport>>,
}

impl Doctor {
    /// The doctor of the hosts `engine` drives.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Runs every check against `host` and remembers the report.
    pub async fn run(&self, host: &str) -> Result<DoctorReport, EngineError> {
        let runtime = self.engine.host(host)?;
        let report = run(&self.engine, runtime).await;
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
        if let Ok(mut last) = self.last.lock() {
            last.insert(host.to_owned(), report.clone());
        }
        Ok(report)
    }

    /// The last doctor report of `host`, if the doctor ran since the daemon started.
    pub fn last(&self, host: &str) -> Option<DoctorReport> {
        self.last
            .lock()
            .ok()
            .and_then(|last| last.get(host).cloned())
    }
}

async fn run(engine: &Engine, host: &HostRuntime) -> DoctorReport {
    // `engine.doctor_call_timeout`, or `compose.request_timeout` if shorter.
    let limit = engine.doctor_call_limit();
    let (token, dry_run, version) = tokio::join!(
        bounded(limit, "GET /status", check_token(host)),
        bounded(limit, "POST /docker/evict", host.client.supports_dry_run()),
        bounded(limit, "GET /version", host.client.version())
    );
    let token_refused = matches!(&token, Err(ComposeError::Unauthorized { .. }));
    let mut checks = vec![
        token_check(token),
        dry_run_check(dry_run),
        version_check(host, &version),
    ];

    let version = version.ok();
    // A replica that runs under a former name (`aliases`) has its logs under that name: with
    // former names configured, `docker ps` says which name runs.
    let renamed = host.config.replicas.values().any(|r| !r.aliases.is_empty());
    let ps = if token_refused || !renamed {
        None
    } else {
        bounded(limit, "GET /docker/ps", host.client.ps())
            .await
            .ok()
    };
    let names: Vec<&str> = host
        .config
        .replicas
        .iter()
        .map(|(service, replica)| {
            std::iter::once(service)
                .chain(&replica.aliases)
                .find(|name| ps.iter().flatten().any(|c| c.is_service(name)))
                .unwrap_or(service)
                .as_str()
        })
        .collect();
    let logs = names.iter().map(|service| {
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
            let sample = engine.prober().sample(&replica.health_url).await;
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

fn token_check(outcome: Result<String, ComposeError>) -> DoctorCheck {
    match outcome {
        Ok(detail) => pass("token_accepted", detail),
        Err(e @ ComposeError::Unauthorized { .. }) => fail(
            "token_accepted",
            format!(
                "{e}; it is not the host's BEARER_TOKEN, so every authenticated call (dry run, \
                 down, up, logs) would fail"
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
) -> Option<ComposeFile> {
    let recorded = engine
        .store()
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
            .and_then(|f| ComposeFile::parse(f).ok())
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
    let Ok(service_name) = ServiceName::parse(service) else {
        return fail(
            &name,
            "not checked: the replica's name is not a compose service name",
        );
    };
    let req = LogsRequest {
        file: file.clone(),
        service: service_name,
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

/// Values that must never reach an answer: the host's env values and its token.
fn secrets_of(host: &HostRuntime) -> Vec<String> {
    let mut secrets: Vec<String> = host.config.env.expose().values().cloned().collect();
    secrets.push(host.config.token.expose().to_owned());
    secrets
}
