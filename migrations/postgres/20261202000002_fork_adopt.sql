-- Where a conversation came from, beside a plain start: forked from another
-- conversation (`forked_from`, the message it was forked after in
-- `forked_at`: null when the source had none), or made to take over an
-- agent session begun elsewhere (`adopted_session`, the agent's id for it).
alter table conversations add column forked_from uuid;
alter table conversations add column forked_at uuid;
alter table conversations add column adopted_session text;
-- A session is taken over once: two conversations of one user and one agent
-- never hold the same adopted session while open, whichever node made them.
create unique index conversations_adopted_once
    on conversations (agent, owner, adopted_session)
    where adopted_session is not null and status <> 'closed';
-- Which conversation holds an agent's session (the listing says it).
create index conversations_by_session on conversations (agent, acp_session_id)
    where acp_session_id is not null;
