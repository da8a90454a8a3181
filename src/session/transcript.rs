//! What was said in a conversation, as messages and tool-call states, built
//! from the user's prompts and the agent's `session/update` notifications.
//!
//! Pure: it knows nothing of the journal, the store or the agent. The session
//! task feeds it and writes out [`Transcript::take_changes`] with each batch.
//! Consecutive chunks of one role within one turn form one message (text
//! joined); a chunk of another role or turn starts a new one. Tool calls are
//! the result of every `tool_call` / `tool_call_update` seen for their id.

use std::collections::HashMap;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::model::{self, ChunkKind, Message, MessagePart, MessageRole, ToolCall};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Transcript {
    /// The message chunks currently merge into.
    current: Option<Current>,
    /// Parts of messages that ended (another role or turn began), not taken
    /// yet.
    ended: Vec<MessagePart>,
    tool_calls: HashMap<String, ToolCall>,
    /// Tool calls changed since the last take, in the order first changed.
    changed_tool_calls: Vec<String>,
}

/// The message being streamed: what was added since it was last taken, and
/// the number of its next part. What was taken before is not kept: memory
/// is bounded by a batch, not by the message.
#[derive(Debug)]
struct Current {
    /// The message, `content` holding the blocks not taken yet.
    message: Message,
    part: i32,
}

impl Current {
    /// Its new blocks as a part, if there are any.
    fn take_part(&mut self) -> Option<MessagePart> {
        if self.message.content.is_empty() {
            return None;
        }
        let message = &mut self.message;
        let part = MessagePart {
            part: self.part,
            message: Message {
                id: message.id,
                turn_id: message.turn_id,
                role: message.role,
                content: std::mem::take(&mut message.content),
                created_at: message.created_at,
            },
            content_in_event: None,
        };
        self.part += 1;
        Some(part)
    }
}

/// What changed since the last [`Transcript::take_changes`]: what was added
/// to messages, and the current state of each changed tool call (upserted).
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub messages: Vec<MessagePart>,
    pub tool_calls: Vec<ToolCall>,
}

impl Transcript {
    /// A prompt starts `turn_id`: it is a message of its own, whose content
    /// is stored in the event `in_event` announcing the turn (not again).
    pub fn user_prompt(&mut self, turn_id: Uuid, content: Vec<Value>, in_event: i64) {
        self.end_message();
        self.ended.push(MessagePart {
            part: 0,
            message: Message {
                id: model::new_id(),
                turn_id: Some(turn_id),
                role: MessageRole::User,
                content,
                created_at: model::now(),
            },
            content_in_event: Some(in_event),
        });
    }

    /// Takes up where an earlier run left a turn (its agent reattached):
    /// chunks go on into `current` (the turn's newest message, and its
    /// next part's number) while it is of their role, and updates of
    /// `tool_calls` (the turn's) build on what is stored of them.
    pub fn take_up(&mut self, current: Option<(Message, i32)>, tool_calls: Vec<ToolCall>) {
        self.current = current.map(|(message, part)| Current { message, part });
        for call in tool_calls {
            self.tool_calls.insert(call.tool_call_id.clone(), call);
        }
    }

    /// Applies an agent's update; `true` when it is a message chunk (whose
    /// event may be joined to the previous one, see
    /// [`model::SessionUpdate::join_chunk`]).
    pub fn apply(&mut self, update: &Value, turn_id: Option<Uuid>) -> bool {
        let kind = update
            .get("sessionUpdate")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(chunk) = ChunkKind::parse(kind) {
            if let Some(block) = update.get("content") {
                self.add_to_message(role(chunk), turn_id, block);
            }
            return true;
        }
        match kind {
            "tool_call" | "tool_call_update" => {
                if let Some(id) = update.get("toolCallId").and_then(Value::as_str) {
                    self.apply_tool_call(id, turn_id, update);
                }
                false
            }
            _ => false,
        }
    }

    /// Applies a plain text chunk of `kind` read on the fast path (as
    /// [`Transcript::apply`] would its update).
    pub fn text_chunk(&mut self, kind: ChunkKind, text: &str, turn_id: Option<Uuid>) {
        let role = role(kind);
        match &mut self.current {
            Some(current) if current.message.role == role && current.message.turn_id == turn_id => {
                current.message.push_text(text);
            }
            _ => self.add_to_message(role, turn_id, &json!({"type": "text", "text": text})),
        }
    }

    /// Applies what a permission request's `toolCall` (an update of the
    /// call, without `sessionUpdate`) says to the call's record.
    pub fn apply_tool_call_update(&mut self, update: &Value, turn_id: Option<Uuid>) {
        if let Some(id) = update.get("toolCallId").and_then(Value::as_str) {
            self.apply_tool_call(id, turn_id, update);
        }
    }

    /// What is known of a tool call, overlaid with `update` (a permission
    /// request's `toolCall`, which may carry only some fields).
    pub fn known_tool_call(&self, update: &Value) -> Value {
        let mut merged = serde_json::Map::new();
        let known = update
            .get("toolCallId")
            .and_then(Value::as_str)
            .and_then(|id| self.tool_calls.get(id));
        if let Some(call) = known {
            let fields = [
                ("kind", call.kind.clone().map(Value::from)),
                ("title", call.title.clone().map(Value::from)),
                ("locations", call.locations.clone()),
                ("rawInput", call.raw_input.clone()),
            ];
            // What the agent never said stays out, rather than `null`.
            for (k, v) in fields {
                if let Some(v) = v.filter(|v| !v.is_null()) {
                    merged.insert(k.to_owned(), v);
                }
            }
        }
        if let Some(update) = update.as_object() {
            for (k, v) in update {
                if !v.is_null() {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
        Value::Object(merged)
    }

    /// Everything that changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        let mut messages = std::mem::take(&mut self.ended);
        messages.extend(self.current.as_mut().and_then(Current::take_part));
        let tool_calls = self
            .changed_tool_calls
            .drain(..)
            .filter_map(|id| self.tool_calls.get(&id).cloned())
            .collect();
        Changes {
            messages,
            tool_calls,
        }
    }

    fn end_message(&mut self) {
        if let Some(mut current) = self.current.take() {
            self.ended.extend(current.take_part());
        }
    }

    fn add_to_message(&mut self, role: MessageRole, turn_id: Option<Uuid>, block: &Value) {
        match &mut self.current {
            Some(current) if current.message.role == role && current.message.turn_id == turn_id => {
                current.message.push_block(block);
            }
            _ => {
                self.end_message();
                let mut message = Message {
                    id: model::new_id(),
                    turn_id,
                    role,
                    content: Vec::new(),
                    created_at: model::now(),
                };
                message.push_block(block);
                self.current = Some(Current { message, part: 0 });
            }
        }
    }

    fn apply_tool_call(&mut self, id: &str, turn_id: Option<Uuid>, update: &Value) {
        let at = model::now();
        let call = self
            .tool_calls
            .entry(id.to_owned())
            .or_insert_with(|| ToolCall::new(id.to_owned(), turn_id, at));
        call.apply(update, at);
        if !self.changed_tool_calls.iter().any(|c| c == id) {
            self.changed_tool_calls.push(id.to_owned());
        }
    }
}

/// The role of the message a chunk of `kind` belongs to.
fn role(kind: ChunkKind) -> MessageRole {
    match kind {
        ChunkKind::AgentMessage => MessageRole::Agent,
        ChunkKind::AgentThought => MessageRole::Thought,
        ChunkKind::UserMessage => MessageRole::User,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &str, text: &str) -> Value {
        json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
    }

    fn texts(parts: &[MessagePart]) -> Vec<(MessageRole, String)> {
        parts
            .iter()
            .map(|p| {
                let m = &p.message;
                let text = m
                    .content
                    .iter()
                    .map(|b| b["text"].as_str().unwrap_or("<block>"))
                    .collect::<Vec<_>>()
                    .join("|");
                (m.role, text)
            })
            .collect()
    }

    #[test]
    fn chunks_of_one_role_in_one_turn_form_one_message() {
        let mut t = Transcript::default();
        let turn = Some(model::new_id());
        assert!(t.apply(&chunk("agent_message_chunk", "Hel"), turn));
        assert!(t.apply(&chunk("agent_message_chunk", "lo"), turn));
        let changes = t.take_changes();
        assert_eq!(
            texts(&changes.messages),
            [(MessageRole::Agent, "Hello".into())]
        );
        assert_eq!(changes.messages[0].part, 0);
        // More text is the next part of the same message: only what was
        // added, whatever the message holds already.
        t.apply(&chunk("agent_message_chunk", "!"), turn);
        let again = t.take_changes();
        assert_eq!(again.messages[0].message.id, changes.messages[0].message.id);
        assert_eq!(again.messages[0].part, 1);
        assert_eq!(texts(&again.messages), [(MessageRole::Agent, "!".into())]);
        assert_eq!(t.take_changes(), Changes::default(), "nothing new");
        // Read back, the parts form the whole message.
        let mut whole = changes.messages[0].message.clone();
        whole.extend(again.messages[0].message.content.clone());
        assert_eq!(whole.content, [json!({"type": "text", "text": "Hello!"})]);
    }

    #[test]
    fn another_role_or_turn_starts_a_new_message() {
        let mut t = Transcript::default();
        let (one, two) = (model::new_id(), model::new_id());
        t.apply(&chunk("agent_thought_chunk", "hmm"), Some(one));
        t.apply(&chunk("agent_message_chunk", "A"), Some(one));
        t.apply(&chunk("agent_message_chunk", "B"), Some(one));
        t.user_prompt(two, vec![json!({"type": "text", "text": "next"})], 7);
        t.apply(&chunk("agent_message_chunk", "C"), Some(two));
        t.apply(&chunk("user_message_chunk", "echo"), Some(two));
        let changes = t.take_changes();
        assert_eq!(
            texts(&changes.messages),
            [
                (MessageRole::Thought, "hmm".into()),
                (MessageRole::Agent, "AB".into()),
                (MessageRole::User, "next".into()),
                (MessageRole::Agent, "C".into()),
                (MessageRole::User, "echo".into()),
            ]
        );
        let turns: Vec<_> = changes.messages.iter().map(|p| p.message.turn_id).collect();
        assert_eq!(
            turns,
            [Some(one), Some(one), Some(two), Some(two), Some(two)]
        );
    }

    #[test]
    fn tool_calls_between_chunks_keep_the_message_whole_and_end_up_merged() {
        let mut t = Transcript::default();
        let turn = Some(model::new_id());
        t.apply(&chunk("agent_message_chunk", "Let me "), turn);
        let announced = json!({"sessionUpdate": "tool_call", "toolCallId": "c1",
            "title": "Write a.txt", "kind": "edit", "status": "pending",
            "locations": [{"path": "/w/a.txt"}]});
        assert!(!t.apply(&announced, turn));
        t.apply(&chunk("agent_message_chunk", "write it."), turn);
        let done = json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1",
            "status": "completed", "title": null});
        t.apply(&done, turn);
        let changes = t.take_changes();
        assert_eq!(
            texts(&changes.messages),
            [(MessageRole::Agent, "Let me write it.".into())]
        );
        assert_eq!(changes.tool_calls.len(), 1, "one state per changed call");
        let call = &changes.tool_calls[0];
        assert_eq!(call.title.as_deref(), Some("Write a.txt"));
        assert_eq!(call.status.as_deref(), Some("completed"));
        assert_eq!(call.turn_id, turn);
        // A permission request's partial toolCall is completed from it.
        let known = t.known_tool_call(&json!({"toolCallId": "c1", "title": "Write!"}));
        assert_eq!(known["kind"], "edit");
        assert_eq!(known["title"], "Write!");
        assert_eq!(known["locations"], json!([{"path": "/w/a.txt"}]));
    }

    #[test]
    fn blocks_that_are_not_plain_text_are_kept_apart() {
        let mut t = Transcript::default();
        let image = json!({"sessionUpdate": "agent_message_chunk",
            "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}});
        t.apply(&chunk("agent_message_chunk", "a"), None);
        t.apply(&image, None);
        t.apply(&chunk("agent_message_chunk", "b"), None);
        let changes = t.take_changes();
        assert_eq!(
            texts(&changes.messages),
            [(MessageRole::Agent, "a|<block>|b".into())]
        );
    }
}
