//! The `canaryd` binary explains itself to a stranger: the environment it reads, help on every
//! flag, daemon-only flags kept to the daemon's commands, every missing secret at once, and
//! hints that work from a clone without `canaryd` on PATH.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use canaryd::cli::Cli;
use clap::CommandFactory;

use crate::helpers::TestApp;

fn canaryd(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canaryd"));
    cmd.args(args)
        .env_remove("CANARYD_TOKEN")
        .env_remove("CANARYD_SERVER");
    cmd
}

fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("the canaryd binary runs");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn help_names_the_environment_the_client_commands_read() {
    for args in [
        &["--help"][..],
        &["history", "--help"],
        &["rollback", "--help"],
        &["show", "--help"],
        &["rollout", "start", "--help"],
        &["rollout", "watch", "--help"],
        &["rollout", "abort", "--help"],
        &["rollout", "approve", "--help"],
    ] {
        let (code, out, err) = run(&mut canaryd(args));
        assert_eq!(code, Some(0), "{args:?}: {err}");
        for var in ["CANARYD_SERVER", "CANARYD_TOKEN"] {
            assert!(out.contains(var), "{args:?} --help names {var}:\n{out}");
        }
    }
}

#[test]
fn the_log_format_is_a_flag_of_the_daemon_commands_only() {
    for args in [["serve", "--help"], ["dev", "--help"]] {
        let (_, out, _) = run(&mut canaryd(&args));
        assert!(out.contains("--log-format"), "{args:?}:\n{out}");
    }
    for args in [
        &["--help"][..],
        &["history", "--help"],
        &["rollback", "--help"],
        &["rollout", "start", "--help"],
    ] {
        let (_, out, _) = run(&mut canaryd(args));
        assert!(!out.contains("--log-format"), "{args:?}:\n{out}");
    }
}

#[test]
fn every_flag_and_argument_has_help_text() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            if sub.get_about().is_none() {
                missing.push(format!("{path} {} (the command)", sub.get_name()));
            }
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "canaryd", &mut missing);
    assert!(missing.is_empty(), "without help text: {missing:#?}");
}

#[test]
fn history_refuses_a_limit_of_zero_as_the_api_does() {
    let (code, _, err) = run(&mut canaryd(&["history", "--limit", "0"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--limit"), "{err}");
}

#[tokio::test]
async fn the_api_refuses_a_limit_of_zero_too() {
    let app = TestApp::spawn().await;
    let (status, body) = {
        let res = reqwest::get(format!("{}/v1/rollouts?limit=0", app.url))
            .await
            .expect("answers");
        let status = res.status().as_u16();
        (status, res.text().await.unwrap_or_default())
    };
    assert_eq!(status, 400, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_refused_token_says_where_the_token_and_the_server_come_from() {
    let app = TestApp::spawn_with_tokens(
        "tok-op-0123456789",
        "tok-oc-0123456789",
        "tok-vw-0123456789",
    )
    .await;
    let url = app.url.clone();
    let (code, _, err) =
        tokio::task::spawn_blocking(move || run(canaryd(&["history"]).env("CANARYD_SERVER", &url)))
            .await
            .expect("join");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("401"), "{err}");
    assert!(err.contains("CANARYD_TOKEN"), "{err}");
    assert!(err.contains("CANARYD_SERVER"), "{err}");
    app.stop().await;
}

#[test]
fn serve_names_every_unset_secret_at_once() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (code, _, err) = run(canaryd(&["serve", "--config", "config/canaryd.yaml"])
        .current_dir(root)
        .env_remove("CANARYD_TOKEN_OPS_ALICE")
        .env_remove("CANARYD_TOKEN_ONCALL")
        .env_remove("CANARYD_TOKEN_AUDIT")
        .env_remove("GPU02_COMPOSE_MANAGER_TOKEN"));
    assert_eq!(code, Some(2), "{err}");
    for (var, key) in [
        ("CANARYD_TOKEN_OPS_ALICE", "auth.tokens[0].token_env"),
        ("CANARYD_TOKEN_ONCALL", "auth.tokens[1].token_env"),
        ("CANARYD_TOKEN_AUDIT", "auth.tokens[2].token_env"),
        ("GPU02_COMPOSE_MANAGER_TOKEN", "hosts.gpu02.token_env"),
    ] {
        let line = err
            .lines()
            .find(|l| l.contains(var))
            .unwrap_or_else(|| panic!("{var} is named: {err}"));
        assert!(
            line.contains("config/canaryd.yaml:") && line.contains(key),
            "with its file, line and key: {line}"
        );
    }
}

/// Waits (bounded) until `path` holds a line containing `needle`; returns the whole text.
async fn wait_for_line(path: &Path, needle: &str) -> String {
    for _ in 0..400 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l.contains(needle)) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "no line with {needle:?} in {:?}",
        std::fs::read_to_string(path)
    );
}

#[tokio::test]
async fn dev_prints_hints_that_run_without_canaryd_on_path_and_removes_its_temp_folder() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let out_path = dir.path().join("stdout");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let mut child = canaryd(&["dev", "--listen", "127.0.0.1:0"])
        .env("TMPDIR", &tmp)
        .env("PATH", "/usr/bin:/bin")
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .expect("canaryd dev starts");
    let text = wait_for_line(&out_path, "rollout watch").await;
    let hint = text
        .lines()
        .find(|l| l.contains("rollout watch"))
        .expect("a watch hint");
    let program = hint
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("{hint}"));
    assert!(
        Path::new(program).is_file(),
        "the hint names a program that runs without canaryd on PATH: {hint}"
    );
    assert!(
        std::fs::read_dir(&tmp).expect("tmp").next().is_some(),
        "dev made its temporary folder under TMPDIR"
    );
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.is_ok_and(|s| s.success()), "SIGTERM sent");
    let mut exited = None;
    for _ in 0..400 {
        if let Some(status) = child.try_wait().expect("wait") {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("dev did not stop on SIGTERM");
    }
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(
        left.is_empty(),
        "dev removed its temporary folder: {left:?}"
    );
}

#[test]
fn a_serve_that_cannot_bind_exits_without_creating_a_database() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("addr").port();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("canaryd.db");
    let config = dir.path().join("canaryd.yaml");
    let text = format!(
        "listen: 127.0.0.1:{port}\ndatabase: {}\nrunbooks_dir: {}\nhosts:\n  gpu02:\n    \
         compose_manager_url: http://127.0.0.1:9\n    token_env: TEST_CM_TOKEN\n    \
         env_file: {}\n    replicas:\n      r1: {{group: g, health_url: http://127.0.0.1:9/health}}\n",
        db.display(),
        root.join("runbooks").display(),
        root.join("config/env/gpu02.env").display(),
    );
    std::fs::write(&config, text).expect("config written");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let (code, _, err) = run(canaryd(&["serve", "--config", &config]).env("TEST_CM_TOKEN", "t"));
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("binding"), "says why: {err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        !db.exists(),
        "no database without a listener; the folder holds {left:?}"
    );
    drop(taken);
}
