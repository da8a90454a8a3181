-- Budgets (`[[budgets]]` in the config): an operator's exceptions, which
-- lift a budget for one user until the end of its window (`until` null: a
-- `total` window, until removed); and the notices recorded so far, one per
-- budget, scope, window and kind (`warning`, `exceeded`), so that each is
-- recorded and notified once whichever node sees it first.
create table budget_exceptions (
    budget_id   text        not null,
    user_name   text        not null,
    until       timestamptz,
    created_by  text        not null,
    created_at  timestamptz not null,
    primary key (budget_id, user_name)
);

create table budget_notices (
    budget_id    text        not null,
    scope_key    text        not null,
    window_start timestamptz not null,
    kind         text        not null,
    at           timestamptz not null,
    primary key (budget_id, scope_key, window_start, kind)
);

-- Turns started, counted for `{turns}` budgets.
create index events_turns_started on events (at) where type = 'turn_started';
