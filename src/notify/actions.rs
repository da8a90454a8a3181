//! Action URLs: `<base_url>/api/v1/actions/<token>`, one per option of a
//! request, each a single-use capability for one user. The token is 32
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
use crate::model::PermissionRequest;
use crate::store::{ActionToken, Store};

/// The path prefix of action URLs.
pub const PATH: &str = "/api/v1/actions/";

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
        for option in &request.options {
            let Some(option_id) = option.get("optionId").and_then(Value::as_str) else {
                continue;
            };
            let token = new_token()?;
            stored.push(ActionToken {
                hash: crate::auth::hash_token(&token),
                request_id: request.id,
                option_id: option_id.to_owned(),
                user_name: user.to_owned(),
                created_at: now,
                expires_at,
                used_at: None,
            });
            actions.push(Action {
                label: option
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or(option_id)
                    .to_owned(),
                option_id: option_id.to_owned(),
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
}
