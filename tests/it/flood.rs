//! A connection flood does not fail a rollout (safety rule 22), with the real binary under
//! systemd's default limits: 1,024 open files, soft and hard. 1,100 idle unauthenticated
//! connections are held open while a canary waits for its replica's health, then while it
//! reads the host's logs and soaks; the canary succeeds and the API answers again within
//! seconds of the flood ending.

use std::time::Duration;

use canaryd_sim::SimHost;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::crash_binary::{free_port, get, serve_under, wait_ready, wait_terminal, write_config};
use crate::helpers::{sim_config, TestApp, R2};

const FLOOD: usize = 1_100;

#[tokio::test]
async fn idle_connections_beyond_the_open_file_limit_fail_no_rollout_and_the_api_comes_back() {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("prlimit (util-linux) is needed to run the daemon under a 1,024 file limit");
    }
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &sim, port);
    // The canary's health wait outlasts the flood.
    let canary = dir.path().join("runbooks/single-replica-canary.yaml");
    let text = std::fs::read_to_string(&canary).expect("runbook");
    let health = "kind: wait_health, timeout: 3s";
    assert!(text.contains(health), "{text}");
    std::fs::write(
        &canary,
        text.replace(health, "kind: wait_health, timeout: 60s"),
    )
    .expect("runbook");
    let log = dir.path().join("canaryd.log");
    let base = format!("http://127.0.0.1:{port}");
    let mut daemon = serve_under(
        &["prlimit", "--nofile=1024:1024", "--"],
        &config,
        &sim,
        &log,
        &[],
    );
    wait_ready(&base, &mut daemon).await;

    sim.faults().set_health_never(R2, true);
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/rollouts"))
        .json(&TestApp::plan("v0.0.452"))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let mut in_health = false;
    for _ in 0..200 {
        let r = get(&base, &format!("/v1/rollouts/{id}")).await;
        let health_running = r["steps"].as_array().is_some_and(|steps| {
            steps
                .iter()
                .any(|s| s["name"] == "health" && s["status"] == "running")
        });
        if health_running {
            in_health = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(in_health, "the canary waits for health");

    // The flood: every connection idle, none authenticated, all held at once.
    let addr = format!("127.0.0.1:{port}");
    // Connected at once; those beyond the daemon's cap and its listen backlog keep retrying
    // their SYN, as a flood's would, until they are dropped with the rest.
    let attempts = (0..FLOOD).map(|_| {
        let addr = addr.clone();
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(20), TcpStream::connect(addr)).await
        })
    });
    let flood: Vec<_> = attempts.collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let connected = flood.iter().filter(|a| a.is_finished()).count();
    eprintln!("flood: {connected} of {FLOOD} connected after 2 s");
    let open = std::fs::read_dir(format!("/proc/{}/fd", daemon.id()))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        open < 1024,
        "the daemon keeps descriptors free: {open} open"
    );

    // The replica comes up while the flood holds: the canary reads its health, the host's
    // logs and soaks with every idle connection still open.
    sim.faults().set_health_never(R2, false);
    tokio::time::sleep(Duration::from_secs(6)).await;
    for attempt in &flood {
        attempt.abort();
    }
    drop(flood);

    let mut answered = false;
    for _ in 0..150 {
        let ok = reqwest::Client::new()
            .get(format!("{base}/healthz"))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ok {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        answered,
        "the API answers again within seconds of the flood ending"
    );
    let canary = wait_terminal(&base, &id).await;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(canary["status"], "succeeded", "{canary:#}\n{said}");
    assert!(!said.contains("Too many open files"), "{said}");
    assert!(
        said.contains("serving at most 512 connections at once (open-file limit 1024)"),
        "{said}"
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
    sim.shutdown().await;
}
