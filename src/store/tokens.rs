//! Who may call: users, their roles and their bearer tokens (only each
//! token's hash is kept). A part of [`Store`](super::Store) (its
//! supertrait), written once for both backends by [`impl_token_store!`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;
use crate::model::Role;

/// A bearer token as shown to operators (never its value or hash).
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct TokenInfo {
    pub id: Uuid,
    pub user: String,
    pub role: Role,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A token row, joined with its user's role.
#[derive(sqlx::FromRow)]
pub(super) struct TokenRow {
    id: Uuid,
    user_name: String,
    role: String,
    label: Option<String>,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
}

impl TryFrom<TokenRow> for TokenInfo {
    type Error = crate::error::Error;
    fn try_from(r: TokenRow) -> Result<TokenInfo> {
        Ok(TokenInfo {
            id: r.id,
            role: role_col(&r.role)?,
            user: r.user_name,
            label: r.label,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
        })
    }
}

/// A stored role.
pub(super) fn role_col(s: &str) -> Result<Role> {
    Role::parse(s).ok_or_else(|| {
        crate::error::Error::Internal(anyhow::anyhow!("bad role {s:?} in the database"))
    })
}

/// Persistence of users and tokens (see the module).
#[async_trait]
pub trait TokenStore: Send + Sync {
    /// Creates a token for `user` (creating the user, or setting its role;
    /// a removed user is one again), storing only the token's hash.
    async fn create_token(
        &self,
        user: &str,
        role: Role,
        label: Option<&str>,
        hash: &str,
    ) -> Result<TokenInfo>;
    /// The active (not revoked) token with this hash.
    async fn find_token(&self, hash: &str) -> Result<Option<TokenInfo>>;
    /// Oldest first, revoked ones included.
    async fn list_tokens(&self) -> Result<Vec<TokenInfo>>;
    /// `false` if there is no active token with this id.
    async fn revoke_token(&self, id: Uuid) -> Result<bool>;
    /// Every active token with its user's role (for closing the WebSockets
    /// of revoked ones, and of users whose role changed).
    async fn active_tokens(&self) -> Result<std::collections::HashMap<Uuid, Role>>;
    /// Removes a user: every token of theirs is revoked, every action URL
    /// of theirs is used up, and they are marked removed (see
    /// [`TokenStore::user_removed`]) until a new token is made for them.
    /// `false` if there is no such user.
    async fn remove_user(&self, name: &str) -> Result<bool>;
    /// Whether `name` was removed (and given no token since): nothing is
    /// sent to them and no action URL of theirs answers, those minted after
    /// the removal (their conversations go on) included. `false` for a name
    /// that is no user (`anonymous` in open mode).
    async fn user_removed(&self, name: &str) -> Result<bool>;
    /// Whether any token is active (then every request needs one).
    async fn any_active_token(&self) -> Result<bool>;
}

/// Implements [`TokenStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_token_store {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::store::tokens::TokenStore for $store {
            async fn create_token(
                &self,
                user: &str,
                role: $crate::model::Role,
                label: Option<&str>,
                hash: &str,
            ) -> $crate::error::Result<$crate::store::tokens::TokenInfo> {
                let mut tx = self.writer().begin().await?;
                sqlx::query(
                    "insert into users (name, role, created_at) values ($1, $2, $3)
                     on conflict (name) do update set role = excluded.role, removed_at = null",
                )
                .bind(user)
                .bind(role.as_str())
                .bind($crate::model::now())
                .execute(&mut *tx)
                .await?;
                let id = $crate::model::new_id();
                sqlx::query(
                    "insert into tokens (id, user_name, label, hash, created_at)
                     values ($1, $2, $3, $4, $5)",
                )
                .bind(id)
                .bind(user)
                .bind(label)
                .bind(hash)
                .bind($crate::model::now())
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query_as::<_, $crate::store::tokens::TokenRow>(
                    "select t.id, t.user_name, u.role, t.label, t.created_at, t.revoked_at
                     from tokens t join users u on u.name = t.user_name where t.id = $1",
                )
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                $crate::store::tokens::TokenInfo::try_from(row)
            }

            async fn find_token(
                &self,
                hash: &str,
            ) -> $crate::error::Result<Option<$crate::store::tokens::TokenInfo>> {
                sqlx::query_as::<_, $crate::store::tokens::TokenRow>(
                    "select t.id, t.user_name, u.role, t.label, t.created_at, t.revoked_at
                     from tokens t join users u on u.name = t.user_name
                     where t.hash = $1 and t.revoked_at is null",
                )
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?
                .map($crate::store::tokens::TokenInfo::try_from)
                .transpose()
            }

            async fn list_tokens(
                &self,
            ) -> $crate::error::Result<Vec<$crate::store::tokens::TokenInfo>> {
                sqlx::query_as::<_, $crate::store::tokens::TokenRow>(
                    "select t.id, t.user_name, u.role, t.label, t.created_at, t.revoked_at
                     from tokens t join users u on u.name = t.user_name order by t.id",
                )
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map($crate::store::tokens::TokenInfo::try_from)
                .collect()
            }

            async fn revoke_token(&self, id: uuid::Uuid) -> $crate::error::Result<bool> {
                let done = sqlx::query(
                    "update tokens set revoked_at = $2 where id = $1 and revoked_at is null",
                )
                .bind(id)
                .bind($crate::model::now())
                .execute(self.writer())
                .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn active_tokens(
                &self,
            ) -> $crate::error::Result<std::collections::HashMap<uuid::Uuid, $crate::model::Role>>
            {
                let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as(
                    "select t.id, u.role from tokens t join users u on u.name = t.user_name
                     where t.revoked_at is null",
                )
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter()
                    .map(|(id, role)| Ok((id, $crate::store::tokens::role_col(&role)?)))
                    .collect()
            }

            async fn remove_user(&self, name: &str) -> $crate::error::Result<bool> {
                let mut tx = self.writer().begin().await?;
                // A write first: the transaction takes the write lock at once
                // (SQLite cannot turn a read transaction into a write one
                // after another writer committed: SQLITE_BUSY_SNAPSHOT).
                let now = $crate::model::now();
                for sql in [
                    "update tokens set revoked_at = $2 where user_name = $1 and revoked_at is null",
                    // Their notifications' action URLs end with them.
                    "update action_tokens set used_at = $2 where user_name = $1 and used_at is null",
                    // Marked, so that nothing later is sent to them or
                    // answers as them (see `user_removed`).
                    "update users set removed_at = $2 where name = $1 and removed_at is null",
                ] {
                    sqlx::query(sql)
                        .bind(name)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                let found: Option<(String,)> =
                    sqlx::query_as("select name from users where name = $1")
                        .bind(name)
                        .fetch_optional(&mut *tx)
                        .await?;
                tx.commit().await?;
                Ok(found.is_some())
            }

            async fn user_removed(&self, name: &str) -> $crate::error::Result<bool> {
                let row: Option<(i32,)> = sqlx::query_as(
                    "select 1 from users where name = $1 and removed_at is not null",
                )
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
                Ok(row.is_some())
            }

            async fn any_active_token(&self) -> $crate::error::Result<bool> {
                let row: Option<(i32,)> =
                    sqlx::query_as("select 1 from tokens where revoked_at is null limit 1")
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.is_some())
            }
        }
    };
}

pub(crate) use impl_token_store;
