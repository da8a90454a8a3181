-- Messages grow by parts: each commit of a streaming message inserts what
-- was added as the next part, instead of rewriting the whole (growing)
-- message, so a long message costs time linear in its length. The message
-- row holds part 0; reading joins the parts in order.
create table message_parts (
    conversation_id uuid    not null,
    message_id      uuid    not null references messages (id) on delete cascade,
    part            integer not null,
    content         json    not null,
    primary key (conversation_id, message_id, part)
);
create index message_parts_by_message on message_parts (message_id);
