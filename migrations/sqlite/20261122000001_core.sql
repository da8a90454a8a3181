-- The embedded (SQLite) schema: the same tables as the Postgres one.
-- Ids are 16-byte UUID blobs (v7: byte order is time order), times are
-- fixed-width RFC 3339 text with microseconds (text order is time order),
-- JSON is text.

create table conversations (
    id              blob primary key,
    agent           text    not null,
    title           text,
    cwd             text    not null,
    status          text    not null,
    acp_session_id  text,
    last_seq        integer not null default 0,
    current_turn_id blob,
    created_at      text    not null,
    updated_at      text    not null
);

create table events (
    conversation_id blob    not null references conversations (id) on delete cascade,
    seq             integer not null,
    type            text    not null,
    at              text    not null,
    data            text    not null,
    primary key (conversation_id, seq)
) without rowid;

create table messages (
    id              blob primary key,
    conversation_id blob not null references conversations (id) on delete cascade,
    turn_id         blob,
    role            text not null,
    content         text not null,
    created_at      text not null
);
create index messages_by_conversation on messages (conversation_id, id);

create table tool_calls (
    conversation_id blob not null references conversations (id) on delete cascade,
    tool_call_id    text not null,
    turn_id         blob,
    title           text,
    kind            text,
    status          text,
    content         text,
    locations       text,
    raw_input       text,
    raw_output      text,
    created_at      text not null,
    updated_at      text not null,
    primary key (conversation_id, tool_call_id)
);

create table permission_requests (
    id              blob primary key,
    conversation_id blob not null references conversations (id) on delete cascade,
    turn_id         blob,
    tool_call       text not null,
    options         text not null,
    status          text not null,
    decision        text,
    created_at      text not null
);
create index permission_requests_pending on permission_requests (id) where status = 'pending';
create index permission_requests_by_conversation on permission_requests (conversation_id, id);
