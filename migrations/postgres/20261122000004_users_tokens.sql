-- Users, their bearer tokens (stored only as SHA-256 hashes), and who owns
-- each conversation.
create table users (
    name       text primary key,
    role       text        not null check (role in ('user', 'operator')),
    created_at timestamptz not null
);

create table tokens (
    id         uuid primary key,
    user_name  text        not null references users (name),
    label      text,
    hash       text        not null unique,
    created_at timestamptz not null,
    revoked_at timestamptz
);

alter table conversations add column owner text;
create index conversations_by_owner on conversations (owner, id);
