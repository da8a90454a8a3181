-- Read-only share links of a conversation (issue 54): whoever holds one sees
-- the conversation's history and live events, nothing else. Only each
-- token's SHA-256 is kept; a link ends when it expires or is revoked.
create table share_links (
    id              uuid        primary key,
    conversation_id uuid        not null references conversations (id) on delete cascade,
    token_hash      text        not null unique,
    created_by      text        not null,
    created_at      timestamptz not null,
    expires_at      timestamptz not null,
    revoked_at      timestamptz
);
create index share_links_by_conversation on share_links (conversation_id);
