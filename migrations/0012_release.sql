-- Releases (docs/reference.md#releases): one version promoted across replicas and hosts. Every
-- target runs as an ordinary canary rollout; `release_target.rollout_id` links it, written in
-- the transaction that creates the rollout (a target is started at most once).
create table release (
    release_id          text primary key,
    status              text not null check (status in ('pending', 'running', 'paused', 'succeeded', 'failed', 'aborted')),
    actor               text not null,
    reason              text not null,
    file                text not null,
    tag                 text not null,
    runbook             text not null,
    max_parallel_hosts  integer not null check (max_parallel_hosts >= 1),
    on_failure          text not null check (on_failure in ('halt', 'rollback_release')),
    created_at          text not null,
    started_at          text,
    finished_at         text,
    error_message       text
);
create index release_created_idx on release (created_at desc, release_id desc);

create table release_target (
    release_id  text not null references release (release_id),
    position    integer not null,
    host        text not null,
    service     text not null,
    -- The validated canary plan of this target (JSON; the plan's env overrides, never the
    -- host's env file).
    plan        text not null,
    rollout_id  text unique references rollout (rollout_id),
    primary key (release_id, position)
);

-- The release's own audit trail: every status change and control request, with actor and reason.
create table release_event (
    seq          integer primary key autoincrement,
    release_id   text not null references release (release_id),
    occurred_at  text not null,
    actor        text not null,
    kind         text not null check (kind in ('release_created', 'release_running', 'release_paused', 'release_resumed', 'release_succeeded', 'release_failed', 'release_aborted', 'target_started', 'target_rollback_started')),
    from_state   text,
    to_state     text,
    reason       text,
    detail       text not null default '{}'
);
create index release_event_release_idx on release_event (release_id, seq);
