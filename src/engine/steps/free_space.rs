//! The `free_space` step (docs/reference.md#pre-staging-weights): a weights pre-stage's gate,
//! read before anything is sent. The host must run the rollout's file (the downloader runs
//! from the file already deployed: a new file would remove the running engines as orphans);
//! weights already cached end the rollout at once (`already_staged`, the runner skips the
//! rest); otherwise the model-cache volume needs `required` free bytes.

use crate::domain::error_code::ErrorCode;
use crate::domain::runbook::step::free_space::FreeSpaceEvidence;
use crate::domain::runbook::step::FreeSpace;
use crate::domain::staging::{self, format_size, SpaceVerdict};
use crate::engine::step_run::{Evidence, Execute, Running, StepEnd, StepRun};

impl Execute for FreeSpace {
    async fn execute(&self, run: &mut StepRun<'_>, _: &mut Running<'_>) -> StepEnd {
        let mut detail = FreeSpaceEvidence {
            weights: Some(self.weights.clone()),
            cache_dir: Some(staging::cache_dir(&self.weights)),
            ..FreeSpaceEvidence::default()
        };
        let fail = |code, msg: String, detail: &FreeSpaceEvidence| {
            StepEnd::failed(code, format!("{msg}; nothing sent"), Evidence::of(detail))
        };
        let host = &run.ctx.host;
        let Some(cache) = &host.model_cache else {
            let msg = format!(
                "host {} has no `model_cache` (its volume and capacity) in canaryd's config: the free space cannot be told",
                host.name
            );
            return fail(ErrorCode::ModelCacheUnknown, msg, &detail);
        };
        let required = match staging::parse_size(&self.required) {
            // A plan may raise the runbook's requirement, never lower it.
            Ok(bytes) => bytes.max(run.rollout.required_free.unwrap_or(0)),
            Err(e) => {
                return fail(
                    ErrorCode::InvalidRequest,
                    format!("`required`: {e}"),
                    &detail,
                )
            }
        };
        detail.volume = Some(cache.volume.clone());
        detail.capacity_bytes = Some(cache.capacity);
        detail.required_bytes = Some(required);
        let version = match run.ctx.calls.version().await {
            Ok(v) => v,
            Err(e) => return fail(e.code(), format!("could not read /version: {e}"), &detail),
        };
        let deployed = version
            .projects
            .get(&host.project)
            .and_then(|p| p.current.as_ref())
            .and_then(|c| c.file.clone())
            .or(version.file);
        detail.deployed_file = deployed.clone();
        let file = run.rollout.file.as_str();
        if deployed.as_deref() != Some(file) {
            let msg = format!(
                "host {} runs {}, not {file}: a pre-stage runs the downloader from the file already deployed (a new file would remove the running engines as orphans)",
                host.name,
                deployed.as_deref().unwrap_or("no recorded file")
            );
            return fail(ErrorCode::FileNotDeployed, msg, &detail);
        }
        let report = match run.ctx.calls.host_cache().await {
            Ok(r) => r,
            Err(e) => {
                return fail(
                    e.code(),
                    format!("could not read /host/cache: {e}"),
                    &detail,
                )
            }
        };
        let volumes: Vec<(String, u64)> = report
            .volumes
            .iter()
            .map(|v| (v.name.clone(), v.size_bytes))
            .collect();
        detail.used_bytes = volumes
            .iter()
            .find(|(name, _)| *name == cache.volume)
            .map(|(_, used)| *used);
        let verdict = staging::verdict(
            &volumes,
            &report.weights,
            &cache.volume,
            cache.capacity,
            required,
            &self.weights,
        );
        match verdict {
            SpaceVerdict::AlreadyStaged => {
                detail.already_staged = Some(true);
                StepEnd::Succeeded(Evidence::of(&detail))
            }
            SpaceVerdict::Enough { free } => {
                detail.free_bytes = Some(free);
                StepEnd::Succeeded(Evidence::of(&detail))
            }
            SpaceVerdict::Insufficient { free, required } => {
                detail.free_bytes = Some(free);
                let msg = format!(
                    "{} free on {} ({} less {} used), {} required for {}",
                    format_size(free),
                    cache.volume,
                    format_size(cache.capacity),
                    format_size(detail.used_bytes.unwrap_or_default()),
                    format_size(required),
                    self.weights
                );
                fail(ErrorCode::InsufficientSpace, msg, &detail)
            }
            SpaceVerdict::VolumeMissing => {
                let reported: Vec<&str> = report.volumes.iter().map(|v| v.name.as_str()).collect();
                let msg = format!(
                    "host {} does not report the model-cache volume {} (it reports: {})",
                    host.name,
                    cache.volume,
                    reported.join(", ")
                );
                fail(ErrorCode::ModelCacheUnknown, msg, &detail)
            }
        }
    }
}
