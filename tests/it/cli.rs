//! The `canaryd` binary as an operator uses it: client commands against a running daemon,
//! and offline checks.

use std::process::Command;

use crate::helpers::{canaryd, canaryd_async, TestApp, FILE, HOST, R2};

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn rollout_start_and_rollback_with_wait_follow_to_the_end_and_exit_zero() {
    let app = TestApp::spawn().await;
    let start = [
        "rollout",
        "start",
        "--host",
        HOST,
        "--file",
        FILE,
        "--service",
        R2,
        "--tag",
        "v0.0.452",
        "--reason",
        "cli canary",
        "--env",
        "GLM53_R2_HICACHE_RAM_BUDGET=406GiB",
        "--wait",
    ];
    let out = canaryd_async(&start, &app.url).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("startup-logs"),
        "a progress line per step: {stdout}"
    );
    assert!(
        stdout.contains("canary of model-sg-glm53-w4afp8-tp4-r2 on gpu02 to v0.0.452"),
        "{stdout}"
    );
    let list = app.api.get("/v1/rollouts?kind=canary").await.expect("list");
    let canary = &list["items"][0];
    assert_eq!(canary["status"], "succeeded", "{canary:#}");
    assert_eq!(canary["tag"], "v0.0.452", "{canary:#}");
    assert!(
        canary["env_overrides"]
            .as_array()
            .is_some_and(|o| o.iter().any(|k| k
                .as_str()
                .is_some_and(|k| k.contains("GLM53_R2_HICACHE_RAM_BUDGET")))),
        "--env reached the plan: {canary:#}"
    );

    let rollback = [
        "rollback",
        "--host",
        HOST,
        "--service",
        R2,
        "--reason",
        "cli rollback",
        "--wait",
    ];
    let out = canaryd_async(&rollback, &app.url).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}: {stdout}", out.status);
    assert!(
        stdout.contains("rollback of model-sg-glm53-w4afp8-tp4-r2 on gpu02 to v0.0.450"),
        "{stdout}"
    );
    let list = app
        .api
        .get("/v1/rollouts?kind=rollback")
        .await
        .expect("list");
    assert_eq!(list["items"][0]["status"], "succeeded", "{list:#}");
    app.stop().await;
}

#[tokio::test]
async fn watch_exits_one_when_the_canary_fails() {
    let app = TestApp::spawn().await;
    app.sim.faults().set_dry_run_extra(Some("nginx".into()));
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let out = canaryd_async(&["rollout", "watch", &id], &app.url).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("plan_gate_failed"));
    assert!(
        stdout.contains("skipped"),
        "the steps after the gate: {stdout}"
    );
    assert!(!stdout.contains("null"), "no `null` evidence: {stdout}");
    app.stop().await;
}

#[test]
fn check_runbook_accepts_the_shipped_runbooks_and_names_file_and_line_of_a_bad_one() {
    for name in [
        "single-replica-canary",
        "recreate-in-place",
        "single-replica-rollback",
        "long-context-rollout",
        "long-context-rollback",
    ] {
        let path = format!("{}/runbooks/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        let out = canaryd(&["check", "runbook", &path], "http://127.0.0.1:9");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "description: x\nsteps:\n  - {name: snap, kind: snapshot}\n  - {name: boom, kind: explode}\n")
        .expect("write");
    let out = canaryd(
        &["check", "runbook", bad.to_str().expect("utf-8 path")],
        "http://127.0.0.1:9",
    );
    assert_eq!(out.status.code(), Some(1), "a check that failed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:4:"), "file:line: {err}");
    assert!(err.contains("explode"), "{err}");
}

#[test]
fn check_config_names_the_missing_env_var_and_exits_two() {
    let path = format!("{}/config/canaryd.yaml", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(["check", "config", &path])
        .env_remove("GPU02_COMPOSE_MANAGER_TOKEN")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("canaryd.yaml"), "{err}");
    assert!(err.contains("_env"), "names the key: {err}");
}

/// Runs the binary with a stdout pipe whose reader has already gone (`| head` that exited).
async fn canaryd_into_closed_pipe(args: Vec<String>, server: String) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_canaryd"))
            .args(&args)
            .env("CANARYD_SERVER", &server)
            .env_remove("CANARYD_TOKEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the canaryd binary runs");
        drop(child.stdout.take()); // the reader closes before anything is written
        child.wait_with_output().expect("waits")
    })
    .await
    .expect("join")
}

#[tokio::test]
async fn history_and_show_into_a_closed_pipe_exit_quietly_without_a_panic() {
    let app = TestApp::spawn().await;
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    app.wait_terminal(&id).await;
    for args in [
        strings(&["history", "--format", "json"]),
        strings(&["history"]),
        strings(&["show", &id]),
        strings(&["rollout", "watch", &id]),
    ] {
        let out = canaryd_into_closed_pipe(args.clone(), app.url.clone()).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.trim().is_empty(), "{args:?} says nothing: {err}");
    }
    app.stop().await;
}

#[tokio::test]
async fn flags_given_with_a_plan_file_override_its_fields_and_the_effective_plan_is_printed() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("plan.yaml");
    std::fs::write(
        &path,
        format!(
            "host: {HOST}\nfile: {FILE}\nservice: model-sg-glm53-w4afp8-tp4-r1\ntag: v0.0.451\n\
             reason: from the file\nenv:\n  GLM53_R2_HICACHE_RAM_BUDGET: 650GiB\n  KEEP_ME: \"1\"\n"
        ),
    )
    .expect("write");
    let args = [
        "rollout",
        "start",
        path.to_str().expect("utf-8 path"),
        "--tag",
        "v0.0.452",
        "--service",
        R2,
        "--env",
        "GLM53_R2_HICACHE_RAM_BUDGET=406GiB",
    ];
    let out = canaryd_async(&args, &app.url).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(
        err.contains("--service, --tag, --env overriding"),
        "says which flags won: {err}"
    );
    assert!(
        err.contains("tag: v0.0.452") && err.contains(&format!("service: {R2}")),
        "prints the effective plan: {err}"
    );
    let list = app.api.get("/v1/rollouts?kind=canary").await.expect("list");
    let canary = &list["items"][0];
    assert_eq!(canary["tag"], "v0.0.452", "{canary:#}");
    assert_eq!(canary["service"], R2, "{canary:#}");
    assert_eq!(canary["reason"], "from the file", "{canary:#}");
    assert_eq!(
        canary["env_overrides"],
        serde_json::json!(["GLM53_R2_HICACHE_RAM_BUDGET", "KEEP_ME"]),
        "{canary:#}"
    );
    let done = app.wait_terminal(canary["id"].as_str().expect("id")).await;
    let up = app
        .compose_calls()
        .into_iter()
        .find(|c| c.path == "/compose/up")
        .expect("a compose call");
    assert_eq!(up.body["services"], serde_json::json!([R2]), "{done:#?}");
    assert_eq!(up.body["env"]["GLM53_R2_HICACHE_RAM_BUDGET"], "406GiB");
    app.stop().await;
}

/// `canaryd check ...` with the shipped config's env vars set (distinct placeholders) or removed.
fn check(args: &[&str], with_env: bool) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canaryd"));
    cmd.arg("check").args(args);
    for var in [
        "CANARYD_TOKEN_OPS_ALICE",
        "CANARYD_TOKEN_ONCALL",
        "CANARYD_TOKEN_AUDIT",
        "GPU02_COMPOSE_MANAGER_TOKEN",
    ] {
        if with_env {
            cmd.env(var, format!("placeholder-{var}"));
        } else {
            cmd.env_remove(var);
        }
    }
    let out = cmd.output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn plan_file(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("plan.yaml");
    std::fs::write(&path, text).expect("write");
    path.to_str().expect("utf-8 path").to_owned()
}

#[test]
fn check_plan_without_a_loadable_config_says_why_and_exits_two_unless_told_no_config() {
    let dir = tempfile::tempdir().expect("tmp");
    let plan = plan_file(
        &dir,
        &format!(
            "host: {HOST}\nfile: {FILE}\nservice: no-such-replica\ntag: v0.0.452\nreason: x\n"
        ),
    );
    let config = format!("{}/config/canaryd.yaml", env!("CARGO_MANIFEST_DIR"));
    let missing = dir.path().join("nope.yaml");
    let missing = missing.to_str().expect("utf-8 path");

    let (code, _, err) = check(&["plan", &plan, "--config", missing], true);
    assert_eq!(
        code,
        Some(2),
        "an explicit --config that does not load: {err}"
    );
    assert!(
        err.contains("nope.yaml") && err.contains("did not load"),
        "{err}"
    );
    assert!(
        err.contains("--no-config"),
        "offers the syntax-only check: {err}"
    );

    let (code, _, err) = check(&["plan", &plan, "--config", &config], false);
    assert_eq!(code, Some(2), "a config whose env vars are unset: {err}");
    assert!(
        err.contains("CANARYD_TOKEN_OPS_ALICE"),
        "names the missing var: {err}"
    );

    let (code, out, err) = check(&["plan", &plan, "--no-config"], false);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("syntax ok"), "{out}");

    let (code, _, err) = check(&["plan", &plan, "--config", &config], true);
    assert_eq!(code, Some(1), "the plan names no configured replica: {err}");
    assert!(err.contains("plan.yaml:3: service:"), "file:line: {err}");
}

#[test]
fn check_plan_errors_carry_file_and_line_and_exit_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = format!("{}/config/canaryd.yaml", env!("CARGO_MANIFEST_DIR"));
    let cases = [
        (
            format!("host: {HOST}\nfile: {FILE}\nservice: {R2}\ntag: v0.0.452\nreason: x\nenv:\n  BAD-KEY: b\n"),
            "plan.yaml:7: env.BAD-KEY:",
        ),
        (
            format!("host: {HOST}\nfile: {FILE}\nservice: {R2}\ntag: v0.0.452\nreason: x\ncolour: red\n"),
            "plan.yaml:6: colour:",
        ),
        (format!("host: {HOST}\nfile: [\n"), "plan.yaml:3: "),
    ];
    for (text, want) in cases {
        let plan = plan_file(&dir, &text);
        let (code, _, err) = check(&["plan", &plan, "--config", &config], true);
        assert_eq!(code, Some(1), "{text}: {err}");
        assert!(err.contains(want), "{want:?} in {err}");
    }
    let plan = plan_file(
        &dir,
        &format!("host: {HOST}\nfile: {FILE}\nservice: {R2}\ntag: v0.0.452\nreason: x\n"),
    );
    let (code, out, err) = check(&["plan", &plan, "--config", &config], true);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("ok ("), "{out}");
}

/// Ctrl-C on `rollout watch` stops following, says the rollout goes on and how to follow or
/// abort it, exits 130; the rollout is still running in the daemon.
#[tokio::test]
async fn ctrl_c_on_watch_says_it_detached_and_the_rollout_goes_on() {
    use std::process::Stdio;
    use std::time::Duration;

    let app = TestApp::spawn().await;
    app.sim.faults().stall_stream(canaryd_sim::SimOp::Up);
    let id = app.start_canary(&TestApp::plan("v0.0.452")).await;
    let child = Command::new(env!("CARGO_BIN_EXE_canaryd"))
        .args(["rollout", "watch", &id])
        .env("CANARYD_SERVER", &app.url)
        .env_remove("CANARYD_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the canaryd binary runs");
    // Let it connect and print its first lines.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("the watch ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("detached: it goes on in the daemon"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("canaryd rollout abort {id}")),
        "{stderr}"
    );
    assert_eq!(app.rollout(&id).await.status, "running");
    app.sim.faults().release_stalls();
}

/// A bad enum value is a usage error (exit 2, listing the values) before anything is sent,
/// as docs/cli.md says; nothing listens at the server it would have asked.
#[test]
fn a_bad_enum_value_on_the_command_line_exits_two_listing_the_values() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "rollout",
                "start",
                "--host",
                HOST,
                "--file",
                FILE,
                "--service",
                R2,
                "--tag",
                "v1",
                "--reason",
                "r",
                "--on-failure",
                "explode",
            ],
            "[possible values: rollback, halt]",
        ),
        (
            &["history", "--status", "nope"],
            "[possible values: pending, running, succeeded, failed, aborted]",
        ),
        (
            &["history", "--kind", "deploy"],
            "[possible values: canary, rollback]",
        ),
        (
            &[
                "release",
                "start",
                "--file",
                FILE,
                "--tag",
                "v1",
                "--reason",
                "r",
                "--target",
                "gpu02/r2",
                "--on-failure",
                "x",
            ],
            "[possible values: halt, rollback_release]",
        ),
    ];
    for (args, values) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_canaryd"))
            .args(args)
            .args(["--server", "http://127.0.0.1:9"])
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(values), "{args:?}: {err}");
        assert!(!err.contains("cannot reach"), "nothing was sent: {err}");
    }
}

/// `serve` whose `listen` address is taken exits 2 (a configuration to change), naming it.
#[tokio::test]
async fn serve_on_a_taken_port_exits_two_naming_the_address() {
    let sim = canaryd_sim::SimHost::start(crate::helpers::sim_config())
        .await
        .expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let config = crate::crash_binary::write_config(dir.path(), &sim, port);
    let log = dir.path().join("serve.log");
    let mut child = crate::crash_binary::serve_with(&config, &sim, &log, &[]);
    let mut status = None;
    for _ in 0..200 {
        if let Ok(Some(s)) = child.try_wait() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let Some(status) = status else {
        let _ = child.kill();
        panic!("serve did not exit: {said}");
    };
    assert_eq!(status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("binding 127.0.0.1:{port}")),
        "{said}"
    );
    assert!(
        !dir.path().join("canaryd.db").exists(),
        "no database was created"
    );
    drop(taken);
    sim.shutdown().await;
}
