-- Search over what was said: each message's text (its parts joined in
-- order, so a word split between two commits is whole here), up to about
-- 64 KiB a message, kept up to date by the commit that writes the part.
-- Full-text matched through an FTS5 index kept in step by triggers
-- (external content). Messages written before this are not indexed.
create table search_texts (
    message_id      blob primary key references messages (id) on delete cascade,
    conversation_id blob not null references conversations (id) on delete cascade,
    body            text not null
);
create index search_texts_by_conversation on search_texts (conversation_id);
create virtual table search_fts using fts5 (body, content = 'search_texts', content_rowid = 'rowid');
create trigger search_texts_insert after insert on search_texts begin
    insert into search_fts (rowid, body) values (new.rowid, new.body);
end;
create trigger search_texts_delete after delete on search_texts begin
    insert into search_fts (search_fts, rowid, body) values ('delete', old.rowid, old.body);
end;
create trigger search_texts_update after update on search_texts begin
    insert into search_fts (search_fts, rowid, body) values ('delete', old.rowid, old.body);
    insert into search_fts (rowid, body) values (new.rowid, new.body);
end;
