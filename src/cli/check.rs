//! `canaryd check config|runbook|plan FILE`: offline validation, `file:line: message` on error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::serve::EXIT_BAD_CONFIG;
use crate::domain::{plan, runbook};

#[derive(Debug, Subcommand)]
pub enum CheckCommand {
    /// A daemon configuration (env vars it names must be set).
    Config { file: PathBuf },
    /// A runbook file.
    Runbook { file: PathBuf },
    /// A canary plan; with a loadable --config, also its host, service and runbook.
    Plan {
        file: PathBuf,
        #[arg(long, default_value = "config/canaryd.yaml")]
        config: PathBuf,
    },
}

pub fn check(what: CheckCommand) -> anyhow::Result<ExitCode> {
    let result = match &what {
        CheckCommand::Config { file } => check_config(file),
        CheckCommand::Runbook { file } => check_runbook(file),
        CheckCommand::Plan { file, config } => check_plan(file, config),
    };
    match result {
        Ok(summary) => {
            outln!("{summary}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("{message}");
            Ok(ExitCode::from(EXIT_BAD_CONFIG))
        }
    }
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("{}: cannot read: {e}", file.display()))
}

fn check_config(file: &Path) -> Result<String, String> {
    let config = crate::config::load(file).map_err(|e| e.to_string())?;
    config.check_listen_safety().map_err(|e| e.to_string())?;
    let runbooks = runbook::load_dir(&config.runbooks_dir).map_err(|e| e.to_string())?;
    let replicas: usize = config.hosts.values().map(|h| h.replicas.len()).sum();
    Ok(format!(
        "{}: ok ({} host(s), {replicas} replica(s), {} runbook(s), {} token(s))",
        file.display(),
        config.hosts.len(),
        runbooks.len(),
        config.tokens.len()
    ))
}

fn check_runbook(file: &Path) -> Result<String, String> {
    let text = read(file)?;
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("runbook");
    let rb = runbook::parse(name, &file.display().to_string(), &text).map_err(|e| e.to_string())?;
    rb.ensure_safe()
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let kinds: Vec<&str> = rb.steps.iter().map(|s| s.kind.name()).collect();
    Ok(format!("{}: ok ({})", file.display(), kinds.join(" -> ")))
}

fn check_plan(file: &Path, config: &Path) -> Result<String, String> {
    let text = read(file)?;
    let label = file.display().to_string();
    let is_json = file.extension().is_some_and(|e| e == "json");
    let spec = if is_json {
        plan::parse_json(text.as_bytes())
    } else {
        plan::parse_yaml(&text)
    };
    let spec = spec.map_err(|e| format!("{label}: {}", e.message))?;
    let loaded = crate::config::load(config)
        .ok()
        .and_then(|c| runbook::load_dir(&c.runbooks_dir).ok().map(|r| (c, r)));
    let Some((config, runbooks)) = loaded else {
        return Ok(format!(
            "{label}: syntax ok (no loadable config at {}: host and service not checked)",
            config.display()
        ));
    };
    let names = runbooks.keys().cloned().collect();
    let plan = plan::validate(spec, &config.known_targets(&names))
        .map_err(|e| format!("{label}: {}", e.message))?;
    Ok(format!(
        "{label}: ok ({} on {} to {}, runbook {})",
        plan.service, plan.host, plan.tag, plan.runbook
    ))
}
