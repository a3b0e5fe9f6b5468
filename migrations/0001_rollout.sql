-- Rollouts: one execution of a runbook for one replica (kind canary or rollback).
-- Ids are prefixed ULIDs (ro_...), times are RFC 3339 UTC text.
create table rollout (
    rollout_id      text primary key,
    kind            text not null check (kind in ('canary', 'rollback')),
    status          text not null check (status in ('pending', 'running', 'succeeded', 'failed', 'aborted')),
    host            text not null,
    file            text not null,
    service         text not null,
    tag             text not null,
    runbook         text not null,
    actor           text not null,
    reason          text not null,
    -- The plan's env overrides only (never the host's env file: it holds secrets).
    env_overrides   text not null default '{}',
    -- SHA-256 of the merged env map (host env file + overrides), hex.
    env_sha256      text not null,
    require_logs    text not null default '[]',
    on_failure      text not null check (on_failure in ('rollback', 'halt')),
    created_at      text not null,
    started_at      text,
    finished_at     text,
    error_code      text,
    error_message   text,
    rollback_of     text references rollout (rollout_id),
    -- A rollback's target as the host reported it when it was deployed: after the up, the host
    -- must report the same commit and file hash, or the tag moved (`tag_moved`).
    expect_commit      text,
    expect_file_sha256 text,
    rolled_back_by  text references rollout (rollout_id),
    -- Set (before the call) once a down or up was sent: a failure after it has something to undo.
    touched_replica integer not null default 0,
    abort_reason    text,
    abort_actor     text,
    -- Equals `host` while the rollout is not terminal, NULL after: the unique index makes
    -- "one active rollout per host" a database fact, not a race.
    active_host     text unique
);

create index rollout_created_idx on rollout (created_at desc, rollout_id desc);
create index rollout_host_service_idx on rollout (host, service, created_at desc);
create index rollout_status_idx on rollout (status, created_at desc);
