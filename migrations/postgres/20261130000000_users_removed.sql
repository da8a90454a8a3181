-- When a user was removed (`DELETE /api/v1/users/{name}`, `token revoke
-- --user`): nothing more is sent to them and no action URL of theirs answers,
-- those minted afterwards included. A new token for them clears it.
alter table users add column removed_at timestamptz;
