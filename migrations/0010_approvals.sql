-- Approvals (the `approve` step, `on_inconclusive: ask`): step.kind takes `approve`, and
-- outbox.event gains
-- 'approval_requested', so a rollout that waits for a human notifies. SQLite cannot alter a
-- CHECK, so the table is rebuilt in place, as in 0007.
create table outbox_new (
    outbox_id    text primary key,
    audit_seq    integer not null,
    event        text not null check (event in ('started', 'step_failed', 'succeeded', 'failed', 'aborted', 'rolled_back', 'replica_left_down', 'approval_requested')),
    rollout_id   text,
    payload      text not null,
    created_at   text not null,
    routed_at    text
);
insert into outbox_new (outbox_id, audit_seq, event, rollout_id, payload, created_at, routed_at)
    select outbox_id, audit_seq, event, rollout_id, payload, created_at, routed_at from outbox;
drop table outbox;
alter table outbox_new rename to outbox;
create index outbox_unrouted_idx on outbox (routed_at, created_at);

-- step.kind takes 'approve' (the triggers of 0008, replaced).
drop trigger step_kind_check_insert;
drop trigger step_kind_check_update;
create trigger step_kind_check_insert before insert on step
    when new.kind not in ('snapshot', 'peers_healthy', 'plan', 'down', 'up', 'verify_neighbours', 'wait_health', 'wait_logs', 'soak', 'smoke', 'analyze', 'approve')
begin
    select raise(abort, 'CHECK constraint failed: step.kind');
end;

create trigger step_kind_check_update before update of kind on step
    when new.kind not in ('snapshot', 'peers_healthy', 'plan', 'down', 'up', 'verify_neighbours', 'wait_health', 'wait_logs', 'soak', 'smoke', 'analyze', 'approve')
begin
    select raise(abort, 'CHECK constraint failed: step.kind');
end;
