-- Agents under shims (issue 30): the shim's socket, so that a gateway
-- starting after a crash or a deploy reattaches to the agent instead of
-- killing it, and what it needs to carry on exactly where the last one
-- stopped (`link`, JSON, written in the same transaction as the events it
-- accounts for): how far the agent's output is committed, the id of the
-- running turn's `session/prompt`, and the JSON-RPC ids of the agent's
-- requests that wait for a person. For a shim, `pid` and `start_time` are
-- the shim's.
alter table agent_processes add column shim_socket text;
alter table agent_processes add column link text;
