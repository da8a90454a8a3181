//! Conversations as rows: created, read, listed, and counted by status. A
//! part of [`Store`](super::Store) (its supertrait), written once for both
//! backends by [`impl_conversation_store!`]. Their state moves with the
//! events that cause it, so it is written with them, by
//! [`Store::commit`](super::Store::commit) and
//! [`Store::resolve_permission`](super::Store::resolve_permission).

use async_trait::async_trait;
use uuid::Uuid;

use crate::error::Result;
use crate::model::Conversation;

/// Persistence of conversations (see the module).
#[async_trait]
pub trait ConversationStore: Send + Sync {
    async fn insert_conversation(&self, conversation: &Conversation) -> Result<()>;
    async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>>;
    /// Newest first; `before` is the last id of the previous page; `owner`
    /// limits the list to one user's conversations, `cwd` to those whose
    /// working directory is exactly that path.
    async fn list_conversations(
        &self,
        limit: i64,
        before: Option<Uuid>,
        owner: Option<&str>,
        cwd: Option<&str>,
    ) -> Result<Vec<Conversation>>;
    /// The ACP `promptCapabilities` the newest conversation of the agent
    /// profile `agent` whose agent answered `initialize` recorded.
    async fn agent_prompt_capabilities(&self, agent: &str) -> Result<Option<serde_json::Value>>;
    /// Conversations whose status says they were busy with their agent
    /// (starting, running a turn, awaiting a permission), each with the turn
    /// it was running.
    async fn live_conversations(&self) -> Result<Vec<(Conversation, Option<Uuid>)>>;
    /// How many conversations have each status (statuses with none left out).
    async fn count_conversations_by_status(&self) -> Result<Vec<(String, i64)>>;
}

/// Implements [`ConversationStore`] for a backend type with a `pool` field
/// (for reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_conversation_store {
    ($store:ty) => {
        const _: () = {
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::Conversation;
            use $crate::store::rows::{ConversationRow, JsonText};

            #[async_trait::async_trait]
            impl $crate::store::conversations::ConversationStore for $store {
                async fn insert_conversation(&self, c: &Conversation) -> Result<()> {
                    sqlx::query(
                        "insert into conversations (id, agent, title, cwd, status,
                           acp_session_id, last_seq, created_at, updated_at, owner,
                           agent_state, node_id)
                         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                    )
                    .bind(c.id)
                    .bind(&c.agent)
                    .bind(&c.title)
                    .bind(&c.cwd)
                    .bind(c.status.as_str())
                    .bind(&c.acp_session_id)
                    .bind(c.last_seq)
                    .bind(c.created_at)
                    .bind(c.updated_at)
                    .bind(&c.owner)
                    .bind(JsonText::of(&c.state))
                    .bind(c.node_id)
                    .execute(self.writer())
                    .await?;
                    Ok(())
                }

                async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>> {
                    sqlx::query_as::<_, ConversationRow>(
                        "select * from conversations where id = $1",
                    )
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(ConversationRow::into_conversation)
                    .transpose()
                }

                async fn list_conversations(
                    &self,
                    limit: i64,
                    before: Option<Uuid>,
                    owner: Option<&str>,
                    cwd: Option<&str>,
                ) -> Result<Vec<Conversation>> {
                    sqlx::query_as::<_, ConversationRow>(
                        "select * from conversations
                         where ($1 is null or id < $1) and ($3 is null or owner = $3)
                           and ($4 is null or cwd = $4)
                         order by id desc limit $2",
                    )
                    .bind(before)
                    .bind(limit)
                    .bind(owner)
                    .bind(cwd)
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(ConversationRow::into_conversation)
                    .collect()
                }

                async fn agent_prompt_capabilities(
                    &self,
                    agent: &str,
                ) -> Result<Option<serde_json::Value>> {
                    // A few of the newest: one whose agent never started
                    // recorded none.
                    let states: Vec<(Option<sqlx::types::Json<serde_json::Value>>,)> =
                        sqlx::query_as(
                            "select agent_state from conversations
                             where agent = $1 and agent_state is not null
                             order by id desc limit 20",
                        )
                        .bind(agent)
                        .fetch_all(&self.pool)
                        .await?;
                    Ok(states.into_iter().find_map(|(state,)| {
                        let capabilities = state?.0.get("prompt_capabilities")?.clone();
                        capabilities.is_object().then_some(capabilities)
                    }))
                }

                async fn live_conversations(&self) -> Result<Vec<(Conversation, Option<Uuid>)>> {
                    sqlx::query_as::<_, ConversationRow>(
                        "select * from conversations
                         where status in ('starting', 'running', 'awaiting_permission')
                         order by id",
                    )
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(ConversationRow::into_parts)
                    .collect()
                }

                async fn count_conversations_by_status(&self) -> Result<Vec<(String, i64)>> {
                    Ok(sqlx::query_as(
                        "select status, count(*) from conversations
                         group by status order by status",
                    )
                    .fetch_all(&self.pool)
                    .await?)
                }
            }
        };
    };
}

pub(crate) use impl_conversation_store;
