//! Releases end to end (docs/reference.md#releases): several simulated hosts on loopback, one
//! daemon; the ordering is asserted from the compose calls each host recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use canaryd::api::ReleaseOut;
use canaryd_sim::SimOp;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::fleet::Fleet;
use crate::helpers::{canaryd_async, is_dry_run, FILE, R1, R2};

mod check;
mod events;
mod guide;

impl Fleet {
    async fn release(&self, id: &str) -> ReleaseOut {
        serde_json::from_value(self.get(&format!("/v1/releases/{id}")).await).expect("release")
    }

    async fn start(&self, body: &Value) -> String {
        let (status, out) = self.post("/v1/releases", body).await;
        assert_eq!(status, 201, "release accepted: {out}");
        out["id"].as_str().expect("id").to_owned()
    }

    /// Polls until `done` holds (bounded: 600 × 50 ms).
    async fn wait_for(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(&ReleaseOut) -> bool,
    ) -> ReleaseOut {
        for _ in 0..600 {
            let r = self.release(id).await;
            if done(&r) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("release {id} never {what}: {:#?}", self.release(id).await);
    }

    async fn wait_terminal(&self, id: &str) -> ReleaseOut {
        self.wait_for(id, "ended", |r| {
            matches!(r.status.as_str(), "succeeded" | "failed" | "aborted")
        })
        .await
    }

    /// The real (not dry-run) `up` calls each (host, service) received.
    fn real_ups(&self) -> BTreeMap<(String, String), usize> {
        let mut out = BTreeMap::new();
        for (host, sim) in &self.sims {
            for call in sim.calls() {
                if call.path.starts_with("/compose/up") && !is_dry_run(&call) {
                    *out.entry((host.clone(), service_of(&call.body)))
                        .or_insert(0) += 1;
                }
            }
        }
        out
    }

    /// When each (host, service) first received a down or up (dry runs included).
    fn first_call(&self, host: &str, service: &str) -> Option<DateTime<Utc>> {
        self.sim(host)
            .calls()
            .into_iter()
            .filter(|c| c.path.starts_with("/compose/") && service_of(&c.body) == service)
            .map(|c| c.at)
            .min()
    }
}

fn service_of(body: &Value) -> String {
    body["services"][0].as_str().unwrap_or_default().to_owned()
}

fn three_hosts(max_parallel_hosts: u32, on_failure: &str) -> Value {
    let targets: Vec<Value> = ["gpu01", "gpu02", "gpu03"]
        .iter()
        .flat_map(|h| {
            [
                json!({"host": h, "service": R2}),
                json!({"host": h, "service": R1}),
            ]
        })
        .collect();
    json!({"file": FILE, "tag": "v0.0.452", "reason": "promote v0.0.452", "targets": targets,
           "max_parallel_hosts": max_parallel_hosts, "on_failure": on_failure})
}

/// Each target's time away, from its host's first compose call for it to its rollout's end.
fn intervals(fleet: &Fleet, r: &ReleaseOut) -> Vec<(String, DateTime<Utc>, DateTime<Utc>)> {
    r.targets
        .iter()
        .map(|t| {
            let start = fleet
                .first_call(&t.host, &t.service)
                .unwrap_or_else(|| panic!("{}/{} was called", t.host, t.service));
            (t.host.clone(), start, t.finished_at.expect("finished"))
        })
        .collect()
}

#[tokio::test]
async fn three_hosts_release_canary_first_one_replica_per_host_at_most_two_hosts_at_once() {
    let fleet = Fleet::spawn(3).await;
    let id = fleet.start(&three_hosts(2, "halt")).await;
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(r.progress.get("succeeded"), Some(&6), "{r:#?}");
    assert!(r.targets[0].canary && r.targets[0].host == "gpu01" && r.targets[0].service == R2);

    let iv = intervals(&fleet, &r);
    let canary_end = iv[0].2;
    for (i, (host, start, _)) in iv.iter().enumerate().skip(1) {
        assert!(
            *start > canary_end,
            "target {i} on {host} started before the canary ended"
        );
    }
    for (i, a) in iv.iter().enumerate() {
        for b in iv.iter().skip(i + 1) {
            if a.0 == b.0 {
                assert!(
                    a.2 < b.1 || b.2 < a.1,
                    "two replicas of {} away at once",
                    a.0
                );
            }
        }
    }
    let mut most = 0;
    for (_, at, _) in &iv {
        let hosts: BTreeSet<&str> = iv
            .iter()
            .filter(|(_, s, e)| s <= at && at < e)
            .map(|(h, _, _)| h.as_str())
            .collect();
        most = most.max(hosts.len());
    }
    assert_eq!(
        most, 2,
        "hosts in parallel up to max_parallel_hosts: {iv:#?}"
    );
    assert!(
        fleet.real_ups().values().all(|n| *n == 1),
        "{:?}",
        fleet.real_ups()
    );

    let listed = fleet.get(&format!("/v1/rollouts?release={id}")).await;
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(6));
    let kinds: Vec<String> = r.events.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds.first().map(String::as_str), Some("release_created"));
    assert_eq!(kinds.last().map(String::as_str), Some("release_succeeded"));
    assert_eq!(kinds.iter().filter(|k| *k == "target_started").count(), 6);
    let metrics = reqwest::get(format!("{}/metrics", fleet.url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("canaryd_releases_total{outcome=\"succeeded\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failure_on_the_second_host_halts_with_only_the_failed_target_rolled_back() {
    let fleet = Fleet::spawn(3).await;
    fleet
        .sim("gpu02")
        .faults()
        .fail_phase(SimOp::Up, Some("up".into()));
    let id = fleet.start(&three_hosts(1, "halt")).await;
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let states: Vec<(&str, &str, &str)> = r
        .targets
        .iter()
        .map(|t| (t.host.as_str(), t.service.as_str(), t.state.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            ("gpu01", R2, "succeeded"),
            ("gpu01", R1, "succeeded"),
            ("gpu02", R2, "failed"),
            ("gpu02", R1, "not_started"),
            ("gpu03", R2, "not_started"),
            ("gpu03", R1, "not_started"),
        ]
    );
    let rolled: Vec<&str> = r
        .targets
        .iter()
        .filter(|t| t.rollback_id.is_some())
        .map(|t| t.service.as_str())
        .collect();
    assert_eq!(
        rolled,
        [R2],
        "exactly the failed target rolled back: {r:#?}"
    );
    assert_eq!(r.targets[2].rollback_status.as_deref(), Some("succeeded"));
    assert!(
        r.error.as_deref().unwrap_or("").contains("gpu02"),
        "{:?}",
        r.error
    );
    assert!(fleet
        .sim("gpu03")
        .calls()
        .iter()
        .all(|c| !c.path.starts_with("/compose/")));
}

#[tokio::test]
async fn rollback_release_puts_every_changed_target_back_on_its_prior_deployment() {
    // One replica per host: a host's second replica has no prior deployment of its own to go
    // back to (its baseline is read from the host's last deployment; docs/reference.md#releases).
    let fleet = Fleet::spawn(3).await;
    fleet
        .sim("gpu02")
        .faults()
        .fail_phase(SimOp::Up, Some("up".into()));
    let mut body = three_hosts(1, "rollback_release");
    body["targets"] = json!([
        {"host": "gpu01", "service": R2}, {"host": "gpu03", "service": R2},
        {"host": "gpu02", "service": R2}, {"host": "gpu02", "service": R1}
    ]);
    let id = fleet.start(&body).await;
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let states: Vec<&str> = r.targets.iter().map(|t| t.state.as_str()).collect();
    assert_eq!(
        states,
        ["rolled_back", "rolled_back", "failed", "not_started"],
        "{r:#?}"
    );
    // Reverse order: gpu03 (changed last) is rolled back before gpu01.
    let rb = |i: usize| r.targets[i].rollback_id.clone().expect("rolled back");
    let gpu03_back = fleet.get(&format!("/v1/rollouts/{}", rb(1))).await;
    let gpu01_back = fleet.get(&format!("/v1/rollouts/{}", rb(0))).await;
    assert!(gpu03_back["finished_at"].as_str() < gpu01_back["created_at"].as_str());
    for out in [&gpu03_back, &gpu01_back] {
        assert_eq!(
            out["tag"], "v0.0.450",
            "back on the prior deployment: {out}"
        );
        assert_eq!(out["status"], "succeeded");
    }
}

#[tokio::test]
async fn a_paused_release_starts_nothing_until_resumed() {
    let fleet = Fleet::spawn(3).await;
    let id = fleet.start(&three_hosts(1, "halt")).await;
    fleet
        .wait_for(&id, "started its canary", |r| {
            r.targets[0].rollout_id.is_some()
        })
        .await;
    let (status, out) = fleet
        .post(
            &format!("/v1/releases/{id}/pause"),
            &json!({"reason": "watching queue depth"}),
        )
        .await;
    assert_eq!(
        (status, out["status"].as_str()),
        (200, Some("paused")),
        "{out}"
    );
    let r = fleet
        .wait_for(&id, "let its canary finish", |r| {
            r.targets[0].state == "succeeded"
        })
        .await;
    assert_eq!(r.status, "paused");
    assert!(
        r.targets[1..].iter().all(|t| t.rollout_id.is_none()),
        "{r:#?}"
    );
    let (status, out) = fleet
        .post(
            &format!("/v1/releases/{id}/pause"),
            &json!({"reason": "again"}),
        )
        .await;
    assert_eq!(
        (status, out["error"]["code"].as_str()),
        (409, Some("release_state"))
    );
    let (status, _) = fleet
        .post(
            &format!("/v1/releases/{id}/resume"),
            &json!({"reason": "queue is fine"}),
        )
        .await;
    assert_eq!(status, 200);
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let paused = r
        .events
        .iter()
        .find(|e| e.kind == "release_paused")
        .expect("paused event");
    assert_eq!(paused.reason.as_deref(), Some("watching queue depth"));
    assert!(r.events.iter().any(|e| e.kind == "release_resumed"));
}

#[tokio::test]
async fn an_aborted_release_aborts_its_running_target_and_starts_nothing_more() {
    let fleet = Fleet::spawn(3).await;
    let id = fleet.start(&three_hosts(1, "halt")).await;
    fleet
        .wait_for(&id, "started its canary", |r| {
            r.targets[0].rollout_id.is_some()
        })
        .await;
    let (status, out) = fleet
        .post(
            &format!("/v1/releases/{id}/abort"),
            &json!({"reason": "wrong tag"}),
        )
        .await;
    assert_eq!(
        (status, out["status"].as_str()),
        (200, Some("aborted")),
        "{out}"
    );
    let canary = out["targets"][0]["rollout_id"]
        .as_str()
        .expect("canary")
        .to_owned();
    let done = fleet
        .engine
        .wait_terminal(&canary, Duration::from_secs(15))
        .await
        .expect("canary ends");
    assert_eq!(done.status.as_str(), "aborted");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = fleet.release(&id).await;
    assert_eq!(r.status, "aborted");
    assert!(
        r.targets[1..]
            .iter()
            .all(|t| t.rollout_id.is_none() && t.state == "not_started"),
        "{r:#?}"
    );
    let aborted = r.events.last().expect("events");
    assert_eq!(aborted.kind, "release_aborted");
    assert_eq!(aborted.detail["not_started"], 5, "{aborted:?}");
    for host in ["gpu02", "gpu03"] {
        assert!(
            fleet
                .sim(host)
                .calls()
                .iter()
                .all(|c| !c.path.starts_with("/compose/")),
            "{host} got no call"
        );
    }
}

#[tokio::test]
async fn a_release_killed_mid_way_resumes_every_target_exactly_once() {
    let fleet = Fleet::spawn(3).await;
    let id = fleet.start(&three_hosts(1, "halt")).await;
    let r = fleet
        .wait_for(&id, "reached its third target", |r| {
            r.targets[2].rollout_id.is_some()
        })
        .await;
    let third = r.targets[2].rollout_id.clone().expect("third");
    // Killed while the third target soaks (after its up: a resumed soak must not send another).
    for _ in 0..300 {
        let out = fleet.get(&format!("/v1/rollouts/{third}")).await;
        let soaking = out["steps"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["name"] == "soak" && s["status"] == "running")
        });
        if soaking {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fleet = fleet.crash_and_restart().await;
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    assert_eq!(r.targets[2].rollout_id.as_deref(), Some(third.as_str()));
    let ups = fleet.real_ups();
    assert_eq!(ups.len(), 6, "{ups:?}");
    assert!(ups.values().all(|n| *n == 1), "no duplicate up: {ups:?}");
    let listed = fleet.get(&format!("/v1/rollouts?release={id}")).await;
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(6),
        "one rollout per target"
    );
}

#[tokio::test]
async fn a_release_with_an_unknown_target_is_refused_naming_it_and_nothing_is_stored() {
    let fleet = Fleet::spawn(1).await;
    let mut body = three_hosts(1, "halt");
    body["targets"] = json!([{"host": "gpu01", "service": R2}, {"host": "gpu09", "service": R1}]);
    let (status, out) = fleet.post("/v1/releases", &body).await;
    assert_eq!(status, 422, "{out}");
    assert_eq!(out["error"]["code"], "unknown_host");
    let message = out["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("targets[1] (gpu09/"), "{message}");
    body["targets"] = json!([{"host": "gpu01", "service": "model-x-r9"}]);
    let (status, out) = fleet.post("/v1/releases", &body).await;
    assert_eq!(
        (status, out["error"]["code"].as_str()),
        (422, Some("unknown_service")),
        "{out}"
    );
    let list = fleet.get("/v1/releases").await;
    assert_eq!(list["items"], json!([]));
    body["targets"] = Value::Null;
    body["selector"] = json!({"hosts": ["gpu01"], "group": "glm53-long"});
    let id = fleet.start(&body).await;
    let r = fleet.release(&id).await;
    let order: Vec<&str> = r.targets.iter().map(|t| t.service.as_str()).collect();
    assert_eq!(order, [R2, R1], "a selector rolls r2 first, then r1");
}

#[tokio::test]
async fn the_cli_starts_a_release_from_flags_and_waits_for_it() {
    let fleet = Fleet::spawn(2).await;
    let args: Vec<String> = [
        "release",
        "start",
        "--file",
        FILE,
        "--tag",
        "v0.0.452",
        "--reason",
        "cli release",
        "--host",
        "gpu01",
        "--host",
        "gpu02",
        "--group",
        "glm53-long",
        "--max-parallel-hosts",
        "2",
        "--wait",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = canaryd_async(&args, &fleet.url).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("canary gpu01/{R2}: succeeded")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("gpu02/{R1}: succeeded")),
        "{stdout}"
    );
    assert!(stdout.contains("succeeded (prod/"), "{stdout}");
    // Each target's replica downtime, and the release's in all.
    let out_lines = stdout
        .lines()
        .filter(|l| l.contains(", replica out "))
        .count();
    assert!(
        out_lines >= 4,
        "every target says how long its replica was out: {stdout}"
    );
    assert!(
        stdout.contains("replicas out "),
        "the summary adds them up: {stdout}"
    );
}

#[tokio::test]
async fn a_target_whose_host_is_busy_waits_for_it_instead_of_failing() {
    let fleet = Fleet::spawn(2).await;
    fleet.sim("gpu02").faults().set_health_never(R1, true);
    let plan = json!({"host": "gpu02", "file": FILE, "service": R1, "tag": "v0.0.451",
                      "reason": "someone else's canary", "on_failure": "halt"});
    let (status, other) = fleet.post("/v1/rollouts", &plan).await;
    assert_eq!(status, 201, "{other}");
    let other = other["id"].as_str().expect("id").to_owned();
    let mut body = three_hosts(1, "halt");
    body["targets"] = json!([{"host": "gpu01", "service": R2}, {"host": "gpu02", "service": R2}]);
    let id = fleet.start(&body).await;
    let r = fleet
        .wait_for(&id, "finished its canary", |r| {
            r.targets[0].state == "succeeded"
        })
        .await;
    let busy = fleet.get(&format!("/v1/rollouts/{other}")).await;
    if busy["status"] == "running" {
        assert_eq!(r.targets[1].state, "waiting", "{r:#?}");
    }
    assert_eq!(r.status, "running");
    fleet.sim("gpu02").faults().set_health_never(R1, false);
    let (status, _) = fleet
        .post(
            &format!("/v1/rollouts/{other}/abort"),
            &json!({"reason": "make way"}),
        )
        .await;
    assert_eq!(status, 200);
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let other = fleet.get(&format!("/v1/rollouts/{other}")).await;
    let target = fleet
        .get(&format!(
            "/v1/rollouts/{}",
            r.targets[1].rollout_id.as_deref().expect("started")
        ))
        .await;
    // Started only once the other rollout had stopped acting (its aborted step ended).
    let stopped = other["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["status"] == "aborted"))
        .and_then(|s| s["finished_at"].as_str())
        .expect("an aborted step")
        .to_owned();
    assert!(
        stopped.as_str() <= target["created_at"].as_str().unwrap_or(""),
        "{target}"
    );
}

impl Fleet {
    /// The compose-manager calls (`/compose/…`, `/docker/…`) `host` received after `after`
    /// that name `service` in their body.
    fn calls_naming(&self, host: &str, service: &str, after: DateTime<Utc>) -> Vec<String> {
        self.sim(host)
            .calls()
            .into_iter()
            .filter(|c| c.at > after)
            .filter(|c| c.path.starts_with("/compose/") || c.path.starts_with("/docker/"))
            .filter(|c| c.body.to_string().contains(service))
            .map(|c| format!("{} {} {}", c.method, c.path, c.body))
            .collect()
    }
}

#[tokio::test]
async fn a_release_over_its_canary_already_at_the_tag_counts_it_done_and_sends_it_nothing() {
    let fleet = Fleet::spawn(1).await;
    // The operator guide's flow: a canary of r2 to the new tag, then the release of that tag
    // with r2 as its canary.
    let plan = json!({"host": "gpu01", "file": FILE, "service": R2, "tag": "v0.0.452",
                      "reason": "canary v0.0.452"});
    let (status, canary) = fleet.post("/v1/rollouts", &plan).await;
    assert_eq!(status, 201, "{canary}");
    let canary = canary["id"].as_str().expect("id").to_owned();
    let done = fleet
        .engine
        .wait_terminal(&canary, Duration::from_secs(30))
        .await
        .expect("the canary ends");
    assert_eq!(done.status.as_str(), "succeeded");
    let canary_end = done.finished_at.expect("finished");

    let id = fleet
        .start(&json!({"file": FILE, "tag": "v0.0.452", "reason": "promote v0.0.452",
                        "targets": [{"host": "gpu01", "service": R1}, {"host": "gpu01", "service": R2}],
                        "canary": {"host": "gpu01", "service": R2}}))
        .await;
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
    let states: Vec<(&str, &str, Option<&str>)> = r
        .targets
        .iter()
        .map(|t| {
            (
                t.service.as_str(),
                t.state.as_str(),
                t.rollout_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(states[0], (R2, "already_current", None), "{r:#?}");
    assert_eq!((states[1].0, states[1].1), (R1, "succeeded"), "{r:#?}");
    assert_eq!(
        fleet.calls_naming("gpu01", R2, canary_end),
        Vec::<String>::new(),
        "nothing sent for the replica already at the tag"
    );
    assert_eq!(
        fleet.real_ups().get(&("gpu01".to_owned(), R1.to_owned())),
        Some(&1)
    );
    let listed = fleet.get(&format!("/v1/rollouts?release={id}")).await;
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(1),
        "no rollout for the target already current: {listed}"
    );
    let current = r
        .events
        .iter()
        .find(|e| e.kind == "target_already_current")
        .unwrap_or_else(|| panic!("a target_already_current event: {r:#?}"));
    assert_eq!(current.detail["rollout_id"], canary.as_str(), "{current:?}");
    assert_eq!(r.progress.get("already_current"), Some(&1), "{r:#?}");

    let out = canaryd_async(&["release", "watch", &id], &fleet.url).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "canary gpu01/{R2}: already_current (already at the release's file, tag and env: nothing sent)"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 already_current, 1 succeeded"),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_release_whose_canary_fails_ends_its_other_targets_not_started_and_sends_them_nothing() {
    let fleet = Fleet::spawn(2).await;
    fleet
        .sim("gpu01")
        .faults()
        .fail_phase(SimOp::Up, Some("up".into()));
    let before = Utc::now();
    let mut body = three_hosts(1, "halt");
    body["targets"] = json!([
        {"host": "gpu01", "service": R2}, {"host": "gpu01", "service": R1},
        {"host": "gpu02", "service": R2}
    ]);
    let id = fleet.start(&body).await;
    let r = fleet.wait_terminal(&id).await;
    assert_eq!(r.status, "failed", "{r:#?}");
    let states: Vec<&str> = r.targets.iter().map(|t| t.state.as_str()).collect();
    assert_eq!(states, ["failed", "not_started", "not_started"], "{r:#?}");
    assert_eq!(r.progress.get("waiting"), None, "{r:#?}");
    assert_eq!(
        fleet.calls_naming("gpu01", R1, before),
        Vec::<String>::new()
    );
    assert!(fleet
        .sim("gpu02")
        .calls()
        .iter()
        .all(|c| !c.path.starts_with("/compose/")));
}
