-- JSON columns become `json` (text, checked for validity) instead of `jsonb`:
-- jsonb cannot hold the escape \u0000, which any tool output read from a
-- binary file may carry, while json keeps the text exactly as written. The
-- gateway never queries inside these documents, so nothing is lost.
alter table events alter column data type json using data::json;
alter table messages alter column content type json using content::json;
alter table tool_calls
    alter column content type json using content::json,
    alter column locations type json using locations::json,
    alter column raw_input type json using raw_input::json,
    alter column raw_output type json using raw_output::json;
alter table permission_requests
    alter column tool_call type json using tool_call::json,
    alter column options type json using options::json,
    alter column decision type json using decision::json;
alter table policy_sets alter column rules type json using rules::json;
