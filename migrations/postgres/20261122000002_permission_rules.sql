-- "Always allow" / "always reject" answers remembered per conversation, keyed
-- on what the tool call is.
create table permission_rules (
    id              uuid primary key,
    conversation_id uuid        not null references conversations (id) on delete cascade,
    tool_kind       text        not null,
    -- the program for execute, the path for path tools, else the title ('' if none)
    subject         text        not null,
    option_kind     text        not null check (option_kind in ('allow_always', 'reject_always')),
    permission_id   uuid        not null,
    created_at      timestamptz not null,
    unique (conversation_id, tool_kind, subject)
);
