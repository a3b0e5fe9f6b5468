-- step.kind takes only the registered step kinds (domain::runbook::StepKindName; a test keeps
-- this list equal to it). SQLite cannot add a CHECK to a column without rebuilding the table,
-- and `step` is the parent of step_attempt's foreign key: rebuilt inside the migration's
-- transaction (foreign keys on), its drop leaves violations counted at commit, which fails.
-- Two triggers refuse what `check (kind in (...))` would. A new kind replaces both in a new
-- migration.
create trigger step_kind_check_insert before insert on step
    when new.kind not in ('snapshot', 'peers_healthy', 'plan', 'down', 'up', 'verify_neighbours', 'wait_health', 'wait_logs', 'soak', 'smoke', 'analyze')
begin
    select raise(abort, 'CHECK constraint failed: step.kind');
end;

create trigger step_kind_check_update before update of kind on step
    when new.kind not in ('snapshot', 'peers_healthy', 'plan', 'down', 'up', 'verify_neighbours', 'wait_health', 'wait_logs', 'soak', 'smoke', 'analyze')
begin
    select raise(abort, 'CHECK constraint failed: step.kind');
end;
