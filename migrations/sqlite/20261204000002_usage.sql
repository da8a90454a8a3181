-- Every usage report an agent sent (ACP `usage_update`), kept: per
-- conversation and turn, with the cost increase it stands for (`delta`,
-- computed from the cumulative figures the agent reports, in its currency).
-- No foreign key to conversations: spend outlives a conversation's removal.
create table usage_records (
    id              blob primary key,
    conversation_id blob    not null,
    turn_id         blob,
    -- The conversation's owner: spend is the owner's.
    owner           text,
    -- The agent profile's name.
    agent           text    not null,
    at              text    not null,
    -- The seq of the `session_update` event that carried it.
    seq             integer,
    used            integer,
    size            integer,
    -- The cost as reported: cumulative for the agent's session.
    cost_amount     real,
    cost_currency   text,
    -- This report's cost increase (0 when none).
    delta           real    not null default 0
);
create index usage_records_by_owner on usage_records (owner, at);
create index usage_records_by_conversation on usage_records (conversation_id, at);
create index usage_records_by_agent on usage_records (agent, at);
