-- "Always allow" / "always reject" answers remembered per conversation.
create table permission_rules (
    id              blob primary key,
    conversation_id blob not null references conversations (id) on delete cascade,
    tool_kind       text not null,
    subject         text not null,
    option_kind     text not null check (option_kind in ('allow_always', 'reject_always')),
    permission_id   blob not null,
    created_at      text not null,
    unique (conversation_id, tool_kind, subject)
);
