//! Safety rule 14's check: a rollout ending without its target brought back says whether it
//! left the replica down, from `docker ps`.

use super::super::left_down;
use super::{ended, Bench};
use crate::config::sim::R2;

#[tokio::test]
async fn a_replica_is_left_down_only_when_touched_and_not_running() {
    let bench = Bench::new(
        "  - {name: peers, kind: peers_healthy}\n  - {name: plan, kind: plan}\n  - {name: down, kind: down, timeout: 10s}\n  - {name: up, kind: up}\n",
    ).await;
    let mut rollout = bench.rollout().await;
    assert!(!rollout.touched_replica);
    assert_eq!(
        left_down::check(bench.host(), bench.store(), &rollout).await,
        None,
        "never touched"
    );
    rollout.touched_replica = true;
    assert_eq!(
        left_down::check(bench.host(), bench.store(), &rollout).await,
        None,
        "touched, still running"
    );

    let end = bench.run(2, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    let rollout = bench.rollout().await;
    assert!(rollout.touched_replica, "the down marked the rollout");
    let seen = left_down::check(bench.host(), bench.store(), &rollout)
        .await
        .expect("left down");
    assert_eq!(seen["seen_by"], "docker ps", "{seen}");
    assert!(
        bench
            .sim
            .containers()
            .iter()
            .all(|c| c.service != R2 || c.state != "running"),
        "the sim's r2 is down"
    );
}
