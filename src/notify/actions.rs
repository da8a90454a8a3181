//! Action URLs: `<base_url>/api/v1/actions/<token>`, one per option of a
//! request (or per one-tap answer of a question: see [`question_option`]),
//! each a single-use capability for one user. The token is 32
//! random bytes, base64url; only its SHA-256 is stored (as API tokens are).
//! It ends when used (whatever came of it), when its request is answered
//! (`POST` then says 409 `already_resolved`), or after `action_ttl`. The
//! routes that answer it are in `crate::api::actions`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use super::notifier::MintActions;
use super::Action;
use crate::error::{Error, Result};
use crate::model::{PermissionRequest, WaitingKind};
use crate::permissions::question::one_tap;
use crate::store::{ActionToken, Store};

/// The path prefix of action URLs.
pub const PATH: &str = "/api/v1/actions/";

/// How a question's one-tap answer is stored in an action token's
/// `option_id`: this prefix, then the content it accepts with, as compact
/// JSON (`question-accept:{"env":"prod"}`). A token is read by its
/// request's kind (a question's token never as a permission option, nor the
/// other way round); the prefix makes a question's token say so by itself.
pub const QUESTION_ACCEPT: &str = "question-accept:";

/// The `option_id` of a question's one-tap answer accepting with `content`.
pub fn question_option(content: &Value) -> String {
    format!("{QUESTION_ACCEPT}{content}")
}

/// The content a question's `option_id` accepts with, if it is one
/// [`question_option`] made.
pub fn question_content(option_id: &str) -> Option<Value> {
    let json = option_id.strip_prefix(QUESTION_ACCEPT)?;
    serde_json::from_str::<Value>(json)
        .ok()
        .filter(Value::is_object)
}

/// What a notification may offer to answer `request` with in one tap:
/// `(option_id, label)`, one per option of a permission request, one per
/// [`one_tap`] answer of a form question (a yes/no, or a choice of at most
/// three), none for any other question.
pub fn choices(request: &PermissionRequest) -> Vec<(String, String)> {
    match request.kind {
        WaitingKind::Permission => request
            .options
            .iter()
            .filter_map(|option| {
                let id = option.get("optionId").and_then(Value::as_str)?;
                let label = option.get("name").and_then(Value::as_str).unwrap_or(id);
                Some((id.to_owned(), label.to_owned()))
            })
            .collect(),
        WaitingKind::Question => request
            .tool_call
            .get("requestedSchema")
            .filter(|_| request.tool_call.get("mode").and_then(Value::as_str) != Some("url"))
            .and_then(one_tap)
            .unwrap_or_default()
            .into_iter()
            .map(|(label, content)| (question_option(&content), label))
            .collect(),
    }
}

/// A new token's value: 32 random bytes, base64url without padding.
pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Internal(anyhow::anyhow!("no randomness: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Whether `token` could be one [`new_token`] made (anything else is not
/// looked up).
pub fn well_formed(token: &str) -> bool {
    token.len() == 43
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Mints action URLs into the store.
pub struct Minter {
    pub store: Arc<dyn Store>,
    /// `notifications.base_url`, without a trailing `/`.
    pub base_url: String,
    pub ttl: Duration,
}

#[async_trait::async_trait]
impl MintActions for Minter {
    async fn mint(&self, request: &PermissionRequest, user: &str) -> Result<Vec<Action>> {
        let now = crate::model::now();
        let expires_at =
            now + chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::hours(1));
        let mut actions = Vec::new();
        let mut stored = Vec::new();
        for (option_id, label) in choices(request) {
            let token = new_token()?;
            stored.push(ActionToken {
                hash: crate::auth::hash_token(&token),
                request_id: request.id,
                option_id: option_id.clone(),
                user_name: user.to_owned(),
                created_at: now,
                expires_at,
                used_at: None,
            });
            actions.push(Action {
                label,
                option_id,
                url: format!("{}{PATH}{token}", self.base_url.trim_end_matches('/')),
            });
        }
        self.store.insert_action_tokens(&stored).await?;
        Ok(actions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_random_bytes_in_base64url() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(well_formed(&a), "{a}");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&a)
            .unwrap();
        assert_eq!(bytes.len(), 32);
        assert!(!well_formed("short"));
        assert!(!well_formed(&format!("{}=", &a[..42])));
    }

    fn asked(tool_call: Value) -> PermissionRequest {
        PermissionRequest {
            id: uuid::Uuid::now_v7(),
            conversation_id: uuid::Uuid::now_v7(),
            turn_id: None,
            tool_call,
            options: Vec::new(),
            status: crate::model::PermissionStatus::Pending,
            decision: None,
            created_at: crate::model::now(),
            kind: WaitingKind::Question,
        }
    }

    #[test]
    fn a_questions_one_tap_answers_are_choices_that_read_back_as_their_content() {
        let yes_no = asked(serde_json::json!({"mode": "form", "message": "Go?",
            "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}}}}));
        let offered = choices(&yes_no);
        assert_eq!(
            offered,
            [
                ("question-accept:{\"go\":true}".to_owned(), "Yes".to_owned()),
                ("question-accept:{\"go\":false}".to_owned(), "No".to_owned())
            ]
        );
        assert_eq!(
            question_content(&offered[0].0),
            Some(serde_json::json!({"go": true}))
        );
        // Nothing else reads as a question's answer.
        for other in [
            "allow-once",
            "question-accept:",
            "question-accept:[1]",
            "{\"go\":true}",
        ] {
            assert_eq!(question_content(other), None, "{other}");
        }
        // A URL question, or a form of more than one field, offers none.
        let url = asked(serde_json::json!({"mode": "url", "message": "Sign in",
            "url": "https://example.org"}));
        assert!(choices(&url).is_empty());
        let wide = asked(serde_json::json!({"mode": "form", "message": "Which?",
            "requestedSchema": {"properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}}}}));
        assert!(choices(&wide).is_empty());
    }
}
