//! The real thing: `canaryd serve` (the built binary) is killed with SIGKILL in the middle of
//! a compose `up`, restarted on the same database, and must reconcile instead of resending;
//! then it is stopped with SIGTERM and must exit cleanly.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use canaryd_sim::{SimHost, SimOp};
use serde_json::Value;

use crate::helpers::{sim_config, TestApp, FAST_CANARY, FAST_RECREATE, FAST_ROLLBACK, R1, R2};

const TOKEN_ENV: &str = "CANARYD_TEST_GPU02_TOKEN";

pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("addr").port()
}

pub(crate) fn write_config(dir: &Path, sim: &SimHost, port: u16) -> std::path::PathBuf {
    let runbooks = dir.join("runbooks");
    std::fs::create_dir_all(&runbooks).expect("runbooks dir");
    for (name, text) in [
        ("single-replica-canary", FAST_CANARY.as_str()),
        ("single-replica-rollback", FAST_ROLLBACK.as_str()),
        ("recreate-in-place", FAST_RECREATE),
    ] {
        std::fs::write(runbooks.join(format!("{name}.yaml")), text).expect("runbook");
    }
    let env: String = sim_config()
        .initial_env
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    std::fs::write(dir.join("gpu02.env"), env).expect("env file");
    let health = |s: &str| sim.health_url(s).expect("health url");
    let yaml = format!(
        "listen: 127.0.0.1:{port}
database: canaryd.db
runbooks_dir: runbooks
hosts:
  gpu02:
    compose_manager_url: {url}
    token_env: {TOKEN_ENV}
    env_file: gpu02.env
    replicas:
      {R1}: {{group: glm53-long, health_url: {h1}}}
      {R2}: {{group: glm53-long, health_url: {h2}}}
compose:
  busy_retry_initial: 100ms
  busy_retry_max: 1s
",
        url = sim.url(),
        h1 = health(R1),
        h2 = health(R2),
    );
    let path = dir.join("canaryd.yaml");
    std::fs::write(&path, yaml).expect("config");
    path
}

fn serve(config: &Path, sim: &SimHost, log: &Path) -> Child {
    serve_with(config, sim, log, &[])
}

/// `canaryd serve --config CONFIG ARGS...`, its stderr appended to `log`.
pub(crate) fn serve_with(config: &Path, sim: &SimHost, log: &Path, args: &[&str]) -> Child {
    serve_under(&[], config, sim, log, args)
}

/// `serve_with`, run by `wrapper` (a command that execs the rest, such as `prlimit ... --`).
pub(crate) fn serve_under(
    wrapper: &[&str],
    config: &Path,
    sim: &SimHost,
    log: &Path,
    args: &[&str],
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let (program, before) = match wrapper {
        [first, rest @ ..] => (std::ffi::OsStr::new(*first), rest),
        [] => (std::ffi::OsStr::new(env!("CARGO_BIN_EXE_canaryd")), &[][..]),
    };
    let mut command = Command::new(program);
    if !wrapper.is_empty() {
        command.args(before).arg(env!("CARGO_BIN_EXE_canaryd"));
    }
    command
        .args(["serve", "--config"])
        .arg(config)
        .args(args)
        .env(TOKEN_ENV, sim.token())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("canaryd starts")
}

pub(crate) async fn wait_ready(base: &str, child: &mut Child) {
    for _ in 0..300 {
        if let Ok(res) = reqwest::get(format!("{base}/readyz")).await {
            if res.status() == 200 {
                return;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("canaryd exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("canaryd never became ready");
}

pub(crate) async fn get(base: &str, path: &str) -> Value {
    reqwest::get(format!("{base}{path}"))
        .await
        .expect("answers")
        .json()
        .await
        .expect("json")
}

pub(crate) async fn wait_terminal(base: &str, id: &str) -> Value {
    for _ in 0..300 {
        let r = get(base, &format!("/v1/rollouts/{id}")).await;
        if matches!(
            r["status"].as_str(),
            Some("succeeded" | "failed" | "aborted")
        ) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never finished");
}

/// Starts a canary whose `up` the host holds open; returns its id once the up is in flight.
pub(crate) async fn canary_held_in_its_up(base: &str, sim: &SimHost) -> String {
    sim.faults().stall_stream(SimOp::Up);
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/rollouts"))
        .json(&TestApp::plan("v0.0.452"))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    for _ in 0..500 {
        if sim.faults().stalled_streams() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sim.faults().stalled_streams(), 1, "the up is in flight");
    created["id"].as_str().expect("id").to_owned()
}

#[tokio::test]
async fn a_kill_dash_nine_mid_up_is_reconciled_after_restart_and_sigterm_exits_cleanly() {
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &sim, port);
    let log = dir.path().join("canaryd.log");
    let base = format!("http://127.0.0.1:{port}");

    let mut first = serve(&config, &sim, &log);
    wait_ready(&base, &mut first).await;
    let id = canary_held_in_its_up(&base, &sim).await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();

    let mut second = serve(&config, &sim, &log);
    wait_ready(&base, &mut second).await;
    let canary = wait_terminal(&base, &id).await;
    assert_eq!(canary["status"], "failed", "{canary:#}");
    assert_eq!(canary["error"]["code"], "compose_outcome_unknown");
    let rb_id = canary["rolled_back_by"].as_str().expect("rolled back");
    let rollback = wait_terminal(&base, rb_id).await;
    assert_eq!(rollback["status"], "succeeded", "{rollback:#}");

    let ups = |tag: &str| {
        sim.calls()
            .iter()
            .filter(|c| {
                c.path == "/compose/up" && c.body.get("dry_run").is_none() && c.body["tag"] == tag
            })
            .count()
    };
    assert_eq!(ups("v0.0.452"), 1, "the killed up was never resent");
    assert_eq!(ups("v0.0.450"), 1, "one up for the rollback");
    for c in sim
        .calls()
        .iter()
        .filter(|c| c.path.starts_with("/compose/"))
    {
        if c.path != "/compose/logs" {
            assert_eq!(c.body["services"], serde_json::json!([R2]), "{}", c.body);
        }
    }

    // SIGTERM: stops accepting, finishes its writes, exits 0.
    let pid = second.id().to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let mut exited = None;
    for _ in 0..200 {
        if let Ok(Some(status)) = second.try_wait() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(status) = exited else {
        let _ = second.kill();
        panic!("canaryd did not stop on SIGTERM");
    };
    assert!(status.success(), "clean exit: {status}");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("resuming rollout"),
        "the restart resumed it: {logged}"
    );
    sim.shutdown().await;
}
