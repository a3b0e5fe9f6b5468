-- A release target can end without a rollout of its own (docs/reference.md#releases):
--   already_current: its replica's recorded deployment already is the release's file, tag and
--                    env; counted done, nothing sent.
--   not_started:     its release ended failed or aborted before its turn.
-- release_event.kind gains 'target_already_current'. SQLite cannot alter a CHECK, so both
-- tables are rebuilt in place.
create table release_target_new (
    release_id  text not null references release (release_id),
    position    integer not null,
    host        text not null,
    service     text not null,
    -- The validated canary plan of this target (JSON; the plan's env overrides, never the
    -- host's env file).
    plan        text not null,
    rollout_id  text unique references rollout (rollout_id),
    -- Set only on a target without a rollout.
    outcome     text check (outcome in ('already_current', 'not_started')),
    primary key (release_id, position),
    check (outcome is null or rollout_id is null)
);
insert into release_target_new (release_id, position, host, service, plan, rollout_id)
    select release_id, position, host, service, plan, rollout_id from release_target;
drop table release_target;
alter table release_target_new rename to release_target;
-- Releases that ended before this migration: their unstarted targets end not_started.
update release_target set outcome = 'not_started'
    where rollout_id is null
    and release_id in (select release_id from release where status in ('failed', 'aborted'));

create table release_event_new (
    seq          integer primary key autoincrement,
    release_id   text not null references release (release_id),
    occurred_at  text not null,
    actor        text not null,
    kind         text not null check (kind in ('release_created', 'release_running', 'release_paused', 'release_resumed', 'release_succeeded', 'release_failed', 'release_aborted', 'target_started', 'target_rollback_started', 'target_already_current')),
    from_state   text,
    to_state     text,
    reason       text,
    detail       text not null default '{}'
);
insert into release_event_new (seq, release_id, occurred_at, actor, kind, from_state, to_state, reason, detail)
    select seq, release_id, occurred_at, actor, kind, from_state, to_state, reason, detail from release_event;
drop table release_event;
alter table release_event_new rename to release_event;
create index release_event_release_idx on release_event (release_id, seq);
