//! The storable fallback: when the database refuses what a commit held
//! (a NUL character, a string too long for it), each part is written on
//! its own (each event moving the conversation's `last_seq` with it), and a
//! part refused again is written as a stand-in (NULs replaced, long strings
//! cut, the event marked `unstorable`), so that nothing else is lost and
//! `seq` stays gap-free. An event refused because its `seq` is taken has no
//! stand-in: the journal goes on after what is stored (see
//! `Journal::seq_taken`).

use serde_json::{json, Map, Value};

use super::Journal;
use crate::error::Result;
use crate::model::{Event, EventBody, MessagePart, ToolCall};
use crate::store::Batch;
use crate::telemetry;

/// Longest string kept in a stand-in.
const MAX_STRING: usize = 4096;

/// `value` with NUL characters replaced and long strings cut.
fn stand_in_value(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(stand_in_str(s)),
        Value::Array(items) => Value::Array(items.iter().map(stand_in_value).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (stand_in_str(k), stand_in_value(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn stand_in_str(s: &str) -> String {
    let mut end = s.len().min(MAX_STRING);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = s[..end].replace('\0', "\u{FFFD}");
    if end < s.len() {
        out.push_str("…[cut: could not be stored]");
    }
    out
}

fn stand_in_tool_call(call: &ToolCall) -> ToolCall {
    let text = |s: &Option<String>| s.as_deref().map(stand_in_str);
    let doc = |v: &Option<Value>| v.as_ref().map(stand_in_value);
    ToolCall {
        tool_call_id: stand_in_str(&call.tool_call_id),
        turn_id: call.turn_id,
        title: text(&call.title),
        kind: text(&call.kind),
        status: text(&call.status),
        content: doc(&call.content),
        locations: doc(&call.locations),
        raw_input: doc(&call.raw_input),
        raw_output: doc(&call.raw_output),
        created_at: call.created_at,
        updated_at: call.updated_at,
    }
}

/// What to store instead of an event the database refused, best first:
/// its data made lossy, then only the small members clients rely on
/// (`turn_id`, `stop_reason`, `status`). Both say `unstorable`.
fn event_stand_ins(event: &Event) -> Vec<Event> {
    let note = "the database could not store this event as the agent sent it";
    let data = event.data_value();
    let mut lossy = match stand_in_value(&data) {
        Value::Object(map) => map,
        other => Map::from_iter([("value".to_owned(), other)]),
    };
    lossy.insert("unstorable".into(), json!(note));
    let mut minimal = Map::new();
    for key in ["turn_id", "stop_reason", "status"] {
        if let Some(Value::String(s)) = data.get(key) {
            if s.len() <= 64 && !s.contains('\0') {
                minimal.insert(key.into(), json!(s));
            }
        }
    }
    minimal.insert("unstorable".into(), json!(note));
    [lossy, minimal]
        .into_iter()
        .map(|data| Event {
            body: EventBody::Verbatim {
                kind: event.body.kind().to_owned(),
                data: Value::Object(data),
            },
            ..event.clone()
        })
        .collect()
}

/// A batch of one request, event, message or tool call: a piece.
macro_rules! piece {
    ($field:ident: $item:expr) => {
        Batch {
            $field: vec![$item],
            ..Batch::default()
        }
    };
}

impl Journal {
    /// Writes the batch one piece per transaction, in order (requests before
    /// the events announcing them, events in `seq` order, then messages, tool
    /// calls, usage records and the conversation's state), publishing each event once it is
    /// stored. A piece refused again is replaced by a form the database can
    /// hold: an event keeps its `seq` and `type` and says in `data.unstorable`
    /// why its content is missing; a message, tool call or request keeps its
    /// identity with long or unusual strings cut. Only a transient error stops
    /// this early, and then what is not written yet stays in the batch.
    pub(super) async fn commit_piecewise(&mut self) -> Result<()> {
        while let Some(request) = self.batch.new_permissions.first() {
            let mut lossy = request.clone();
            lossy.tool_call = stand_in_value(&lossy.tool_call);
            lossy.options = lossy.options.iter().map(stand_in_value).collect();
            let piece = piece!(new_permissions: request.clone());
            match self
                .commit_piece(piece, [piece!(new_permissions: lossy)])
                .await
            {
                // Stored by a commit whose answer was lost.
                Err(e) if e.is_unique_violation() => {}
                other => {
                    other?;
                }
            }
            self.batch.new_permissions.remove(0);
        }
        // Each piece moves `last_seq` up to its event (see `Store::commit`):
        // whatever stops this early, the next journal starts after what is
        // stored.
        while let Some(event) = self.batch.events.first() {
            let stand_ins = event_stand_ins(event)
                .into_iter()
                .map(|e| piece!(events: e));
            match self
                .commit_piece(piece!(events: event.clone()), stand_ins)
                .await
            {
                Ok(Some(written)) => {
                    telemetry::events_written(written.events.len());
                    self.publish_committed(written.events);
                }
                Ok(None) => {}
                Err(e) if e.is_unique_violation() => {
                    // Its seq is taken: tried again after it (or it is
                    // this very event, stored already).
                    if self.seq_taken().await? {
                        continue;
                    }
                }
                Err(e) => return Err(e),
            }
            self.batch.events.remove(0);
        }
        while let Some(message) = self.batch.messages.first() {
            // Its own copy of a prompt: the event holding it may have been
            // stored as a stand-in without it.
            let message = MessagePart {
                content_in_event: None,
                ..message.clone()
            };
            let mut lossy = message.clone();
            lossy.message.content = lossy.message.content.iter().map(stand_in_value).collect();
            self.commit_piece(piece!(messages: message), [piece!(messages: lossy)])
                .await?;
            self.batch.messages.remove(0);
        }
        while let Some(call) = self.batch.tool_calls.first() {
            let stand_in = piece!(tool_calls: stand_in_tool_call(call));
            self.commit_piece(piece!(tool_calls: call.clone()), [stand_in])
                .await?;
            self.batch.tool_calls.remove(0);
        }
        // Usage records hold nothing the database refuses (agents' strings
        // are stored as `text_col` makes them) and are written idempotently:
        // no stand-in.
        while let Some(record) = self.batch.usage.first() {
            self.commit_piece(piece!(usage: record.clone()), []).await?;
            self.batch.usage.remove(0);
        }
        let patch = Batch {
            conversation: self.batch.conversation.take(),
            fence: self.fence,
            link: self.batch.link.take(),
            ..Batch::default()
        };
        self.outlets
            .store
            .commit(self.conversation_id, &patch)
            .await?;
        self.batch = Batch::default();
        self.committed();
        Ok(())
    }

    /// The first event of the batch was refused for its `seq`, which is
    /// taken. Either by this very event, stored by a commit whose answer was
    /// lost (same seq, type and time): it is published as stored and leaves
    /// the batch. Or by another, when this journal started (or went on)
    /// behind what is stored: the batch's events move past the newest
    /// stored seq, to be tried again (`true`); they are never stored under
    /// a seq taken, nor dropped for it. `false`: nothing stored takes it
    /// after all (the database refused it for another key): the event is
    /// dropped, loudly.
    async fn seq_taken(&mut self) -> Result<bool> {
        let event = &self.batch.events[0];
        let seq = event.seq;
        let stored = self
            .outlets
            .store
            .list_events(self.conversation_id, seq - 1, 1)
            .await?
            .pop()
            .filter(|s| s.seq == seq);
        if let Some(stored) = stored {
            if stored.body.kind() == event.body.kind() && stored.at == event.at {
                self.batch.events.remove(0);
                self.publish_committed(vec![stored]);
                return Ok(true);
            }
        }
        let newest = self
            .outlets
            .store
            .last_event_seq(self.conversation_id)
            .await?;
        if self.move_past(newest) {
            return Ok(true);
        }
        tracing::error!(conversation_id = %self.conversation_id, seq,
            "the database refused an event for a key it does not hold; it is not stored");
        Ok(false)
    }

    /// Commits `piece`, else the first of `stand_ins` the database accepts;
    /// `None` when it refused them all (the piece is dropped, loudly). A
    /// key that is taken fails it (a stand-in has the same key): see
    /// [`crate::error::Error::is_unique_violation`].
    async fn commit_piece(
        &self,
        mut piece: Batch,
        stand_ins: impl IntoIterator<Item = Batch>,
    ) -> Result<Option<Batch>> {
        piece.fence = self.fence;
        let mut refused = match self
            .outlets
            .store
            .commit(self.conversation_id, &piece)
            .await
        {
            Ok(()) => return Ok(Some(piece)),
            Err(e) if e.is_transient() || e.is_fenced() || e.is_unique_violation() => {
                return Err(e)
            }
            Err(e) => e,
        };
        for mut stand_in in stand_ins {
            stand_in.fence = self.fence;
            tracing::warn!(conversation_id = %self.conversation_id, error = %refused,
                "the database refused part of a batch; storing a stand-in");
            match self
                .outlets
                .store
                .commit(self.conversation_id, &stand_in)
                .await
            {
                Ok(()) => return Ok(Some(stand_in)),
                Err(e) if e.is_transient() || e.is_fenced() => return Err(e),
                Err(e) => refused = e,
            }
        }
        tracing::error!(conversation_id = %self.conversation_id, error = %refused,
            "the database refused part of a batch and every stand-in; it is not stored");
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::journal::tests::journal_in;

    fn thought(text: &str) -> Value {
        json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}})
    }

    /// A commit went through but its answer was lost: the journal tries
    /// its batch again, finds its own events stored under their seqs, and
    /// publishes them once, storing nothing twice; then goes on.
    #[tokio::test]
    async fn events_a_lost_answer_left_stored_are_published_not_stored_again() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, outlets) = journal_in(dir.path()).await;
        let (store, id) = (outlets.store, journal.conversation_id());
        let mut sub = outlets.bus.subscribe(id);
        journal.session_update(thought("a"), None);
        journal.session_update(thought("b"), None);
        let lost = Batch {
            events: journal.batch.events.clone(),
            conversation: Some(journal.patch(2)),
            ..Batch::default()
        };
        store.commit(id, &lost).await.unwrap();

        journal.flush().await.unwrap();
        journal.session_update(thought("c"), None);
        journal.flush().await.unwrap();
        let stored = store.list_events(id, 0, 10).await.unwrap();
        let texts: Vec<(i64, Value)> = stored
            .iter()
            .map(|e| (e.seq, e.data_value()["update"]["content"]["text"].clone()))
            .collect();
        assert_eq!(texts, [(1, json!("a")), (2, json!("b")), (3, json!("c"))]);
        let mut published = Vec::new();
        while let Ok(p) = sub.rx.try_recv() {
            published.push(p.seq);
        }
        assert_eq!(published, [1, 2, 3]);
        let row = store.get_conversation(id).await.unwrap().unwrap();
        assert_eq!(row.last_seq, 3);
    }
}
