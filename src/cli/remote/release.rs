//! `canaryd release start|watch|pause|resume|abort|show` (docs/cli.md#release).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::super::client::created_id;
use super::super::{ApiClient, ServerArgs};
use super::parse_env_flags;
use crate::api::ReleaseOut;
use crate::domain::names::{self, ComposeFile, Tag};

/// How often `watch` reads the release.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Submit a release (a YAML/JSON file, or flags).
    #[command(after_help = super::super::CLIENT_ENV_HELP)]
    Start(Box<ReleaseStartArgs>),
    /// Follow a release, a line per target change, until it ends: exit 0 succeeded, 1 failed,
    /// 2 aborted.
    #[command(after_help = super::super::CLIENT_ENV_HELP)]
    Watch {
        /// The release's id (`rel_...`).
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Start no more targets; running ones finish.
    #[command(after_help = super::super::CLIENT_ENV_HELP)]
    Pause(ControlArgs),
    /// Start targets again.
    #[command(after_help = super::super::CLIENT_ENV_HELP)]
    Resume(ControlArgs),
    /// Abort the release and its running target rollouts.
    #[command(after_help = super::super::CLIENT_ENV_HELP)]
    Abort(ControlArgs),
    /// A release's targets and events.
    #[command(after_help = super::super::CLIENT_ENV_HELP)]
    Show {
        /// The release's id (`rel_...`).
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The release's id (`rel_...`).
    pub id: String,
    /// Why (kept in the release's audit trail).
    #[arg(long)]
    pub reason: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct ReleaseStartArgs {
    /// A release file (YAML, or JSON by its .json extension; docs/operator-guide.md).
    pub release: Option<PathBuf>,
    /// The compose file on the hosts (`prod/...yaml`).
    #[arg(long, value_parser = names::arg::<ComposeFile>)]
    pub file: Option<String>,
    /// The git tag to deploy.
    #[arg(long, value_parser = names::arg::<Tag>)]
    pub tag: Option<String>,
    /// Why (kept in the audit trail).
    #[arg(long)]
    pub reason: Option<String>,
    /// A target, HOST/SERVICE, in release order (repeatable).
    #[arg(long = "target")]
    pub targets: Vec<String>,
    /// Instead of targets: the replicas of --group on these hosts (repeatable, in order).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// The replica group of --host.
    #[arg(long)]
    pub group: Option<String>,
    /// The canary target, HOST/SERVICE (default: the first target).
    #[arg(long)]
    pub canary: Option<String>,
    /// Hosts rolled at once after the canary (default 1).
    #[arg(long)]
    pub max_parallel_hosts: Option<u32>,
    /// `halt` (default) or `rollback_release`.
    #[arg(long, value_parser = super::one_of(crate::domain::release::ReleaseOnFailure::ALL.iter().map(|v| v.as_str())))]
    pub on_failure: Option<String>,
    /// The runbook of every target (default single-replica-canary).
    #[arg(long)]
    pub runbook: Option<String>,
    /// An env override, KEY=VALUE (repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// A startup log line every target's rollout must see, added to the file's
    /// `require_logs` (repeatable).
    #[arg(long = "require-log")]
    pub require_logs: Vec<String>,
    /// Follow the release until it ends.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

fn target(s: &str, flag: &str) -> anyhow::Result<Value> {
    let Some((host, service)) = s.split_once('/') else {
        bail!("--{flag} {s}: expected HOST/SERVICE");
    };
    Ok(json!({"host": host, "service": service}))
}

/// The request: the file's fields, then the flags over them.
fn body_of(args: &ReleaseStartArgs) -> anyhow::Result<Value> {
    let mut body = match &args.release {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            if path.extension().and_then(|e| e.to_str()) == Some("json") {
                serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?
            } else {
                serde_yaml::from_str::<Value>(&text)
                    .with_context(|| format!("{}", path.display()))?
            }
        }
        None => json!({}),
    };
    if !body.is_object() {
        bail!("the release must be a mapping of fields");
    }
    for (field, value) in [
        ("file", &args.file),
        ("tag", &args.tag),
        ("reason", &args.reason),
        ("runbook", &args.runbook),
        ("on_failure", &args.on_failure),
    ] {
        if let Some(v) = value {
            body[field] = json!(v);
        }
    }
    if let Some(n) = args.max_parallel_hosts {
        body["max_parallel_hosts"] = json!(n);
    }
    if !args.targets.is_empty() {
        let targets: anyhow::Result<Vec<Value>> =
            args.targets.iter().map(|t| target(t, "target")).collect();
        body["targets"] = json!(targets?);
    }
    if !args.hosts.is_empty() || args.group.is_some() {
        let group = args.group.clone().context("--host needs --group")?;
        body["selector"] = json!({"hosts": args.hosts, "group": group});
    }
    if let Some(c) = &args.canary {
        body["canary"] = target(c, "canary")?;
    }
    if !args.env.is_empty() {
        let env: BTreeMap<String, String> = parse_env_flags(&args.env)?;
        if !body["env"].is_object() && !body["env"].is_null() {
            bail!("the release file's env is not a mapping: cannot apply --env to it");
        }
        for (key, value) in env {
            body["env"][key] = json!(value);
        }
    }
    if !args.require_logs.is_empty() {
        let logs = body
            .as_object_mut()
            .map(|b| b.entry("require_logs").or_insert_with(|| json!([])));
        let Some(Value::Array(logs)) = logs else {
            bail!("the release file's require_logs is not a list: cannot add --require-log to it");
        };
        logs.extend(args.require_logs.iter().map(|l| json!(l)));
    }
    for field in ["file", "tag", "reason"] {
        if body.get(field).is_none() {
            bail!("--{field} is required (or in the release file)");
        }
    }
    Ok(body)
}

pub async fn release(cmd: ReleaseCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ReleaseCommand::Start(args) => {
            let client = ApiClient::from_env(&args.server.server)?;
            let out = client.post("/v1/releases", &body_of(&args)?).await?;
            let id = created_id(&out)?;
            let r: ReleaseOut = serde_json::from_value(out)?;
            outln!(
                "{id} created: {} to {} on {} target(s)",
                r.file,
                r.tag,
                r.targets.len()
            )?;
            if args.wait {
                return watch(&client, &id).await;
            }
            Ok(ExitCode::SUCCESS)
        }
        ReleaseCommand::Watch { id, server } => {
            watch(&ApiClient::from_env(&server.server)?, &id).await
        }
        ReleaseCommand::Pause(a) => control(a, "pause").await,
        ReleaseCommand::Resume(a) => control(a, "resume").await,
        ReleaseCommand::Abort(a) => control(a, "abort").await,
        ReleaseCommand::Show { id, server } => {
            let client = ApiClient::from_env(&server.server)?;
            let r = get(&client, &id).await?;
            outln!("{}", summary(&r))?;
            for t in &r.targets {
                outln!("  {}", target_line(t))?;
            }
            for e in &r.events {
                outln!(
                    "  {} {} {}{}",
                    e.at.format("%H:%M:%S"),
                    e.actor,
                    e.kind,
                    e.reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn control(a: ControlArgs, verb: &str) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_env(&a.server.server)?;
    let out = client
        .post(
            &format!("/v1/releases/{}/{verb}", a.id),
            &json!({"reason": a.reason}),
        )
        .await?;
    outln!(
        "{verb} of {}: status {}",
        a.id,
        out["status"].as_str().unwrap_or("?")
    )?;
    Ok(ExitCode::SUCCESS)
}

async fn get(client: &ApiClient, id: &str) -> anyhow::Result<ReleaseOut> {
    Ok(serde_json::from_value(
        client.get(&format!("/v1/releases/{id}")).await?,
    )?)
}

fn summary(r: &ReleaseOut) -> String {
    let progress: Vec<String> = r.progress.iter().map(|(k, v)| format!("{v} {k}")).collect();
    let out: Vec<i64> = r.targets.iter().filter_map(|t| t.downtime_ms).collect();
    let downtime = match out.iter().max() {
        Some(longest) => format!(
            "; replicas out {} in all, the longest {}",
            seconds(out.iter().sum()),
            seconds(*longest)
        ),
        None => String::new(),
    };
    format!(
        "{} {} ({} to {}): {}{downtime}",
        r.id,
        r.status,
        r.file,
        r.tag,
        progress.join(", ")
    )
}

/// Milliseconds as seconds with one decimal: `2.1s`.
fn seconds(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn target_line(t: &crate::api::ReleaseTargetOut) -> String {
    format!(
        "{}{}/{}: {}{}{}{}{}",
        if t.canary { "canary " } else { "" },
        t.host,
        t.service,
        t.state,
        match (t.rollout_id.as_deref(), t.state.as_str()) {
            (Some(id), _) => format!(" ({id})"),
            (None, "already_current") =>
                " (already at the release's file, tag and env: nothing sent)".to_owned(),
            (None, "not_started") => " (the release ended first)".to_owned(),
            (None, _) => String::new(),
        },
        t.current_step
            .as_deref()
            .map(|s| format!(" step {s}"))
            .unwrap_or_default(),
        t.downtime_ms
            .map(|ms| format!(", replica out {}", seconds(ms)))
            .unwrap_or_default(),
        t.error
            .as_deref()
            .map(|e| format!(" {e}"))
            .unwrap_or_default()
    )
}

/// Follows a release: a line per target whose state (or running step) changed, then the
/// summary; exit 0 succeeded, 1 failed, 2 aborted. The release's event stream wakes it at
/// each target start and end; it also reads the release every `WATCH_INTERVAL` for the
/// targets' steps, and only polls when the stream is unavailable or breaks.
pub async fn watch(client: &ApiClient, id: &str) -> anyhow::Result<ExitCode> {
    tokio::select! {
        code = follow_release(client, id) => code,
        _ = tokio::signal::ctrl_c() => Ok(super::detached(&format!(
            "release {id}: `canaryd release watch {id}` follows it again, `canaryd release \
             pause|abort {id} --reason R` stops it"
        ))),
    }
}

async fn follow_release(client: &ApiClient, id: &str) -> anyhow::Result<ExitCode> {
    // What was shown per target: its state and running step (a target between two steps
    // keeps the step last shown).
    let mut seen: BTreeMap<u32, (String, Option<String>)> = BTreeMap::new();
    let mut stream = match client
        .get_stream(&format!("/v1/releases/{id}/events"), None)
        .await
    {
        Ok(res) => Some(res),
        Err(e) => {
            eprintln!("event stream of {id} unavailable ({e:#}); polling instead");
            None
        }
    };
    loop {
        let r = get(client, id).await?;
        for t in &r.targets {
            let shown = seen.get(&t.position);
            let state_changed = shown.is_none_or(|(state, _)| *state != t.state);
            let step_changed =
                t.current_step.is_some() && shown.is_some_and(|(_, step)| *step != t.current_step);
            if state_changed || step_changed {
                outln!("{}", target_line(t))?;
                seen.insert(t.position, (t.state.clone(), t.current_step.clone()));
            }
        }
        if matches!(r.status.as_str(), "succeeded" | "failed" | "aborted") {
            outln!("{}", summary(&r))?;
            return Ok(match r.status.as_str() {
                "succeeded" => ExitCode::SUCCESS,
                "aborted" => ExitCode::from(2),
                _ => ExitCode::from(1),
            });
        }
        match &mut stream {
            // Any event (or keep-alive), or the interval: look again.
            Some(res) => match tokio::time::timeout(WATCH_INTERVAL, res.chunk()).await {
                Err(_) | Ok(Ok(Some(_))) => {}
                // Ended with the release (the next read says so) or broke: poll from now.
                Ok(Ok(None) | Err(_)) => stream = None,
            },
            None => tokio::time::sleep(WATCH_INTERVAL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        args: ReleaseStartArgs,
    }

    #[test]
    fn flags_apply_over_the_release_file_key_by_key() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("release.yaml");
        std::fs::write(
            &file,
            "file: prod/a.yaml\ntag: v1\nreason: r\nenv: {A: '1', B: '2'}\nrequire_logs: [ready]\n",
        )
        .expect("file");
        let line = Line::try_parse_from([
            "release".as_ref(),
            file.as_os_str(),
            "--env".as_ref(),
            "B=3".as_ref(),
            "--require-log".as_ref(),
            "armed".as_ref(),
            "--runbook".as_ref(),
            "recreate-in-place".as_ref(),
        ])
        .expect("parses");
        let body = body_of(&line.args).expect("body");
        assert_eq!(body["env"], json!({"A": "1", "B": "3"}));
        assert_eq!(body["require_logs"], json!(["ready", "armed"]));
        assert_eq!(body["runbook"], "recreate-in-place");
        assert_eq!(body["tag"], "v1");
    }
}
