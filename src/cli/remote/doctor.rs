//! `canaryd doctor [--host H]`: asks the daemon to check hosts before a rollout (docs/oncall.md, "Before a rollout") and
//! prints one line per check. Exit 0 when every check is ok, 1 when one fails, 2 when the
//! doctor could not run (daemon unreachable, token refused, unknown host).

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use crate::cli::{ApiClient, ServerArgs};

/// Some check failed.
const EXIT_CHECK_FAILED: u8 = 1;
/// The doctor could not run (as clap's usage errors).
const EXIT_CANNOT_ASK: u8 = 2;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Check only this host (default: every configured host).
    #[arg(long)]
    pub host: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    match run(&args).await {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => Ok(ExitCode::from(EXIT_CHECK_FAILED)),
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(ExitCode::from(EXIT_CANNOT_ASK))
        }
    }
}

/// Whether every check of every host passed.
async fn run(args: &DoctorArgs) -> anyhow::Result<bool> {
    let client = ApiClient::from_env(&args.server.server)?;
    let hosts = match &args.host {
        Some(host) => vec![host.clone()],
        None => client
            .get("/v1/hosts")
            .await?
            .as_array()
            .map(|hosts| {
                hosts
                    .iter()
                    .filter_map(|h| h["host"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    };
    if hosts.is_empty() {
        anyhow::bail!("the daemon has no configured host");
    }
    let mut all_ok = true;
    for host in &hosts {
        let report = client
            .get(&format!("/v1/hosts/{}/doctor", encode_segment(host)))
            .await?;
        print!("{}", render(&report));
        let failed = failed_names(&report);
        if !failed.is_empty() || report["ok"] != Value::Bool(true) {
            all_ok = false;
            eprintln!(
                "{host}: {} check(s) failed: {}",
                failed.len(),
                failed.join(", ")
            );
        }
    }
    Ok(all_ok)
}

fn failed_names(report: &Value) -> Vec<&str> {
    checks(report)
        .iter()
        .filter(|c| c["ok"] != Value::Bool(true))
        .filter_map(|c| c["name"].as_str())
        .collect()
}

fn checks(report: &Value) -> &[Value] {
    report["checks"].as_array().map_or(&[], Vec::as_slice)
}

/// One line per check: `host  ok|FAIL  name  detail` (the detail on one line).
pub fn render(report: &Value) -> String {
    let host = report["host"].as_str().unwrap_or("?");
    let width = checks(report)
        .iter()
        .filter_map(|c| c["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for check in checks(report) {
        let verdict = if check["ok"] == Value::Bool(true) {
            "ok"
        } else {
            "FAIL"
        };
        let detail = check["detail"]
            .as_str()
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        out.push_str(&format!(
            "{host}  {verdict:<4}  {:<width$}  {detail}\n",
            check["name"].as_str().unwrap_or("?")
        ));
    }
    out
}

/// A host name as one URL path segment.
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_check_is_one_aligned_line_with_its_detail_flattened() {
        let report = json!({"host": "gpu02", "ok": false, "checks": [
            {"name": "dry_run_supported", "ok": true, "detail": "POST /docker/evict answered 422"},
            {"name": "compose_logs:r1", "ok": false,
             "detail": "failed (500): docker compose failed (exit 1):\nstderr: PROXY_TOKEN"},
        ]});
        assert_eq!(
            render(&report),
            "gpu02  ok    dry_run_supported  POST /docker/evict answered 422\n\
             gpu02  FAIL  compose_logs:r1    failed (500): docker compose failed (exit 1): stderr: PROXY_TOKEN\n"
        );
        assert_eq!(failed_names(&report), vec!["compose_logs:r1"]);
    }

    #[test]
    fn a_host_name_is_sent_as_one_path_segment() {
        assert_eq!(encode_segment("gpu02"), "gpu02");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }
}
