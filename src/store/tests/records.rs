//! Deployments, the history query, the outbox, retention and replicas left down.

use std::collections::BTreeMap;

use chrono::Duration;
use sqlx::ConnectOptions;

use super::{apply, at, change, create, rollout, temp_store};
use crate::domain::state::{DeploymentSource, RolloutEvent, RolloutStatus};
use crate::store::{fmt_time, NewDeployment, RolloutFilter, RunningState, Store};

fn deployment(tag: &str, s: i64, rollout_id: Option<&str>) -> NewDeployment {
    NewDeployment {
        host: "h1".into(),
        service: "r2".parse().expect("a valid name"),
        file: "prod/a.yaml".parse().expect("a valid name"),
        tag: tag.parse().expect("a valid name"),
        env_overrides: BTreeMap::new(),
        env_sha256: None,
        commit: None,
        file_sha256: None,
        image: None,
        source: if rollout_id.is_some() {
            DeploymentSource::Rollout
        } else {
            DeploymentSource::Baseline
        },
        rollout_id: rollout_id.map(str::to_owned),
        deployed_at: at(s),
        deployed_as: None,
    }
}

/// A rollout of h1/r2 that succeeds at `s + 1` and records `tag`.
async fn deploy(store: &Store, id: &str, tag: &str, s: i64) {
    create(store, &rollout(id, "h1", "r2", s)).await;
    apply(store, id, RolloutEvent::Start, s).await;
    store
        .succeed_rollout(
            id,
            &change(RolloutEvent::Succeed, s + 1),
            &deployment(tag, s + 1, Some(id)),
        )
        .await
        .expect("succeeded");
}

fn running(tag: &str) -> RunningState {
    RunningState {
        file: "prod/a.yaml".parse().expect("a valid name"),
        tag: tag.parse().expect("a valid name"),
        env_overrides: BTreeMap::new(),
    }
}

#[tokio::test]
async fn deployments_are_recorded_newest_first_and_a_baseline_only_once() {
    let (_dir, store) = temp_store().await;
    store
        .record_baselines(&[deployment("v0", 0, None)])
        .await
        .expect("baseline");
    store
        .record_baselines(&[deployment("v00", 1, None)])
        .await
        .expect("ignored");
    deploy(&store, "ro_1", "v1", 10).await;
    deploy(&store, "ro_2", "v2", 20).await;
    let tags: Vec<String> = store
        .deployments("h1", "r2")
        .await
        .expect("read")
        .into_iter()
        .map(|d| d.tag.to_string())
        .collect();
    assert_eq!(tags, ["v2", "v1", "v0"]);
    let recent = store.recent_deployments("h1", "r2", 2).await.expect("read");
    assert_eq!(recent.len(), 2);
    assert_eq!(
        store
            .get_rollout("ro_2")
            .await
            .expect("read")
            .map(|r| r.status),
        Some(RolloutStatus::Succeeded)
    );
    let of = store
        .deployment_of("ro_1")
        .await
        .expect("read")
        .expect("found");
    assert_eq!(of.tag, "v1");
    assert!(store.deployment_of("ro_x").await.expect("read").is_none());
    let v1 = store
        .deployment_with_tag("h1", "r2", "v1")
        .await
        .expect("read");
    assert_eq!(v1.map(|d| d.rollout_id), Some(Some("ro_1".to_owned())));
    assert!(store
        .deployment_with_tag("h1", "r1", "v1")
        .await
        .expect("read")
        .is_none());
}

/// A snapshot's baselines go in together: each replica without a row gets one, a replica
/// that has one keeps it, and a second call with every replica recorded writes nothing.
#[tokio::test]
async fn baselines_are_recorded_together_each_only_for_a_replica_without_one() {
    let (dir, store) = temp_store().await;
    deploy(&store, "ro_1", "v1", 10).await;
    let r1 = NewDeployment {
        service: "r1".parse().expect("a valid name"),
        ..deployment("v0", 0, None)
    };
    let r2 = deployment("v0", 0, None);
    store
        .record_baselines(&[r1.clone(), r2.clone()])
        .await
        .expect("baselines");
    let tags = |service: &'static str| {
        let store = store.clone();
        async move {
            let all = store.deployments("h1", service).await.expect("read");
            all.into_iter()
                .map(|d| (d.tag, d.source))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        tags("r1").await,
        [(
            "v0".parse().expect("a valid name"),
            DeploymentSource::Baseline
        )]
    );
    assert_eq!(
        tags("r2").await,
        [(
            "v1".parse().expect("a valid name"),
            DeploymentSource::Rollout
        )],
        "r2 was deployed by canaryd: no baseline"
    );
    // Another process holds the database's write lock: a write would wait for it and fail.
    let mut other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("canaryd.db"))
        .connect()
        .await
        .expect("open");
    sqlx::query("begin immediate")
        .execute(&mut other)
        .await
        .expect("write lock");
    store
        .record_baselines(&[r1, r2])
        .await
        .expect("nothing to record: no write");
    sqlx::query("rollback")
        .execute(&mut other)
        .await
        .expect("released");
    assert_eq!(tags("r1").await.len(), 1);
}

#[tokio::test]
async fn the_prior_deployment_is_the_newest_that_differs_from_what_runs() {
    let (_dir, store) = temp_store().await;
    store
        .record_baselines(&[deployment("v0", 0, None)])
        .await
        .expect("baseline");
    deploy(&store, "ro_1", "v1", 10).await;
    deploy(&store, "ro_2", "v2", 20).await;
    let cases = [
        (running("v2"), None, Some("v1")),
        (running("v1"), None, Some("v2")),
        (running("v2"), Some("v0"), Some("v0")),
        (running("v2"), Some("v2"), None),
        (running("v9"), Some("v7"), None),
    ];
    for (now, tag, expected) in cases {
        let prior = store
            .prior_deployment("h1", "r2", &now, tag)
            .await
            .expect("read");
        assert_eq!(prior.map(|d| d.tag).as_deref(), expected, "{now:?} {tag:?}");
    }
}

#[tokio::test]
async fn the_history_filters_and_pages_newest_first_without_repeats() {
    let (_dir, store) = temp_store().await;
    for n in 0..5 {
        let id = format!("ro_{n}");
        let host = if n % 2 == 0 { "h1" } else { "h2" };
        create(&store, &rollout(&id, host, "r2", n * 10)).await;
        apply(&store, &id, RolloutEvent::Fail, n * 10 + 1).await;
    }
    let ids = |rs: Vec<crate::store::Rollout>| rs.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let all = RolloutFilter {
        limit: 100,
        ..RolloutFilter::default()
    };
    assert_eq!(
        ids(store.list_rollouts(&all).await.expect("list")),
        ["ro_4", "ro_3", "ro_2", "ro_1", "ro_0"]
    );
    let h1 = RolloutFilter {
        host: Some("h1".into()),
        ..all.clone()
    };
    assert_eq!(
        ids(store.list_rollouts(&h1).await.expect("list")),
        ["ro_4", "ro_2", "ro_0"]
    );
    let running = RolloutFilter {
        status: Some(RolloutStatus::Running),
        ..all.clone()
    };
    assert!(store
        .list_rollouts(&running)
        .await
        .expect("list")
        .is_empty());
    let mut seen = Vec::new();
    let mut page = RolloutFilter {
        limit: 2,
        ..all.clone()
    };
    loop {
        let items = store.list_rollouts(&page).await.expect("page");
        let Some(last) = items.last() else { break };
        page.before = Some((fmt_time(last.created_at), last.id.clone()));
        seen.extend(ids(items));
    }
    assert_eq!(seen, ["ro_4", "ro_3", "ro_2", "ro_1", "ro_0"]);
    let csv = store.export_csv_page(&h1).await.expect("csv");
    assert_eq!(csv.rows, 3);
    assert_eq!(csv.text.lines().count(), 3, "{}", csv.text);
}

#[tokio::test]
async fn a_notification_is_enqueued_with_its_event_routed_to_each_webhook_and_delivered() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    assert!(
        store
            .unrouted_notifications(10)
            .await
            .expect("read")
            .is_empty(),
        "created notifies nothing"
    );
    apply(&store, "ro_1", RolloutEvent::Start, 1).await;
    let unrouted = store.unrouted_notifications(10).await.expect("read");
    assert_eq!(unrouted.len(), 1);
    assert_eq!(unrouted[0].event, "started");
    let id = unrouted[0].outbox_id.clone();
    store
        .route_notifications(&[(id.as_str(), &["ops", "chat"])], at(2))
        .await
        .expect("routed");
    assert!(store
        .unrouted_notifications(10)
        .await
        .expect("read")
        .is_empty());
    assert_eq!(store.next_delivery_at().await.expect("read"), Some(at(2)));
    let due = store.due_deliveries(at(2), 10).await.expect("due");
    assert_eq!(due.len(), 2);
    let payload: serde_json::Value = serde_json::from_str(&due[0].payload).expect("json");
    assert_eq!(payload["event"], "started");
    assert_eq!(payload["rollout"]["id"], "ro_1");
    for d in &due {
        store
            .claim_delivery(&d.outbox_id, &d.webhook, at(3), at(60))
            .await
            .expect("claimed");
    }
    assert!(
        store
            .due_deliveries(at(3), 10)
            .await
            .expect("due")
            .is_empty(),
        "claimed until the retry"
    );
    store
        .finish_delivery(&id, "ops", at(4), Ok(()))
        .await
        .expect("delivered");
    store
        .finish_delivery(&id, "chat", at(4), Err(("503".into(), false)))
        .await
        .expect("retry later");
    let retry = store.due_deliveries(at(60), 10).await.expect("due");
    assert_eq!(retry.len(), 1);
    assert_eq!((retry[0].webhook.as_str(), retry[0].attempts), ("chat", 1));
    store
        .finish_delivery(&id, "chat", at(61), Err(("503".into(), true)))
        .await
        .expect("given up");
    assert_eq!(
        store.delivery_counts().await.expect("counts"),
        [("delivered".to_owned(), 1), ("failed".to_owned(), 1)]
    );
}

#[tokio::test]
async fn retention_purges_old_terminal_rollouts_but_keeps_their_deployments_and_active_ones() {
    let (_dir, store) = temp_store().await;
    deploy(&store, "ro_old", "v1", 0).await;
    create(&store, &rollout("ro_live", "h1", "r2", 5)).await;
    let now = at(1) + Duration::days(8);
    let purged = store.purge_finished(now, 7).await.expect("purged");
    assert_eq!((purged.rollouts, purged.steps), (1, 3));
    assert!(store.get_rollout("ro_old").await.expect("read").is_none());
    assert!(store.get_rollout("ro_live").await.expect("read").is_some());
    let kept = store.deployments("h1", "r2").await.expect("read");
    assert_eq!(kept.len(), 1, "deployments are history");
    assert_eq!(kept[0].rollout_id, None, "only the link is lost");
    let again = store.purge_finished(now, 7).await.expect("purged");
    assert_eq!(again.rollouts, 0);
}

#[tokio::test]
async fn a_replica_left_down_stays_listed_until_a_later_rollout_of_it_succeeds() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    apply(&store, "ro_1", RolloutEvent::Start, 1).await;
    let mut down = change(RolloutEvent::Fail, 2);
    down.error = Some(("replica_left_down".into(), "no container".into()));
    let r = store
        .end_with_replica_left_down("ro_1", &down, &Default::default())
        .await
        .expect("ended");
    assert_eq!(r.status, RolloutStatus::Failed);
    let kinds: Vec<_> = store
        .audit_events("ro_1", 0)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(
        kinds.contains(&crate::domain::audit::AuditKind::ReplicaLeftDown),
        "{kinds:?}"
    );
    assert_eq!(
        store.replicas_left_down().await.expect("read"),
        [("h1".to_owned(), "r2".to_owned())]
    );
    deploy(&store, "ro_2", "v2", 10).await;
    assert!(store.replicas_left_down().await.expect("read").is_empty());
}

#[tokio::test]
async fn a_rename_is_kept_on_the_rollout_and_each_deployment_keeps_the_name_it_ran_under() {
    let (_dir, store) = temp_store().await;
    let old = NewDeployment {
        deployed_as: Some("r2-old".parse().expect("a valid name")),
        ..deployment("v1", 0, None)
    };
    store
        .record_baselines(std::slice::from_ref(&old))
        .await
        .expect("baseline");
    let mut new = rollout("ro_1", "h1", "r2", 1);
    new.replaces = Some(crate::domain::plan::Replaces {
        service: "r2-old".parse().expect("a name"),
        file: None,
        tag: Some("v1".parse().expect("a tag")),
    });
    create(&store, &new).await;
    let read = store
        .get_rollout("ro_1")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(read.replaced().map(|s| s.as_str()), Some("r2-old"));
    assert_eq!(read.replaces, new.replaces);
    assert_eq!(
        (read.target().as_str(), read.deploy_as.as_deref()),
        ("r2", None)
    );
    let listed = store
        .list_rollouts(&RolloutFilter::default())
        .await
        .expect("list");
    assert_eq!(listed[0].replaces, new.replaces, "the list reads it too");
    apply(&store, "ro_1", RolloutEvent::Start, 1).await;
    store
        .succeed_rollout(
            "ro_1",
            &change(RolloutEvent::Succeed, 2),
            &deployment("v2", 2, Some("ro_1")),
        )
        .await
        .expect("succeeded");
    let named = |name: &'static str| {
        let store = &store;
        async move {
            store
                .deployment_named("h1", "r2", name)
                .await
                .expect("query")
                .map(|d| (d.tag.clone(), d.name().to_owned()))
        }
    };
    assert_eq!(
        named("r2-old").await,
        Some((
            "v1".parse().expect("a valid name"),
            "r2-old".parse().expect("a valid name")
        ))
    );
    assert_eq!(
        named("r2").await,
        Some((
            "v2".parse().expect("a valid name"),
            "r2".parse().expect("a valid name")
        ))
    );
    assert_eq!(named("r2-other").await, None);
}

/// Deliveries go in the order of the audit events, whatever their times say: here the
/// rollout's failure is stamped a second before its start (two clocks read by different
/// tasks can do that; the same millisecond, the usual case, left the order to random ids).
#[tokio::test]
async fn deliveries_are_due_in_the_order_of_their_audit_events() {
    let (_dir, store) = temp_store().await;
    create(&store, &rollout("ro_1", "h1", "r2", 0)).await;
    apply(&store, "ro_1", RolloutEvent::Start, 5).await;
    apply(&store, "ro_1", RolloutEvent::Fail, 4).await;
    let unrouted = store.unrouted_notifications(10).await.expect("read");
    let routes: Vec<(&str, &[&str])> = unrouted
        .iter()
        .map(|n| (n.outbox_id.as_str(), &["ops"][..]))
        .collect();
    store
        .route_notifications(&routes, at(6))
        .await
        .expect("routed");
    let due = store.due_deliveries(at(6), 10).await.expect("due");
    let events: Vec<&str> = due.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(events, ["started", "failed"]);
}

/// A notifier pass routes its whole batch in one transaction: each notification gets its own
/// webhooks' deliveries and is marked routed; one that nobody listens to is routed with none.
#[tokio::test]
async fn a_batch_of_notifications_is_routed_together_each_to_its_own_webhooks() {
    let (_dir, store) = temp_store().await;
    for (id, host) in [("ro_1", "h1"), ("ro_2", "h2"), ("ro_3", "h3")] {
        create(&store, &rollout(id, host, "r2", 0)).await;
        apply(&store, id, RolloutEvent::Start, 1).await;
    }
    let unrouted = store.unrouted_notifications(10).await.expect("read");
    assert_eq!(unrouted.len(), 3);
    let ids: Vec<&str> = unrouted.iter().map(|n| n.outbox_id.as_str()).collect();
    let (ops, both, none): (&[&str], &[&str], &[&str]) = (&["ops"], &["ops", "chat"], &[]);
    store
        .route_notifications(&[(ids[0], ops), (ids[1], both), (ids[2], none)], at(2))
        .await
        .expect("routed");
    assert!(store
        .unrouted_notifications(10)
        .await
        .expect("read")
        .is_empty());
    let due = store.due_deliveries(at(2), 10).await.expect("due");
    let mut got: Vec<(&str, &str)> = due
        .iter()
        .map(|d| (d.outbox_id.as_str(), d.webhook.as_str()))
        .collect();
    got.sort_unstable();
    let mut want = vec![(ids[0], "ops"), (ids[1], "chat"), (ids[1], "ops")];
    want.sort_unstable();
    assert_eq!(got, want);
}
