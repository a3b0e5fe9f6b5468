-- The step kinds step.kind may take are rows of `step_kind`, not a list in this file: Store::open
-- fills it from the registered kinds (domain::runbook::StepKindName::ALL) at every start, and
-- removes a name no longer registered once no step row uses it. A new kind needs no migration.
-- The two triggers of 0008 (which stand for the CHECK that `step`, the parent of step_attempt's
-- foreign key, cannot get without a rebuild) now refuse a kind that is not in the table.
create table step_kind (
    name text primary key not null
);

drop trigger step_kind_check_insert;
drop trigger step_kind_check_update;

create trigger step_kind_check_insert before insert on step
    when new.kind not in (select name from step_kind)
begin
    select raise(abort, 'CHECK constraint failed: step.kind');
end;

create trigger step_kind_check_update before update of kind on step
    when new.kind not in (select name from step_kind)
begin
    select raise(abort, 'CHECK constraint failed: step.kind');
end;
