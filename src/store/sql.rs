//! The SQL both backends share. Postgres and SQLite accept the same
//! statements (`$n` parameters, `on conflict`, `returning`), and every
//! bound and decoded type exists in both drivers, so each part of
//! [`Store`](super::backend::Store) is written once, as a macro that a
//! backend expands against its own pool: [`impl_store!`] here (the
//! appending writes, and every part by job through their own macros),
//! [`impl_notify_store!`](super::notify) beside it.
//!
//! What differs is each backend's own: how it matches search words, its
//! commit (Postgres writes a batch in one statement, one round trip;
//! SQLite, in the process, in one transaction of several statements), and
//! Postgres' resolution of a request in one statement. The clauses that
//! decide what a commit leaves where a row is stored already are written
//! here once, for both commits.

/// What a commit does with a tool call already stored: takes its new state,
/// keeping the `turn_id` and `created_at` it was first written with.
macro_rules! tool_call_update {
    () => {
        "on conflict (conversation_id, tool_call_id) do update set
           title = excluded.title, kind = excluded.kind, status = excluded.status,
           content = excluded.content, locations = excluded.locations,
           raw_input = excluded.raw_input, raw_output = excluded.raw_output,
           updated_at = excluded.updated_at"
    };
}

/// What a commit does with a message's search text already stored: adds
/// to it while it is under the cap, the parameter that follows (so a huge
/// message costs no more).
macro_rules! search_text_append {
    () => {
        "on conflict (message_id) do update
           set body = search_texts.body || excluded.body
           where length(search_texts.body) < "
    };
}

pub(crate) use {search_text_append, tool_call_update};

/// The statements both backends' writes share, for the backend's connection
/// type `$conn`: `fence`, `bind_patch`, `update_conversation` and
/// `insert_event`, defined in the invoking module (its commit uses them).
macro_rules! shared_writes {
    ($conn:ty) => {
        type Db = <$conn as sqlx::Connection>::Database;

        /// Holds the conversation for this transaction if its owner epoch is
        /// still `fence` (a write lock on its row, so no claim slips in
        /// before the commit); otherwise the transaction writes nothing.
        async fn fence(
            tx: &mut $conn,
            conversation_id: uuid::Uuid,
            fence: Option<i64>,
        ) -> $crate::error::Result<()> {
            let Some(epoch) = fence else { return Ok(()) };
            let held = sqlx::query(
                "update conversations set owner_epoch = owner_epoch
                 where id = $1 and owner_epoch = $2",
            )
            .bind(conversation_id)
            .bind(epoch)
            .execute(tx)
            .await?
            .rows_affected();
            if held == 0 {
                return Err($crate::error::Error::Fenced(conversation_id));
            }
            Ok(())
        }

        /// Binds a patch's seven columns (status, acp_session_id, last_seq,
        /// current_turn_id, updated_at, agent_state, prompt_queue), in that
        /// order.
        fn bind_patch<'q>(
            query: sqlx::query::Query<'q, Db, <Db as sqlx::Database>::Arguments<'q>>,
            patch: &'q $crate::store::backend::ConversationPatch,
        ) -> sqlx::query::Query<'q, Db, <Db as sqlx::Database>::Arguments<'q>> {
            use $crate::store::rows::{text_col, JsonText};
            query
                .bind(patch.status.as_str())
                .bind(patch.acp_session_id.as_deref().map(text_col))
                .bind(patch.last_seq)
                .bind(patch.current_turn_id)
                .bind(patch.updated_at)
                .bind(patch.state.as_ref().map(JsonText::of))
                .bind(patch.queue.as_ref().map(JsonText::of))
        }

        async fn update_conversation(
            tx: &mut $conn,
            conversation_id: uuid::Uuid,
            patch: &$crate::store::backend::ConversationPatch,
        ) -> $crate::error::Result<()> {
            let query = sqlx::query(
                "update conversations set status = $2, acp_session_id = $3, last_seq = $4,
                   current_turn_id = $5, updated_at = $6, agent_state = coalesce($7, agent_state),
                   prompt_queue = coalesce($8, prompt_queue)
                 where id = $1",
            )
            .bind(conversation_id);
            bind_patch(query, patch).execute(tx).await?;
            Ok(())
        }

        async fn insert_event(
            tx: &mut $conn,
            conversation_id: uuid::Uuid,
            event: &$crate::model::Event,
        ) -> $crate::error::Result<()> {
            sqlx::query(
                "insert into events (conversation_id, seq, type, at, data)
                 values ($1, $2, $3, $4, $5)",
            )
            .bind(conversation_id)
            .bind(event.seq)
            .bind(event.body.kind())
            .bind(event.at)
            .bind($crate::store::rows::JsonText::of(&event.body.data()))
            .execute(tx)
            .await?;
            Ok(())
        }
    };
}

/// Implements [`Store`](super::backend::Store) and its parts by job for a
/// backend type with a `pool` field (for reads), a `writer()` method (the
/// pool every write goes through) and a `lanes` field
/// ([`Lanes`](super::backend::Lanes): who goes first to the writer);
/// `$conn` is the backend's connection type. It defines, for the
/// backend's own code, what [`shared_writes!`] does. The invoking module
/// must define what [`impl_search_store!`](super::search) needs, and
/// - `async fn write_batch(&Pool, Uuid, &Batch) -> Result<()>`: the
///   backend's one commit of a batch, all of it or nothing (see
///   [`Store::commit`](super::backend::Store::commit) for what it writes);
/// - `async fn resolve_at_once(&Pool, &Resolution, &Event, &ConversationPatch, Option<i64>) -> Result<Option<Event>>`:
///   a resolution in one statement where the backend can; `None` where it
///   cannot, or the stored request is not as the resolution expects, and
///   the transaction here decides.
macro_rules! impl_store {
    ($store:ty, $conn:ty) => {
        $crate::store::sql::shared_writes!($conn);

        const _: () = {
            use $crate::error::Result;
            use $crate::model::{Event, PermissionRequest};
            use $crate::store::backend::{Batch, ConversationPatch, Resolution};
            use $crate::store::rows::{JsonText, PermissionRow};

            #[async_trait::async_trait]
            impl $crate::store::backend::Store for $store {
                async fn ping(&self) -> Result<()> {
                    sqlx::query("select 1").execute(&self.pool).await?;
                    Ok(())
                }

                async fn commit(&self, conversation_id: uuid::Uuid, batch: &Batch) -> Result<()> {
                    if batch.is_empty() {
                        return Ok(());
                    }
                    let _place = self.lanes.enter(batch.lane).await;
                    write_batch(self.writer(), conversation_id, batch).await?;
                    $crate::telemetry::transaction(batch.rows());
                    Ok(())
                }

                async fn resolve_permission(
                    &self,
                    resolution: &Resolution,
                    mut event: Event,
                    patch: &ConversationPatch,
                    fence_at: Option<i64>,
                ) -> Result<Option<(PermissionRequest, Event)>> {
                    let at_once =
                        resolve_at_once(self.writer(), resolution, &event, patch, fence_at);
                    if let Some(event) = at_once.await? {
                        $crate::telemetry::transaction(3);
                        return Ok(Some((resolution.resolved(), event)));
                    }
                    let mut tx = self.writer().begin().await?;
                    fence(&mut tx, event.conversation_id, fence_at).await?;
                    // A write first: the transaction takes the write lock at once.
                    let row = sqlx::query_as::<_, PermissionRow>(
                        "update permission_requests set status = $2, decision = $3
                         where id = $1 and status = 'pending' returning *",
                    )
                    .bind(resolution.request.id)
                    .bind(resolution.status.as_str())
                    .bind(JsonText::of(&resolution.decision))
                    .fetch_optional(&mut *tx)
                    .await?;
                    let Some(row) = row else {
                        return Ok(None);
                    };
                    let request = PermissionRequest::try_from(row)?;
                    event.body = $crate::model::EventBody::resolved(request.clone());
                    insert_event(&mut tx, event.conversation_id, &event).await?;
                    update_conversation(&mut tx, event.conversation_id, patch).await?;
                    tx.commit().await?;
                    // The request, its event and the conversation.
                    $crate::telemetry::transaction(3);
                    Ok(Some((request, event)))
                }
            }
        };

        $crate::store::conversations::impl_conversation_store!($store);
        $crate::store::search::impl_search_store!($store);
        $crate::store::events::impl_event_store!($store);
        $crate::store::messages::impl_message_store!($store);
        $crate::store::permissions::impl_permission_store!($store);
        $crate::store::processes::impl_process_store!($store);
        $crate::store::usage::impl_usage_store!($store);
        $crate::store::tokens::impl_token_store!($store);
        $crate::store::budgets::impl_budget_store!($store);
        $crate::store::share_links::impl_share_link_store!($store);
        $crate::store::members::impl_member_store!($store);
    };
}

pub(crate) use {impl_store, shared_writes};
