-- Several gateway nodes on one database (src/cluster.rs).
--
-- A node is one gateway process. It renews its lease while it runs; a node
-- whose lease ran out (or, on the same machine, whose process is gone) is
-- dead, and the conversations it owned are taken over by the living.
create table nodes (
    id            uuid primary key,
    hostname      text        not null,
    -- as in agent_processes: which process table `pid` belongs to
    boot_id       text        not null,
    pid_namespace text        not null,
    pid           integer     not null,
    start_time    bigint      not null,
    started_at    timestamptz not null,
    lease_until   timestamptz not null
);

-- The node whose agent runs the conversation (null: none does). No foreign
-- key: a dead node's row goes once its conversations are settled.
alter table conversations add column node_id uuid;
create index conversations_node_id on conversations (node_id) where node_id is not null;

-- Commands for a conversation that arrived at a node that does not own it,
-- for its owner to run (it learns of them by NOTIFY acp_commands). Whoever
-- sets taken_at runs it: the owner, or the sender when the owner died first.
create table commands (
    id              uuid primary key,
    node_id         uuid        not null,
    conversation_id uuid        not null references conversations (id) on delete cascade,
    kind            text        not null,
    body            json        not null,
    created_at      timestamptz not null,
    taken_at        timestamptz,
    -- {"ok": value} or {"problem": {...}}
    answer          json,
    answered_at     timestamptz
);
create index commands_waiting on commands (node_id) where taken_at is null;
