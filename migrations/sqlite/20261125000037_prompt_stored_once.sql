-- A prompt is stored once: in its `turn_started` event. The user message it
-- also is names that event here (`prompt_seq`) and keeps an empty `content`;
-- reading a message joins the event's `content` back in. Messages written
-- before this keep their own copy (prompt_seq null).
alter table messages add column prompt_seq integer;
