-- A conversation made on a repository: its git worktree (repository, base,
-- branch, path, git directories) as JSON, set when it is made; and how much
-- differs from its base (files, lines added and removed, commits) as last
-- recorded by a `changes_*` event, for the list to show.
alter table conversations add column worktree json;
alter table conversations add column change_totals json;
