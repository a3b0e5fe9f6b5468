-- A rollout's replica downtime in milliseconds, from the down sent to its replica to the first
-- healthy answer after the up (domain::downtime), written with the rollout's end; null when it
-- did not take its replica down or the replica never answered healthy again.
alter table rollout add column downtime_ms integer;

-- The low-traffic windows a plan named (JSON), which its `window` step waits for instead of
-- the host's; null: the host's.
alter table rollout add column windows text;

-- The free space a plan requires of a weights pre-stage (bytes), when more than its runbook's
-- `free_space.required`; null: the runbook's.
alter table rollout add column required_free integer;
