//! Answers of compose-manager's JSON (non-streaming) endpoints, as the engine keeps them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ComposeError;

/// One container from `GET /docker/ps` (`docker ps --format json`); missing keys are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsEntry {
    /// `ID`.
    pub id: String,
    /// `Names` (the container name, e.g. `model-sg-glm53-w4afp8-tp4-r2`).
    pub names: String,
    /// `Image`.
    pub image: String,
    /// `State`, e.g. `running`.
    pub state: String,
    /// `Status`, e.g. `Up 3 hours (healthy)`.
    pub status: String,
    /// `Labels`, docker's comma-separated `k=v` text.
    pub labels: String,
}

/// `GET /status`: the operation holding the host's lock, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStatus {
    /// `None` when the host is idle.
    #[serde(default)]
    pub in_flight: Option<InFlight>,
}

/// The operation in flight on a host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// `compose_up` (also dry runs), `compose_down`, `docker_restart`, ...
    #[serde(default)]
    pub action: String,
    /// RFC 3339.
    #[serde(default)]
    pub started_at: Option<String>,
    /// Tag of a compose operation.
    #[serde(default)]
    pub tag: Option<String>,
    /// Compose file of a compose operation.
    #[serde(default)]
    pub file: Option<String>,
    /// Services it was scoped to (empty when unscoped).
    #[serde(default)]
    pub services: Vec<String>,
}

/// `GET /version`: the top-level fields are the last *attempted* up; `projects` the last
/// *successful* ones per compose project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// Tag of the last attempted up.
    #[serde(default)]
    pub tag: Option<String>,
    /// Commit SHA the tag resolved to.
    #[serde(default)]
    pub commit: Option<String>,
    /// Compose file of the last attempted up.
    #[serde(default)]
    pub file: Option<String>,
    /// SHA-256 of that compose file.
    #[serde(default)]
    pub file_sha256: Option<String>,
    /// compose-manager's own image digest.
    #[serde(default)]
    pub image: Option<String>,
    /// Keyed by compose project (`work` by default).
    #[serde(default)]
    pub projects: BTreeMap<String, ProjectDeployments>,
}

/// The current and previous successful deployment of one compose project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectDeployments {
    /// The last successful deployment.
    #[serde(default)]
    pub current: Option<DeployedRecord>,
    /// The one before it; absent until a second success.
    #[serde(default)]
    pub previous: Option<DeployedRecord>,
}

/// One deployment record of compose-manager.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployedRecord {
    /// Tag deployed.
    #[serde(default)]
    pub tag: Option<String>,
    /// Commit SHA of the tag.
    #[serde(default)]
    pub commit: Option<String>,
    /// Compose file deployed.
    #[serde(default)]
    pub file: Option<String>,
    /// SHA-256 of the compose file.
    #[serde(default)]
    pub file_sha256: Option<String>,
}

/// `{"status":"ok","output":"..."}` of logs and ps.
#[derive(Debug, Deserialize)]
pub(crate) struct OutputIn {
    #[serde(default)]
    pub(crate) output: String,
}

/// Splits the `output` of `GET /docker/ps` (one JSON object per line) into entries.
pub(crate) fn parse_ps_output(endpoint: &str, output: &str) -> Result<Vec<PsEntry>, ComposeError> {
    let mut entries = Vec::new();
    for (index, line) in output.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| {
            ComposeError::protocol(endpoint, index + 1, line, format!("not JSON: {e}"))
        })?;
        let Value::Object(map) = value else {
            return Err(ComposeError::protocol(
                endpoint,
                index + 1,
                line,
                "not a JSON object",
            ));
        };
        let text = |key: &str| match map.get(key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        entries.push(PsEntry {
            id: text("ID"),
            names: text("Names"),
            image: text("Image"),
            state: text("State"),
            status: text("Status"),
            labels: text("Labels"),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ps_output_is_split_into_entries_with_missing_keys_empty() {
        let output = concat!(
            r#"{"ID":"abc","Names":"nginx","Image":"nginx:1","State":"running","Status":"Up 1 hour","Labels":"a=b"}"#,
            "\n\n",
            r#"{"ID":"def","Names":"model-sg-glm53-w4afp8-tp4-r2","Image":"sglang@sha256:1"}"#,
            "\n"
        );
        let entries = parse_ps_output("/docker/ps", output).expect("parses");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].labels, "a=b");
        assert_eq!(entries[1].names, "model-sg-glm53-w4afp8-tp4-r2");
        assert_eq!(entries[1].state, "");
    }

    #[test]
    fn a_ps_line_that_is_not_json_is_a_protocol_error_naming_the_line() {
        let err = parse_ps_output("/docker/ps", "{\"ID\":\"a\"}\nnot json\n").err();
        assert!(
            matches!(err, Some(ComposeError::Protocol { line_no: 2, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn version_and_status_parse_with_omitted_keys() {
        let v: VersionInfo = serde_json::from_str(
            r#"{"status":"ok","tag":"v2","projects":{"work":{"current":{"tag":"v2","file":"prod/a.yaml"}}}}"#,
        )
        .expect("parses");
        assert_eq!(v.tag.as_deref(), Some("v2"));
        let work = &v.projects["work"];
        assert_eq!(
            work.current.as_ref().and_then(|c| c.file.as_deref()),
            Some("prod/a.yaml")
        );
        assert!(work.previous.is_none());
        let fresh: VersionInfo = serde_json::from_str(r#"{"status":"ok"}"#).expect("parses");
        assert_eq!(fresh, VersionInfo::default());

        let idle: HostStatus =
            serde_json::from_str(r#"{"status":"ok","in_flight":null}"#).expect("parses");
        assert!(idle.in_flight.is_none());
        let busy: HostStatus = serde_json::from_str(
            r#"{"status":"ok","in_flight":{"action":"compose_up","started_at":"2026-05-01T00:00:00Z","services":["r2"],"container":"x"}}"#,
        )
        .expect("parses");
        let in_flight = busy.in_flight.expect("busy");
        assert_eq!(in_flight.action, "compose_up");
        assert_eq!(in_flight.services, vec!["r2".to_owned()]);
        assert!(in_flight.tag.is_none());
    }
}
