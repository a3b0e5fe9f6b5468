//! `free_space`: the gate of a weights pre-stage (seed 003), before anything is sent: the
//! weights already cached end the rollout at once (`already_staged`); too little room on the
//! model-cache volume fails it (`insufficient_space`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Checked, StepDef, QUICK_STEP_BUDGET};
use crate::domain::staging::{format_size, parse_size};

/// Reads the host's model cache (`GET /host/cache`) and the file it runs (`GET /version`):
/// the rollout's file must be the one already deployed (a new file would remove the running
/// engines as orphans); `weights` already cached succeed and end the rollout, every later step
/// skipped; otherwise the volume's free space must be at least `required`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeSpace {
    /// The Hugging Face repo the downloader fetches (`org/repo`).
    pub weights: String,
    /// The free space the download needs (the snapshot and headroom for the transfer).
    #[serde(default = "required")]
    pub required: String,
}

impl StepDef for FreeSpace {
    const NAME: &'static str = "free_space";
    const DOC: &'static str = "the weights pre-stage's gate: already cached ends the rollout, too little free space on the model cache fails it, nothing sent";
    const FIELDS: &'static [&'static str] = &["weights", "required"];

    fn check(&self) -> Checked {
        parse_size(&self.required).map_err(|e| ("required", format!("`required`: {e}")))?;
        let parts: Vec<&str> = self.weights.split('/').collect();
        if parts.len() != 2 || parts.iter().any(|p| p.trim().is_empty()) {
            return Err((
                "weights",
                format!(
                    "`weights`: `{}` is not a Hugging Face repo `org/repo`",
                    self.weights
                ),
            ));
        }
        Ok(())
    }

    fn budget(&self) -> Duration {
        QUICK_STEP_BUDGET
    }

    type Evidence = FreeSpaceEvidence;

    fn summary(d: &FreeSpaceEvidence) -> Option<String> {
        if d.already_staged == Some(true) {
            return Some(format!(
                "{} already cached: nothing to download",
                d.weights.as_deref().unwrap_or("the weights")
            ));
        }
        match (d.free_bytes, d.required_bytes) {
            (Some(free), Some(required)) => Some(format!(
                "{} free, {} required",
                format_size(free),
                format_size(required)
            )),
            _ => None,
        }
    }
}

/// What the gate read and decided.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FreeSpaceEvidence {
    /// The repo, and its cache directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
    /// `true`: the weights are cached; the rollout ends here, succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub already_staged: Option<bool>,
    /// The model-cache volume, its configured capacity and what the host reports it uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_bytes: Option<u64>,
    /// The file the host runs (`GET /version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_file: Option<String>,
}

fn required() -> String {
    "250GiB".to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::runbook::step::evidence_tests::same_json_and_summary;

    #[test]
    fn stored_free_space_evidence_reads_and_writes_back_the_same_json() {
        let gib = 1u64 << 30;
        let cases = [
            (json!({}), None),
            (
                json!({"weights": "graphistry/GLM-5.3-Flash-W4AFP8",
                       "cache_dir": "models--graphistry--GLM-5.3-Flash-W4AFP8",
                       "already_staged": true}),
                Some("graphistry/GLM-5.3-Flash-W4AFP8 already cached: nothing to download"),
            ),
            (
                json!({"weights": "a/b", "volume": "hf", "capacity_bytes": 1024 * gib,
                       "used_bytes": 180 * gib, "free_bytes": 844 * gib,
                       "required_bytes": 250 * gib, "deployed_file": "prod/a.yaml"}),
                Some("844.0 GiB free, 250.0 GiB required"),
            ),
        ];
        same_json_and_summary::<FreeSpace>(&cases);
    }

    #[test]
    fn a_gate_needs_an_org_repo_and_a_size() {
        let ok: FreeSpace = serde_yaml::from_str("{weights: org/repo}").expect("reads");
        assert_eq!(ok.required, "250GiB");
        assert!(ok.check().is_ok());
        for (yaml, field) in [
            ("{weights: repo}", "weights"),
            ("{weights: org/}", "weights"),
            ("{weights: org/repo, required: 250GB}", "required"),
        ] {
            let step: FreeSpace = serde_yaml::from_str(yaml).expect("reads");
            assert_eq!(step.check().map_err(|(f, _)| f), Err(field), "{yaml}");
        }
    }
}
