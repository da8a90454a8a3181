-- Conversations shared with other users (issue 54): each member's role
-- (`viewer`, `approver`, `collaborator`), who shared it and when. Its
-- changes are recorded in the conversation's events too (`member_*`).
create table conversation_members (
    conversation_id blob not null references conversations (id) on delete cascade,
    user_name       text not null,
    role            text not null,
    added_by        text not null,
    added_at        text not null,
    primary key (conversation_id, user_name)
);
create index conversation_members_by_user on conversation_members (user_name);
