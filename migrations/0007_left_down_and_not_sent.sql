-- Two CHECK lists grow; SQLite cannot alter a CHECK, so both tables are rebuilt in place.
--
-- outbox.event gains 'replica_left_down': a rollout that ends with its target taken down and
-- not brought back is its own notification (safety rule 14).
create table outbox_new (
    outbox_id    text primary key,
    audit_seq    integer not null,
    event        text not null check (event in ('started', 'step_failed', 'succeeded', 'failed', 'aborted', 'rolled_back', 'replica_left_down')),
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

-- step_attempt.outcome gains 'not_sent': an abort that lands while the attempt row is written
-- stops the call before it is sent. The engine always wrote it; the old CHECK refused it, which
-- left the row without outcome ("may have been sent").
create table step_attempt_new (
    attempt_id   text primary key,
    step_id      text not null references step (step_id),
    rollout_id   text not null references rollout (rollout_id),
    n            integer not null,
    endpoint     text not null,
    started_at   text not null,
    finished_at  text,
    outcome      text check (outcome in ('succeeded', 'failed', 'unknown', 'error', 'busy', 'not_sent')),
    detail       text not null default '{}'
);
insert into step_attempt_new (attempt_id, step_id, rollout_id, n, endpoint, started_at, finished_at, outcome, detail)
    select attempt_id, step_id, rollout_id, n, endpoint, started_at, finished_at, outcome, detail from step_attempt;
drop table step_attempt;
alter table step_attempt_new rename to step_attempt;
create index step_attempt_rollout_idx on step_attempt (rollout_id, started_at);
create index step_attempt_step_idx on step_attempt (step_id);

-- The replicas left down (the canaryd_replicas_down gauge, /v1/replicas): read on every scrape,
-- so they are found without scanning the rollout history.
create index rollout_left_down_idx on rollout (host, service, finished_at) where error_code = 'replica_left_down';
