-- audit_event.kind gets the CHECK every other stored enum has: the list of `AuditKind`
-- (`store/checks.rs` compares the two). SQLite cannot add a CHECK to a column, so the table is
-- rebuilt in place, its rows, its index and its AUTOINCREMENT counter kept (a purged event's
-- `seq` is never handed out again: SSE clients resume by it and the outbox points at it).
-- Nothing references audit_event; its own foreign key to rollout is declared again.
create table audit_event_new (
    seq          integer primary key autoincrement,
    occurred_at  text not null,
    rollout_id   text references rollout (rollout_id),
    step_name    text,
    actor        text not null,
    kind         text not null check (kind in ('rollout_created', 'rollout_pending', 'rollout_running', 'rollout_succeeded', 'rollout_failed', 'rollout_aborted', 'rollout_resumed', 'step_pending', 'step_running', 'step_succeeded', 'step_failed', 'step_skipped', 'step_aborted', 'abort_requested', 'approval_requested', 'approved', 'rollback_linked', 'replica_left_down', 'deployment_recorded', 'retention_purged')),
    from_state   text,
    to_state     text,
    detail       text not null default '{}'
);
insert into audit_event_new (seq, occurred_at, rollout_id, step_name, actor, kind, from_state, to_state, detail)
    select seq, occurred_at, rollout_id, step_name, actor, kind, from_state, to_state, detail from audit_event;
delete from sqlite_sequence where name = 'audit_event_new';
insert into sqlite_sequence (name, seq) select 'audit_event_new', seq from sqlite_sequence where name = 'audit_event';
drop table audit_event;
alter table audit_event_new rename to audit_event;
create index audit_event_rollout_idx on audit_event (rollout_id, seq);
