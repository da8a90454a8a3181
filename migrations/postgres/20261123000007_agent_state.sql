-- What the agent last reported about a conversation's session (its modes,
-- configuration options, commands, usage and title), as one JSON document of
-- ACP objects kept verbatim, so that a client sees them before the agent
-- runs again.
alter table conversations add column agent_state json;
