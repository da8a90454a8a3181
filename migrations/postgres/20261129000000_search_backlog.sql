-- Messages written before search existed (or with no text in them yet): each
-- is indexed once by the running gateway (`store::search_backlog`), in the
-- background, and its row here deleted in the same transaction. Nothing is
-- added here afterwards: the commits index what they write.
create table search_backlog (
    message_id      uuid primary key references messages (id) on delete cascade,
    conversation_id uuid not null
);
insert into search_backlog (message_id, conversation_id)
select m.id, m.conversation_id from messages m
where not exists (select 1 from search_texts s where s.message_id = m.id);
create index search_backlog_by_conversation on search_backlog (conversation_id);
