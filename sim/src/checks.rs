//! The checks every compose-manager handler of the simulated host shares: bearer auth, the
//! tag table, env keys and values, the `project` override, and the refusal they answer with.

use std::collections::BTreeMap;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde_json::json;

use super::state::{Shared, TagEntry, PROJECT};

/// A refused request: `{"status":"error","error":…}` with its status code.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"status": "error", "error": self.message})),
        )
            .into_response()
    }
}

/// `{"status":"error","error":…}` with `status`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        message: message.into(),
    }
}

/// The 409 of a held lock.
pub(crate) fn busy(action: &str) -> Refusal {
    error(
        StatusCode::CONFLICT,
        format!("another docker operation is already in progress: {action}"),
    )
}

/// `Authorization: Bearer <token>`, exactly; 401 with the documented messages otherwise.
pub(crate) fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), Refusal> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        None => Err(error(
            StatusCode::UNAUTHORIZED,
            "Missing or invalid Authorization header",
        )),
        Some(token) if token == shared.token => Ok(()),
        Some(_) => Err(error(StatusCode::UNAUTHORIZED, "Invalid token")),
    }
}

/// The tag table: unknown → `tag not found`, younger than the minimum age → `tag too recent`.
/// A scripted rate limit of the git host answers like an unknown tag.
pub(crate) fn check_tag<'a>(shared: &'a Shared, tag: &str) -> Result<&'a TagEntry, Refusal> {
    let rate_limited = {
        let mut st = shared.state();
        let limited = st.faults.tag_rate_limited > 0;
        st.faults.tag_rate_limited = st.faults.tag_rate_limited.saturating_sub(1);
        limited
    };
    if rate_limited {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("tag not found: {tag}"),
        ));
    }
    let entry = shared
        .find_tag(tag)
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, format!("tag not found: {tag}")))?;
    if entry.committed_at > Utc::now() - shared.min_tag_age {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "tag too recent: {} is less than {} hours old",
                entry.committed_at.format("%Y-%m-%d %H:%M:%S UTC"),
                shared.min_tag_age.num_hours()
            ),
        ));
    }
    Ok(entry)
}

/// Env keys `[A-Za-z_][A-Za-z0-9_]*`, values without newlines.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), Refusal> {
    for (key, value) in env {
        let mut chars = key.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
        if !valid {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("invalid env var key: '{key}' (must match [A-Za-z_][A-Za-z0-9_]*)"),
            ));
        }
        if value.contains('\n') || value.contains('\r') {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("env var '{key}' value must not contain newlines"),
            ));
        }
    }
    Ok(())
}

/// A `project` override must be canonical and not reserved. (The simulated host models the
/// one default project, `work`; an accepted override acts on it too.)
pub(crate) fn check_project(project: Option<&str>) -> Result<(), Refusal> {
    let Some(p) = project else {
        return Ok(());
    };
    let message = if p.is_empty() {
        format!("project name '{p}' is empty after sanitization")
    } else if p == PROJECT || p == "dstack" {
        format!("project '{p}' is reserved and cannot be overridden")
    } else if !p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        || !p
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        format!(
            "project '{p}' is not canonical (must be lowercase [a-z0-9_-], \
             starting with a letter or digit)"
        )
    } else {
        return Ok(());
    };
    Err(error(StatusCode::BAD_REQUEST, message))
}
