//! Client commands: rollout start/watch/abort/approve, rollback, history, show, doctor.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::client::created_id;
use super::output::{audit_trail, timeline};
use super::{ApiClient, ServerArgs};
use crate::api::RolloutOut;
use crate::domain::names::{self, ComposeFile, ServiceName, Tag};
use crate::domain::state::{OnFailure, RolloutKind, RolloutStatus};

mod doctor;
mod release;
mod watch;

pub use doctor::{doctor, DoctorArgs};
pub use release::{release, watch as watch_release, ReleaseCommand};
pub use watch::follow;

/// A flag's parser that takes only `values` (the domain's names of an enum): a bad value is a
/// usage error (exit 2, listing them) before anything is sent.
pub(crate) fn one_of(
    values: impl IntoIterator<Item = &'static str>,
) -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(values)
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Submit a canary plan (a YAML/JSON file, or flags).
    #[command(after_help = super::CLIENT_ENV_HELP)]
    Start(StartArgs),
    /// Follow a rollout until it ends: exit 0 succeeded, 1 failed or rolled back, 2 aborted.
    #[command(after_help = super::CLIENT_ENV_HELP)]
    Watch {
        /// The rollout's id (`ro_...`).
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Abort a rollout before its next side effect.
    #[command(after_help = super::CLIENT_ENV_HELP)]
    Abort {
        /// The rollout's id (`ro_...`).
        id: String,
        /// Why (kept in the audit trail).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Approve the step a rollout waits on (an `approve` step, an analysis check that asks,
    /// or a `window` step waiting for a low-traffic window): the rollout goes on now.
    #[command(after_help = super::CLIENT_ENV_HELP)]
    Approve {
        /// The rollout's id (`ro_...`).
        id: String,
        /// Why (kept in the audit trail with your name).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        server: ServerArgs,
    },
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// A plan file (YAML, or JSON by its .json extension; see docs/reference.md#canary-plans).
    /// Flags given with it override its fields; the effective plan is printed before it is sent.
    pub plan: Option<PathBuf>,
    /// The host, as named under `hosts:` in the daemon's config.
    #[arg(long)]
    pub host: Option<String>,
    /// The compose file on the host, relative to its repository (`prod/...yaml`).
    #[arg(long, value_parser = names::arg::<ComposeFile>)]
    pub file: Option<String>,
    /// The one replica (compose service) to roll.
    #[arg(long, value_parser = names::arg::<ServiceName>)]
    pub service: Option<String>,
    /// The git tag to deploy.
    #[arg(long, value_parser = names::arg::<Tag>)]
    pub tag: Option<String>,
    /// Why (kept in the audit trail).
    #[arg(long)]
    pub reason: Option<String>,
    /// The runbook to run (default single-replica-canary).
    #[arg(long)]
    pub runbook: Option<String>,
    /// `rollback` (default): a canary that fails after touching its replica rolls it back by
    /// itself; `halt`: it leaves the replica as it is.
    #[arg(long, value_parser = one_of(OnFailure::ALL.iter().map(|v| v.as_str())))]
    pub on_failure: Option<String>,
    /// An env override, KEY=VALUE (repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// A required startup log line (repeatable).
    #[arg(long = "require-log")]
    pub require_logs: Vec<String>,
    /// Follow the rollout until it ends.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The host, as named under `hosts:` in the daemon's config.
    #[arg(long)]
    pub host: String,
    /// The replica (compose service) to roll back.
    #[arg(long)]
    pub service: String,
    /// Why (kept in the audit trail).
    #[arg(long)]
    pub reason: String,
    /// Roll back to this recorded tag instead of the prior deployment.
    #[arg(long, value_parser = names::arg::<Tag>)]
    pub to_tag: Option<String>,
    /// Abort the host's active rollout first.
    #[arg(long)]
    pub preempt: bool,
    /// Follow the rollback until it ends (exit 0 succeeded, 1 failed, 2 aborted).
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only rollouts of this host.
    #[arg(long)]
    pub host: Option<String>,
    /// Only rollouts of this replica.
    #[arg(long)]
    pub service: Option<String>,
    /// Only this status: pending, running, succeeded, failed or aborted.
    #[arg(long, value_parser = one_of(RolloutStatus::ALL.iter().map(|v| v.as_str())))]
    pub status: Option<String>,
    /// Only this kind: canary or rollback.
    #[arg(long, value_parser = one_of(RolloutKind::ALL.iter().map(|v| v.as_str())))]
    pub kind: Option<String>,
    /// Only rollouts to this tag.
    #[arg(long)]
    pub tag: Option<String>,
    /// Who started the rollout (token name; `canaryd` for automatic rollbacks).
    #[arg(long)]
    pub actor: Option<String>,
    /// Created at or after this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Created before this RFC 3339 time.
    #[arg(long)]
    pub until: Option<String>,
    /// At most this many rollouts, newest first (fetched page by page); at least 1.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// table, json or csv (anything else is a usage error, exit 2).
    #[arg(long, default_value = "table", value_parser = ["table", "json", "csv"])]
    pub format: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn rollout(cmd: RolloutCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        RolloutCommand::Start(args) => start(args).await,
        RolloutCommand::Watch { id, server } => {
            watch(&ApiClient::from_env(&server.server)?, &id).await
        }
        RolloutCommand::Abort { id, reason, server } => {
            let client = ApiClient::from_env(&server.server)?;
            let out = client
                .post(
                    &format!("/v1/rollouts/{id}/abort"),
                    &json!({"reason": reason}),
                )
                .await?;
            outln!(
                "abort of {id} requested (status {})",
                out["status"].as_str().unwrap_or("?")
            )?;
            Ok(ExitCode::SUCCESS)
        }
        RolloutCommand::Approve { id, reason, server } => {
            let client = ApiClient::from_env(&server.server)?;
            let out = client
                .post(
                    &format!("/v1/rollouts/{id}/approve"),
                    &json!({"reason": reason}),
                )
                .await?;
            outln!(
                "{id} approved (status {})",
                out["status"].as_str().unwrap_or("?")
            )?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn plan_from_flags(args: &StartArgs) -> anyhow::Result<Value> {
    let need = |v: &Option<String>, flag: &str| {
        v.clone()
            .with_context(|| format!("--{flag} is required without a plan file"))
    };
    let env = parse_env_flags(&args.env)?;
    let mut plan = json!({
        "host": need(&args.host, "host")?, "file": need(&args.file, "file")?,
        "service": need(&args.service, "service")?, "tag": need(&args.tag, "tag")?,
        "reason": need(&args.reason, "reason")?, "env": env,
    });
    if let Some(rb) = &args.runbook {
        plan["runbook"] = json!(rb);
    }
    if let Some(on_failure) = &args.on_failure {
        plan["on_failure"] = json!(on_failure);
    }
    if !args.require_logs.is_empty() {
        plan["require_logs"] = json!(args.require_logs);
    }
    Ok(plan)
}

/// The one-value flags, by the plan field each replaces.
fn field_flags(args: &StartArgs) -> [(&'static str, &Option<String>); 7] {
    [
        ("host", &args.host),
        ("file", &args.file),
        ("service", &args.service),
        ("tag", &args.tag),
        ("reason", &args.reason),
        ("runbook", &args.runbook),
        ("on_failure", &args.on_failure),
    ]
}

/// The flags given on the command line, as `--name` (what overrides a plan file's fields).
fn given_flags(args: &StartArgs) -> Vec<String> {
    let mut flags: Vec<String> = field_flags(args)
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(field, _)| format!("--{}", field.replace('_', "-")))
        .collect();
    if !args.env.is_empty() {
        flags.push("--env".to_owned());
    }
    if !args.require_logs.is_empty() {
        flags.push("--require-log".to_owned());
    }
    flags
}

/// A plan file with the flags applied over it: `--host`, `--file`, `--service`, `--tag`,
/// `--reason`, `--runbook` and `--on-failure` replace the file's fields, `--env` keys replace the file's keys
/// of the same name (the others stay), `--require-log` lines are added to the file's.
fn plan_with_flags(file_plan: Value, args: &StartArgs) -> anyhow::Result<Value> {
    let Value::Object(mut plan) = file_plan else {
        bail!("the plan file must hold a mapping of plan fields");
    };
    for (field, value) in field_flags(args) {
        if let Some(v) = value {
            plan.insert(field.to_owned(), json!(v));
        }
    }
    if !args.env.is_empty() {
        let env = plan.entry("env").or_insert_with(|| json!({}));
        if env.is_null() {
            *env = json!({});
        }
        let Value::Object(env) = env else {
            bail!("the plan file's env is not a mapping: cannot add --env to it");
        };
        for (k, v) in parse_env_flags(&args.env)? {
            env.insert(k, json!(v));
        }
    }
    if !args.require_logs.is_empty() {
        let logs = plan.entry("require_logs").or_insert_with(|| json!([]));
        if logs.is_null() {
            *logs = json!([]);
        }
        let Value::Array(logs) = logs else {
            bail!("the plan file's require_logs is not a list: cannot add --require-log to it");
        };
        logs.extend(args.require_logs.iter().map(|l| json!(l)));
    }
    Ok(Value::Object(plan))
}

fn parse_env_flags(flags: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    for kv in flags {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?}: expected KEY=VALUE"))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    Ok(env)
}

/// Reads a plan file (YAML, or JSON by its `.json` extension) into a JSON value.
fn read_plan_file(path: &std::path::Path, text: &str) -> anyhow::Result<Value> {
    if path.extension().is_some_and(|e| e == "json") {
        return serde_json::from_str(text)
            .with_context(|| format!("{}: not valid JSON", path.display()));
    }
    let yaml: serde_yaml::Value = crate::domain::yaml_line::read(text).map_err(|errors| {
        let e = &errors[0];
        let line = e.line.map(|l| format!(":{l}")).unwrap_or_default();
        anyhow::anyhow!("{}{line}: not valid YAML: {}", path.display(), e.message)
    })?;
    serde_json::to_value(yaml).with_context(|| format!("{}: not a plain mapping", path.display()))
}

async fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_env(&args.server.server)?;
    let out = match &args.plan {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let flags = given_flags(&args);
            if flags.is_empty() {
                let is_json = path.extension().is_some_and(|e| e == "json");
                let ct = if is_json {
                    "application/json"
                } else {
                    "application/yaml"
                };
                client.post_raw("/v1/rollouts", ct, text).await?
            } else {
                // Never silent: the flags win over the file, and the plan sent is shown first.
                let plan = plan_with_flags(read_plan_file(path, &text)?, &args)?;
                eprintln!(
                    "{} with {} overriding it; submitting this plan:\n{}",
                    path.display(),
                    flags.join(", "),
                    serde_yaml::to_string(&plan)?.trim_end()
                );
                client.post("/v1/rollouts", &plan).await?
            }
        }
        None => {
            client
                .post("/v1/rollouts", &plan_from_flags(&args)?)
                .await?
        }
    };
    let id = created_id(&out)?;
    let line = format!(
        "{id} created ({} of {} on {})",
        out["kind"].as_str().unwrap_or("?"),
        out["service"].as_str().unwrap_or("?"),
        out["host"].as_str().unwrap_or("?")
    );
    created(&client, &id, &line, args.wait).await
}

/// Says what was created and, with `--wait`, follows it to its end.
async fn created(client: &ApiClient, id: &str, line: &str, wait: bool) -> anyhow::Result<ExitCode> {
    outln!("{line}")?;
    if wait {
        return watch(client, id).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Follows a rollout, printing a line per step change, until it is terminal. Ctrl-C only
/// stops following (exit 130): the rollout goes on in the daemon, and the line says how to
/// follow or abort it.
pub async fn watch(client: &ApiClient, id: &str) -> anyhow::Result<ExitCode> {
    let r = tokio::select! {
        r = follow(client, id, |line| outln!("{line}")) => r?,
        _ = tokio::signal::ctrl_c() => {
            return Ok(detached(&format!(
                "rollout {id}: `canaryd rollout watch {id}` follows it again, `canaryd rollout \
                 abort {id} --reason R` stops it"
            )));
        }
    };
    outln!("{}", timeline(&r))?;
    Ok(exit_code_of(&r))
}

/// What Ctrl-C on a command that follows something says: it goes on without us. Exit 130, as
/// a shell reports SIGINT.
pub fn detached(what_next: &str) -> ExitCode {
    eprintln!("\ndetached: it goes on in the daemon. {what_next}");
    ExitCode::from(130)
}

/// docs/cli.md#exit-codes: 0 succeeded, 1 failed or rolled back, 2 aborted.
pub fn exit_code_of(r: &RolloutOut) -> ExitCode {
    match r.status.as_str() {
        "succeeded" => ExitCode::SUCCESS,
        "aborted" => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

pub async fn rollback(args: RollbackArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_env(&args.server.server)?;
    let body = json!({"host": args.host, "service": args.service, "reason": args.reason, "to_tag": args.to_tag, "preempt": args.preempt});
    let out = client.post("/v1/rollbacks", &body).await?;
    let id = created_id(&out)?;
    let line = format!(
        "{id} created: rollback of {} on {} to {}",
        args.service,
        args.host,
        out["tag"].as_str().unwrap_or("?")
    );
    created(&client, &id, &line, args.wait).await
}

pub async fn show(id: &str, server: &ServerArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_env(&server.server)?;
    let r = client.rollout(id).await?;
    let audit = client.get(&format!("/v1/rollouts/{id}/audit")).await?;
    out!("{}", timeline(&r))?;
    if let Some(url) = &r.page_url {
        out!("page: {url}")?;
    }
    out!(
        "{}",
        audit_trail(audit["items"].as_array().map_or(&[], Vec::as_slice))
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Rollouts per request while paging through history.
const HISTORY_PAGE: u32 = 500;

pub async fn history(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_env(&args.server.server)?;
    let items = fetch_history(&client, &args).await?;
    out!("{}", render_history(&items, &args.format)?)?;
    Ok(ExitCode::SUCCESS)
}

/// Pages through `GET /v1/rollouts` with the filters of `args` until `--limit` items or the end.
pub async fn fetch_history(client: &ApiClient, args: &HistoryArgs) -> anyhow::Result<Vec<Value>> {
    let mut base = Vec::new();
    let filters = [
        ("host", &args.host),
        ("service", &args.service),
        ("status", &args.status),
        ("kind", &args.kind),
        ("tag", &args.tag),
        ("actor", &args.actor),
        ("since", &args.since),
        ("until", &args.until),
    ];
    for (k, v) in filters {
        if let Some(v) = v {
            base.push(format!("{k}={}", encode(v)));
        }
    }
    let mut items: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    while items.len() < args.limit as usize {
        let want = (args.limit as usize - items.len()).min(HISTORY_PAGE as usize);
        let mut query = base.clone();
        query.push(format!("limit={want}"));
        if let Some(c) = &cursor {
            query.push(format!("cursor={}", encode(c)));
        }
        let page = client
            .get(&format!("/v1/rollouts?{}", query.join("&")))
            .await?;
        if let Some(page_items) = page["items"].as_array() {
            items.extend(page_items.iter().cloned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    Ok(items)
}

/// Renders history items as a table, JSON or CSV (the daemon's CSV columns).
pub fn render_history(items: &[Value], format: &str) -> anyhow::Result<String> {
    match format {
        "json" => Ok(format!("{}\n", serde_json::to_string_pretty(items)?)),
        "csv" => {
            let mut out = String::from(RolloutOut::CSV_HEADER);
            for item in items {
                let r: RolloutOut = serde_json::from_value(item.clone())?;
                r.write_csv_record(&mut out);
            }
            Ok(out)
        }
        "table" => {
            let rows: Vec<RolloutOut> = items
                .iter()
                .map(|item| serde_json::from_value(item.clone()))
                .collect::<Result<_, _>>()?;
            // A rollout a rollback undid says so: the column is as wide as its longest status.
            let statuses: Vec<String> = rows.iter().map(RolloutOut::shown_status).collect();
            let w = statuses
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                .max(9);
            let mut out = format!(
                "{:<30} {:<8} {:<w$} {:<8} {:<32} {:<10} {:<12} {:<20} {:>7} REASON\n",
                "ID", "KIND", "STATUS", "HOST", "SERVICE", "TAG", "ACTOR", "CREATED", "OUT"
            );
            for (r, status) in rows.iter().zip(&statuses) {
                let reason = r.reason.replace(['\n', '\r'], " ");
                out.push_str(&format!(
                    "{:<30} {:<8} {:<w$} {:<8} {:<32} {:<10} {:<12} {:<20} {:>7} {}\n",
                    r.id,
                    r.kind,
                    status,
                    r.host,
                    r.service,
                    r.tag,
                    r.actor,
                    r.created_at.format("%Y-%m-%d %H:%M:%S"),
                    // How long the replica was out, once the rollout ended.
                    r.downtime_ms
                        .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                        .unwrap_or_default(),
                    reason
                ));
            }
            Ok(out)
        }
        other => bail!("--format {other:?}: expected table, json or csv"),
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
