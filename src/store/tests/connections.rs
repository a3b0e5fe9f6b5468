//! The store's connections: one that writes, several that only read.

use chrono::Utc;

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
    let e = sqlx::query("update rollout set touched_replica = 1 where rollout_id = 'r1'")
        .execute(&mut *store.read().await.expect("reader"))
        .await
        .expect_err("the engine's reader is query_only");
    assert!(e.to_string().contains("readonly"), "{e}");
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(!r.touched_replica, "the refused updates changed nothing");
    let step = &store.steps("r1").await.expect("steps")[0];
    store
        .begin_attempt(step, "compose/down", Utc::now(), true)
        .await
        .expect("written by the writer");
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(
        r.touched_replica,
        "the readers see what the writer committed"
    );
}

/// Many tasks write at once, each transaction reading a counter and writing it back one
/// higher: every increment lands (the writer serves one transaction at a time, in turn), and
/// none fails on a busy database.
#[tokio::test]
async fn concurrent_writes_all_land_one_transaction_at_a_time() {
    let (_dir, store) = temp_store().await;
    store
        .create_rollout(&rollout("r1", "gpu01", "svc-r2", 0), &steps())
        .await
        .expect("created");
    let n = 40;
    let writes = (0..n).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .write(|mut db| async move {
                    let (attempts,): (i64,) = sqlx::query_as(
                        "select attempts from step where rollout_id = 'r1' and position = 0",
                    )
                    .fetch_one(&mut *db)
                    .await?;
                    sqlx::query(
                        "update step set attempts = ? where rollout_id = 'r1' and position = 0",
                    )
                    .bind(attempts + 1)
                    .execute(&mut *db)
                    .await?;
                    db.commit(()).await
                })
                .await
        })
    });
    for w in futures_util::future::join_all(writes).await {
        w.expect("task").expect("every write lands");
    }
    let steps = store.steps("r1").await.expect("steps");
    assert_eq!(steps[0].attempts, n, "no increment lost");
}

/// Once the store is closed, a write fails with an error and changes nothing.
#[tokio::test]
async fn a_write_after_close_fails() {
    let (dir, store) = temp_store().await;
    store
        .create_rollout(&rollout("r1", "gpu01", "svc-r2", 0), &steps())
        .await
        .expect("created");
    let step = &store.steps("r1").await.expect("steps")[0];
    store.close().await;
    let e = store
        .begin_attempt(step, "compose/down", Utc::now(), true)
        .await
        .expect_err("closed");
    assert!(e.to_string().contains("closed"), "{e}");
    let store = crate::store::Store::open(&dir.path().join("canaryd.db"))
        .await
        .expect("reopen");
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(!r.touched_replica, "the refused write changed nothing");
}
