-- Core schema: conversations, their event log, merged messages, tool calls and
-- permission requests. Migrations are never edited once applied; add new ones.

create table conversations (
    id             uuid primary key,
    agent          text        not null,
    title          text,
    cwd            text        not null,
    status         text        not null,
    acp_session_id text,
    last_seq       bigint      not null default 0,
    -- the turn in progress, so that a restart can end it in the log
    current_turn_id uuid,
    created_at     timestamptz not null,
    updated_at     timestamptz not null
);

-- One row per published event. (conversation_id, seq) is the identity: seq is
-- assigned by the single writer of a conversation, starting at 1, without gaps.
create table events (
    conversation_id uuid        not null references conversations (id) on delete cascade,
    seq             bigint      not null,
    type            text        not null,
    at              timestamptz not null,
    data            jsonb       not null,
    primary key (conversation_id, seq)
);

-- Consecutive chunks of one role within a turn, merged.
create table messages (
    id              uuid primary key,
    conversation_id uuid        not null references conversations (id) on delete cascade,
    turn_id         uuid,
    role            text        not null,
    content         jsonb       not null,
    created_at      timestamptz not null
);
create index messages_by_conversation on messages (conversation_id, id);

create table tool_calls (
    conversation_id uuid        not null references conversations (id) on delete cascade,
    tool_call_id    text        not null,
    turn_id         uuid,
    title           text,
    kind            text,
    status          text,
    content         jsonb,
    locations       jsonb,
    raw_input       jsonb,
    raw_output      jsonb,
    created_at      timestamptz not null,
    updated_at      timestamptz not null,
    primary key (conversation_id, tool_call_id)
);

create table permission_requests (
    id              uuid primary key,
    conversation_id uuid        not null references conversations (id) on delete cascade,
    turn_id         uuid,
    tool_call       jsonb       not null,
    options         jsonb       not null,
    status          text        not null,
    decision        jsonb,
    created_at      timestamptz not null
);
create index permission_requests_pending on permission_requests (created_at) where status = 'pending';
create index permission_requests_by_conversation on permission_requests (conversation_id, id);
