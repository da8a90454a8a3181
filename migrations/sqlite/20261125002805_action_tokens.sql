-- Action URLs of notifications (issue 28): single-use capabilities, one per
-- option of a request, stored only as SHA-256 hashes.
create table action_tokens (
    hash        text primary key,
    request_id  blob not null references permission_requests (id) on delete cascade,
    option_id   text not null,
    user_name   text not null,
    created_at  text not null,
    expires_at  text not null,
    used_at     text
);
create index action_tokens_by_expiry on action_tokens (expires_at);
