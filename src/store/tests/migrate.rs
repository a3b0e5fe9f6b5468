//! A database written by an older canaryd migrates with its rows kept: built at an older
//! migration, filled through raw SQL (the store's queries speak the newest schema), opened.

use std::borrow::Cow;
use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::at;
use crate::domain::audit::AuditKind;
use crate::domain::release::TargetOutcome;
use crate::domain::state::{DeploymentSource, RolloutStatus};
use crate::store::{fmt_time, AuditEntry, Store, MIGRATOR};

/// The migrations up to `version`, as a database last opened by that canaryd has them.
fn migrator_up_to(version: i64) -> Migrator {
    let migrations: Vec<_> = MIGRATOR
        .iter()
        .filter(|m| m.version <= version)
        .cloned()
        .collect();
    assert!(
        migrations.iter().any(|m| m.version == version),
        "no migration {version}"
    );
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

/// A database at migration `version` holding one failed canary of h1/r2 (a step, an attempt,
/// three audit events, a deployment, a notification), whose audit counter is past its rows
/// (events 4 to 10 were purged).
async fn old_database(path: &std::path::Path, version: i64) {
    let options = SqliteConnectOptions::from_str("sqlite://")
        .expect("options")
        .filename(path)
        .create_if_missing(true)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("old database");
    migrator_up_to(version)
        .run(&pool)
        .await
        .expect("old migrations");
    let t = |s| fmt_time(at(s));
    let statements = [
        format!(
            "insert into rollout (rollout_id, kind, status, host, file, service, tag, runbook, \
             actor, reason, env_sha256, on_failure, created_at, started_at, finished_at, \
             error_code) values ('ro_1', 'canary', 'failed', 'h1', 'prod/a.yaml', 'r2', 'v2', \
             'single-replica-canary', 'alice', 'test', 'sha', 'halt', '{}', '{}', '{}', \
             'compose_failed')",
            t(0),
            t(1),
            t(3)
        ),
        format!(
            "insert into step (step_id, rollout_id, position, name, kind, status, started_at, \
             finished_at) values ('st_1', 'ro_1', 0, 'up', 'up', 'failed', '{}', '{}')",
            t(1),
            t(2)
        ),
        format!(
            "insert into step_attempt (attempt_id, step_id, rollout_id, n, endpoint, started_at, \
             outcome) values ('at_1', 'st_1', 'ro_1', 1, '/docker/up', '{}', 'not_sent')",
            t(1)
        ),
        format!(
            "insert into audit_event (seq, occurred_at, rollout_id, step_name, actor, kind, \
             from_state, to_state) values \
             (1, '{0}', 'ro_1', null, 'alice', 'rollout_created', null, 'pending'), \
             (2, '{1}', 'ro_1', 'up', 'canaryd', 'step_failed', 'running', 'failed'), \
             (3, '{2}', 'ro_1', null, 'canaryd', 'rollout_failed', 'running', 'failed'), \
             (10, '{2}', null, null, 'canaryd', 'retention_purged', null, null)",
            t(0),
            t(2),
            t(3)
        ),
        "delete from audit_event where seq = 10".to_owned(),
        format!(
            "insert into deployment (deployment_id, host, service, file, tag, source, \
             deployed_at) values ('de_1', 'h1', 'r2', 'prod/a.yaml', 'v1', 'baseline', '{}')",
            t(0)
        ),
        format!(
            "insert into outbox (outbox_id, audit_seq, event, rollout_id, payload, created_at) \
             values ('ob_1', 3, 'replica_left_down', 'ro_1', '{{}}', '{}')",
            t(3)
        ),
    ];
    for sql in statements {
        sqlx::query(&sql)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    pool.close().await;
}

async fn pragma_rows(store: &Store, sql: &str) -> Vec<String> {
    let rows: Vec<(String,)> = sqlx::query_as(sql)
        .fetch_all(store.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter().map(|(v,)| v).collect()
}

/// The error of a statement the database must refuse.
async fn refused(store: &Store, sql: &str) -> String {
    let e = store.write_one(sql, |q| q).await.expect_err(sql);
    e.to_string()
}

#[tokio::test]
async fn a_database_at_migration_7_migrates_with_its_rows_and_audit_counter_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("canaryd.db");
    old_database(&path, 7).await;

    let store = Store::open(&path).await.expect("migrates");

    let rollout = store
        .get_rollout("ro_1")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(rollout.status, RolloutStatus::Failed);
    assert_eq!(store.steps("ro_1").await.expect("steps").len(), 1);
    let events: Vec<(i64, AuditKind)> = store
        .audit_events("ro_1", 0)
        .await
        .expect("events")
        .into_iter()
        .map(|e| (e.seq, e.kind))
        .collect();
    assert_eq!(
        events,
        [
            (1, AuditKind::RolloutCreated),
            (2, AuditKind::StepFailed),
            (3, AuditKind::RolloutFailed),
        ]
    );
    let deployments = store.deployments("h1", "r2").await.expect("deployments");
    assert_eq!(deployments.len(), 1);
    assert_eq!(deployments[0].source, DeploymentSource::Baseline);

    // A purged event's seq is not handed out again.
    store
        .audit(&AuditEntry::new(at(4), "alice", AuditKind::AbortRequested).rollout("ro_1"))
        .await
        .expect("appended");
    let last = store.audit_events("ro_1", 3).await.expect("events");
    assert_eq!(last.iter().map(|e| e.seq).collect::<Vec<_>>(), [11]);

    // The kind is checked now; the index and the foreign key are still there.
    let bogus = refused(
        &store,
        "insert into audit_event (occurred_at, actor, kind) \
         values ('2026-01-01T00:00:00Z', 'x', 'rollout_exploded')",
    )
    .await;
    assert!(
        bogus.contains("CHECK"),
        "an unknown kind is refused: {bogus}"
    );
    let orphan = refused(
        &store,
        "insert into audit_event (occurred_at, rollout_id, actor, kind) \
         values ('2026-01-01T00:00:00Z', 'ro_none', 'x', 'rollout_created')",
    )
    .await;
    assert!(
        orphan.contains("FOREIGN KEY"),
        "an event of no rollout is refused: {orphan}"
    );
    assert!(
        pragma_rows(&store, "select name from pragma_index_list('audit_event')")
            .await
            .contains(&"audit_event_rollout_idx".to_owned())
    );
    assert_eq!(
        pragma_rows(&store, "select \"table\" from pragma_foreign_key_check").await,
        Vec::<String>::new()
    );
    assert_eq!(
        pragma_rows(
            &store,
            "select name from sqlite_master where name like '%_new'"
        )
        .await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_database_at_migration_13_migrates_its_releases_and_ends_unstarted_targets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("canaryd.db");
    {
        let options = SqliteConnectOptions::from_str("sqlite://")
            .expect("options")
            .filename(&path)
            .create_if_missing(true)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("old database");
        migrator_up_to(13).run(&pool).await.expect("old migrations");
        let t = |s| fmt_time(at(s));
        // A failed release (its canary failed, its second target never started), and a running
        // one.
        let statements = [
            format!(
                "insert into rollout (rollout_id, kind, status, host, file, service, tag, runbook, \
                 actor, reason, env_sha256, on_failure, created_at) values ('ro_1', 'canary', \
                 'failed', 'h1', 'prod/a.yaml', 'r2', 'v2', 'single-replica-canary', 'alice', \
                 'test', 'sha', 'rollback', '{}')",
                t(6)
            ),
            format!(
                "insert into release (release_id, status, actor, reason, file, tag, runbook, \
                 max_parallel_hosts, on_failure, created_at) values \
                 ('rel_1', 'failed', 'alice', 'promote', 'prod/a.yaml', 'v2', 'single-replica-canary', 1, 'halt', '{0}'), \
                 ('rel_2', 'running', 'alice', 'promote', 'prod/a.yaml', 'v3', 'single-replica-canary', 1, 'halt', '{0}')",
                t(5)
            ),
            "insert into release_target (release_id, position, host, service, plan, rollout_id) values \
             ('rel_1', 0, 'h1', 'r2', '{}', 'ro_1'), ('rel_1', 1, 'h1', 'r1', '{}', null), \
             ('rel_2', 0, 'h1', 'r2', '{}', null)"
                .to_owned(),
            format!(
                "insert into release_event (seq, release_id, occurred_at, actor, kind) values \
                 (7, 'rel_1', '{0}', 'alice', 'release_created'), (8, 'rel_1', '{0}', 'canaryd', 'release_failed')",
                t(5)
            ),
        ];
        for sql in statements {
            sqlx::query(&sql)
                .execute(&pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        pool.close().await;
    }

    let store = Store::open(&path).await.expect("migrates");

    let failed = store
        .get_release("rel_1")
        .await
        .expect("read")
        .expect("kept");
    let outcomes: Vec<Option<TargetOutcome>> = failed.targets.iter().map(|t| t.outcome).collect();
    assert_eq!(outcomes, [None, Some(TargetOutcome::NotStarted)]);
    assert_eq!(failed.targets[0].rollout_id.as_deref(), Some("ro_1"));
    let running = store
        .get_release("rel_2")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(
        running.targets[0].outcome, None,
        "a running release's target still waits"
    );
    let seqs: Vec<i64> = store
        .release_events("rel_1")
        .await
        .expect("events")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [7, 8]);
    // The counter continues past the kept events; the new kind is accepted, an outcome on a
    // target with a rollout is not.
    store
        .end_unstarted_targets("rel_1")
        .await
        .expect("nothing left to end");
    store
        .write_one(
            "insert into release_event (release_id, occurred_at, actor, kind) \
             values ('rel_2', '2026-01-01T00:00:00Z', 'canaryd', 'target_already_current')",
            |q| q,
        )
        .await
        .expect("the new kind");
    assert_eq!(
        store.release_events("rel_2").await.expect("events")[0].seq,
        9
    );
    let both = refused(
        &store,
        "update release_target set outcome = 'not_started' where release_id = 'rel_1' and position = 0",
    )
    .await;
    assert!(both.contains("CHECK"), "{both}");
    assert_eq!(
        pragma_rows(&store, "select \"table\" from pragma_foreign_key_check").await,
        Vec::<String>::new()
    );
}
