-- Notifications (src/notify): each user's targets, the keys of what was
-- already notified, the durable outbox (one row per delivery to one
-- target), every attempt, and the gateway's VAPID key pair.
create table notification_targets (
    id                blob primary key,
    owner             text        not null,
    kind              text        not null,
    label             text,
    -- JSON array of event names
    events            text        not null,
    -- JSON: the kind's settings (URL, secret, token, subscription, device token)
    config            text        not null,
    created_at        text not null,
    gone              integer     not null default false,
    last_at           text,
    last_outcome      text,
    last_detail       text
);
create index notification_targets_by_owner on notification_targets (owner, id);

-- What made a notification "the same" (e.g. permission_waiting:<request>).
create table notification_keys (
    owner      text        not null,
    key        text        not null,
    created_at text not null,
    primary key (owner, key)
);

-- The outbox: claimed by one node at a time (claimed_by, until
-- claimed_until), retried at
-- due_at until delivered, gone, or out of attempts.
create table notification_deliveries (
    id            blob primary key,
    target_id     blob        not null references notification_targets (id) on delete cascade,
    event         text        not null,
    -- the JSON body to send
    body          text        not null,
    collapse_key  text,
    attempts      integer     not null default 0,
    status        text        not null,
    due_at        text not null,
    -- the node whose claim it is: a claim of a node that died is void
    claimed_by    blob,
    claimed_until text,
    created_at    text not null
);
create index notification_deliveries_due on notification_deliveries (due_at) where status = 'pending';

create table notification_attempts (
    delivery_id blob        not null,
    target_id   blob        not null references notification_targets (id) on delete cascade,
    event       text        not null,
    attempt     integer     not null,
    outcome     text        not null,
    http_status integer,
    error       text,
    at          text not null,
    primary key (delivery_id, attempt)
);
create index notification_attempts_by_target on notification_attempts (target_id, at);

-- The gateway's VAPID key pair (RFC 8292), made on first start: the raw
-- private scalar and the uncompressed public point, base64url unpadded.
create table vapid_keys (
    id          integer primary key check (id = 1),
    private_key text        not null,
    public_key  text        not null,
    created_at  text not null
);
