-- What ran on a replica: written when a rollout succeeds (source 'rollout') or, on the first
-- rollout of a replica canaryd never deployed, from the host's GET /version (source 'baseline').
create table deployment (
    deployment_id  text primary key,
    host           text not null,
    service        text not null,
    file           text not null,
    tag            text not null,
    env_overrides  text not null default '{}',
    env_sha256     text,
    commit_sha     text,
    file_sha256    text,
    image          text,
    source         text not null check (source in ('rollout', 'baseline')),
    rollout_id     text references rollout (rollout_id),
    deployed_at    text not null
);

create index deployment_replica_idx on deployment (host, service, deployed_at desc);
