-- Action URLs of notifications (issue 28): single-use capabilities, one per
-- option of a request, stored only as SHA-256 hashes.
create table action_tokens (
    hash        text primary key,
    request_id  uuid        not null references permission_requests (id) on delete cascade,
    option_id   text        not null,
    user_name   text        not null,
    created_at  timestamptz not null,
    expires_at  timestamptz not null,
    used_at     timestamptz
);
create index action_tokens_by_expiry on action_tokens (expires_at);
