-- What waits for a person: a permission request, or an agent's question
-- (ACP elicitation, `kind = 'question'`, its `elicitation/create` parameters
-- in `tool_call`, no options). Both are held, stored, notified and answered
-- the same way.
alter table permission_requests add column kind text not null default 'permission';
