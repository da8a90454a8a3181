//! Who is calling: bearer tokens, roles, and per-token rate limits.
//!
//! A token is `acpgw_` followed by 64 random hex digits; only its SHA-256 is
//! stored. Requests carry it as `Authorization: Bearer <token>`; WebSocket
//! clients that cannot set headers use `?access_token=<token>` or the
//! subprotocol `bearer.<token>` (read from the request by
//! [`crate::api`]'s extractor). While no token exists at all, the gateway
//! runs open (it then listens only on loopback, see [`crate::app`]) and every
//! caller is the operator `anonymous`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::RateLimits;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::Role;
use crate::ratelimit::SlidingWindow;
use crate::store::{Store, TokenInfo};

/// A new random token.
pub fn new_token() -> String {
    format!(
        "acpgw_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The prefix of a share link's token (see `crate::api`'s share links):
/// not a bearer token, and told apart from one at a glance.
pub const SHARE_TOKEN_PREFIX: &str = "acpgw_share_";

/// A new random share link token: [`SHARE_TOKEN_PREFIX`] and 64 random hex
/// digits. Like a bearer token, only its [`hash_token`] is stored.
pub fn new_share_token() -> String {
    format!(
        "{SHARE_TOKEN_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Whether `token` could be one [`new_share_token`] made (anything else is
/// not looked up).
pub fn share_token_well_formed(token: &str) -> bool {
    token.strip_prefix(SHARE_TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// What is stored of a token.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a user name: `[A-Za-z0-9._@-]+`, at most 64 characters.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
}

/// Creates a token for `user` (who exists from then on): the one way tokens
/// are made, by the API and the CLI alike. Returns what is stored and the
/// token itself, which is shown once and never kept.
pub async fn issue_token(
    store: &dyn Store,
    user: &str,
    role: Role,
    label: Option<&str>,
) -> Result<(TokenInfo, String)> {
    if !valid_user_name(user) {
        return Err(Error::Unprocessable(
            "user must be 1-64 characters of [A-Za-z0-9._@-]".into(),
        ));
    }
    if let Some(label) = label {
        limits::line("label", label, limits::LABEL_MAX_CHARS)?;
    }
    let token = new_token();
    let info = store
        .create_token(user, role, label, &hash_token(&token))
        .await?;
    Ok((info, token))
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
    pub fn require_operator(&self) -> Result<()> {
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

/// Authentication state shared by all requests.
pub struct Auth {
    /// Set once any token exists; never cleared while running.
    required: AtomicBool,
    limits: RateLimits,
    hits: Mutex<SlidingWindow<(&'static str, String)>>,
    /// Tokens with open WebSockets (`None`: the open mode's), each with the
    /// role they were opened with and the signal that closes them when the
    /// token is revoked or the role changes (see [`Auth::close_revoked`]).
    watched: Mutex<HashMap<Option<uuid::Uuid>, Watched>>,
    /// Share links with open WebSockets on this node, each with the signal
    /// that closes them when the link is revoked (see
    /// [`Auth::close_share`]).
    shares: Mutex<HashMap<uuid::Uuid, SharedSockets>>,
    /// Failed lookups of share links per client address.
    share_failures: Mutex<SlidingWindow<String>>,
}

/// Failed lookups of share links (unknown, expired or revoked tokens)
/// allowed per client address per [`SHARE_FAILURE_WINDOW`], as for action
/// URLs; beyond, a lookup that fails answers 429 until the window moves on.
/// A usable link is never refused for them.
const SHARE_FAILURES: u32 = 20;
const SHARE_FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The WebSockets of one share link on this node.
#[derive(Debug)]
struct SharedSockets {
    closed: CancellationToken,
    open: usize,
}

/// The WebSockets of one token.
#[derive(Debug)]
struct Watched {
    role: Role,
    closed: CancellationToken,
}

impl Watched {
    fn new(role: Role) -> Watched {
        Watched {
            role,
            closed: CancellationToken::new(),
        }
    }
}

/// Which limit a request counts against.
#[derive(Debug, Clone, Copy)]
pub enum Limited {
    /// Per token.
    Prompt,
    /// Per token.
    Connection,
    /// A new conversation (and so an agent process), per user: tokens are
    /// cheap to have several of, processes are not.
    Conversation,
}

impl Auth {
    pub fn new(required: bool, limits: RateLimits) -> Auth {
        Auth {
            required: AtomicBool::new(required),
            limits,
            hits: Mutex::new(SlidingWindow::default()),
            watched: Mutex::new(HashMap::new()),
            shares: Mutex::new(HashMap::new()),
            share_failures: Mutex::new(SlidingWindow::default()),
        }
    }

    /// Who presents `token` (401 for an unknown or revoked one, or for none
    /// once tokens exist); without tokens, the open mode's `anonymous`.
    pub async fn identify(&self, store: &dyn Store, token: Option<&str>) -> Result<Caller> {
        let Some(token) = token else {
            if !self.required.load(Ordering::Relaxed) {
                // Open mode until the first token exists (checked each time,
                // so a token created by the CLI takes effect at once).
                if store.any_active_token().await? {
                    self.required.store(true, Ordering::Relaxed);
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
        match store.find_token(&hash_token(token)).await? {
            Some(info) => {
                self.required.store(true, Ordering::Relaxed);
                Ok(Caller {
                    user: info.user,
                    role: info.role,
                    token_id: Some(info.id),
                })
            }
            None => Err(Error::Unauthorized("unknown or revoked token".into())),
        }
    }

    /// Cancelled when the caller's token is revoked (or its user removed),
    /// when its user's role changes, and in open mode when the first token
    /// is made: what a WebSocket shows was decided by the role it was opened
    /// with. WebSockets select on it and close with 1008.
    pub fn on_revocation(&self, caller: &Caller) -> CancellationToken {
        let mut watched = self.watched.lock().unwrap();
        let entry = watched
            .entry(caller.token_id)
            .or_insert_with(|| Watched::new(caller.role));
        if entry.role != caller.role {
            // Changed since its other sockets opened: they close now.
            entry.closed.cancel();
            *entry = Watched::new(caller.role);
        }
        entry.closed.clone()
    }

    /// Whether any WebSocket is open (else there is nothing to check).
    pub fn watching(&self) -> bool {
        !self.watched.lock().unwrap().is_empty()
    }

    /// Closes the WebSockets of every watched token that is not `active`
    /// (the active tokens with their users' roles) with the role it was
    /// opened with; those of the open mode once any token is.
    pub fn close_revoked(&self, active: &HashMap<uuid::Uuid, Role>) {
        self.watched.lock().unwrap().retain(|id, watched| {
            let role = match id {
                Some(id) => active.get(id).copied(),
                None => active.is_empty().then_some(Role::Operator),
            };
            if role == Some(watched.role) {
                return true;
            }
            tracing::info!(token_id = ?id, "token revoked or its role changed: closing its websockets");
            watched.closed.cancel();
            false
        });
    }

    /// One more open WebSocket of the share link `link`: what it returns is
    /// cancelled when the link is revoked, here ([`Auth::close_share`]) or
    /// on another node (found by [`Auth::close_revoked_shares`]); the
    /// socket says [`Auth::share_socket_closed`] when it ends.
    pub fn on_share_revocation(&self, link: uuid::Uuid) -> CancellationToken {
        let mut shares = self.shares.lock().unwrap();
        let entry = shares.entry(link).or_insert_with(|| SharedSockets {
            closed: CancellationToken::new(),
            open: 0,
        });
        entry.open += 1;
        entry.closed.child_token()
    }

    /// One WebSocket of the share link `link` ended.
    pub fn share_socket_closed(&self, link: uuid::Uuid) {
        let mut shares = self.shares.lock().unwrap();
        if let Some(entry) = shares.get_mut(&link) {
            entry.open = entry.open.saturating_sub(1);
            if entry.open == 0 {
                shares.remove(&link);
            }
        }
    }

    /// Closes every WebSocket of the share link `link` (it was revoked).
    pub fn close_share(&self, link: uuid::Uuid) {
        if let Some(entry) = self.shares.lock().unwrap().remove(&link) {
            tracing::info!(share_link_id = %link, "share link revoked: closing its websockets");
            entry.closed.cancel();
        }
    }

    /// The share links with WebSockets open on this node.
    pub fn watched_shares(&self) -> Vec<uuid::Uuid> {
        self.shares.lock().unwrap().keys().copied().collect()
    }

    /// Of the share links `asked` about, closes the WebSockets of those not
    /// `unrevoked` (revoked, maybe on another node, or gone).
    pub fn close_revoked_shares(&self, asked: &[uuid::Uuid], unrevoked: &[uuid::Uuid]) {
        for link in asked {
            if !unrevoked.contains(link) {
                self.close_share(*link);
            }
        }
    }

    /// Counts a failed lookup of a share link by `client` (its address):
    /// 429 once it failed [`SHARE_FAILURES`] times in the last minute (a
    /// lookup refused so is not counted, so `Retry-After` holds).
    pub fn share_lookup_failed(&self, client: &str) -> Result<()> {
        self.share_failures
            .lock()
            .unwrap()
            .try_hit(
                client.to_owned(),
                SHARE_FAILURES,
                SHARE_FAILURE_WINDOW,
                Instant::now(),
            )
            .map_err(|wait| Error::TooManyRequests {
                detail: "too many unknown share links from this address; try again later".into(),
                retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
            })
    }

    /// Counts one request of `kind` for the caller; 429 with the seconds to
    /// wait when over the limit.
    pub fn check_rate(&self, caller: &Caller, kind: Limited) -> Result<()> {
        let (name, per_minute, per, key) = match kind {
            Limited::Prompt => (
                "prompts",
                self.limits.prompts_per_minute,
                "token",
                caller.limit_key(),
            ),
            Limited::Connection => (
                "connections",
                self.limits.connections_per_minute,
                "token",
                caller.limit_key(),
            ),
            Limited::Conversation => (
                "new conversations",
                self.limits.conversations_per_minute,
                "user",
                caller.user.clone(),
            ),
        };
        let window = Duration::from_secs(60);
        let mut hits = self.hits.lock().unwrap();
        hits.try_hit((name, key), per_minute, window, Instant::now())
            .map_err(|wait| Error::TooManyRequests {
                detail: format!("at most {per_minute} {name} per minute per {per}"),
                // Rounded up: a client that waits this long gets through.
                retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
            })
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

    #[test]
    fn share_tokens_are_random_prefixed_and_checked_before_any_lookup() {
        let (a, b) = (new_share_token(), new_share_token());
        assert_ne!(a, b);
        assert!(share_token_well_formed(&a), "{a}");
        assert!(!share_token_well_formed(&new_token()));
        assert!(!share_token_well_formed(&a[..a.len() - 1]));
        assert!(!share_token_well_formed(&format!("{a}0")));
        assert!(!share_token_well_formed(&a.to_uppercase()));
        assert!(!share_token_well_formed(""));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_answer_429_with_the_wait_until_the_window_frees() {
        let auth = Auth::new(
            true,
            RateLimits {
                prompts_per_minute: 2,
                connections_per_minute: 5,
                conversations_per_minute: 1,
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

    #[tokio::test(start_paused = true)]
    async fn new_conversations_are_limited_per_user_whatever_the_token() {
        let auth = Auth::new(
            true,
            RateLimits {
                prompts_per_minute: 10,
                connections_per_minute: 10,
                conversations_per_minute: 1,
            },
        );
        let caller = |user: &str| Caller {
            user: user.into(),
            role: Role::User,
            token_id: Some(uuid::Uuid::now_v7()),
        };
        auth.check_rate(&caller("ann"), Limited::Conversation)
            .unwrap();
        // Another token of the same user is the same user.
        match auth.check_rate(&caller("ann"), Limited::Conversation) {
            Err(Error::TooManyRequests {
                retry_after,
                detail,
            }) => {
                assert_eq!(retry_after, 60);
                assert!(detail.contains("per user"), "{detail}");
            }
            other => panic!("expected 429, got {other:?}"),
        }
        auth.check_rate(&caller("bob"), Limited::Conversation)
            .unwrap();
    }
}
