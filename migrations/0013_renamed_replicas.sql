-- Renamed replicas (docs/reference.md#renamed-replicas). A rollout's `service` stays the
-- replica's slot (its key in the config), so history, peers and rollback follow the slot.
--   deploy_as: the compose service `plan` and `up` act on when it is not the slot's key (a
--              rollback to a former name); NULL means `service`.
--   replaces:  the former service `down` acts on, as JSON {service, file?, tag?}; NULL when
--              the rollout renames nothing.
-- A deployment records the compose service it ran under (`deployed_as`; NULL: `service`).
alter table rollout add column deploy_as text check (deploy_as is null or deploy_as <> '');
alter table rollout add column replaces text check (replaces is null or json_valid(replaces));
alter table deployment add column deployed_as text check (deployed_as is null or deployed_as <> '');
