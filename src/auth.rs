//! Who is calling: bearer tokens, roles, and per-token rate limits.
//!
//! A token is `acpgw_` followed by 64 random hex digits; only its SHA-256 is
//! stored. Requests carry it as `Authorization: Bearer <token>`; WebSocket
//! clients that cannot set headers use `?access_token=<token>` or the
//! subprotocol `bearer.<token>`. While no token exists at all, the gateway
//! runs open (it then listens only on loopback, see [`crate::app`]) and every
//! caller is the operator `anonymous`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::error::Error;

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and answers only their own conversations.
    User,
    /// Sees everything; alone changes policies and tokens.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// A new random token.
pub fn new_token() -> String {
    format!(
        "acpgw_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// What is stored of a token.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: String,
    pub role: Role,
    /// The token used (`None` in open mode): rate limits are per token.
    pub token_id: Option<uuid::Uuid>,
}

impl Caller {
    pub fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// How decisions by this caller are recorded.
    pub fn decided_by(&self) -> String {
        format!("user:{}", self.user)
    }

    /// Whether this caller may see a conversation owned by `owner`.
    pub fn can_see(&self, owner: Option<&str>) -> bool {
        self.is_operator() || owner == Some(self.user.as_str())
    }

    /// The owner filter for lists: `None` (everything) for operators.
    pub fn owner_filter(&self) -> Option<String> {
        (!self.is_operator()).then(|| self.user.clone())
    }

    /// 403 unless an operator.
    pub fn require_operator(&self) -> Result<(), Error> {
        if self.is_operator() {
            Ok(())
        } else {
            Err(Error::Forbidden("only operators may do this".into()))
        }
    }

    fn limit_key(&self) -> String {
        self.token_id
            .map(|id| id.to_string())
            .unwrap_or_else(|| self.user.clone())
    }
}

/// The token a request presents: the `Authorization` header, or, on a
/// WebSocket upgrade only (browsers cannot set headers there),
/// `?access_token=` or the `bearer.<token>` subprotocol.
fn presented_token(parts: &Parts) -> Option<String> {
    if let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) {
        let value = value.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_owned());
    }
    if !is_websocket_upgrade(parts) {
        return None;
    }
    if let Some(query) = parts.uri.query() {
        for pair in query.split('&') {
            if let Some(token) = pair.strip_prefix("access_token=") {
                return Some(token.to_owned());
            }
        }
    }
    bearer_subprotocol(parts).map(|(token, _)| token)
}

/// A `GET` asking to upgrade to a WebSocket.
fn is_websocket_upgrade(parts: &Parts) -> bool {
    parts.method == axum::http::Method::GET
        && parts
            .headers
            .get(axum::http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// `Sec-WebSocket-Protocol: bearer.<token>`: the token and the protocol
/// string to echo back.
pub fn bearer_subprotocol(parts: &Parts) -> Option<(String, String)> {
    let header = parts
        .headers
        .get(axum::http::header::SEC_WEBSOCKET_PROTOCOL)?;
    header.to_str().ok()?.split(',').find_map(|p| {
        let p = p.trim();
        p.strip_prefix("bearer.")
            .map(|token| (token.to_owned(), p.to_owned()))
    })
}

/// Authentication state shared by all requests.
pub struct Auth {
    /// Set once any token exists; never cleared while running.
    required: AtomicBool,
    limits: RateLimits,
    hits: Mutex<HashMap<(&'static str, String), VecDeque<Instant>>>,
    /// Tokens with open WebSockets, each with the signal that closes them
    /// when the token is revoked (see [`Auth::close_revoked`]).
    watched: Mutex<HashMap<uuid::Uuid, CancellationToken>>,
}

/// Requests per minute allowed per token.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default = "default_prompts_per_minute")]
    pub prompts_per_minute: u32,
    #[serde(default = "default_connections_per_minute")]
    pub connections_per_minute: u32,
}

fn default_prompts_per_minute() -> u32 {
    30
}
fn default_connections_per_minute() -> u32 {
    120
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            prompts_per_minute: default_prompts_per_minute(),
            connections_per_minute: default_connections_per_minute(),
        }
    }
}

/// Which limit a request counts against.
#[derive(Debug, Clone, Copy)]
pub enum Limited {
    Prompt,
    Connection,
}

impl Auth {
    pub fn new(required: bool, limits: RateLimits) -> Auth {
        Auth {
            required: AtomicBool::new(required),
            limits,
            hits: Mutex::new(HashMap::new()),
            watched: Mutex::new(HashMap::new()),
        }
    }

    /// Cancelled when the caller's token is revoked (or its user removed);
    /// never in open mode. WebSockets select on it and close with 1008.
    pub fn on_revocation(&self, caller: &Caller) -> CancellationToken {
        match caller.token_id {
            Some(id) => self.watched.lock().unwrap().entry(id).or_default().clone(),
            None => CancellationToken::new(),
        }
    }

    /// Whether any WebSocket is open with a token (else there is nothing to check).
    pub fn watching(&self) -> bool {
        !self.watched.lock().unwrap().is_empty()
    }

    /// Closes the WebSockets of every watched token that is not `active`.
    pub fn close_revoked(&self, active: &HashSet<uuid::Uuid>) {
        self.watched.lock().unwrap().retain(|id, closed| {
            if active.contains(id) {
                return true;
            }
            tracing::info!(token_id = %id, "token revoked: closing its websockets");
            closed.cancel();
            false
        });
    }

    /// Counts one request of `kind` for the caller; 429 with the seconds to
    /// wait when over the limit.
    pub fn check_rate(&self, caller: &Caller, kind: Limited) -> Result<(), Error> {
        let (name, per_minute) = match kind {
            Limited::Prompt => ("prompts", self.limits.prompts_per_minute),
            Limited::Connection => ("connections", self.limits.connections_per_minute),
        };
        let window = Duration::from_secs(60);
        let now = Instant::now();
        let mut hits = self.hits.lock().unwrap();
        let times = hits.entry((name, caller.limit_key())).or_default();
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            times.pop_front();
        }
        if times.len() >= per_minute as usize {
            let oldest = *times.front().expect("over a positive limit");
            let wait = window.saturating_sub(now.duration_since(oldest));
            return Err(Error::TooManyRequests {
                detail: format!("at most {per_minute} {name} per minute per token"),
                retry_after: wait.as_secs().max(1),
            });
        }
        times.push_back(now);
        Ok(())
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Error> {
        let auth = state.auth();
        let Some(token) = presented_token(parts) else {
            if !auth.required.load(Ordering::Relaxed) {
                // Open mode until the first token exists (checked each time,
                // so a token created by the CLI takes effect at once).
                if state.store().any_active_token().await? {
                    auth.required.store(true, Ordering::Relaxed);
                } else {
                    return Ok(Caller {
                        user: "anonymous".into(),
                        role: Role::Operator,
                        token_id: None,
                    });
                }
            }
            return Err(Error::Unauthorized("a bearer token is required".into()));
        };
        match state.store().find_token(&hash_token(&token)).await? {
            Some(info) => {
                auth.required.store(true, Ordering::Relaxed);
                Ok(Caller {
                    user: info.user,
                    role: info.role,
                    token_id: Some(info.id),
                })
            }
            None => Err(Error::Unauthorized("unknown or revoked token".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_only_their_hash_is_kept() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with("acpgw_") && a.len() == 6 + 64);
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_ne!(hash_token(&a), hash_token(&b));
        assert!(!hash_token(&a).contains(&a[6..]));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_answer_429_with_the_wait_until_the_window_frees() {
        let auth = Auth::new(
            true,
            RateLimits {
                prompts_per_minute: 2,
                connections_per_minute: 5,
            },
        );
        let caller = Caller {
            user: "u".into(),
            role: Role::User,
            token_id: Some(uuid::Uuid::now_v7()),
        };
        auth.check_rate(&caller, Limited::Prompt).unwrap();
        tokio::time::advance(Duration::from_secs(20)).await;
        auth.check_rate(&caller, Limited::Prompt).unwrap();
        match auth.check_rate(&caller, Limited::Prompt) {
            Err(Error::TooManyRequests { retry_after, .. }) => assert_eq!(retry_after, 40),
            other => panic!("expected 429, got {other:?}"),
        }
        // Connections are counted apart.
        auth.check_rate(&caller, Limited::Connection).unwrap();
        tokio::time::advance(Duration::from_secs(41)).await;
        auth.check_rate(&caller, Limited::Prompt).unwrap();
    }
}
