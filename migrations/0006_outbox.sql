-- Transactional outbox of notifications (webhooks). A row is written in the SAME transaction as
-- the audit event that causes it, so a notification exists if and only if its state change was
-- committed. The notifier fans each row out to the configured webhooks (`outbox_delivery`) and
-- delivers with retries; `outbox_id` is the `Idempotency-Key` header of every attempt.
create table outbox (
    outbox_id    text primary key,
    -- No foreign keys: retention may purge a rollout and its audit trail before or after its
    -- notifications are delivered; a notification carries everything it needs in `payload`.
    audit_seq    integer not null,
    event        text not null check (event in ('started', 'step_failed', 'succeeded', 'failed', 'aborted', 'rolled_back')),
    rollout_id   text,
    -- JSON: what the webhook receives (the Slack format sends its `text`).
    payload      text not null,
    created_at   text not null,
    -- Set once a delivery row exists for every webhook subscribed to `event`.
    routed_at    text
);

create index outbox_unrouted_idx on outbox (routed_at, created_at);

-- One row per (notification, webhook). An attempt is claimed (attempts + 1 and the next retry
-- time) and committed before the request is sent: a crash after the send leaves the row
-- pending, and it is sent again, with the same Idempotency-Key, at `next_attempt_at`.
create table outbox_delivery (
    outbox_id        text not null,
    webhook          text not null,
    status           text not null check (status in ('pending', 'delivered', 'failed')),
    attempts         integer not null default 0,
    next_attempt_at  text not null,
    last_attempt_at  text,
    delivered_at     text,
    last_error       text,
    primary key (outbox_id, webhook)
);

create index outbox_delivery_due_idx on outbox_delivery (status, next_attempt_at);
