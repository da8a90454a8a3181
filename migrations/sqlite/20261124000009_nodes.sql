-- The node whose agent runs the conversation (see the Postgres migration of
-- the same name). SQLite serves one node: this is always that node or null.
alter table conversations add column node_id blob;
