//! Release targets that end without a rollout: `already_current` only when the replica's
//! recorded deployment is exactly what the target would deploy and nothing touched it since;
//! `not_started` with the release's end.

use std::collections::BTreeMap;

use super::{apply, at, change, create, rollout, temp_store};
use crate::domain::release::{ReleaseOnFailure, ReleaseStatus, TargetOutcome, SYSTEM_ACTOR};
use crate::domain::state::{DeploymentSource, RolloutEvent};
use crate::store::{NewDeployment, NewRelease, NewReleaseTarget, NewRollout, Store};

/// A rollout of h1/r2 (the fixture's file, tag v2, env and hash) that touches the replica and
/// succeeds at `s + 1`, recording its deployment.
async fn deploy(store: &Store, id: &str, s: i64) {
    let r = rollout(id, "h1", "r2", s);
    create(store, &r).await;
    apply(store, id, RolloutEvent::Start, s).await;
    touch(store, id).await;
    let d = NewDeployment {
        host: r.host,
        service: r.service,
        file: r.file,
        tag: r.tag,
        env_overrides: r.env_overrides,
        env_sha256: Some(r.env_sha256),
        commit: None,
        file_sha256: None,
        image: None,
        source: DeploymentSource::Rollout,
        rollout_id: Some(id.to_owned()),
        deployed_at: at(s + 1),
        deployed_as: None,
    };
    store
        .succeed_rollout(id, &change(RolloutEvent::Succeed, s + 1), &d)
        .await
        .expect("succeeded");
}

async fn touch(store: &Store, id: &str) {
    store
        .write_one(
            "update rollout set touched_replica = 1 where rollout_id = ?",
            |q| q.bind(id),
        )
        .await
        .expect("touched");
}

/// A running release of `n` targets, all h1/r2 (the store does not judge the list).
async fn running_release(store: &Store, id: &str, n: usize) {
    let new = NewRelease {
        id: id.into(),
        actor: "alice".into(),
        reason: "promote v2".into(),
        file: "prod/a.yaml".into(),
        tag: "v2".into(),
        runbook: "single-replica-canary".into(),
        max_parallel_hosts: 1,
        on_failure: ReleaseOnFailure::Halt,
        created_at: at(100),
        targets: (0..n)
            .map(|_| NewReleaseTarget {
                host: "h1".into(),
                service: "r2".into(),
                plan: serde_json::json!({}),
            })
            .collect(),
    };
    store.create_release(&new).await.expect("created");
    store
        .move_release(
            id,
            &[ReleaseStatus::Pending],
            ReleaseStatus::Running,
            SYSTEM_ACTOR,
            None,
            None,
            at(101),
        )
        .await
        .expect("running");
}

/// What target `position` would deploy: the fixture's rollout, changed by `edit`.
fn want(edit: impl FnOnce(&mut NewRollout)) -> NewRollout {
    let mut r = rollout("ro_new", "h1", "r2", 200);
    edit(&mut r);
    r
}

#[tokio::test]
async fn a_target_is_already_current_only_when_file_tag_env_and_hash_all_match() {
    let (_dir, store) = temp_store().await;
    deploy(&store, "ro_1", 0).await;
    running_release(&store, "rel_1", 5).await;
    let other = [
        want(|r| r.tag = "v3".parse().expect("a valid name")),
        want(|r| r.file = "prod/b.yaml".parse().expect("a valid name")),
        want(|r| r.env_overrides = BTreeMap::new()),
        want(|r| r.env_sha256 = "other".into()),
    ];
    for (position, w) in (1..).zip(&other) {
        let ended = store
            .end_target_if_current("rel_1", position, w, at(200))
            .await
            .expect("checked");
        assert_eq!(ended, None, "target {position}: {w:?}");
    }
    let ended = store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(200))
        .await
        .expect("checked");
    assert_eq!(ended.as_deref(), Some("ro_1"));
    let r = store
        .get_release("rel_1")
        .await
        .expect("read")
        .expect("one");
    let outcomes: Vec<Option<TargetOutcome>> = r.targets.iter().map(|t| t.outcome).collect();
    assert_eq!(
        outcomes,
        [Some(TargetOutcome::AlreadyCurrent), None, None, None, None]
    );
    // Once ended it is not ended again (nor could it be started).
    let again = store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(201))
        .await
        .expect("checked");
    assert_eq!(again, None);
    let events = store.release_events("rel_1").await.expect("events");
    let current: Vec<_> = events
        .iter()
        .filter(|e| e.kind.as_str() == "target_already_current")
        .collect();
    assert_eq!(current.len(), 1, "{events:?}");
    assert_eq!(current[0].detail["rollout_id"], "ro_1");
}

#[tokio::test]
async fn a_later_rollout_that_touched_the_replica_or_one_that_runs_means_not_current() {
    let (_dir, store) = temp_store().await;
    deploy(&store, "ro_1", 0).await;
    running_release(&store, "rel_1", 1).await;
    // Failed after a down or up, recording no deployment: the replica may run anything.
    create(&store, &rollout("ro_2", "h1", "r2", 10)).await;
    apply(&store, "ro_2", RolloutEvent::Start, 10).await;
    let ended = store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(200))
        .await
        .expect("checked");
    assert_eq!(ended, None, "a rollout of the replica runs");
    touch(&store, "ro_2").await;
    apply(&store, "ro_2", RolloutEvent::Fail, 11).await;
    let ended = store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(200))
        .await
        .expect("checked");
    assert_eq!(ended, None, "a failed rollout touched the replica since");
    // A later success records the deployment again: current.
    deploy(&store, "ro_3", 20).await;
    let ended = store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(200))
        .await
        .expect("checked");
    assert_eq!(ended.as_deref(), Some("ro_3"));
}

#[tokio::test]
async fn a_release_that_is_not_running_ends_no_target_already_current() {
    let (_dir, store) = temp_store().await;
    deploy(&store, "ro_1", 0).await;
    running_release(&store, "rel_1", 2).await;
    store
        .move_release(
            "rel_1",
            &[ReleaseStatus::Running],
            ReleaseStatus::Paused,
            "bob",
            Some("hold"),
            None,
            at(150),
        )
        .await
        .expect("paused");
    let ended = store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(200))
        .await
        .expect("checked");
    assert_eq!(ended, None);
}

#[tokio::test]
async fn an_ended_release_leaves_no_target_waiting() {
    let (_dir, store) = temp_store().await;
    deploy(&store, "ro_1", 0).await;
    running_release(&store, "rel_1", 3).await;
    store
        .end_target_if_current("rel_1", 0, &want(|_| {}), at(200))
        .await
        .expect("checked");
    let r = store
        .move_release(
            "rel_1",
            &[ReleaseStatus::Running],
            ReleaseStatus::Aborted,
            "bob",
            Some("wrong tag"),
            None,
            at(300),
        )
        .await
        .expect("aborted");
    let outcomes: Vec<Option<TargetOutcome>> = r.targets.iter().map(|t| t.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Some(TargetOutcome::AlreadyCurrent),
            Some(TargetOutcome::NotStarted),
            Some(TargetOutcome::NotStarted)
        ]
    );
    let events = store.release_events("rel_1").await.expect("events");
    let aborted = events.last().expect("events");
    assert_eq!(aborted.detail["not_started"], 2, "{aborted:?}");
    assert_eq!(store.end_unstarted_targets("rel_1").await.expect("ok"), 0);
}
