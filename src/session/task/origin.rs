//! How a new conversation begins ([`Origin`]): plainly, forked from
//! another conversation (its history copied in), or taking over an agent
//! session begun elsewhere; and what is undone when a fork or an adoption
//! fails (nothing of it is kept).

use serde_json::Value;
use uuid::Uuid;

use super::super::journal::Journal;
use crate::model;

/// How a new conversation begins.
#[derive(Debug, Default)]
pub enum Origin {
    /// A new agent session (`session/new`).
    #[default]
    Plain,
    /// Forked: the agent session forked (`session/fork`) and the history the
    /// new conversation holds from the first (copied, with new ids).
    Fork {
        source_session: String,
        messages: Vec<model::Message>,
        tool_calls: Vec<model::ToolCall>,
    },
    /// Taking over the agent session its `adopted_session` names
    /// (`session/load`, its history replayed into it, or `session/resume`).
    Adopt,
}

impl Origin {
    /// Whether a conversation that fails to begin so is removed (nothing of
    /// it is left: the caller is told why) rather than kept as `failed`.
    pub(super) fn leaves_nothing(&self) -> bool {
        !matches!(self, Origin::Plain)
    }
}

/// Puts a fork's copied history in its first commit: each message whole,
/// as one part, under a new id (in the source's order: new ids sort after
/// one another as they are made), each tool call as it stands; and, for
/// clients that build a conversation from its events, the same as the
/// `session_update`s an agent replays (outside any turn), messages and tool
/// calls in the order they began.
pub(super) fn copy_history(
    journal: &mut Journal,
    messages: &[model::Message],
    tool_calls: &[model::ToolCall],
) {
    let mut replay: Vec<(chrono::DateTime<chrono::Utc>, usize, Vec<Value>)> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let kind = match message.role {
            model::MessageRole::User => "user_message_chunk",
            model::MessageRole::Agent => "agent_message_chunk",
            model::MessageRole::Thought => "agent_thought_chunk",
        };
        let updates = message
            .content
            .iter()
            .map(|block| serde_json::json!({"sessionUpdate": kind, "content": block}))
            .collect();
        replay.push((message.created_at, i, updates));
        journal.save_message(model::MessagePart {
            part: 0,
            message: model::Message {
                id: model::new_id(),
                ..message.clone()
            },
            content_in_event: None,
        });
    }
    for (i, call) in tool_calls.iter().enumerate() {
        let mut update = serde_json::json!({
            "sessionUpdate": "tool_call",
            "toolCallId": call.tool_call_id,
            "title": call.title.clone().unwrap_or_default(),
        });
        for (key, value) in [
            ("kind", call.kind.clone().map(Value::String)),
            ("status", call.status.clone().map(Value::String)),
            ("content", call.content.clone()),
            ("locations", call.locations.clone()),
            ("rawInput", call.raw_input.clone()),
            ("rawOutput", call.raw_output.clone()),
        ] {
            if let Some(value) = value {
                update[key] = value;
            }
        }
        replay.push((call.created_at, messages.len() + i, vec![update]));
        journal.save_tool_call(call.clone());
    }
    replay.sort_by_key(|(at, i, _)| (*at, *i));
    for update in replay.into_iter().flat_map(|(_, _, updates)| updates) {
        journal.session_update(update, None);
    }
}

/// Removes a conversation that never got going (see [`Origin`]).
pub(super) async fn forget_conversation(store: &dyn crate::store::Store, id: Uuid) {
    if let Err(e) = store.delete_conversation(id).await {
        tracing::warn!(conversation_id = %id, error = %e, "could not remove the conversation that failed to begin");
    }
}
