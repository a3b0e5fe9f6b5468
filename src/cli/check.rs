//! `canaryd check config|runbook|plan|release FILE`: offline validation, `file:line: message`
//! on error.
//!
//! Exit codes (docs/cli.md#exit-codes): 0 the file is valid; 1 the check failed (the runbook
//! or plan is invalid); 2 usage or configuration: an unreadable file, a config that does not
//! load (the file checked by `check config`, or the `--config` a plan is checked against).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::serve::EXIT_BAD_CONFIG;
use crate::api::ReleaseIn;
use crate::config::ResolvedConfig;
use crate::domain::plan::{self, PlanError};
use crate::domain::runbook;
use crate::domain::yaml_line::{self, describe_yaml_error, locate, Seg};

/// The file checked is invalid.
pub const EXIT_CHECK_FAILED: u8 = 1;

#[derive(Debug, Subcommand)]
pub enum CheckCommand {
    /// A daemon configuration: keys, URLs, env files, runbooks, and every env var it names must
    /// be set. Exit 2 when it does not load, as `serve` would.
    Config {
        /// The config file (YAML), e.g. config/canaryd.yaml.
        file: PathBuf,
    },
    /// A runbook file. Exit 1 when it is invalid.
    Runbook {
        /// The runbook file (YAML), e.g. runbooks/single-replica-canary.yaml.
        file: PathBuf,
    },
    /// A canary plan, checked against a config's hosts, replicas and runbooks. Exit 1 when the
    /// plan is invalid, 2 when the config does not load (use --no-config for the syntax only).
    Plan {
        /// The plan file (YAML or JSON), as `canaryd rollout start` takes it.
        file: PathBuf,
        /// The config whose hosts, replicas and runbooks the plan must name (the env vars it
        /// names must be set; any distinct values do for a check).
        #[arg(long, default_value = "config/canaryd.yaml")]
        config: PathBuf,
        /// Check the plan's fields and syntax only, without a config.
        #[arg(long, conflicts_with = "config")]
        no_config: bool,
    },
    /// A release file, checked against a config as `POST /v1/releases` would check it: every
    /// target (or the selector's hosts and group) known, the canary among them, each target a
    /// valid canary plan. Exit 1 when the release is invalid, 2 when the config does not load.
    Release {
        /// The release file (YAML or JSON), as `canaryd release start` takes it.
        file: PathBuf,
        /// The config whose hosts, replicas and runbooks the release must name.
        #[arg(long, default_value = "config/canaryd.yaml")]
        config: PathBuf,
        /// Check the release's fields and syntax only, without a config.
        #[arg(long, conflicts_with = "config")]
        no_config: bool,
    },
}

/// Why a check did not pass.
#[derive(Debug)]
enum Failure {
    /// The file checked is invalid (exit 1).
    Invalid(String),
    /// Usage or configuration: the check could not run (exit 2).
    Unusable(String),
}

pub fn check(what: CheckCommand) -> anyhow::Result<ExitCode> {
    let result = match &what {
        CheckCommand::Config { file } => check_config(file),
        CheckCommand::Runbook { file } => check_runbook(file),
        CheckCommand::Plan {
            file,
            config,
            no_config,
        } => check_plan(file, (!*no_config).then_some(config.as_path())),
        CheckCommand::Release {
            file,
            config,
            no_config,
        } => check_release(file, (!*no_config).then_some(config.as_path())),
    };
    match result {
        Ok(summary) => {
            outln!("{summary}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(Failure::Invalid(message)) => {
            eprintln!("{message}");
            Ok(ExitCode::from(EXIT_CHECK_FAILED))
        }
        Err(Failure::Unusable(message)) => {
            eprintln!("{message}");
            Ok(ExitCode::from(EXIT_BAD_CONFIG))
        }
    }
}

fn read(file: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(file)
        .map_err(|e| Failure::Unusable(format!("{}: cannot read: {e}", file.display())))
}

fn check_config(file: &Path) -> Result<String, Failure> {
    let unusable = |e: &dyn std::fmt::Display| Failure::Unusable(e.to_string());
    let config = crate::config::load(file).map_err(|e| unusable(&e))?;
    config.check_listen_safety().map_err(|e| unusable(&e))?;
    let runbooks = runbook::load_dir(&config.runbooks_dir).map_err(|e| unusable(&e))?;
    config.check_runbooks(&runbooks).map_err(|e| unusable(&e))?;
    let replicas: usize = config.hosts.values().map(|h| h.replicas.len()).sum();
    Ok(format!(
        "{}: ok ({} host(s), {replicas} replica(s), {} runbook(s), {} token(s))",
        file.display(),
        config.hosts.len(),
        runbooks.len(),
        config.tokens.len()
    ))
}

fn check_runbook(file: &Path) -> Result<String, Failure> {
    let text = read(file)?;
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("runbook");
    let rb = runbook::parse(name, &file.display().to_string(), &text)
        .map_err(|e| Failure::Invalid(e.to_string()))?;
    rb.ensure_safe()
        .map_err(|e| Failure::Invalid(format!("{}: {e}", file.display())))?;
    let kinds: Vec<&str> = rb.steps.iter().map(|s| s.kind.name()).collect();
    Ok(format!("{}: ok ({})", file.display(), kinds.join(" -> ")))
}

fn check_plan(file: &Path, config: Option<&Path>) -> Result<String, Failure> {
    let text = read(file)?;
    let label = file.display().to_string();
    let is_json = file.extension().is_some_and(|e| e == "json");
    let spec = if is_json {
        plan::parse_json(text.as_bytes())
    } else {
        plan::parse_yaml(&text)
    };
    let spec = spec.map_err(|e| Failure::Invalid(plan_error_at(&label, &text, is_json, &e)))?;
    let Some(config_path) = config else {
        return Ok(format!(
            "{label}: syntax ok (--no-config: host, service and runbook not checked)"
        ));
    };
    let (config, names) = load_config(config_path, &label, "plan")?;
    let plan = plan::validate(spec, &config.known_targets(&names))
        .map_err(|e| Failure::Invalid(plan_error_at(&label, &text, is_json, &e)))?;
    Ok(format!(
        "{label}: ok ({} on {} to {}, runbook {}; checked against {})",
        plan.service,
        plan.host,
        plan.tag,
        plan.runbook,
        config_path.display()
    ))
}

/// The config a file is checked against, and its runbooks' names.
fn load_config(
    config_path: &Path,
    label: &str,
    what: &str,
) -> Result<(ResolvedConfig, BTreeSet<String>), Failure> {
    let loaded = crate::config::load(config_path).map_err(|e| e.to_string());
    let loaded = loaded.and_then(|c| {
        runbook::load_dir(&c.runbooks_dir)
            .map(|r| (c, r.keys().cloned().collect()))
            .map_err(|e| e.to_string())
    });
    loaded.map_err(|why| {
        Failure::Unusable(format!(
            "{label}: not checked: the config {} did not load: {why}\n\
             (set the env vars it names: any distinct values do for a check; pass --config FILE; or \
             --no-config to check the {what}'s syntax only)",
            config_path.display()
        ))
    })
}

fn check_release(file: &Path, config: Option<&Path>) -> Result<String, Failure> {
    let text = read(file)?;
    let label = file.display().to_string();
    let input: ReleaseIn = if file.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text)
            .map_err(|e| Failure::Invalid(format!("{label}:{}: {e}", e.line())))?
    } else {
        serde_yaml::from_str(&text).map_err(|e| {
            let (line, message) = describe_yaml_error(&e);
            Failure::Invalid(format!("{label}:{}: {message}", line.unwrap_or(1)))
        })?
    };
    let Some(config_path) = config else {
        return Ok(format!(
            "{label}: syntax ok (--no-config: hosts, services and runbook not checked)"
        ));
    };
    let (config, names) = load_config(config_path, &label, "release")?;
    let release =
        crate::api::release::validate(&config, &config.known_targets(&names), input, "check")
            .map_err(|refusal| {
                let (code, message) = (refusal.code, refusal.message);
                let line = release_error_line(&text, &message);
                Failure::Invalid(format!("{label}:{line}: {message} ({code})"))
            })?;
    let canary = &release.targets[0];
    Ok(format!(
        "{label}: ok ({} target(s) to {}, canary {}/{}, max_parallel_hosts {}, on_failure {}, \
         runbook {}; checked against {})",
        release.targets.len(),
        release.tag,
        canary.host,
        canary.service,
        release.max_parallel_hosts,
        release.on_failure,
        release.runbook,
        config_path.display()
    ))
}

/// The line of the field a release refusal names first (`targets[1] (…): …`,
/// `selector.hosts[0]: …`, `canary (…): …`), or of its nearest parent found; else 1.
fn release_error_line(text: &str, message: &str) -> usize {
    let field = message.split([' ', ':', ',']).next().unwrap_or_default();
    let mut path = Vec::new();
    for part in field.split('.') {
        match part.split_once('[') {
            Some((name, rest)) => {
                path.push(Seg::Key(name));
                if let Some(n) = rest.strip_suffix(']').and_then(|n| n.parse().ok()) {
                    path.push(Seg::Index(n));
                }
            }
            None => path.push(Seg::Key(part)),
        }
    }
    while !path.is_empty() {
        if let Some(line) = locate(text, &path) {
            return line;
        }
        path.pop();
    }
    1
}

/// `file:line: message` for a refused plan: the line of the field at fault, or of the syntax
/// error; line 1 (the document) when the fault has no place, such as a missing field.
fn plan_error_at(label: &str, text: &str, is_json: bool, e: &PlanError) -> String {
    if e.field.is_none() {
        let syntax = if is_json {
            serde_json::from_str::<serde_json::Value>(text)
                .err()
                .map(|err| (Some(err.line()), e.message.clone()))
        } else {
            yaml_line::read::<serde_yaml::Value>(text)
                .err()
                .map(|errors| {
                    let e = &errors[0];
                    (e.line, format!("the plan is not valid YAML: {}", e.message))
                })
        };
        if let Some((line, message)) = syntax {
            return format!("{label}:{}: {message}", line.unwrap_or(1));
        }
    }
    let line = e
        .field
        .as_deref()
        .and_then(|f| locate(text, &field_path(f)))
        .unwrap_or(1);
    format!("{label}:{line}: {}", e.message)
}

/// A plan error's field (`service`, `env.KEY`, `require_logs[1]`) as a path into the document.
fn field_path(field: &str) -> Vec<Seg<'_>> {
    if let Some((name, rest)) = field.split_once('[') {
        if let Some(n) = rest.strip_suffix(']').and_then(|n| n.parse().ok()) {
            return vec![Seg::Key(name), Seg::Index(n)];
        }
    }
    match field.split_once('.') {
        Some((name, key)) => vec![Seg::Key(name), Seg::Key(key)],
        None => vec![Seg::Key(field)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_errors_point_at_the_line_of_their_field() {
        let yaml = "host: gpu02\nfile: prod/x.yaml\nservice: r2\ntag: v1\nreason: r\n\
                    env:\n  GOOD: a\n  BAD-KEY: b\nrequire_logs:\n  - ok\n  - \"re:(\"\n";
        let err = |field: &str| PlanError {
            code: "invalid_env",
            field: Some(field.to_owned()),
            message: format!("{field}: bad"),
        };
        let cases = [
            ("service", "p.yaml:3: service: bad"),
            ("env.BAD-KEY", "p.yaml:8: env.BAD-KEY: bad"),
            ("require_logs[1]", "p.yaml:11: require_logs[1]: bad"),
            ("runbook", "p.yaml:1: runbook: bad"),
        ];
        for (field, want) in cases {
            assert_eq!(plan_error_at("p.yaml", yaml, false, &err(field)), want);
        }
    }

    #[test]
    fn release_errors_point_at_the_line_of_the_target_they_name() {
        let yaml =
            "file: prod/x.yaml\ntag: v1\nreason: r\ntargets:\n  - {host: gpu02, service: r2}\n  \
                    - {host: gpu09, service: r1}\nselector:\n  hosts: [gpu02]\n  group: g\n";
        let cases = [
            ("targets[1] (gpu09/r1): unknown host", 6),
            ("targets[7] (gpu09/r1): unknown host", 4),
            ("selector.hosts[0]: \"gpu09\" is not a configured host", 8),
            ("targets, selector: give exactly one of them", 4),
            ("max_parallel_hosts: must be at least 1", 1),
        ];
        for (message, want) in cases {
            assert_eq!(release_error_line(yaml, message), want, "{message}");
        }
    }

    #[test]
    fn a_yaml_syntax_error_gives_its_own_line() {
        let text = "host: gpu02\nfile: [\n";
        let e = plan::parse_yaml(text).expect_err("bad yaml");
        let got = plan_error_at("p.yaml", text, false, &e);
        assert!(got.starts_with("p.yaml:3: "), "{got}");
        assert!(!got.contains(" at line "), "{got}");
    }
}
