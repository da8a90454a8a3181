//! A conversation's prompt queue (pure): the prompts sent while a turn
//! runs, in the order they start, and the edits a person makes to them.
//! The session task holds it while its agent runs and says what changed as
//! `queue_changed` events; without a running agent the supervisor edits the
//! stored one the same way (see `route.rs`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{QueueChanged, QueuedPrompt};

/// Most prompts waiting in one conversation's queue.
pub const QUEUE_MAX: usize = 20;

/// A person's change to a queued prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "edit", rename_all = "snake_case")]
pub enum QueueEdit {
    /// New content, a new place (0 is next), or both.
    Change {
        prompt: Uuid,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Vec<Value>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        position: Option<usize>,
    },
    Remove {
        prompt: Uuid,
    },
}

impl QueueEdit {
    /// The prompt it changes.
    pub fn prompt(&self) -> Uuid {
        match self {
            QueueEdit::Change { prompt, .. } | QueueEdit::Remove { prompt } => *prompt,
        }
    }
}

/// Where a prompt is queued: steering ones first (the newest first: it
/// was sent last to cut in), then the others in the order they came.
/// Returns its position.
pub fn push(queue: &mut Vec<QueuedPrompt>, prompt: QueuedPrompt) -> Result<usize> {
    if queue.len() >= QUEUE_MAX {
        return Err(Error::conflict(
            "queue_full",
            format!("{QUEUE_MAX} prompts are queued already; wait for one to start or remove one"),
        ));
    }
    let position = if prompt.steer { 0 } else { queue.len() };
    queue.insert(position, prompt);
    Ok(position)
}

/// Applies `edit`, by `by`: what the `queue_changed` event says, or 404
/// when no such prompt waits (the caller tells one that started apart).
pub fn apply(queue: &mut Vec<QueuedPrompt>, edit: QueueEdit, by: &str) -> Result<QueueChanged> {
    let prompt = edit.prompt();
    let at = queue
        .iter()
        .position(|p| p.id == prompt)
        .ok_or_else(|| Error::NotFound(format!("no queued prompt {prompt}")))?;
    let change = match edit {
        QueueEdit::Remove { .. } => {
            queue.remove(at);
            "removed"
        }
        QueueEdit::Change {
            content, position, ..
        } => {
            let moved = position.is_some_and(|p| p.min(queue.len() - 1) != at);
            if let Some(content) = content {
                queue[at].content = content;
            }
            if let Some(position) = position {
                let entry = queue.remove(at);
                queue.insert(position.min(queue.len()), entry);
            }
            if moved {
                "moved"
            } else {
                "edited"
            }
        }
    };
    Ok(QueueChanged {
        change: change.to_owned(),
        prompt_id: prompt,
        by: Some(by.to_owned()),
        queue: queue.clone(),
    })
}

/// After a turn that ended with `stop_reason`: the prompt to start now, if
/// any (taken off the queue). A steering prompt starts however the turn
/// ended; the others only after `end_turn` (a cancel, a refusal or an
/// error holds them for a person).
pub fn next_after(queue: &mut Vec<QueuedPrompt>, stop_reason: &str) -> Option<QueuedPrompt> {
    let first = queue.first()?;
    (first.steer || stop_reason == "end_turn").then(|| queue.remove(0))
}

/// The `queue_changed` of `started` taken off the queue to start.
pub fn started(queue: &[QueuedPrompt], started: &QueuedPrompt) -> QueueChanged {
    QueueChanged {
        change: "started".into(),
        prompt_id: started.id,
        by: None,
        queue: queue.to_vec(),
    }
}

/// The text the agent gets for a person's reason given with their answer
/// to its permission request (ACP answers carry only an option): what was
/// asked, what was answered, and why.
pub fn reason_text(request: &crate::model::PermissionRequest, reason: &str) -> String {
    let title = request
        .tool_call
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map_or_else(|| "a tool call".to_owned(), |t| format!("\"{t}\""));
    let decision = request.decision.as_ref();
    let option = decision
        .and_then(|d| d.option_id.as_deref())
        .and_then(|id| request.option(id));
    let kind = option.and_then(|o| o.get("kind")).and_then(Value::as_str);
    let name = option
        .and_then(|o| o.get("name"))
        .and_then(Value::as_str)
        .map(|n| format!(" (\"{n}\")"))
        .unwrap_or_default();
    match kind {
        Some(kind) if kind.starts_with("allow") => {
            format!("The user allowed your request to run {title}{name}, and said: {reason}")
        }
        _ => format!("The user refused your request to run {title}{name}. Their reason: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;

    fn prompt(text: &str, steer: bool) -> QueuedPrompt {
        QueuedPrompt {
            id: model::new_id(),
            content: vec![serde_json::json!({"type": "text", "text": text})],
            queued_by: "user:alice".into(),
            queued_at: model::now(),
            steer,
            reason_for: None,
        }
    }

    fn texts(queue: &[QueuedPrompt]) -> Vec<&str> {
        queue
            .iter()
            .map(|p| p.content[0]["text"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn steering_prompts_go_first_and_the_rest_in_order() {
        let mut queue = Vec::new();
        assert_eq!(push(&mut queue, prompt("a", false)).unwrap(), 0);
        assert_eq!(push(&mut queue, prompt("b", false)).unwrap(), 1);
        assert_eq!(push(&mut queue, prompt("now", true)).unwrap(), 0);
        assert_eq!(texts(&queue), ["now", "a", "b"]);
    }

    #[test]
    fn a_full_queue_refuses_another() {
        let mut queue = Vec::new();
        for i in 0..QUEUE_MAX {
            push(&mut queue, prompt(&i.to_string(), false)).unwrap();
        }
        let full = push(&mut queue, prompt("one more", false)).unwrap_err();
        assert_eq!(full.problem().code, "queue_full");
        assert_eq!(queue.len(), QUEUE_MAX);
    }

    #[test]
    fn edits_move_change_and_remove() {
        let mut queue = Vec::new();
        let (a, b, c) = (prompt("a", false), prompt("b", false), prompt("c", false));
        let (a_id, c_id) = (a.id, c.id);
        for p in [a, b, c] {
            push(&mut queue, p).unwrap();
        }
        let moved = QueueEdit::Change {
            prompt: c_id,
            content: None,
            position: Some(0),
        };
        assert_eq!(
            apply(&mut queue, moved, "user:alice").unwrap().change,
            "moved"
        );
        assert_eq!(texts(&queue), ["c", "a", "b"]);
        let edited = QueueEdit::Change {
            prompt: a_id,
            content: Some(vec![serde_json::json!({"type": "text", "text": "A"})]),
            position: Some(99),
        };
        let changed = apply(&mut queue, edited, "user:bob").unwrap();
        assert_eq!(
            (changed.change.as_str(), changed.by.as_deref()),
            ("moved", Some("user:bob"))
        );
        assert_eq!(texts(&queue), ["c", "b", "A"]);
        let same_place = QueueEdit::Change {
            prompt: a_id,
            content: None,
            position: Some(2),
        };
        assert_eq!(
            apply(&mut queue, same_place, "user:bob").unwrap().change,
            "edited"
        );
        let removed = apply(&mut queue, QueueEdit::Remove { prompt: c_id }, "user:alice").unwrap();
        assert_eq!(removed.change, "removed");
        assert_eq!(texts(&removed.queue), ["b", "A"]);
        let gone = apply(&mut queue, QueueEdit::Remove { prompt: c_id }, "user:alice");
        assert!(matches!(gone, Err(Error::NotFound(_))));
    }

    #[test]
    fn only_end_turn_or_a_steering_prompt_moves_the_queue_on() {
        let mut queue = vec![prompt("a", false)];
        for held in ["cancelled", "refusal", "error", "max_tokens"] {
            assert!(next_after(&mut queue, held).is_none(), "{held}");
        }
        assert_eq!(texts(&[next_after(&mut queue, "end_turn").unwrap()]), ["a"]);
        assert!(next_after(&mut queue, "end_turn").is_none());
        let mut queue = vec![prompt("now", true), prompt("later", false)];
        assert_eq!(
            texts(&[next_after(&mut queue, "cancelled").unwrap()]),
            ["now"]
        );
        assert!(next_after(&mut queue, "cancelled").is_none());
    }

    #[test]
    fn the_agent_hears_what_was_refused_and_why() {
        let request: crate::model::PermissionRequest = serde_json::from_value(serde_json::json!({
            "id": model::new_id(), "conversation_id": model::new_id(), "turn_id": null,
            "tool_call": {"toolCallId": "t1", "title": "rm -rf build"},
            "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "no", "name": "Reject", "kind": "reject_once"}
            ],
            "status": "rejected",
            "decision": {"option_id": "no", "outcome": "selected", "decided_by": "user:alice",
                         "reason": "wrong directory", "decided_at": model::now()},
            "created_at": model::now()
        }))
        .unwrap();
        assert_eq!(
            reason_text(&request, "wrong directory"),
            "The user refused your request to run \"rm -rf build\" (\"Reject\"). Their reason: wrong directory"
        );
        let mut allowed = request.clone();
        allowed.decision.as_mut().unwrap().option_id = Some("allow".into());
        assert!(reason_text(&allowed, "ok").starts_with("The user allowed your request to run"));
    }
}
