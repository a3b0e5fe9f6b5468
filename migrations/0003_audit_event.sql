-- Append-only audit trail: every state change and every mutating request, with its actor.
-- `seq` orders events for replay (SSE, `show`).
create table audit_event (
    seq          integer primary key autoincrement,
    occurred_at  text not null,
    rollout_id   text references rollout (rollout_id),
    step_name    text,
    actor        text not null,
    kind         text not null,
    from_state   text,
    to_state     text,
    detail       text not null default '{}'
);

create index audit_event_rollout_idx on audit_event (rollout_id, seq);
