//! `session_update`, the event an agent's stream is made of: its data
//! ([`SessionUpdate`]), the kinds of message chunk ([`ChunkKind`]), how
//! consecutive text chunks join into one event while it is being written,
//! and its JSON text, made once and shared by everything that sends or
//! stores it.
//!
//! A streamed chunk may be megabytes long and is written to the store and
//! sent to every WebSocket: serialising it for each would cost as much
//! again each time. The text is made the first time the event is
//! serialised and kept; changing the update (joining a chunk) drops it.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::model::conversation::{plain_text, plain_text_mut};

/// Which message a chunk belongs to: the `sessionUpdate` of a message
/// chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkKind {
    AgentMessage,
    AgentThought,
    UserMessage,
}

impl ChunkKind {
    /// The ACP `sessionUpdate` tag.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentMessage => "agent_message_chunk",
            Self::AgentThought => "agent_thought_chunk",
            Self::UserMessage => "user_message_chunk",
        }
    }

    /// The kind a `sessionUpdate` tag names, if it is a chunk's.
    pub fn parse(tag: &str) -> Option<Self> {
        Some(match tag {
            "agent_message_chunk" => Self::AgentMessage,
            "agent_thought_chunk" => Self::AgentThought,
            "user_message_chunk" => Self::UserMessage,
            _ => return None,
        })
    }

    /// The update of a plain text chunk of this kind: `{"sessionUpdate":
    /// kind, "content": {"type": "text", "text": text}}`.
    pub fn text_update(self, text: &str) -> Value {
        json!({
            "sessionUpdate": self.as_str(),
            "content": {"type": "text", "text": text},
        })
    }
}

/// `session_update`: an update from the agent, verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = SessionUpdateData)]
pub struct SessionUpdate {
    /// The turn it belongs to; `null` between turns.
    turn_id: Option<Uuid>,
    /// The ACP update object (`sessionUpdate` tells its kind), verbatim.
    /// Consecutive text chunks of one kind may be merged into one event.
    update: Value,
    /// Its JSON text once made (see the module docs).
    #[serde(skip)]
    json: Json,
}

/// The JSON text of a [`SessionUpdate`], once made: shared by its clones,
/// and no part of what the update is (two updates that say the same are
/// equal whether or not either was serialised yet).
#[derive(Clone, Default)]
struct Json(OnceLock<Arc<RawValue>>);

impl PartialEq for Json {
    fn eq(&self, _: &Json) -> bool {
        true
    }
}

impl std::fmt::Debug for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "made"
        } else {
            "not made"
        })
    }
}

impl SessionUpdate {
    pub fn new(turn_id: Option<Uuid>, update: Value) -> SessionUpdate {
        SessionUpdate {
            turn_id,
            update,
            json: Json::default(),
        }
    }

    /// The turn it belongs to.
    pub fn turn_id(&self) -> Option<Uuid> {
        self.turn_id
    }

    /// The agent's update object.
    pub fn update(&self) -> &Value {
        &self.update
    }

    /// Serialises it as its JSON text, made once (see the module docs).
    pub(super) fn serialize_shared<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RawValue::serialize(self.json(), s)
    }

    /// Its JSON text, made the first time it is asked for.
    fn json(&self) -> &Arc<RawValue> {
        self.json.0.get_or_init(|| {
            Arc::from(serde_json::value::to_raw_value(self).expect("an update serializes"))
        })
    }

    /// Makes its JSON text now, so that copies made from here on share it
    /// (see the module docs).
    pub(super) fn make_json(&self) {
        self.json();
    }

    /// Keeps `json`, the text this update was read from, as its JSON text:
    /// it is sent on as stored, not made again.
    pub(super) fn keep_json(&self, json: Arc<RawValue>) {
        let _ = self.json.0.set(json);
    }

    /// The update, to change: the JSON made of it no longer holds.
    fn update_mut(&mut self) -> &mut Value {
        self.json = Json::default();
        &mut self.update
    }

    /// Joins chunk update `next` onto this one when both carry one plain
    /// text block and are equal apart from its text (same kind, no
    /// annotations or `_meta` that joining would lose); `false` leaves it
    /// untouched.
    pub fn join_chunk(&mut self, next: &Value) -> bool {
        let (Some(new_text), Some(_)) = (
            next.get("content").and_then(plain_text),
            self.update.get("content").and_then(plain_text),
        ) else {
            return false;
        };
        if !same_but_text(&self.update, next) {
            return false;
        }
        if let Value::String(text) = &mut self.update_mut()["content"]["text"] {
            text.push_str(new_text);
        }
        true
    }

    /// Its text, to append to, when it is exactly a plain text chunk of
    /// `kind` (nothing else that joining more text would lose).
    pub fn chunk_text_mut(&mut self, kind: ChunkKind) -> Option<&mut String> {
        let map = self.update.as_object().filter(|m| m.len() == 2)?;
        if map.get("sessionUpdate")?.as_str()? != kind.as_str() {
            return None;
        }
        plain_text(map.get("content")?)?;
        plain_text_mut(self.update_mut().get_mut("content")?)
    }

    /// `{turn_id, update}` read back, moving `update` (no copy); else `data`
    /// as it was.
    pub(super) fn from_value(data: Value) -> Result<SessionUpdate, Value> {
        let turn_id = match data.get("turn_id") {
            Some(Value::Null) => None,
            Some(Value::String(id)) => match Uuid::parse_str(id) {
                Ok(id) => Some(id),
                Err(_) => return Err(data),
            },
            _ => return Err(data),
        };
        match data {
            Value::Object(mut map)
                if map.len() == 2
                    && map.keys().next().map(String::as_str) == Some("turn_id")
                    && map.contains_key("update") =>
            {
                let update = map.remove("update").unwrap_or_default();
                Ok(SessionUpdate::new(turn_id, update))
            }
            other => Err(other),
        }
    }
}

/// Whether two chunk updates are equal apart from `content.text` (compared
/// in place: the text may be long, and this runs for every chunk).
fn same_but_text(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return false;
    };
    a.len() == b.len()
        && a.iter().all(|(key, va)| match (key.as_str(), b.get(key)) {
            ("content", Some(vb)) => match (va.as_object(), vb.as_object()) {
                (Some(ca), Some(cb)) => {
                    ca.len() == cb.len()
                        && ca.iter().all(|(k, v)| k == "text" || cb.get(k) == Some(v))
                        && cb.contains_key("text")
                }
                _ => false,
            },
            (_, Some(vb)) => va == vb,
            (_, None) => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &str, text: &str) -> Value {
        json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
    }

    fn shared_text(update: &SessionUpdate) -> String {
        struct Shared<'a>(&'a SessionUpdate);
        impl Serialize for Shared<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.serialize_shared(s)
            }
        }
        serde_json::to_string(&Shared(update)).unwrap()
    }

    #[test]
    fn copies_made_once_its_json_is_made_share_that_text() {
        let update = SessionUpdate::new(None, chunk("agent_message_chunk", "Hello"));
        let before = update.clone();
        update.make_json();
        let after = update.clone();
        assert!(before.json.0.get().is_none());
        assert!(Arc::ptr_eq(update.json(), after.json.0.get().unwrap()));
        assert_eq!(shared_text(&after), shared_text(&before));
    }

    #[test]
    fn chunk_events_join_only_when_nothing_but_the_text_differs() {
        let mut prev = SessionUpdate::new(None, chunk("agent_message_chunk", "Hel"));
        assert!(prev.join_chunk(&chunk("agent_message_chunk", "lo")));
        assert_eq!(prev.update(), &chunk("agent_message_chunk", "Hello"));
        for other in [
            chunk("agent_thought_chunk", "x"),
            json!({"sessionUpdate": "agent_message_chunk", "content":
                {"type": "text", "text": "x", "annotations": {"priority": 1}}}),
            json!({"sessionUpdate": "agent_message_chunk", "_meta": {"a": 1},
                "content": {"type": "text", "text": "x"}}),
            json!({"sessionUpdate": "agent_message_chunk", "content":
                {"type": "image", "data": "AA==", "mimeType": "image/png"}}),
        ] {
            let mut prev = SessionUpdate::new(None, chunk("agent_message_chunk", "Hello"));
            assert!(!prev.join_chunk(&other), "{other}");
            assert_eq!(prev.update(), &chunk("agent_message_chunk", "Hello"));
        }
    }

    #[test]
    fn only_a_plain_text_chunk_of_its_kind_gives_its_text() {
        let mut plain = SessionUpdate::new(None, ChunkKind::AgentThought.text_update("hm"));
        assert!(plain.chunk_text_mut(ChunkKind::AgentMessage).is_none());
        plain
            .chunk_text_mut(ChunkKind::AgentThought)
            .unwrap()
            .push('m');
        assert_eq!(plain.update(), &chunk("agent_thought_chunk", "hmm"));
        let mut meta = SessionUpdate::new(
            None,
            json!({"sessionUpdate": "agent_thought_chunk", "_meta": {},
                "content": {"type": "text", "text": "x"}}),
        );
        assert!(meta.chunk_text_mut(ChunkKind::AgentThought).is_none());
    }

    /// The text made once is the text serialising makes, and a chunk
    /// joined after it was made is in the next one.
    #[test]
    fn the_text_made_once_is_what_serialising_makes_and_follows_a_join() {
        let turn = Some(Uuid::from_u128(7));
        let mut update = SessionUpdate::new(turn, chunk("agent_message_chunk", "Hé \"x\"\n"));
        let made = shared_text(&update);
        assert_eq!(made, serde_json::to_string(&update).unwrap());
        assert_eq!(shared_text(&update.clone()), made);
        assert!(update.join_chunk(&chunk("agent_message_chunk", "more")));
        assert_eq!(
            shared_text(&update),
            serde_json::to_string(&update).unwrap()
        );
        assert!(shared_text(&update).contains("more"));
        update
            .chunk_text_mut(ChunkKind::AgentMessage)
            .unwrap()
            .push('!');
        assert!(shared_text(&update).contains("more!"));
    }
}
