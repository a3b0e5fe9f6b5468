-- Steps of a rollout, copied from the runbook when the rollout is created.
create table step (
    step_id      text primary key,
    rollout_id   text not null references rollout (rollout_id),
    position     integer not null,
    name         text not null,
    kind         text not null,
    status       text not null check (status in ('pending', 'running', 'succeeded', 'failed', 'skipped', 'aborted')),
    attempts     integer not null default 0,
    started_at   text,
    finished_at  text,
    -- Waits keep their deadline across restarts.
    deadline_at  text,
    -- JSON evidence: the dry-run plan, matched log lines, health samples, transcript tail, error.
    detail       text not null default '{}',
    unique (rollout_id, position)
);

-- Write-ahead record of every compose-manager call with side effects: the row exists before
-- the call is sent, its outcome is written after. A row without outcome after a restart means
-- "this may have happened": recovery reconciles it instead of resending.
create table step_attempt (
    attempt_id   text primary key,
    step_id      text not null references step (step_id),
    rollout_id   text not null references rollout (rollout_id),
    n            integer not null,
    endpoint     text not null,
    started_at   text not null,
    finished_at  text,
    outcome      text check (outcome in ('succeeded', 'failed', 'unknown', 'error', 'busy')),
    detail       text not null default '{}'
);

create index step_attempt_rollout_idx on step_attempt (rollout_id, started_at);
