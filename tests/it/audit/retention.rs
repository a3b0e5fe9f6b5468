//! Retention with a fixed `now`: old terminal rollouts go, deployments and active ones stay.

use std::collections::BTreeMap;

use canaryd::domain::audit::AuditKind;
use canaryd::domain::state::{DeploymentSource, RolloutEvent};
use canaryd::store::{NewDeployment, RolloutChange, Store};

use super::{at, insert, Row};

#[tokio::test]
async fn retention_deletes_old_finished_rollouts_and_keeps_deployments_and_active_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(&dir.path().join("r.db")).await.expect("store");
    let day = |d: i64| at(0) + chrono::Duration::days(d);

    // Old, succeeded, with a deployment and an attempt.
    let mut old_ok = Row::new(day(0));
    old_ok.host = "h1";
    let old_ok = insert(
        &store,
        &Row {
            outcome: RolloutEvent::Start,
            ..old_ok
        },
    )
    .await;
    let steps = store.steps(&old_ok).await.expect("steps");
    store
        .begin_attempt(&steps[1], "/compose/up", day(0), false)
        .await
        .expect("attempt");
    let deployment = NewDeployment {
        host: "h1".into(),
        service: "svc-a".parse().expect("a valid name"),
        file: "prod/x.yaml".parse().expect("a valid name"),
        tag: "v1".parse().expect("a valid name"),
        env_overrides: BTreeMap::new(),
        env_sha256: None,
        commit: None,
        file_sha256: None,
        image: None,
        source: DeploymentSource::Rollout,
        rollout_id: Some(old_ok.clone()),
        deployed_at: day(0),
        deployed_as: None,
    };
    let change = RolloutChange {
        event: RolloutEvent::Succeed,
        actor: "canaryd".into(),
        error: None,
        detail: Default::default(),
        at: day(0),
    };
    store
        .succeed_rollout(&old_ok, &change, &deployment)
        .await
        .expect("succeeded");
    // Old and failed; recent; and an old one still running.
    let old_failed = insert(
        &store,
        &Row {
            host: "h2",
            outcome: RolloutEvent::Fail,
            ..Row::new(day(1))
        },
    )
    .await;
    let recent = insert(
        &store,
        &Row {
            host: "h3",
            ..Row::new(day(95))
        },
    )
    .await;
    let running = insert(
        &store,
        &Row {
            host: "h4",
            outcome: RolloutEvent::Start,
            ..Row::new(day(2))
        },
    )
    .await;

    let purged = store.purge_finished(day(100), 90).await.expect("purge");
    assert_eq!(purged.rollouts, 2, "{purged:?}");
    assert_eq!(purged.attempts, 1);
    assert_eq!(purged.steps, 4);
    for gone in [&old_ok, &old_failed] {
        assert!(
            store.get_rollout(gone).await.expect("read").is_none(),
            "{gone} deleted"
        );
        assert!(store.steps(gone).await.expect("read").is_empty());
        assert!(store.attempts(gone).await.expect("read").is_empty());
        assert!(store.audit_events(gone, 0).await.expect("read").is_empty());
    }
    for kept in [&recent, &running] {
        assert!(
            store.get_rollout(kept).await.expect("read").is_some(),
            "{kept} kept"
        );
        assert!(!store.audit_events(kept, 0).await.expect("read").is_empty());
    }
    let deployments = store.deployments("h1", "svc-a").await.expect("read");
    assert_eq!(
        deployments.len(),
        1,
        "the deployment stays: it is rollback history"
    );
    assert_eq!(deployments[0].tag, "v1");
    assert_eq!(
        deployments[0].rollout_id, None,
        "only the link to the purged rollout goes"
    );
    let all = store.audit_events_after(0).await.expect("read");
    let note = all
        .iter()
        .find(|e| e.kind == AuditKind::RetentionPurged)
        .expect("purge audited");
    assert_eq!(note.detail["rollouts"], 2);

    let again = store.purge_finished(day(100), 90).await.expect("purge");
    assert_eq!(again.rollouts, 0, "nothing left to delete");
    // Without a retention setting nothing runs at all.
    assert!(canaryd::store::spawn_retention(store.clone(), None).is_none());
}
