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
                    let (attempts,): (i64,) = db
                        .query("select attempts from step where rollout_id = 'r1' and position = 0")
                        .fetch_one()
                        .await?;
                    db.query(
                        "update step set attempts = ? where rollout_id = 'r1' and position = 0",
                    )
                    .bind(attempts + 1);
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

/// A write whose future is dropped in the middle of its transaction (after a statement, before
/// `COMMIT`) keeps nothing of it, and the next write finds the writer free and outside any
/// transaction.
#[tokio::test]
async fn a_write_cancelled_mid_transaction_keeps_nothing_and_frees_the_writer() {
    let (_dir, store) = temp_store().await;
    store
        .create_rollout(&rollout("r1", "gpu01", "svc-r2", 0), &steps())
        .await
        .expect("created");
    let (inside, reached) = tokio::sync::oneshot::channel::<()>();
    let inside = std::sync::Mutex::new(Some(inside));
    let cancelled = store.write(|mut db| {
        let inside = inside.lock().expect("lock").take();
        async move {
            // Sent (not only queued): the update ran inside the open transaction.
            db.query("update rollout set touched_replica = 1 where rollout_id = 'r1'")
                .execute()
                .await?;
            if let Some(inside) = inside {
                let _ = inside.send(());
            }
            std::future::pending::<()>().await;
            db.commit(()).await
        }
    });
    tokio::select! {
        _ = cancelled => panic!("the write never commits"),
        _ = reached => {}
    }
    // The write's future is dropped here, between its update and its commit.
    let step = &store.steps("r1").await.expect("steps")[0];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        store.begin_attempt(step, "compose/plan", Utc::now(), false),
    )
    .await
    .expect("the writer is free again")
    .expect("the next write commits");
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(!r.touched_replica, "the cancelled update was rolled back");
    assert_eq!(store.attempts("r1").await.expect("attempts").len(), 1);
}

/// A transaction's queued statements go out together, each taking its own arguments in
/// order; a read in the middle sees what was queued before it; a queued statement that
/// fails fails the commit and nothing of the transaction is kept.
#[tokio::test]
async fn queued_statements_bind_in_order_and_a_failing_one_keeps_nothing() {
    let (_dir, store) = temp_store().await;
    store
        .create_rollout(&rollout("r1", "gpu01", "svc-r2", 0), &steps())
        .await
        .expect("created");
    let seen = store
        .write(|mut db| async move {
            db.query("update step set attempts = ? where rollout_id = ? and position = ?")
                .bind(7_i64)
                .bind("r1")
                .bind(0_i64);
            db.query("update rollout set touched_replica = 1 where rollout_id = ?")
                .bind("r1");
            db.query("update step set detail = ? where rollout_id = ? and position = ?")
                .bind("{\"n\":1}")
                .bind("r1")
                .bind(0_i64);
            let (attempts, detail): (i64, String) = db
                .query("select attempts, detail from step where rollout_id = ? and position = 0")
                .bind("r1")
                .fetch_one()
                .await?;
            db.commit((attempts, detail)).await
        })
        .await
        .expect("committed");
    assert_eq!(seen, (7, "{\"n\":1}".to_string()));
    let r = store.get_rollout("r1").await.expect("read").expect("r1");
    assert!(r.touched_replica);

    let e = store
        .write(|mut db| async move {
            db.query("update step set attempts = 99 where rollout_id = ?")
                .bind("r1");
            db.query("update rollout set status = 'sideways' where rollout_id = ?")
                .bind("r1");
            db.commit(()).await
        })
        .await
        .expect_err("not a status");
    assert!(e.to_string().contains("CHECK"), "{e}");
    assert_eq!(store.steps("r1").await.expect("steps")[0].attempts, 7);
    // The writer is free and outside any transaction.
    store
        .write_one(
            "update step set attempts = 8 where rollout_id = 'r1'",
            |q| q,
        )
        .await
        .expect("the next write commits");
}

/// SQLite's own errors, as sqlx reports them, are told apart: the storage refusing a write
/// (here `SQLITE_READONLY`, from a `query_only` connection) is a storage fault a rollout's
/// task waits out; a refused change (a CHECK) is not.
#[tokio::test]
async fn sqlite_errors_from_sqlx_are_classified_as_storage_faults_or_refusals() {
    let (_dir, store) = temp_store().await;
    store
        .create_rollout(&rollout("r1", "gpu01", "svc-r2", 0), &steps())
        .await
        .expect("created");
    let readonly = sqlx::query("update rollout set touched_replica = 1")
        .execute(store.pool())
        .await
        .expect_err("the pool is query_only");
    let readonly = crate::store::StoreError::from(readonly);
    assert!(
        crate::store::health::is_storage_fault(&readonly),
        "{readonly}"
    );
    let check = store
        .write_one("update rollout set status = 'sideways'", |q| q)
        .await
        .expect_err("not a status");
    assert!(check.to_string().contains("CHECK"), "{check}");
    assert!(!crate::store::health::is_storage_fault(&check), "{check}");
}
