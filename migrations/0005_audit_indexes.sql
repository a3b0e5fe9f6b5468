-- Indexes for the audit queries (GET /v1/rollouts filters, newest first, keyset pagination),
-- for retention, and for the foreign-key checks a delete of a rollout or step triggers.
-- Each filter index ends with (created_at, rollout_id): equality on the filter column, then
-- the rows come out already in keyset order, so `limit` stops early and no sort is needed.

drop index if exists rollout_host_service_idx;
drop index if exists rollout_status_idx;

create index rollout_host_idx on rollout (host, created_at, rollout_id);
create index rollout_service_idx on rollout (service, created_at, rollout_id);
create index rollout_status_idx on rollout (status, created_at, rollout_id);
create index rollout_kind_idx on rollout (kind, created_at, rollout_id);
create index rollout_tag_idx on rollout (tag, created_at, rollout_id);
create index rollout_actor_idx on rollout (actor, created_at, rollout_id);

-- Retention: terminal rollouts by the time they finished.
create index rollout_finished_idx on rollout (finished_at) where active_host is null;

-- Children looked up by parent (foreign-key checks on delete, recovery, attempt numbering).
create index rollout_rollback_of_idx on rollout (rollback_of) where rollback_of is not null;
create index rollout_rolled_back_by_idx on rollout (rolled_back_by) where rolled_back_by is not null;
create index step_attempt_step_idx on step_attempt (step_id);
create index deployment_rollout_idx on deployment (rollout_id) where rollout_id is not null;
