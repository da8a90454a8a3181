//! Read-only share links of conversations (only each token's SHA-256 is
//! kept; see `crate::api`'s share links). A part of [`Store`](super::Store)
//! (its supertrait), written once for both backends by
//! [`impl_share_link_store!`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;

/// A share link as stored: its token's hash, never the token.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ShareLink {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub token_hash: String,
    /// `user:<name>`.
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ShareLink {
    /// Neither revoked nor expired at `now`.
    pub fn usable(&self, now: DateTime<Utc>) -> bool {
        self.revoked_at.is_none() && self.expires_at > now
    }
}

/// The most ids one statement asks about (SQLite's bound parameters are
/// limited; Postgres' too, far higher).
pub(crate) const IDS_PER_STATEMENT: usize = 500;

/// Persistence of share links (see the module).
#[async_trait]
pub trait ShareLinkStore: Send + Sync {
    /// Stores a link as it is; `false` when one with its id or its hash
    /// exists (left as it is: `export` run again).
    async fn insert_share_link(&self, link: &ShareLink) -> Result<bool>;
    /// The link with this token hash, whatever its state.
    async fn find_share_link(&self, token_hash: &str) -> Result<Option<ShareLink>>;
    /// A conversation's links, oldest first, revoked and expired ones too.
    async fn list_share_links(&self, conversation_id: Uuid) -> Result<Vec<ShareLink>>;
    /// Revokes the conversation's link `id` at `now` unless it was already;
    /// the link as it is now (`None`: the conversation has no such link).
    async fn revoke_share_link(
        &self,
        conversation_id: Uuid,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<ShareLink>>;
    /// Of `ids`, those that are still stored and not revoked (expiry is for
    /// the caller to see).
    async fn unrevoked_share_links(&self, ids: &[Uuid]) -> Result<Vec<Uuid>>;
    /// Every link, oldest first (for `export`).
    async fn all_share_links(&self) -> Result<Vec<ShareLink>>;
}

/// `$1, $2, …, $n`.
pub(crate) fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Implements [`ShareLinkStore`] for a backend type with a `pool` field
/// (for reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_share_link_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::store::share_links::{ShareLink, ShareLinkStore};

            #[async_trait::async_trait]
            impl ShareLinkStore for $store {
                async fn insert_share_link(&self, l: &ShareLink) -> Result<bool> {
                    let done = sqlx::query(
                        "insert into share_links (id, conversation_id, token_hash, created_by,
                           created_at, expires_at, revoked_at)
                         values ($1, $2, $3, $4, $5, $6, $7) on conflict do nothing",
                    )
                    .bind(l.id)
                    .bind(l.conversation_id)
                    .bind(&l.token_hash)
                    .bind(&l.created_by)
                    .bind(l.created_at)
                    .bind(l.expires_at)
                    .bind(l.revoked_at)
                    .execute(self.writer())
                    .await?;
                    Ok(done.rows_affected() > 0)
                }

                async fn find_share_link(&self, token_hash: &str) -> Result<Option<ShareLink>> {
                    Ok(sqlx::query_as::<_, ShareLink>(
                        "select * from share_links where token_hash = $1",
                    )
                    .bind(token_hash)
                    .fetch_optional(&self.pool)
                    .await?)
                }

                async fn list_share_links(&self, conversation_id: Uuid) -> Result<Vec<ShareLink>> {
                    Ok(sqlx::query_as::<_, ShareLink>(
                        "select * from share_links where conversation_id = $1
                         order by created_at, id",
                    )
                    .bind(conversation_id)
                    .fetch_all(&self.pool)
                    .await?)
                }

                async fn revoke_share_link(
                    &self,
                    conversation_id: Uuid,
                    id: Uuid,
                    now: DateTime<Utc>,
                ) -> Result<Option<ShareLink>> {
                    sqlx::query(
                        "update share_links set revoked_at = $3
                         where id = $1 and conversation_id = $2 and revoked_at is null",
                    )
                    .bind(id)
                    .bind(conversation_id)
                    .bind(now)
                    .execute(self.writer())
                    .await?;
                    Ok(sqlx::query_as::<_, ShareLink>(
                        "select * from share_links where id = $1 and conversation_id = $2",
                    )
                    .bind(id)
                    .bind(conversation_id)
                    .fetch_optional(self.writer())
                    .await?)
                }

                async fn unrevoked_share_links(&self, ids: &[Uuid]) -> Result<Vec<Uuid>> {
                    let mut found = Vec::new();
                    for chunk in ids.chunks($crate::store::share_links::IDS_PER_STATEMENT) {
                        let sql = format!(
                            "select id from share_links where revoked_at is null and id in ({})",
                            $crate::store::share_links::placeholders(chunk.len())
                        );
                        let mut query = sqlx::query_as::<_, (Uuid,)>(&sql);
                        for id in chunk {
                            query = query.bind(*id);
                        }
                        found.extend(
                            query
                                .fetch_all(&self.pool)
                                .await?
                                .into_iter()
                                .map(|(id,)| id),
                        );
                    }
                    Ok(found)
                }

                async fn all_share_links(&self) -> Result<Vec<ShareLink>> {
                    Ok(sqlx::query_as::<_, ShareLink>(
                        "select * from share_links order by created_at, id",
                    )
                    .fetch_all(&self.pool)
                    .await?)
                }
            }
        };
    };
}

pub(crate) use impl_share_link_store;
