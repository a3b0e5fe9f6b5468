//! `POST /compose/down`: auth, lock, tag (age included), env, project; then compose's
//! stop/remove lines against the file on disk (a down fetches nothing), ending in `done`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::checks::{authorize, check_env, check_project, check_tag, Refusal};
use super::compose_file::ComposeFile;
use super::dry_run::{scope, unset_variable_warnings};
use super::fault_state::SimOp;
use super::state::{Shared, HF_VOLUME};
use super::stream::{respond, Emitter, Gone};
use super::up::{default_file, take_lock};

/// The body of `POST /compose/down`.
#[derive(Deserialize)]
pub(crate) struct DownIn {
    tag: String,
    #[serde(default = "default_file")]
    file: String,
    #[serde(default)]
    volumes: bool,
    #[serde(default)]
    services: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    project: Option<String>,
}

/// `POST /compose/down`: checks the tag (age included) but runs against the file on disk.
pub(crate) async fn compose_down(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(req): Json<DownIn>,
) -> Response {
    let delay = shared.state().faults.take_delay(SimOp::Down);
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    start_down(&shared, &headers, req).unwrap_or_else(IntoResponse::into_response)
}

fn start_down(shared: &Arc<Shared>, headers: &HeaderMap, req: DownIn) -> Result<Response, Refusal> {
    authorize(shared, headers)?;
    super::up::scripted_status(shared, SimOp::Down)?;
    let lock = take_lock(shared, "compose_down", &req.tag, &req.file, &req.services)?;
    check_tag(shared, &req.tag)?;
    check_env(&req.env)?;
    check_project(req.project.as_deref())?;
    let (fail, cut, shape) = {
        let mut st = shared.state();
        let (fail, cut) = st.faults.take_for(SimOp::Down);
        (fail, cut, st.faults.take_shape(SimOp::Down))
    };
    let shared2 = shared.clone();
    Ok(respond(shared, lock, shape, move |em| async move {
        let _gone: Result<(), Gone> = run_down(shared2, req, fail.is_some(), cut, em).await;
    }))
}

async fn run_down(
    shared: Arc<Shared>,
    req: DownIn,
    fail: bool,
    cut: bool,
    mut em: Emitter,
) -> Result<(), Gone> {
    let (disk, file) = {
        let st = shared.state();
        let file = shared.parsed_on_disk(&st, &req.file);
        (st.disk.get(&req.file).cloned(), file)
    };
    let (Some(text), Some(file)) = (disk, file) else {
        em.stderr(&format!(
            "open /app/work/{}: no such file or directory",
            req.file
        ))
        .await?;
        return em.done(false, 1).await;
    };
    em.stderr_all(&unset_variable_warnings(&text, &req.env))
        .await?;
    if let Some(unknown) = req
        .services
        .iter()
        .find(|s| !file.services.contains_key(*s))
    {
        em.stderr(&format!("no such service: {unknown}")).await?;
        return em.done(false, 1).await;
    }
    let targets = down_targets(&shared, file, &req.services);
    if fail {
        if let Some((_, name)) = targets.first() {
            em.stderr(&format!(" Container {name}  Stopping")).await?;
            em.stderr(&format!("Error response from daemon: cannot stop container: {name}: tried to kill container, but did not receive an exit event"))
                .await?;
        }
        return em.done(false, 1).await;
    }
    {
        let mut st = shared.state();
        for (service, _) in &targets {
            st.containers.remove(service);
        }
    }
    for (_, name) in &targets {
        for verb in ["Stopping", "Stopped", "Removing", "Removed"] {
            em.stderr(&format!(" Container {name}  {verb}")).await?;
        }
    }
    if req.volumes && req.services.is_empty() {
        for verb in ["Removing", "Removed"] {
            em.stderr(&format!(" Volume {}  {verb}", HF_VOLUME)).await?;
        }
    }
    if cut {
        return Ok(());
    }
    em.done(true, 0).await
}

/// Containers a down removes, dependents first: the named services' containers, or for `[]`
/// every container of a service the file defines.
fn down_targets(shared: &Shared, file: &ComposeFile, services: &[String]) -> Vec<(String, String)> {
    let st = shared.state();
    let present: Vec<String> = st
        .containers
        .keys()
        .filter(|s| file.services.contains_key(*s))
        .filter(|s| services.is_empty() || services.contains(s))
        .cloned()
        .collect();
    let mut order = scope(file, &present).unwrap_or_default();
    order.reverse();
    order
        .into_iter()
        .filter(|s| present.contains(s))
        .filter_map(|s| st.containers.get(&s).map(|c| (s.clone(), c.name.clone())))
        .collect()
}
