//! The store's connections: one that writes, several that only read (issue 17).

use super::{rollout, steps, temp_store};

#[tokio::test]
async fn a_write_sent_to_the_reading_connections_is_refused_and_changes_nothing() {
    let (_dir, store) = temp_store().await;
    store
        .create_rollout(&rollout("r1", "gpu01", "svc-r2", 0), &steps())
        .await
        .expect("created");
    let e = sqlx::query("update rollout set touched_replica = 1 where rollout_id = 'r1'")
        .execute(store.pool())
        .await
        .expect_err("the readers are query_only");
    assert!(e.to_string().contains("readonly"), "{e}");
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(!r.touched_replica, "the refused update changed nothing");
    store
        .mark_touched("r1")
        .await
        .expect("written by the writer");
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(
        r.touched_replica,
        "the readers see what the writer committed"
    );
}

#[tokio::test]
async fn concurrent_writes_all_land_through_the_one_writing_connection() {
    let (_dir, store) = temp_store().await;
    let n = 40;
    for i in 0..n {
        let id = format!("r{i}");
        store
            .create_rollout(&rollout(&id, &format!("gpu{i:02}"), "svc-r2", i), &steps())
            .await
            .expect("created");
    }
    let writes = (0..n).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { store.mark_touched(&format!("r{i}")).await })
    });
    for w in futures_util::future::join_all(writes).await {
        w.expect("task").expect("every write lands");
    }
    assert_eq!(store.writer().size(), 1, "one writing connection");
    for i in 0..n {
        let r = store.get_rollout(&format!("r{i}")).await.expect("read");
        assert!(r.expect("exists").touched_replica, "r{i}");
    }
}
