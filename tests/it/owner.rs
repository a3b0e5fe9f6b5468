//! One daemon per database (safety rule 17), with the real binary: a second `canaryd serve`
//! on the same database file exits 2 at once naming the owner and touching nothing; with
//! `--wait-for-lock` it waits for the owner to go, then resumes its rollouts.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::Duration;

use canaryd_sim::SimHost;
use serde_json::Value;

use crate::crash_binary::{
    canary_held_in_its_up, free_port, get, serve_with, wait_ready, wait_terminal, write_config,
};
use crate::helpers::sim_config;

/// A second config in the same folder: another port, the same `database: canaryd.db`.
fn second_config(first: &Path, port: u16) -> PathBuf {
    second_config_on(first, port, "canaryd.db")
}

/// A second config in the same folder: another port, `database: <database>`.
fn second_config_on(first: &Path, port: u16, database: &str) -> PathBuf {
    let text = std::fs::read_to_string(first).expect("first config");
    let listen = text.lines().next().expect("listen line").to_owned();
    let text = text
        .replacen(&listen, &format!("listen: 127.0.0.1:{port}"), 1)
        .replacen("database: canaryd.db", &format!("database: {database}"), 1);
    let path = first.with_file_name("canaryd-second.yaml");
    std::fs::write(&path, text).expect("second config");
    path
}

async fn exit_of(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let tries = within.as_millis() / 50;
    for _ in 0..tries {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A daemon (the real binary) that owns its database, a canary of it held in its `up`.
struct Owner {
    sim: SimHost,
    dir: tempfile::TempDir,
    config: PathBuf,
    base: String,
    first: Child,
    id: String,
}

impl Owner {
    async fn mid_up() -> Owner {
        let sim = SimHost::start(sim_config()).await.expect("sim");
        let dir = tempfile::tempdir().expect("dir");
        let port = free_port();
        let config = write_config(dir.path(), &sim, port);
        let log = dir.path().join("canaryd.log");
        let base = format!("http://127.0.0.1:{port}");
        let mut first = serve_with(&config, &sim, &log, &[]);
        wait_ready(&base, &mut first).await;
        let id = canary_held_in_its_up(&base, &sim).await;
        Owner {
            sim,
            dir,
            config,
            base,
            first,
            id,
        }
    }
}

fn audit_kinds(events: &Value) -> Vec<String> {
    events["items"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|e| e["kind"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_second_serve_on_the_same_database_exits_2_naming_the_owner_and_touches_nothing() {
    let Owner {
        sim,
        dir,
        config,
        base,
        mut first,
        id,
    } = Owner::mid_up().await;
    let calls_before = sim.calls().len();
    let events_before = get(&base, &format!("/v1/rollouts/{id}/audit")).await;

    let second_port = free_port();
    let second_config = second_config(&config, second_port);
    let second_log = dir.path().join("second.log");
    let mut second = serve_with(&second_config, &sim, &second_log, &[]);
    let status = exit_of(&mut second, Duration::from_secs(10)).await;
    let Some(status) = status else {
        let _ = second.kill();
        let _ = first.kill();
        panic!("the second daemon did not exit");
    };
    let said = std::fs::read_to_string(&second_log).unwrap_or_default();
    assert_eq!(status.code(), Some(2), "exit 2: {said}");
    let db = dir.path().join("canaryd.db");
    let expected = format!(
        "database {} is in use by canaryd pid {}; stop it, or start with `--wait-for-lock",
        db.display(),
        first.id()
    );
    assert!(said.contains(&expected), "names the owner: {said}");
    assert_eq!(
        sim.calls().len(),
        calls_before,
        "nothing was sent to the host"
    );
    let events_after = get(&base, &format!("/v1/rollouts/{id}/audit")).await;
    assert_eq!(
        audit_kinds(&events_after),
        audit_kinds(&events_before),
        "nothing was written for the live rollout"
    );

    // The owner goes on alone: the up ends, the canary succeeds, one up was ever sent.
    sim.faults().release_stalls();
    let canary = wait_terminal(&base, &id).await;
    assert_eq!(canary["status"], "succeeded", "{canary:#}");
    let ups = sim
        .calls()
        .iter()
        .filter(|c| c.path == "/compose/up" && c.body.get("dry_run").is_none())
        .count();
    assert_eq!(ups, 1, "one real up");
    let _ = first.kill();
    let _ = first.wait();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_symlink_or_a_hard_link_to_the_database_is_refused_like_the_file_itself() {
    let Owner {
        sim,
        dir,
        config,
        base,
        mut first,
        id,
    } = Owner::mid_up().await;
    let calls_before = sim.calls().len();
    let events_before = get(&base, &format!("/v1/rollouts/{id}/audit")).await;
    let aliases = dir.path().join("aliases");
    std::fs::create_dir(&aliases).expect("aliases dir");
    let db = dir.path().join("canaryd.db");
    std::os::unix::fs::symlink(&db, aliases.join("symlink.db")).expect("symlink");
    std::fs::hard_link(&db, aliases.join("hard.db")).expect("hard link");
    // Where the old design kept `<database>.lock`: a symlink to a file of the operator's
    // that must never be followed, truncated or written.
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, "keep me\n").expect("precious");
    std::os::unix::fs::symlink(&precious, aliases.join("symlink.db.lock")).expect("lock link");

    for alias in ["aliases/symlink.db", "aliases/hard.db"] {
        let port = free_port();
        let second_config = second_config_on(&config, port, alias);
        let log = dir.path().join(format!("{}.log", alias.replace('/', "-")));
        let mut second = serve_with(&second_config, &sim, &log, &[]);
        let Some(status) = exit_of(&mut second, Duration::from_secs(10)).await else {
            let _ = second.kill();
            let _ = first.kill();
            panic!("the daemon on {alias} did not exit");
        };
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(status.code(), Some(2), "{alias}: exit 2: {said}");
        assert!(
            said.contains(&format!("is in use by canaryd pid {}", first.id())),
            "{alias}: names the owner: {said}"
        );
    }
    assert_eq!(
        sim.calls().len(),
        calls_before,
        "nothing was sent to the host"
    );
    let events_after = get(&base, &format!("/v1/rollouts/{id}/audit")).await;
    assert_eq!(audit_kinds(&events_after), audit_kinds(&events_before));
    assert_eq!(
        std::fs::read_to_string(&precious).expect("precious"),
        "keep me\n",
        "a symlinked lock name was never followed"
    );
    sim.faults().release_stalls();
    let canary = wait_terminal(&base, &id).await;
    assert_eq!(canary["status"], "succeeded", "{canary:#}");
    let _ = first.kill();
    let _ = first.wait();
    sim.shutdown().await;
}

#[tokio::test]
async fn serve_wait_for_lock_takes_the_database_when_the_owner_dies_and_resumes_its_rollout() {
    let Owner {
        sim,
        dir,
        config,
        base: _,
        mut first,
        id,
    } = Owner::mid_up().await;

    let second_port = free_port();
    let second_base = format!("http://127.0.0.1:{second_port}");
    let second_config = second_config(&config, second_port);
    let second_log = dir.path().join("second.log");
    let mut second = serve_with(
        &second_config,
        &sim,
        &second_log,
        &["--wait-for-lock", "60s"],
    );
    // It waits, and sends nothing while the owner lives.
    let calls_before = sim.calls().len();
    assert!(
        exit_of(&mut second, Duration::from_secs(1)).await.is_none(),
        "the second daemon waits"
    );
    assert_eq!(
        sim.calls().len(),
        calls_before,
        "nothing sent while it waits"
    );
    let said = std::fs::read_to_string(&second_log).unwrap_or_default();
    assert!(
        said.contains("is in use by canaryd pid"),
        "says why it waits: {said}"
    );

    // The owner dies mid-up (a redeploy that kills the old container): the waiting daemon
    // takes over, reconciles the up instead of resending it, and rolls the canary back.
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    wait_ready(&second_base, &mut second).await;
    let canary = wait_terminal(&second_base, &id).await;
    assert_eq!(canary["status"], "failed", "{canary:#}");
    assert_eq!(canary["error"]["code"], "compose_outcome_unknown");
    let events = get(&second_base, &format!("/v1/rollouts/{id}/audit")).await;
    assert!(
        audit_kinds(&events).contains(&"rollout_resumed".to_owned()),
        "{events:#}"
    );
    let ups = sim
        .calls()
        .iter()
        .filter(|c| {
            c.path == "/compose/up"
                && c.body.get("dry_run").is_none()
                && c.body["tag"] == "v0.0.452"
        })
        .count();
    assert_eq!(ups, 1, "the up in flight was never resent");
    let _ = second.kill();
    let _ = second.wait();
    sim.shutdown().await;
}
