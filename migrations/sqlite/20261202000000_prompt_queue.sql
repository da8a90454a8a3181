-- A conversation's prompt queue: the prompts sent while a turn ran, waiting
-- to start in order (a JSON array of queued prompts; null: none ever queued).
-- Written with the conversation's state, in the same statement as the
-- events that say how it changed, so a prompt that starts leaves the queue
-- in the commit of its `turn_started`.
alter table conversations add column prompt_queue text;
