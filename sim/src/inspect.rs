//! The read-only views: `GET /docker/ps` (docker's JSON lines) and `POST /compose/logs`
//! (compose's prefixed log lines, the last `tail` per container).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::checks::{authorize, error};
use super::dry_run::missing_required_variable;
use super::state::{Container, Shared, HF_VOLUME, PROJECT};

/// docker's `units.HumanDuration`, as in `Up 3 minutes`.
pub(crate) fn human_duration(d: chrono::Duration) -> String {
    let seconds = d.num_seconds();
    let minutes = d.num_minutes();
    let hours = (d.num_seconds() as f64 / 3600.0 + 0.5) as i64;
    match () {
        _ if seconds < 1 => "Less than a second".to_string(),
        _ if seconds == 1 => "1 second".to_string(),
        _ if seconds < 60 => format!("{seconds} seconds"),
        _ if minutes == 1 => "About a minute".to_string(),
        _ if minutes < 60 => format!("{minutes} minutes"),
        _ if hours == 1 => "About an hour".to_string(),
        _ if hours < 48 => format!("{hours} hours"),
        _ if hours < 24 * 7 * 2 => format!("{} days", hours / 24),
        _ if hours < 24 * 30 * 2 => format!("{} weeks", hours / 24 / 7),
        _ if hours < 24 * 365 * 2 => format!("{} months", hours / 24 / 30),
        _ => format!("{} years", hours / 24 / 365),
    }
}

#[allow(clippy::too_many_arguments)]
fn ps_line(
    id: &str,
    name: &str,
    image: &str,
    command: &str,
    labels: &str,
    created_at: DateTime<Utc>,
    started_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> String {
    let short: String = command.chars().take(20).collect();
    let command = if command.chars().count() > 20 {
        format!("\"{short}…\"")
    } else {
        format!("\"{short}\"")
    };
    json!({
        "Command": command,
        "CreatedAt": created_at.format("%Y-%m-%d %H:%M:%S +0000 UTC").to_string(),
        "ID": &id[..id.len().min(12)],
        "Image": image,
        "Labels": labels,
        "LocalVolumes": "1",
        "Mounts": HF_VOLUME,
        "Names": name,
        "Networks": "dstack_default",
        "Ports": "",
        "RunningFor": format!("{} ago", human_duration(now - created_at)),
        "Size": "0B",
        "State": "running",
        "Status": format!("Up {}", human_duration(now - started_at)),
    })
    .to_string()
}

fn labels(c: &Container) -> String {
    format!(
        "com.docker.compose.service={},com.docker.compose.project={PROJECT},\
         com.docker.compose.oneoff=False,com.docker.compose.container-number=1,\
         com.docker.compose.config-hash={},com.docker.compose.image={}",
        c.service, c.fingerprint, c.image
    )
}

/// `GET /docker/ps`: `docker ps --format json`, so running containers only (a finished
/// one-shot does not show), newest first, 12-hex short IDs; plus compose-manager itself
/// (project `dstack`, up since two days before the host started).
pub(crate) async fn docker_ps(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(denied) = authorize(&shared, &headers) {
        return denied.into_response();
    }
    let now = Utc::now();
    let running: Vec<Container> = {
        let st = shared.state();
        st.containers
            .values()
            .filter(|c| c.running)
            .cloned()
            .collect()
    };
    let booted = shared.booted_at - chrono::Duration::days(2);
    let mut rows: Vec<(DateTime<Utc>, String)> = running
        .iter()
        .map(|c| {
            let line = ps_line(
                &c.id,
                &c.name,
                &c.image,
                &c.command,
                &labels(c),
                c.created_at,
                c.started_at,
                now,
            );
            (c.created_at, line)
        })
        .collect();
    rows.push((
        booted,
        ps_line(
            "c0ffee0c0ffee0c0ffee0c0ffee0c0ffee0c0ffee0c0ffee0c0ffee0c0ffee01",
            "compose-manager",
            "ghcr.io/nearai/compose-manager:prod",
            "/usr/local/bin/compose-manager",
            "com.docker.compose.service=compose-manager,com.docker.compose.project=dstack",
            booted,
            booted,
            now,
        ),
    ));
    rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let lines: Vec<String> = rows.into_iter().map(|(_, line)| line).collect();
    Json(json!({"status": "ok", "output": lines.join("\n")})).into_response()
}

#[derive(Deserialize)]
struct LogsIn {
    #[serde(default = "default_file")]
    file: String,
    #[serde(default = "default_tail")]
    tail: u32,
    #[serde(default)]
    services: Vec<String>,
}

fn default_file() -> String {
    "docker-compose.yml".to_string()
}

fn default_tail() -> u32 {
    100
}

impl Default for LogsIn {
    fn default() -> Self {
        LogsIn {
            file: default_file(),
            tail: default_tail(),
            services: Vec::new(),
        }
    }
}

fn compose_failed(stderr: &str) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("docker compose failed (exit 1):\nstderr: {stderr}\nstdout: "),
    )
    .into_response()
}

/// `POST /compose/logs`: any body problem (no JSON content type, bad JSON, wrong types)
/// means all defaults, as on the real server. Reads the on-disk file.
pub(crate) async fn compose_logs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(denied) = authorize(&shared, &headers) {
        return denied.into_response();
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let input: LogsIn = if is_json {
        serde_json::from_slice(&body).unwrap_or_default()
    } else {
        LogsIn::default()
    };
    let st = shared.state();
    let file = match shared.parsed_on_disk(&st, &input.file) {
        Some(file) => file,
        None => {
            return compose_failed(&format!(
                "open /app/work/{}: no such file or directory",
                input.file
            ))
        }
    };
    // Logs run with the host's own env files only, never the request's env:
    // a `${VAR:?}` they leave unset fails every logs call, as on the real server.
    let text = st
        .disk
        .get(&input.file)
        .map(String::as_str)
        .unwrap_or_default();
    if let Some(message) = missing_required_variable(text, &st.host_env) {
        return compose_failed(&message);
    }
    if let Some(unknown) = input
        .services
        .iter()
        .find(|s| !file.services.contains_key(*s))
    {
        return compose_failed(&format!("no such service: {unknown}"));
    }
    let shown: Vec<&Container> = st
        .containers
        .values()
        .filter(|c| file.services.contains_key(&c.service))
        .filter(|c| input.services.is_empty() || input.services.contains(&c.service))
        .collect();
    let width = shown.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut output = String::new();
    for c in shown {
        let skip = c.log.len().saturating_sub(input.tail as usize);
        for line in c.log.iter().skip(skip) {
            output.push_str(&format!("{:<width$}  | {line}\n", c.name));
        }
    }
    Json(json!({"status": "ok", "output": output})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_docker_ps() {
        let cases = [
            (0, "Less than a second"),
            (1, "1 second"),
            (42, "42 seconds"),
            (90, "About a minute"),
            (5 * 60, "5 minutes"),
            (3600, "About an hour"),
            (5 * 3600, "5 hours"),
            (3 * 86_400, "3 days"),
            (20 * 86_400, "2 weeks"),
            (90 * 86_400, "3 months"),
            (800 * 86_400, "2 years"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(chrono::Duration::seconds(secs)), want);
        }
    }
}
