//! Reading what a conversation's events made: its messages (each stored in
//! parts, one per commit that added to it) and its tool calls' latest
//! states. A part of [`Store`](super::Store) (its supertrait), written once
//! for both backends by [`impl_message_store!`]; both are written with the
//! events they come from, by [`Store::commit`](super::Store::commit).

use async_trait::async_trait;
use uuid::Uuid;

use super::page::Bounded;
use crate::error::Result;
use crate::model::{Message, ToolCall};

/// Reads of messages and tool calls (see the module).
#[async_trait]
pub trait MessageStore: Send + Sync {
    /// Every message of the conversation, oldest first.
    async fn list_messages(&self, conversation_id: Uuid) -> Result<Vec<Message>>;
    /// A page of the conversation's messages after the message `after` (from
    /// the first without), oldest first, bounded as
    /// [`EventStore::list_events_page`](super::events::EventStore::list_events_page):
    /// a message counts whole, its parts joined.
    async fn list_messages_page(
        &self,
        conversation_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Bounded<Message>>;
    /// The conversation's newest message (its content left empty) and the
    /// number of its next part, if it has any.
    async fn last_message(&self, conversation_id: Uuid) -> Result<Option<(Message, i32)>>;
    /// Whether the conversation has had the turn `turn_id` (its prompt is
    /// stored with it).
    async fn turn_exists(&self, conversation_id: Uuid, turn_id: Uuid) -> Result<bool>;
    async fn list_tool_calls(&self, conversation_id: Uuid) -> Result<Vec<ToolCall>>;
}

/// Adds the parts of the page's messages to them, as `parts` (every part of
/// the messages from the page's first to its last, in message id and part
/// order) holds them; a message whose parts would pass the page's byte
/// bound ends the page before it (the first message is the page's whatever
/// its size).
pub(super) async fn join_parts(
    page: &mut Bounded<Message>,
    mut parts: impl futures::Stream<Item = Result<super::rows::MessagePartRow, sqlx::Error>> + Unpin,
) -> Result<()> {
    use futures::TryStreamExt as _;
    // Both in id order: one pass joins every part to its message.
    let mut at = 0;
    while let Some(part) = parts.try_next().await? {
        while page.items.get(at).is_some_and(|m| m.id != part.message_id) {
            at += 1;
        }
        if at >= page.items.len() {
            break;
        }
        let size = super::page::json_size(&part.content.0);
        if at == 0 {
            // The first message is the page's whatever its size.
            page.count(size);
        } else if !page.grow(size) {
            // This message passes the bound: the page ends
            // before it, and it starts the next.
            page.items.truncate(at);
            break;
        }
        page.items[at].extend(part.content.0);
    }
    Ok(())
}

/// Implements [`MessageStore`] for a backend type with a `pool` field.
macro_rules! impl_message_store {
    ($store:ty) => {
        const _: () = {
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::{Message, ToolCall};
            use $crate::store::page::Bounded;
            use $crate::store::messages::{join_parts, MessageStore};
            use $crate::store::rows::{MessagePartRow, MessageRow, ToolCallRow};

            #[async_trait::async_trait]
            impl MessageStore for $store {
                async fn list_messages(&self, conversation_id: Uuid) -> Result<Vec<Message>> {
                    let page = self
                        .list_messages_page(conversation_id, None, i64::MAX, usize::MAX)
                        .await?;
                    Ok(page.items)
                }

                async fn list_messages_page(
                    &self,
                    conversation_id: Uuid,
                    after: Option<Uuid>,
                    limit: i64,
                    max_bytes: usize,
                ) -> Result<Bounded<Message>> {
                    let mut page = Bounded::new(limit, max_bytes);
                    // A prompt's content is read from its `turn_started`.
                    let rows = sqlx::query_as::<_, MessageRow>(
                        "select m.id, m.turn_id, m.role, m.content, m.created_at, e.data as prompt
                         from messages m
                         left join events e on e.conversation_id = m.conversation_id
                           and e.seq = m.prompt_seq
                         where m.conversation_id = $1 and ($2 is null or m.id > $2)
                         order by m.id limit $3",
                    )
                    .bind(conversation_id)
                    .bind(after)
                    .bind(limit)
                    .fetch(&self.pool);
                    page.fill(rows, Message::try_from).await?;
                    let (Some(first), Some(last)) = (page.items.first(), page.items.last()) else {
                        return Ok(page);
                    };
                    let (first, last) = (first.id, last.id);
                    let parts = sqlx::query_as::<_, MessagePartRow>(
                        "select message_id, content from message_parts
                         where conversation_id = $1 and message_id >= $2 and message_id <= $3
                         order by message_id, part",
                    )
                    .bind(conversation_id)
                    .bind(first)
                    .bind(last)
                    .fetch(&self.pool);
                    join_parts(&mut page, parts).await?;
                    Ok(page)
                }

                async fn turn_exists(&self, conversation_id: Uuid, turn_id: Uuid) -> Result<bool> {
                    let found: Option<i32> = sqlx::query_scalar(
                        "select 1 from messages where conversation_id = $1 and turn_id = $2 limit 1",
                    )
                    .bind(conversation_id)
                    .bind(turn_id)
                    .fetch_optional(&self.pool)
                    .await?;
                    Ok(found.is_some())
                }

                async fn last_message(
                    &self,
                    conversation_id: Uuid,
                ) -> Result<Option<(Message, i32)>> {
                    let row: Option<(
                        Uuid,
                        Option<Uuid>,
                        String,
                        chrono::DateTime<chrono::Utc>,
                        i64,
                    )> = sqlx::query_as(
                        "select m.id, m.turn_id, m.role, m.created_at,
                               (select count(*) from message_parts p
                                where p.conversation_id = m.conversation_id and p.message_id = m.id)
                             from messages m where m.conversation_id = $1
                             order by m.id desc limit 1",
                    )
                    .bind(conversation_id)
                    .fetch_optional(&self.pool)
                    .await?;
                    let Some((id, turn_id, role, created_at, parts)) = row else {
                        return Ok(None);
                    };
                    let role = $crate::model::MessageRole::parse(&role).ok_or_else(|| {
                        $crate::error::Error::Internal(anyhow::anyhow!("message role {role:?}"))
                    })?;
                    let message = Message {
                        id,
                        turn_id,
                        role,
                        content: Vec::new(),
                        created_at,
                    };
                    Ok(Some((message, 1 + parts as i32)))
                }

                async fn list_tool_calls(&self, conversation_id: Uuid) -> Result<Vec<ToolCall>> {
                    let rows = sqlx::query_as::<_, ToolCallRow>(
                        "select * from tool_calls where conversation_id = $1
                         order by created_at, tool_call_id",
                    )
                    .bind(conversation_id)
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(ToolCall::from).collect())
                }
            }
        };
    };
}

pub(crate) use impl_message_store;
