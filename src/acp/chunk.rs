//! The fast path for what an agent sends most: a `session/update`
//! notification carrying one plain text message chunk. Such a line is read
//! straight into its text (no JSON tree is built) and handed on as a
//! [`TextChunk`]; anything else about it (another field, another shape) and
//! the line takes the general path instead, so nothing the agent sent is
//! lost or reshaped: [`TextChunk::to_params`] gives back the same JSON.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

/// Which message a chunk belongs to (the model's: its events are made of
/// chunks).
pub use crate::model::ChunkKind;

/// The method of the notification a chunk comes in.
pub const METHOD: &str = "session/update";

/// `{"sessionId": session_id, "update": {"sessionUpdate": kind, "content":
/// {"type": "text", "text": text}}}`, exactly: nothing else was in it.
#[derive(Debug, Clone, PartialEq)]
pub struct TextChunk {
    pub session_id: String,
    pub kind: ChunkKind,
    pub text: String,
}

impl TextChunk {
    /// The notification's `params`, as the agent sent them.
    pub fn to_params(&self) -> Value {
        json!({
            "sessionId": self.session_id,
            "update": self.update(),
        })
    }

    /// The `update` member.
    pub fn update(&self) -> Value {
        self.kind.text_update(&self.text)
    }
}

/// A line that is exactly a text chunk notification, read without building
/// a JSON tree; `None` for anything else (which then takes the general
/// path: this only decides which way is faster, never what is accepted).
pub fn parse_line(line: &[u8]) -> Option<TextChunk> {
    // Cheap refusals first: most other lines differ early.
    let line: Line = serde_json::from_slice(line).ok()?;
    if line.method != METHOD || line.jsonrpc.as_deref().is_some_and(|v| v != "2.0") {
        return None;
    }
    let update = line.params.update;
    if update.content.kind != "text" {
        return None;
    }
    Some(TextChunk {
        session_id: line.params.session_id.into_owned(),
        kind: ChunkKind::parse(&update.session_update)?,
        text: update.content.text.into_owned(),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: Params<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params<'a> {
    #[serde(borrow, rename = "sessionId")]
    session_id: Cow<'a, str>,
    #[serde(borrow)]
    update: Update<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Update<'a> {
    #[serde(borrow, rename = "sessionUpdate")]
    session_update: Cow<'a, str>,
    #[serde(borrow)]
    content: Content<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Content<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Cow<'a, str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn a_plain_text_chunk_is_read_whole_and_gives_back_what_was_sent() {
        let params = json!({"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "Hé \"there\"\n\u{0}!"}}});
        for sent in [
            json!({"jsonrpc": "2.0", "method": "session/update", "params": params}),
            json!({"method": "session/update", "params": params}),
        ] {
            let chunk = parse_line(&line(sent)).expect("fast path");
            assert_eq!(chunk.kind, ChunkKind::AgentMessage);
            assert_eq!(chunk.text, "Hé \"there\"\n\u{0}!");
            assert_eq!(chunk.to_params(), params);
        }
        let thought = json!({"method": "session/update", "params": {"sessionId": "s",
            "update": {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": ""}}}});
        assert_eq!(
            parse_line(&line(thought)).unwrap().kind,
            ChunkKind::AgentThought
        );
    }

    #[test]
    fn anything_more_or_else_takes_the_general_path() {
        let chunk = |update: Value| {
            json!({"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": "s", "update": update}})
        };
        let text = json!({"type": "text", "text": "x"});
        for other in [
            // Annotations, _meta, other content, other updates: kept verbatim elsewhere.
            chunk(json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "x", "annotations": {"priority": 1}}})),
            chunk(json!({"sessionUpdate": "agent_message_chunk", "content": text, "_meta": {}})),
            chunk(json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "image", "data": "AA==", "mimeType": "image/png"}})),
            chunk(json!({"sessionUpdate": "tool_call", "content": text})),
            chunk(json!({"sessionUpdate": "agent_message_chunk"})),
            // A request, another method, another version, extra members.
            json!({"jsonrpc": "2.0", "id": 1, "method": "session/update",
                "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": text}}}),
            json!({"jsonrpc": "2.0", "method": "session/other",
                "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": text}}}),
            json!({"jsonrpc": "1.0", "method": "session/update",
                "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": text}}}),
            json!({"method": "session/update", "x": 1,
                "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": text}}}),
        ] {
            assert_eq!(parse_line(&line(other.clone())), None, "{other}");
        }
        for garbage in [&b"not json"[..], b"", b"[]", b"{\"method\": 1}"] {
            assert_eq!(parse_line(garbage), None);
        }
    }
}
