//! Safety rule 14's check: a rollout ending without its target brought back says whether it
//! left the replica down, from `docker ps`, or from its own calls when the host cannot be read.

use super::super::left_down;
use super::{ended, Bench, R2};
use crate::compose::ComposeError;

const STEPS: &str = "  - {name: peers, kind: peers_healthy}\n  - {name: plan, kind: plan}\n  - {name: down, kind: down, timeout: 10s}\n  - {name: up, kind: up}\n";

#[tokio::test]
async fn a_replica_is_left_down_only_when_touched_and_not_running() {
    let bench = Bench::new(STEPS);
    let mut rollout = bench.rollout.clone();
    assert_eq!(
        left_down::check(&bench.host, &bench.store, &rollout).await,
        None,
        "never touched"
    );
    rollout.touched_replica = true;
    assert_eq!(
        left_down::check(&bench.host, &bench.store, &rollout).await,
        None,
        "touched, still running"
    );

    let end = bench.run(2, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(bench.host.id_of(R2), None, "r2 is down");
    let seen = left_down::check(&bench.host, &bench.store, &rollout)
        .await
        .expect("left down");
    assert_eq!(seen.seen_by, "docker ps", "{seen:?}");

    // The host cannot be read: the rollout's own down, with no up after it, says so.
    *bench.host.ps_error.lock().expect("ps") = Some(ComposeError::Timeout {
        endpoint: "docker/ps".to_owned(),
    });
    let seen = left_down::check(&bench.host, &bench.store, &rollout)
        .await
        .expect("left down");
    assert_eq!(seen.seen_by, "compose attempts", "{seen:?}");
    *bench.host.ps_error.lock().expect("ps") = None;

    // Brought back: running again.
    let end = bench.run(3, None).await;
    let (status, code, detail) = ended(&end);
    assert_eq!((status, code), ("succeeded", None), "{detail}");
    assert_eq!(
        left_down::check(&bench.host, &bench.store, &rollout).await,
        None,
        "running again"
    );
}
