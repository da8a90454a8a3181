//! The storable fallback: when the database refuses what a commit max_buffered
//! (a NUL character, a string too long for it), each part is written on
//! its own (each event moving the conversation's `last_seq` with it), and a
//! part refused again is written as a stand-in (NULs replaced, long strings
//! cut, the event marked `unstorable`), so that nothing else is lost and
//! `seq` stays gap-free.

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
    /// calls and the conversation's state), publishing each event once it is
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
            self.commit_piece(piece, [piece!(new_permissions: lossy)])
                .await?;
            self.batch.new_permissions.remove(0);
        }
        // Each piece moves `last_seq` up to its event (see `Store::commit`):
        // whatever stops this early, the next journal starts after what is
        // stored.
        while let Some(event) = self.batch.events.first() {
            let stand_ins = event_stand_ins(event)
                .into_iter()
                .map(|e| piece!(events: e));
            if let Some(written) = self
                .commit_piece(piece!(events: event.clone()), stand_ins)
                .await?
            {
                telemetry::events_written(written.events.len());
                self.publish_committed(written.events);
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
        let patch = Batch {
            conversation: self.batch.conversation.take(),
            fence: self.fence,
            link: self.batch.link.take(),
            ..Batch::default()
        };
        self.sink.store.commit(self.conversation_id, &patch).await?;
        self.batch = Batch::default();
        self.committed();
        Ok(())
    }

    /// Commits `piece`, else the first of `stand_ins` the database accepts;
    /// `None` when it refused them all (the piece is dropped, loudly).
    async fn commit_piece(
        &self,
        mut piece: Batch,
        stand_ins: impl IntoIterator<Item = Batch>,
    ) -> Result<Option<Batch>> {
        piece.fence = self.fence;
        let mut refused = match self.sink.store.commit(self.conversation_id, &piece).await {
            Ok(()) => return Ok(Some(piece)),
            Err(e) if e.is_transient() || e.is_fenced() => return Err(e),
            Err(e) => e,
        };
        for mut stand_in in stand_ins {
            stand_in.fence = self.fence;
            tracing::warn!(conversation_id = %self.conversation_id, error = %refused,
                "the database refused part of a batch; storing a stand-in");
            match self
                .sink
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
