-- Fencing (issue 30): each claim of a conversation by a node raises its
-- epoch; every write of the conversation's owner is conditional on the
-- epoch it claimed with, so a node that lost the conversation while cut
-- off writes nothing more to it.
alter table conversations add column owner_epoch bigint not null default 0;
