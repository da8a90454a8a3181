-- Users, their bearer tokens (stored only as SHA-256 hashes), and who owns
-- each conversation.
create table users (
    name       text primary key,
    role       text not null check (role in ('user', 'operator')),
    created_at text not null
);

create table tokens (
    id         blob primary key,
    user_name  text not null references users (name),
    label      text,
    hash       text not null unique,
    created_at text not null,
    revoked_at text
);

alter table conversations add column owner text;
create index conversations_by_owner on conversations (owner, id);
