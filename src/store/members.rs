//! Conversations shared with other users: each member and their role (see
//! [`crate::model::members`]). A part of [`Store`](super::Store) (its
//! supertrait), written once for both backends by [`impl_member_store!`].
//! Only a conversation's session writes them (with the `member_*` event
//! that records the change: see [`crate::session`]); the lists of
//! conversations, searches and permission requests read them through
//! [`shared_with`].

use async_trait::async_trait;
use uuid::Uuid;

use crate::error::Result;
use crate::model::{Member, MemberRole};

/// Persistence of memberships (see the module).
#[async_trait]
pub trait MemberStore: Send + Sync {
    /// A conversation's members, in the order they were added.
    async fn list_members(&self, conversation_id: Uuid) -> Result<Vec<Member>>;
    /// `user`'s membership of the conversation, if any.
    async fn get_member(&self, conversation_id: Uuid, user: &str) -> Result<Option<Member>>;
    /// Adds a member, or changes the role of one there already.
    async fn put_member(&self, conversation_id: Uuid, member: &Member) -> Result<()>;
    /// Removes a member; whether they were one.
    async fn delete_member(&self, conversation_id: Uuid, user: &str) -> Result<bool>;
    /// The conversations shared with `user`, each with their role.
    async fn memberships(&self, user: &str) -> Result<Vec<(Uuid, MemberRole)>>;
    /// Whether `name` is a user (one who had a token) who was not removed.
    async fn known_user(&self, name: &str) -> Result<bool>;
}

/// SQL: whether the conversation `c` is shared with the user bound as
/// `param` (e.g. `"$3"`).
pub fn shared_with(param: &str) -> String {
    format!(
        "exists (select 1 from conversation_members sm
                 where sm.conversation_id = c.id and sm.user_name = {param})"
    )
}

/// SQL: the columns a conversation row adds for its reader bound as
/// `param`: how many members it has, and the reader's role among them.
pub fn sharing_columns(param: &str) -> String {
    format!(
        "(select count(*) from conversation_members sm where sm.conversation_id = c.id)
           as members,
         (select sm.role from conversation_members sm
          where sm.conversation_id = c.id and sm.user_name = {param}) as member_role"
    )
}

/// Implements [`MemberStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_member_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::{Member, MemberRole};

            type Row = (String, String, String, DateTime<Utc>);

            fn member((user, role, added_by, added_at): Row) -> Result<Member> {
                let role = MemberRole::parse(&role).ok_or_else(|| {
                    $crate::error::Error::Internal(anyhow::anyhow!("unknown member role {role:?}"))
                })?;
                Ok(Member {
                    user,
                    role,
                    added_by,
                    added_at,
                })
            }

            #[async_trait::async_trait]
            impl $crate::store::members::MemberStore for $store {
                async fn list_members(&self, conversation_id: Uuid) -> Result<Vec<Member>> {
                    let rows: Vec<Row> = sqlx::query_as(
                        "select user_name, role, added_by, added_at from conversation_members
                         where conversation_id = $1 order by added_at, user_name",
                    )
                    .bind(conversation_id)
                    .fetch_all(&self.pool)
                    .await?;
                    rows.into_iter().map(member).collect()
                }

                async fn get_member(
                    &self,
                    conversation_id: Uuid,
                    user: &str,
                ) -> Result<Option<Member>> {
                    let row: Option<Row> = sqlx::query_as(
                        "select user_name, role, added_by, added_at from conversation_members
                         where conversation_id = $1 and user_name = $2",
                    )
                    .bind(conversation_id)
                    .bind(user)
                    .fetch_optional(&self.pool)
                    .await?;
                    row.map(member).transpose()
                }

                async fn put_member(&self, conversation_id: Uuid, m: &Member) -> Result<()> {
                    sqlx::query(
                        "insert into conversation_members
                           (conversation_id, user_name, role, added_by, added_at)
                         values ($1, $2, $3, $4, $5)
                         on conflict (conversation_id, user_name)
                           do update set role = excluded.role",
                    )
                    .bind(conversation_id)
                    .bind(&m.user)
                    .bind(m.role.as_str())
                    .bind(&m.added_by)
                    .bind(m.added_at)
                    .execute(self.writer())
                    .await?;
                    Ok(())
                }

                async fn delete_member(&self, conversation_id: Uuid, user: &str) -> Result<bool> {
                    let done = sqlx::query(
                        "delete from conversation_members
                         where conversation_id = $1 and user_name = $2",
                    )
                    .bind(conversation_id)
                    .bind(user)
                    .execute(self.writer())
                    .await?;
                    Ok(done.rows_affected() > 0)
                }

                async fn memberships(&self, user: &str) -> Result<Vec<(Uuid, MemberRole)>> {
                    let rows: Vec<(Uuid, String)> = sqlx::query_as(
                        "select conversation_id, role from conversation_members
                         where user_name = $1",
                    )
                    .bind(user)
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows
                        .into_iter()
                        .filter_map(|(id, role)| MemberRole::parse(&role).map(|r| (id, r)))
                        .collect())
                }

                async fn known_user(&self, name: &str) -> Result<bool> {
                    let row: Option<(i32,)> = sqlx::query_as(
                        "select 1 from users where name = $1 and removed_at is null",
                    )
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?;
                    Ok(row.is_some())
                }
            }
        };
    };
}

pub(crate) use impl_member_store;
