//! Start admission end to end (docs/performance.md): canaries started together take
//! their first steps in arrival order, `engine.start_concurrency` at a time; a queued canary
//! that is aborted ends at once, having sent nothing. Several simulated hosts, one daemon; the
//! order is read from the calls each host recorded.

use std::time::Duration;

use canaryd::api::RolloutOut;
use canaryd_sim::SimOp;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::fleet::Fleet;
use crate::helpers::{is_dry_run, FILE, R2};

/// A fleet whose daemon admits `concurrency` canaries at once, each holding its place for
/// `hold` at most.
async fn gated(hosts: usize, concurrency: u32, hold: Duration) -> Fleet {
    Fleet::spawn_with(hosts, |engine| {
        engine.start_concurrency = concurrency;
        engine.start_hold = hold;
    })
    .await
}

impl Fleet {
    async fn start_canary(&self, host: &str) -> String {
        let plan = json!({"host": host, "file": FILE, "service": R2, "tag": "v0.0.452",
            "reason": "admission test"});
        let (status, body) = self.post("/v1/rollouts", &plan).await;
        assert_eq!(status, 201, "plan accepted: {body}");
        body["id"].as_str().expect("id").to_owned()
    }

    async fn rollout(&self, id: &str) -> RolloutOut {
        let r: Value = self.get(&format!("/v1/rollouts/{id}")).await;
        serde_json::from_value(r).expect("rollout")
    }

    /// Polls until the rollout is terminal (bounded: 400 × 50 ms).
    async fn wait_rollout(&self, id: &str) -> RolloutOut {
        for _ in 0..400 {
            let r = self.rollout(id).await;
            if matches!(r.status.as_str(), "succeeded" | "failed" | "aborted") {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("rollout {id} did not finish: {:#?}", self.rollout(id).await);
    }

    /// When the host received its first compose-manager call, and its real `up`.
    fn first_call_and_up(&self, host: &str) -> (DateTime<Utc>, DateTime<Utc>) {
        let calls = self.sim(host).calls();
        let first = calls.iter().map(|c| c.at).min().expect("a call");
        let up = calls
            .iter()
            .find(|c| c.path.starts_with("/compose/up") && !is_dry_run(c))
            .map(|c| c.at)
            .expect("an up");
        (first, up)
    }
}

/// One at a time: each canary's first call to its host comes after the previous canary's `up`
/// (it gave its place back at its health wait), although every host answers its `down` slowly
/// enough that canaries not queued would all have sent their first calls together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_started_together_take_their_first_steps_one_at_a_time_in_arrival_order() {
    let gated = gated(3, 1, Duration::from_secs(30)).await;
    for (_, sim) in &gated.sims {
        sim.faults()
            .delay_answer(SimOp::Down, Duration::from_millis(300), 1);
    }
    let mut ids = Vec::new();
    for host in ["gpu01", "gpu02", "gpu03"] {
        ids.push(gated.start_canary(host).await);
        // Its task takes its place in the queue long before the next one arrives (without the
        // gate, the next one's first call would still come well before this one's `up`).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ids {
        let r = gated.wait_rollout(id).await;
        assert_eq!(r.status, "succeeded", "{r:#?}");
    }
    let mut times: Vec<(DateTime<Utc>, DateTime<Utc>, &str)> = ["gpu01", "gpu02", "gpu03"]
        .into_iter()
        .map(|host| {
            let (first, up) = gated.first_call_and_up(host);
            (first, up, host)
        })
        .collect();
    times.sort();
    let order: Vec<&str> = times.iter().map(|t| t.2).collect();
    assert_eq!(order, ["gpu01", "gpu02", "gpu03"], "arrival order");
    for pair in times.windows(2) {
        let ((_, up, before), (first, _, after)) = (pair[0], pair[1]);
        assert!(
            first >= up,
            "{after}'s first call ({first}) came before {before}'s up ({up}): not one at a time"
        );
    }
}

/// A canary queued behind another is aborted while it waits: it ends `aborted` at once and
/// its host never hears from canaryd, while the canary ahead still holds its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_aborted_while_queued_ends_at_once_having_sent_nothing() {
    let gated = gated(2, 1, Duration::from_secs(60)).await;
    gated.sim("gpu01").faults().stall_stream(SimOp::Down);
    let ahead = gated.start_canary("gpu01").await;
    for _ in 0..200 {
        if gated.sim("gpu01").faults().stalled_streams() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        gated.sim("gpu01").faults().stalled_streams(),
        1,
        "the first canary's down is held"
    );
    let queued = gated.start_canary("gpu02").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(gated.rollout(&queued).await.status, "pending", "it queues");
    let (status, body) = gated
        .post(
            &format!("/v1/rollouts/{queued}/abort"),
            &json!({"reason": "not now"}),
        )
        .await;
    assert_eq!(status, 200, "abort accepted: {body}");
    let r = gated.wait_rollout(&queued).await;
    assert_eq!(r.status, "aborted", "{r:#?}");
    assert!(
        gated.sim("gpu02").calls().is_empty(),
        "the queued canary sent nothing: {:?}",
        gated.sim("gpu02").calls()
    );
    assert_eq!(
        gated.rollout(&ahead).await.status,
        "running",
        "the one ahead still runs"
    );
    gated.sim("gpu01").faults().release_stalls();
    let r = gated.wait_rollout(&ahead).await;
    assert_eq!(r.status, "succeeded", "{r:#?}");
}
