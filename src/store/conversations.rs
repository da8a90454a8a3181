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
    /// A new conversation. One that takes over an agent session that an open
    /// conversation of the same owner and agent took over already
    /// (`adopted_session`) is refused: 409 `already_held`, whichever node
    /// tried first.
    async fn insert_conversation(&self, conversation: &Conversation) -> Result<()>;
    /// Removes a conversation and everything of it: only for one that never
    /// got going (a fork or an adoption its agent refused).
    async fn delete_conversation(&self, id: Uuid) -> Result<()>;

    /// Records how much a conversation's worktree differs from its base
    /// (what its newest `changes_*` event says), for the list to show.
    async fn set_change_totals(&self, id: Uuid, totals: &crate::model::ChangeTotals) -> Result<()>;
    /// Of the agent sessions `session_ids` of the agent profile `agent`,
    /// those an open (not closed) conversation of `owner`'s holds (its
    /// session, or the one it took over), each with that conversation's id.
    async fn session_holders(
        &self,
        agent: &str,
        owner: Option<&str>,
        session_ids: &[String],
    ) -> Result<Vec<(String, Uuid)>>;
    /// Of the agent sessions `session_ids` of the agent profile `agent`,
    /// those a conversation of another user than `owner` was made with or
    /// took over (open or closed): never `owner`'s to list or take, even
    /// where users share the agent's home.
    async fn sessions_of_others(
        &self,
        agent: &str,
        owner: &str,
        session_ids: &[String],
    ) -> Result<Vec<String>>;
    /// A conversation, with what it spent.
    async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>>;
    /// Newest first, each with what it spent; `before` is the last id of
    /// the previous page; `owner` limits the list to one user's
    /// conversations (with `shared`, and those shared with them: each then
    /// with their role), `cwd` to those whose working directory is exactly
    /// that path.
    async fn list_conversations(
        &self,
        limit: i64,
        before: Option<Uuid>,
        owner: Option<&str>,
        cwd: Option<&str>,
        shared: bool,
    ) -> Result<Vec<Conversation>>;
    /// What the newest conversation of the agent profile `agent` whose agent
    /// answered `initialize` recorded as `member` of its report (an object),
    /// looking at a few of the newest: one whose agent never started
    /// recorded none.
    async fn agent_reported(&self, agent: &str, member: &str) -> Result<Option<serde_json::Value>>;
    /// The ACP `promptCapabilities` the agent profile's newest conversation
    /// recorded (see [`ConversationStore::agent_reported`]).
    async fn agent_prompt_capabilities(&self, agent: &str) -> Result<Option<serde_json::Value>> {
        self.agent_reported(agent, "prompt_capabilities").await
    }
    /// What the agent profile's newest conversation recorded its agent
    /// offers for sessions (see [`crate::model::SessionOffers`]).
    async fn agent_session_capabilities(&self, agent: &str) -> Result<Option<serde_json::Value>> {
        self.agent_reported(agent, "session_capabilities").await
    }
    /// Conversations whose status says they were busy with their agent
    /// (starting, running a turn, awaiting a permission), each with the turn
    /// it was running.
    async fn live_conversations(&self) -> Result<Vec<(Conversation, Option<Uuid>)>>;
    /// How many conversations have each status (statuses with none left out).
    async fn count_conversations_by_status(&self) -> Result<Vec<(String, i64)>>;
}

/// Implements [`ConversationStore`] for a backend type with a `pool` field
/// (for reads) and a `writer()` method (the pool every write goes through).
/// The invoking module defines `CONVERSATION_SPEND`: the SQL of what
/// conversation `c` spent, a JSON array of `{currency, amount}` (see
/// [`crate::store::usage`]), read and listed with it.
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
                           agent_state, node_id, forked_from, forked_at, adopted_session,
                           worktree)
                         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                           $15, $16)",
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
                    .bind(c.forked_from.as_ref().map(|f| f.conversation_id))
                    .bind(c.forked_from.as_ref().and_then(|f| f.message_id))
                    .bind(&c.adopted_session)
                    .bind(c.worktree.as_ref().map(JsonText::of))
                    .execute(self.writer())
                    .await
                    .map_err($crate::error::Error::from)
                    .map_err(|e| match e.is_unique_violation() {
                        true => $crate::error::Error::conflict(
                            "already_held",
                            format!(
                                "the agent session {:?} is held by another conversation already",
                                c.adopted_session.as_deref().unwrap_or_default()
                            ),
                        ),
                        false => e,
                    })?;
                    Ok(())
                }

                async fn delete_conversation(&self, id: Uuid) -> Result<()> {
                    sqlx::query("delete from conversations where id = $1")
                        .bind(id)
                        .execute(self.writer())
                        .await?;
                    Ok(())
                }

                async fn set_change_totals(
                    &self,
                    id: Uuid,
                    totals: &$crate::model::ChangeTotals,
                ) -> Result<()> {
                    sqlx::query("update conversations set change_totals = $2 where id = $1")
                        .bind(id)
                        .bind(JsonText::of(totals))
                        .execute(self.writer())
                        .await?;
                    Ok(())
                }

                async fn session_holders(
                    &self,
                    agent: &str,
                    owner: Option<&str>,
                    session_ids: &[String],
                ) -> Result<Vec<(String, Uuid)>> {
                    let mut held = Vec::new();
                    // One query per session: a page of a listing is short.
                    for session in session_ids {
                        let holder: Option<(Uuid,)> = sqlx::query_as(
                            "select id from conversations
                             where agent = $1 and ($2 is null or owner = $2)
                               and status <> 'closed'
                               and (acp_session_id = $3 or adopted_session = $3)
                             order by id desc limit 1",
                        )
                        .bind(agent)
                        .bind(owner)
                        .bind(session)
                        .fetch_optional(&self.pool)
                        .await?;
                        if let Some((id,)) = holder {
                            held.push((session.clone(), id));
                        }
                    }
                    Ok(held)
                }

                async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>> {
                    // Its sharing before its spend: `… as spend from
                    // conversations c where c.id = $1` is how the reading of
                    // one conversation is known (tests/suite/db_outage.rs).
                    let sql = format!(
                        "select c.*, {}, {CONVERSATION_SPEND} as spend from conversations c
                         where c.id = $1",
                        $crate::store::members::sharing_columns("null"),
                    );
                    sqlx::query_as::<_, ConversationRow>(&sql)
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
                    shared: bool,
                ) -> Result<Vec<Conversation>> {
                    let sql = format!(
                        "select c.*, {CONVERSATION_SPEND} as spend, {} from conversations c
                         where ($1 is null or c.id < $1)
                           and ($3 is null or c.owner = $3 or ($5 and {}))
                           and ($4 is null or c.cwd = $4)
                         order by c.id desc limit $2",
                        $crate::store::members::sharing_columns("$3"),
                        $crate::store::members::shared_with("$3"),
                    );
                    sqlx::query_as::<_, ConversationRow>(&sql)
                    .bind(before)
                    .bind(limit)
                    .bind(owner)
                    .bind(cwd)
                    .bind(shared)
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(ConversationRow::into_conversation)
                    .collect()
                }

                async fn agent_reported(
                    &self,
                    agent: &str,
                    member: &str,
                ) -> Result<Option<serde_json::Value>> {
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
                        let reported = state?.0.get(member)?.clone();
                        reported.is_object().then_some(reported)
                    }))
                }

                async fn sessions_of_others(
                    &self,
                    agent: &str,
                    owner: &str,
                    session_ids: &[String],
                ) -> Result<Vec<String>> {
                    let mut theirs = Vec::new();
                    for session in session_ids {
                        let other: Option<(Uuid,)> = sqlx::query_as(
                            "select id from conversations
                             where agent = $1 and owner is not null and owner <> $2
                               and (acp_session_id = $3 or adopted_session = $3)
                             limit 1",
                        )
                        .bind(agent)
                        .bind(owner)
                        .bind(session)
                        .fetch_optional(&self.pool)
                        .await?;
                        if other.is_some() {
                            theirs.push(session.clone());
                        }
                    }
                    Ok(theirs)
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
