-- Search over what was said: each message's text (its parts joined in
-- order, so a word split between two commits is whole here), up to about
-- 64 KiB a message, kept up to date by the commit that writes the part.
-- Full-text matched through a generated tsvector ('simple': no stemming,
-- any language) with a GIN index. Messages written before this are not
-- indexed.
create table search_texts (
    message_id      uuid primary key references messages (id) on delete cascade,
    conversation_id uuid not null references conversations (id) on delete cascade,
    body            text not null,
    tsv             tsvector generated always as (to_tsvector('simple', body)) stored
);
create index search_texts_match on search_texts using gin (tsv);
create index search_texts_by_conversation on search_texts (conversation_id);
