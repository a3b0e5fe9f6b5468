//! `POST /compose/up` (apply, `dry_run`, `materialize_only`): the checks in the documented
//! order (auth, lock, tag, env, project, file), then an NDJSON stream of compose's progress
//! lines ending in `done`. Also the warm deploy a host starts with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde::Deserialize;

use super::checks::{authorize, busy, check_env, check_project, check_tag, error, Refusal};
use super::dry_run::{
    desired, parse_plan, plan, scope, unset_variable_warnings, up_lines, Change, Desired, Existing,
    PlanBody, Step as DryStep,
};
use super::engine::{apply_steps, is_one_shot, StartMode};
use super::fault_state::SimOp;
use super::state::{sha256_hex, DeployRecord, HeldLock, InFlight, Shared};
use super::stream::{respond, Emitter, Gone, StagedEvent};

/// compose-manager's default `file`.
pub(crate) fn default_file() -> String {
    "docker-compose.yml".to_string()
}

/// The body of `POST /compose/up`; unknown fields are ignored, as on the real server.
#[derive(Deserialize)]
pub(crate) struct UpIn {
    tag: String,
    #[serde(default = "default_file")]
    file: String,
    #[serde(default)]
    services: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    force_recreate: bool,
    #[serde(default)]
    project: Option<String>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    materialize_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Apply,
    DryRun,
    Materialize,
}

struct UpJob {
    shared: Arc<Shared>,
    text: String,
    record: DeployRecord,
    services: Vec<String>,
    env: BTreeMap<String, String>,
    images: BTreeMap<String, String>,
    force_recreate: bool,
    mode: Mode,
    fail: Option<String>,
    cut: bool,
    /// The abandoned-child fault: how long compose goes on after the stream ended.
    abandon: Option<std::time::Duration>,
}

/// Takes the one-operation lock for a stream of `action`, or refuses with the 409.
pub(crate) fn take_lock(
    shared: &Arc<Shared>,
    action: &str,
    tag: &str,
    file: &str,
    services: &[String],
) -> Result<HeldLock, Refusal> {
    let entry = InFlight {
        action: action.to_string(),
        started_at: Utc::now(),
        tag: Some(tag.to_string()),
        file: Some(file.to_string()),
        services: services.to_vec(),
        container: None,
        seq: 0,
    };
    shared.try_lock(entry).map_err(|action| busy(&action))
}

/// `POST /compose/up`.
pub(crate) async fn compose_up(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(req): Json<UpIn>,
) -> Response {
    let op = if req.dry_run && !shared.state().faults.legacy {
        SimOp::DryRun
    } else {
        SimOp::Up
    };
    let delay = shared.state().faults.take_delay(op);
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    start_up(&shared, &headers, req).unwrap_or_else(IntoResponse::into_response)
}

fn start_up(shared: &Arc<Shared>, headers: &HeaderMap, req: UpIn) -> Result<Response, Refusal> {
    authorize(shared, headers)?;
    let legacy = shared.state().faults.legacy;
    let scripted_op = if req.dry_run && !legacy {
        SimOp::DryRun
    } else {
        SimOp::Up
    };
    scripted_status(shared, scripted_op)?;
    let mode = match (req.dry_run, req.materialize_only) {
        _ if legacy => Mode::Apply,
        (true, _) => Mode::DryRun,
        (false, true) => Mode::Materialize,
        (false, false) => Mode::Apply,
    };
    let lock = take_lock(shared, "compose_up", &req.tag, &req.file, &req.services)?;
    let tag = check_tag(shared, &req.tag)?;
    check_env(&req.env)?;
    check_project(req.project.as_deref())?;
    let text = shared.file_at(&req.file, &tag.tag).ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("file '{}' not found at tag '{}'", req.file, req.tag),
        )
    })?;
    let moved = shared.state().faults.moved_tags.get(&req.tag).cloned();
    let (commit, text) = match moved {
        Some(commit) => (commit.clone(), format!("{text}# tag moved to {commit}\n")),
        None => (tag.tag.commit.clone(), text),
    };
    let record = DeployRecord {
        tag: req.tag.clone(),
        commit,
        file: req.file.clone(),
        file_sha256: sha256_hex(text.as_bytes()),
    };
    let op = if mode == Mode::DryRun {
        SimOp::DryRun
    } else {
        SimOp::Up
    };
    let (fail, cut, shape) = {
        let mut st = shared.state();
        st.disk.insert(req.file.clone(), text.clone());
        st.disk_tags.insert(req.file.clone(), tag.tag.name.clone());
        if mode == Mode::Apply {
            st.attempted = Some(record.clone());
        }
        let (fail, cut) = st.faults.take_for(op);
        (fail, cut, st.faults.take_shape(op))
    };
    let abandon = if mode == Mode::Apply {
        shared.state().faults.abandon_up.take()
    } else {
        None
    };
    let job = UpJob {
        shared: shared.clone(),
        text,
        record,
        services: req.services,
        env: req.env,
        images: tag.tag.images.clone(),
        force_recreate: req.force_recreate,
        mode,
        fail,
        cut,
        abandon,
    };
    Ok(respond(shared, lock, shape, move |em| async move {
        let _gone: Result<(), Gone> = run_up(job, em).await;
    }))
}

fn existing(shared: &Shared) -> BTreeMap<String, Existing> {
    let st = shared.state();
    st.containers
        .iter()
        .map(|(service, c)| {
            let e = Existing {
                container: c.name.clone(),
                fingerprint: c.fingerprint.clone(),
                running: c.running,
            };
            (service.clone(), e)
        })
        .collect()
}

async fn run_up(job: UpJob, mut em: Emitter) -> Result<(), Gone> {
    let shared = job.shared.clone();
    let Some(file) = shared.parsed_at(&job.record.file, &job.record.tag) else {
        return em.done(false, 1).await;
    };
    let warnings = unset_variable_warnings(&job.text, &job.env);
    let order = match scope(file, &job.services) {
        Ok(order) => order,
        Err(message) => {
            em.stderr_all(&warnings).await?;
            em.stderr(&message).await?;
            if job.mode == Mode::DryRun {
                em.plan(PlanBody::default(), false, 1).await?;
            }
            return em.done(false, 1).await;
        }
    };
    let want: BTreeMap<String, Desired> = order
        .iter()
        .filter_map(|s| {
            let def = file.services.get(s)?;
            Some((s.clone(), desired(def, job.images.get(s), &job.env)))
        })
        .collect();
    let one_shot = |s: &str| file.services.get(s).is_some_and(is_one_shot);
    em.stderr_all(&warnings).await?;
    if job.mode == Mode::DryRun {
        if job.fail.is_some() {
            em.stderr("Error response from daemon: failed to compute the dry-run plan")
                .await?;
            em.plan(PlanBody::default(), false, 1).await?;
            return em.done(false, 1).await;
        }
        let steps = plan(file, &order, &want, &existing(&shared), job.force_recreate);
        let mut lines = up_lines(&steps, &one_shot, true);
        let (extra, removal) = {
            let st = shared.state();
            (
                st.faults.dry_run_extra.clone(),
                st.faults.dry_run_removal.clone(),
            )
        };
        for (name, verbs) in [
            (extra, ["Recreate", "Recreated"]),
            (removal, ["Removing", "Removed"]),
        ] {
            if let Some(name) = name {
                lines.extend(verbs.map(|v| format!(" DRY-RUN MODE -  Container {name}  {v}")));
            }
        }
        em.stderr_all(&lines).await?;
        if job.cut {
            return Ok(());
        }
        em.plan(parse_plan(&lines), true, 0).await?;
        return em.done(true, 0).await;
    }
    // pull --ignore-buildable
    let pulled: Vec<(&String, &Desired)> =
        want.iter().filter(|(_, d)| !d.image.is_empty()).collect();
    for (service, _) in &pulled {
        em.stderr(&format!(" {service} Pulling")).await?;
    }
    if job.fail.as_deref() == Some("pull") {
        let (service, image) = pulled
            .first()
            .map(|(s, d)| (s.as_str(), d.image.as_str()))
            .unwrap_or(("app", "app:latest"));
        let why = format!("manifest for {image} not found: manifest unknown: manifest unknown");
        em.stderr(&format!(" {service} Error {why}")).await?;
        em.stderr(&format!("Error response from daemon: {why}"))
            .await?;
        return em.done(false, 1).await;
    }
    pull_missing(&shared, pulled.iter().map(|(_, d)| d.image.as_str())).await;
    for (service, _) in &pulled {
        em.stderr(&format!(" {service} Pulled")).await?;
    }
    // build
    em.stderr_all(&warnings).await?;
    if job.fail.as_deref() == Some("build") {
        em.stderr("failed to solve: process \"/bin/sh -c pip install -e .\" did not complete successfully: exit code: 1")
            .await?;
        return em.done(false, 1).await;
    }
    if job.mode == Mode::Materialize {
        return finish_stage(job, em, &order).await;
    }
    // up -d --remove-orphans
    em.stderr_all(&warnings).await?;
    let steps = plan(file, &order, &want, &existing(&shared), job.force_recreate);
    if let Some(work) = job.abandon {
        // The stream ends here (lock released with it); the compose child goes on.
        tokio::spawn(finish_abandoned(
            shared.clone(),
            job.record.file.clone(),
            steps,
            want,
            job.record.tag.clone(),
            work,
        ));
        return Ok(());
    }
    let fails = job.fail.is_some();
    let mode = if fails {
        StartMode::CreateOnly
    } else {
        StartMode::Normal
    };
    // An engine of the scope waits for its one-shot dependency to complete: a download the
    // downloader makes happens inside this up's stream.
    let downloads = steps.iter().any(|s| {
        one_shot(&s.service)
            && matches!(s.change, Change::Create | Change::Recreate | Change::Start)
    });
    let engine_waits = downloads && order.iter().any(|s| !one_shot(s));
    if engine_waits && !fails {
        let pending = super::engine::pending_download(&shared.state());
        if let Some((repo, time, bytes)) = pending {
            em.stderr(" model-downloader Started").await?;
            tokio::time::sleep(time).await;
            super::engine::cache_download(&mut shared.state(), &repo, bytes);
            em.stderr(" model-downloader Exited").await?;
        }
    }
    apply_steps(&shared, file, &steps, &want, &job.record.tag, mode);
    let lines = up_lines(&steps, &one_shot, false);
    if fails {
        let shown = lines
            .iter()
            .position(|l| l.ends_with("  Starting"))
            .map_or(lines.len(), |i| i + 1);
        em.stderr_all(&lines[..shown]).await?;
        em.stderr("Error response from daemon: could not select device driver \"nvidia\" with capabilities: [[gpu]]")
            .await?;
        return em.done(false, 1).await;
    }
    em.stderr_all(&lines).await?;
    if job.cut {
        return Ok(());
    }
    em.hold().await?;
    {
        let mut st = shared.state();
        st.previous = st.current.take();
        st.current = Some(job.record.clone());
        st.attempted = Some(job.record.clone());
    }
    em.done(true, 0).await
}

/// The abandoned compose child of [`SimFaults::abandon_up`](super::SimFaults::abandon_up):
/// a container it creates (say after a down) appears and starts a third of `work` after the
/// stream ended; one it recreates stops then, and comes back with a new id at two thirds.
/// The deployed records are not rotated: no `done` was ever sent.
async fn finish_abandoned(
    shared: Arc<Shared>,
    file: String,
    steps: Vec<DryStep>,
    want: BTreeMap<String, Desired>,
    tag: String,
    work: std::time::Duration,
) {
    let Some(parsed) = shared.parsed_at(&file, &tag) else {
        return;
    };
    let (recreated, created): (Vec<DryStep>, Vec<DryStep>) = steps
        .into_iter()
        .filter(|s| matches!(s.change, Change::Create | Change::Recreate))
        .partition(|s| s.change == Change::Recreate);
    tokio::time::sleep(work / 3).await;
    for step in &recreated {
        if let Some(c) = shared.state().containers.get_mut(&step.service) {
            c.running = false;
        }
    }
    apply_steps(&shared, parsed, &created, &want, &tag, StartMode::Normal);
    tokio::time::sleep(work / 3).await;
    apply_steps(&shared, parsed, &recreated, &want, &tag, StartMode::Normal);
}

/// Pulls the images the host does not hold (in parallel, as compose does: the slowest of
/// their [pull times](crate::SimFaults::set_image_pull_time)); they stay on the host.
async fn pull_missing<'a>(shared: &Shared, images: impl Iterator<Item = &'a str>) {
    let (missing, pull_time) = {
        let st = shared.state();
        let missing: BTreeSet<String> = images
            .filter(|i| !st.pulled_images.contains(*i))
            .map(str::to_owned)
            .collect();
        let time = |i: &String| {
            let own = st.faults.pull_times.get(i);
            own.copied().unwrap_or(st.faults.pull_time)
        };
        let slowest = missing.iter().map(time).max().unwrap_or_default();
        (missing, slowest)
    };
    if missing.is_empty() {
        return;
    }
    if !pull_time.is_zero() {
        tokio::time::sleep(pull_time).await;
    }
    shared.state().pulled_images.extend(missing);
}

/// A scripted pre-stream answer (`SimFaults::answer_status`): nothing happens.
pub(crate) fn scripted_status(shared: &Shared, op: SimOp) -> Result<(), Refusal> {
    let status = shared.state().faults.take_status(op);
    match status.and_then(|s| StatusCode::from_u16(s).ok()) {
        Some(status) => Err(error(status, format!("scripted failure ({status})"))),
        None => Ok(()),
    }
}

/// The `staged` line of `materialize_only`: images of existing containers in scope, or `[]`
/// whenever `env` is non-empty (the real server deletes the env file first).
async fn finish_stage(job: UpJob, mut em: Emitter, order: &[String]) -> Result<(), Gone> {
    let images: Vec<String> = if job.env.is_empty() {
        let st = job.shared.state();
        let set: BTreeSet<String> = order
            .iter()
            .filter_map(|s| st.containers.get(s))
            .map(|c| format!("sha256:{}", sha256_hex(c.image.as_bytes())))
            .collect();
        set.into_iter().collect()
    } else {
        Vec::new()
    };
    em.staged(StagedEvent {
        event: "staged",
        file: job.record.file.clone(),
        file_sha256: job.record.file_sha256.clone(),
        images,
        tag: job.record.tag.clone(),
    })
    .await?;
    em.done(true, 0).await
}

/// Deploys `tag` of `file` with `services: []` at start, warm: every default service runs,
/// engines are ready, and `/version` shows it as the current deployment.
pub(crate) fn initial_deploy(
    shared: &Arc<Shared>,
    file_path: &str,
    tag: &str,
    env: &BTreeMap<String, String>,
) -> Result<(), String> {
    let entry = shared
        .find_tag(tag)
        .ok_or_else(|| format!("initial tag {tag} is not in the tag table"))?;
    let text = shared
        .file_at(file_path, &entry.tag)
        .ok_or_else(|| format!("no compose file {file_path}"))?;
    let file = shared
        .parsed_at(file_path, tag)
        .ok_or_else(|| format!("no compose file {file_path}"))?;
    let order = scope(file, &[])?;
    let want: BTreeMap<String, Desired> = order
        .iter()
        .filter_map(|s| {
            let def = file.services.get(s)?;
            Some((s.clone(), desired(def, entry.tag.images.get(s), env)))
        })
        .collect();
    let steps = plan(file, &order, &want, &BTreeMap::new(), false);
    apply_steps(shared, file, &steps, &want, tag, StartMode::Warm);
    let images = want.values().map(|d| d.image.clone());
    shared.state().pulled_images.extend(images);
    let record = DeployRecord {
        tag: tag.to_string(),
        commit: entry.tag.commit.clone(),
        file: file_path.to_string(),
        file_sha256: sha256_hex(text.as_bytes()),
    };
    let mut st = shared.state();
    st.disk.insert(file_path.to_string(), text);
    st.disk_tags.insert(file_path.to_string(), tag.to_string());
    st.attempted = Some(record.clone());
    st.current = Some(record);
    Ok(())
}
