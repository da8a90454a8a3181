//! The write side of one conversation: assigns `seq`, collects events and the
//! state they imply into a [`Batch`], commits it, then publishes the events.
//!
//! A conversation has exactly one `Journal` at a time (its session task, or
//! the recovery pass at start-up), which is what makes `seq` gap-free without
//! a database round-trip per event.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::bus::EventBus;
use crate::error::Result;
use crate::model::{self, Conversation, ConversationStatus, Event, PermissionRequest};
use crate::store::{Batch, ConversationPatch, Resolution, Store};

/// Shared services a journal writes to.
#[derive(Clone)]
pub struct Sink {
    pub store: std::sync::Arc<dyn Store>,
    pub bus: EventBus,
}

/// See the module docs.
pub struct Journal {
    sink: Sink,
    pub conversation_id: Uuid,
    last_seq: i64,
    pub status: ConversationStatus,
    pub acp_session_id: Option<String>,
    pub turn_id: Option<Uuid>,
    /// The conversation's owner, carried along with published events.
    owner: Option<String>,
    /// What has not been committed yet.
    pub batch: Batch,
    dirty: bool,
}

impl Journal {
    pub fn new(sink: Sink, conversation: &Conversation, turn_id: Option<Uuid>) -> Self {
        Journal {
            sink,
            conversation_id: conversation.id,
            last_seq: conversation.last_seq,
            status: conversation.status,
            acp_session_id: conversation.acp_session_id.clone(),
            turn_id,
            owner: conversation.owner.clone(),
            batch: Batch::default(),
            dirty: false,
        }
    }

    /// The seq of the newest event, committed or not.
    pub fn last_seq(&self) -> i64 {
        self.last_seq
    }

    pub fn store(&self) -> &dyn Store {
        &*self.sink.store
    }

    /// Appends an event to the batch.
    pub fn event(&mut self, kind: &str, data: Value) {
        let event = self.next_event(kind, data);
        self.last_seq = event.seq;
        self.batch.events.push(event);
    }

    fn next_event(&self, kind: &str, data: Value) -> Event {
        Event {
            seq: self.last_seq + 1,
            conversation_id: self.conversation_id,
            kind: kind.to_owned(),
            at: model::now(),
            data,
        }
    }

    pub fn set_status(&mut self, status: ConversationStatus) {
        if self.status != status {
            self.status = status;
            self.dirty = true;
        }
    }

    pub fn set_turn(&mut self, turn_id: Option<Uuid>) {
        self.turn_id = turn_id;
        self.dirty = true;
    }

    fn patch(&self, last_seq: i64) -> ConversationPatch {
        ConversationPatch {
            status: self.status,
            acp_session_id: self.acp_session_id.clone(),
            last_seq,
            current_turn_id: self.turn_id,
            updated_at: model::now(),
        }
    }

    /// Commits the batch and publishes its events. Transient database errors
    /// are retried a few times; the batch is kept if they persist.
    pub async fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() && !self.dirty {
            return Ok(());
        }
        self.batch.conversation = Some(self.patch(self.last_seq));
        let mut attempt = 0;
        loop {
            match self
                .sink
                .store
                .commit(self.conversation_id, &self.batch)
                .await
            {
                Ok(()) => break,
                Err(e) if attempt < 3 => {
                    attempt += 1;
                    tracing::warn!(conversation_id = %self.conversation_id, error = %e, attempt, "commit failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
        let batch = std::mem::take(&mut self.batch);
        self.dirty = false;
        self.sink.bus.publish(self.owner.as_deref(), batch.events);
        Ok(())
    }

    /// Flushes, then applies `resolution` if the request is still pending,
    /// together with its `permission_resolved` event. `None`: someone else
    /// resolved it first.
    pub async fn resolve(&mut self, resolution: &Resolution) -> Result<Option<PermissionRequest>> {
        self.flush().await?;
        let event = self.next_event(model::event_type::PERMISSION_RESOLVED, Value::Null);
        let patch = self.patch(event.seq);
        match self
            .sink
            .store
            .resolve_permission(resolution, event, &patch)
            .await?
        {
            Some((request, event)) => {
                self.last_seq = event.seq;
                self.dirty = false;
                self.sink.bus.publish(self.owner.as_deref(), [event]);
                Ok(Some(request))
            }
            None => Ok(None),
        }
    }
}
