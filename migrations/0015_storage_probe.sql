-- One row the daemon rewrites to learn that the database can be written again after a write
-- failed on the storage (a full disk, since freed) while no rollout waits to retry one of its
-- own: `/readyz` comes back by itself (store::health, safety rule 18).
create table storage_probe (
    id  integer primary key check (id = 1),
    at  text not null
);
