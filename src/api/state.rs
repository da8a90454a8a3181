//! What every handler shares: the config, authentication and the session
//! supervisor (which holds the store and the event bus).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::budget::SendBudget;
use crate::auth::{Auth, Caller};
use crate::bus::EventBus;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::Conversation;
use crate::notify::outbox::Outbox;
use crate::session::Sessions;
use crate::store::Store;

/// Shared state of the API: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Services>,
}

/// What every handler reaches through [`AppState`]: the config, auth, the
/// sessions, the sockets and the notifications.
struct Services {
    config: Config,
    auth: Auth,
    sessions: Sessions,
    /// Cancelled once the gateway's sessions have ended at shutdown:
    /// WebSockets send what is left and close with 1001.
    closing: CancellationToken,
    /// The open WebSockets, so that shutdown can wait for their close.
    sockets: TaskTracker,
    /// What every WebSocket together may hold for its client.
    send_budget: SendBudget,
    /// The notifications' durable outbox.
    outbox: Arc<Outbox>,
    /// Which users have a visible client (see [`crate::notify::presence`]).
    presence: crate::notify::presence::Presence,
    /// What was last found of each remote agent's reachability.
    remote_checks: RemoteChecks,
    /// Open ACP client connections per user.
    acp_connections: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    /// What agents may spend.
    budgets: crate::budgets::Budgets,
}

/// One of a user's ACP client connections, counted while it is held.
pub struct AcpSlot {
    state: AppState,
    user: String,
}

impl Drop for AcpSlot {
    fn drop(&mut self) {
        let mut open = self.state.inner.acp_connections.lock().unwrap();
        if let Some(n) = open.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.user);
            }
        }
    }
}

/// How long what `GET /api/v1/agents` found of a remote agent is
/// remembered: asking often does not connect to it often.
const REMOTE_CHECK_FRESH: std::time::Duration = std::time::Duration::from_secs(10);
/// How long `GET /api/v1/agents` waits for a remote agent to answer.
const REMOTE_PROBE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether each remote agent could be reached when last asked, and when
/// that was (by profile name and url).
#[derive(Default)]
struct RemoteChecks(std::sync::Mutex<std::collections::HashMap<(String, String), RemoteCheck>>);

/// When a remote agent was last asked, and why it could not be reached
/// (`None`: it could).
type RemoteCheck = (std::time::Instant, Option<String>);

impl AppState {
    pub fn new(config: Config, auth: Auth, sessions: Sessions, outbox: Arc<Outbox>) -> Self {
        let send_budget = SendBudget::new(config.ws_buffer_bytes, config.ws_buffer_per_user());
        let budgets =
            crate::budgets::Budgets::new(&config.budgets, sessions.outlets().store.clone());
        AppState {
            inner: Arc::new(Services {
                budgets,
                send_budget,
                config,
                auth,
                sessions,
                closing: CancellationToken::new(),
                sockets: TaskTracker::new(),
                outbox,
                presence: Default::default(),
                remote_checks: Default::default(),
                acp_connections: Default::default(),
            }),
        }
    }

    /// A slot for one more ACP client connection of `user`, unless they
    /// hold `acp_connections_per_user` already (429).
    pub fn acp_slot(&self, user: &str) -> Result<AcpSlot> {
        let limit = self.config().acp_connections_per_user;
        let mut open = self.inner.acp_connections.lock().unwrap();
        let n = open.entry(user.to_owned()).or_default();
        if *n >= limit {
            return Err(Error::TooManyRequests {
                detail: format!(
                    "at most {limit} ACP connections per user (acp_connections_per_user)"
                ),
                retry_after: 1,
            });
        }
        *n += 1;
        Ok(AcpSlot {
            state: self.clone(),
            user: user.to_owned(),
        })
    }

    /// Authentication and rate limits.
    pub fn auth(&self) -> &Auth {
        &self.inner.auth
    }

    /// Why the remote agent of `profile` cannot be reached (see
    /// [`crate::acp::remote::unavailable_reason`]), as found within the
    /// last REMOTE_CHECK_FRESH, else found now.
    pub async fn remote_unavailable(
        &self,
        profile: &crate::config::AgentProfile,
    ) -> Option<String> {
        let key = (
            profile.name.clone(),
            profile.url.clone().unwrap_or_default(),
        );
        let checks = &self.inner.remote_checks.0;
        if let Some((at, reason)) = checks.lock().unwrap().get(&key) {
            if at.elapsed() < REMOTE_CHECK_FRESH {
                return reason.clone();
            }
        }
        let reason = crate::acp::remote::unavailable_reason(profile, REMOTE_PROBE_WITHIN).await;
        checks
            .lock()
            .unwrap()
            .insert(key, (std::time::Instant::now(), reason.clone()));
        reason
    }

    /// Which users have a visible client.
    pub fn presence(&self) -> &crate::notify::presence::Presence {
        &self.inner.presence
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The live conversations, and every command to one.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// What agents may spend.
    pub fn budgets(&self) -> &crate::budgets::Budgets {
        &self.inner.budgets
    }

    pub fn store(&self) -> &dyn Store {
        self.inner.sessions.store()
    }

    /// The notifications' durable outbox (an [`Enqueue`](crate::notify::Enqueue)).
    pub fn outbox(&self) -> &Arc<Outbox> {
        &self.inner.outbox
    }

    /// What every WebSocket together may hold for its client
    /// (`ws_buffer_bytes`).
    pub fn send_budget(&self) -> &SendBudget {
        &self.inner.send_budget
    }

    /// Where committed events are published.
    pub fn bus(&self) -> &EventBus {
        &self.inner.sessions.outlets().bus
    }

    /// Cancelled when WebSockets are to close (after the sessions ended at
    /// shutdown, so that clients see how their turns ended).
    pub fn closing(&self) -> &CancellationToken {
        &self.inner.closing
    }

    /// Runs a WebSocket's loop, tracked for shutdown.
    pub fn track_socket<F: std::future::Future>(
        &self,
        serve: F,
    ) -> impl std::future::Future<Output = F::Output> {
        self.inner.sockets.track_future(serve)
    }

    /// Closes every WebSocket (1001) and waits, at most `grace`, until they
    /// have.
    pub async fn close_websockets(&self, grace: std::time::Duration) {
        self.inner.closing.cancel();
        self.inner.sockets.close();
        if tokio::time::timeout(grace, self.inner.sockets.wait())
            .await
            .is_err()
        {
            tracing::warn!("some websockets did not close in time");
        }
    }

    /// The conversation, if it exists and the caller may see it (another
    /// user's conversation is "not found", not "forbidden").
    pub async fn visible_conversation(&self, caller: &Caller, id: Uuid) -> Result<Conversation> {
        let missing = || Error::NotFound(format!("no conversation {id}"));
        let mut conversation = self
            .store()
            .get_conversation(id)
            .await?
            .ok_or_else(missing)?;
        if caller.can_see(conversation.owner.as_deref()) {
            return Ok(conversation);
        }
        // Shared with them, with their role: else "not found".
        let member = self.store().get_member(id, &caller.user).await?;
        conversation.sharing.role = Some(member.ok_or_else(missing)?.role);
        Ok(conversation)
    }

    /// A conversation the caller owns (or any, for an operator): what the
    /// ACP front door serves, to members not at all ("not found").
    pub async fn owned_conversation(&self, caller: &Caller, id: Uuid) -> Result<Conversation> {
        self.store()
            .get_conversation(id)
            .await?
            .filter(|c| caller.can_see(c.owner.as_deref()))
            .ok_or_else(|| Error::NotFound(format!("no conversation {id}")))
    }
}
