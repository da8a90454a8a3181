-- Operator policies set at run time. Every change is a new row (the newest
-- is in force), so the history of who changed what, and when, is kept.
create table policy_sets (
    id         uuid primary key,
    rules      jsonb       not null,
    updated_by text        not null,
    updated_at timestamptz not null
);
