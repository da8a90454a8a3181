-- Agent processes while they run, so that a gateway starting after a crash
-- can kill what its agents left behind. An agent leads a process group whose
-- id is its pid; a pid names that process only on the boot and in the pid
-- namespace it was recorded under, and only while the start time matches
-- (pids are reused). A row is deleted once the agent is gone.
create table agent_processes (
    conversation_id uuid primary key references conversations (id) on delete cascade,
    pid             integer     not null,
    -- clock ticks after boot: field 22 of /proc/<pid>/stat
    start_time      bigint      not null,
    -- /proc/sys/kernel/random/boot_id
    boot_id         text        not null,
    -- the gateway's /proc/self/ns/pid, e.g. pid:[4026531836]
    pid_namespace   text        not null,
    hostname        text        not null,
    started_at      timestamptz not null
);
