//! Reading a conversation's event log: in order after a `seq`, by page, by
//! type, and where it ends. A part of [`Store`](super::Store) (its
//! supertrait), written once for both backends by [`impl_event_store!`].
//! Events are only ever appended, with what they cause, by
//! [`Store::commit`](super::Store::commit) and
//! [`Store::resolve_permission`](super::Store::resolve_permission).

use async_trait::async_trait;
use uuid::Uuid;

use super::page::Bounded;
use crate::error::Result;
use crate::model::Event;

/// Reads of the event log (see the module).
#[async_trait]
pub trait EventStore: Send + Sync {
    /// The conversation's events with `seq > after`, ascending, at most
    /// `limit` (unbounded in bytes: for tools, not for clients).
    async fn list_events(
        &self,
        conversation_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>>;
    /// The `seq` of the conversation's newest stored event (0: none).
    async fn last_event_seq(&self, conversation_id: Uuid) -> Result<i64>;
    /// A page of the conversation's events with `seq > after`, ascending,
    /// bounded by `limit` and `max_bytes` (see [`Bounded`]); rows past the
    /// bound are not read.
    async fn list_events_page(
        &self,
        conversation_id: Uuid,
        after: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Bounded<Event>>;
    /// A page of the conversation's events of one `type` with `seq >
    /// after`, ascending, bounded as [`EventStore::list_events_page`].
    async fn list_events_of_type(
        &self,
        conversation_id: Uuid,
        kind: &str,
        after: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Bounded<Event>>;
}

/// The conversation `$1`'s events after `seq` `$2`, at most `$3`.
pub(super) const EVENTS_AFTER: &str = "select * from events where conversation_id = $1 and seq > $2
     order by seq limit $3";

/// Implements [`EventStore`] for a backend type with a `pool` field.
macro_rules! impl_event_store {
    ($store:ty) => {
        const _: () = {
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::Event;
            use $crate::store::events::EVENTS_AFTER;
            use $crate::store::page::Bounded;
            use $crate::store::rows::EventRow;

            #[async_trait::async_trait]
            impl $crate::store::events::EventStore for $store {
                async fn list_events(
                    &self,
                    conversation_id: Uuid,
                    after: i64,
                    limit: i64,
                ) -> Result<Vec<Event>> {
                    let rows = sqlx::query_as::<_, EventRow>(EVENTS_AFTER)
                        .bind(conversation_id)
                        .bind(after)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                    Ok(rows.into_iter().map(Event::from).collect())
                }

                async fn last_event_seq(&self, conversation_id: Uuid) -> Result<i64> {
                    let newest: Option<i64> = sqlx::query_scalar(
                        "select max(seq) from events where conversation_id = $1",
                    )
                    .bind(conversation_id)
                    .fetch_one(&self.pool)
                    .await?;
                    Ok(newest.unwrap_or(0))
                }

                async fn list_events_page(
                    &self,
                    conversation_id: Uuid,
                    after: i64,
                    limit: i64,
                    max_bytes: usize,
                ) -> Result<Bounded<Event>> {
                    let mut page = Bounded::new(limit, max_bytes);
                    let rows = sqlx::query_as::<_, EventRow>(EVENTS_AFTER)
                        .bind(conversation_id)
                        .bind(after)
                        .bind(limit)
                        .fetch(&self.pool);
                    page.fill(rows, |row| Ok(Event::from(row))).await?;
                    Ok(page)
                }

                async fn list_events_of_type(
                    &self,
                    conversation_id: Uuid,
                    kind: &str,
                    after: i64,
                    limit: i64,
                    max_bytes: usize,
                ) -> Result<Bounded<Event>> {
                    let mut page = Bounded::new(limit, max_bytes);
                    let rows = sqlx::query_as::<_, EventRow>(
                        "select * from events
                         where conversation_id = $1 and type = $2 and seq > $3
                         order by seq limit $4",
                    )
                    .bind(conversation_id)
                    .bind(kind)
                    .bind(after)
                    .bind(limit)
                    .fetch(&self.pool);
                    page.fill(rows, |row| Ok(Event::from(row))).await?;
                    Ok(page)
                }
            }
        };
    };
}

pub(crate) use impl_event_store;
