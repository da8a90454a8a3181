//! What every handler shares: the config, authentication and the session
//! supervisor (which holds the store and the event bus).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::auth::{Auth, Caller};
use crate::bus::EventBus;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::Conversation;
use crate::session::Sessions;
use crate::store::Store;

/// Shared state of the API: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    config: Config,
    auth: Auth,
    sessions: Sessions,
}

impl AppState {
    pub fn new(config: Config, auth: Auth, sessions: Sessions) -> Self {
        AppState {
            inner: Arc::new(Shared {
                config,
                auth,
                sessions,
            }),
        }
    }

    /// Authentication and rate limits.
    pub fn auth(&self) -> &Auth {
        &self.inner.auth
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The live conversations, and every command to one.
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    pub fn store(&self) -> &dyn Store {
        self.inner.sessions.store()
    }

    /// Where committed events are published.
    pub fn bus(&self) -> &EventBus {
        &self.inner.sessions.sink().bus
    }

    /// Cancelled when the gateway stops.
    pub fn shutdown_token(&self) -> &CancellationToken {
        self.inner.sessions.shutdown_token()
    }

    /// The conversation, if it exists and the caller may see it (another
    /// user's conversation is "not found", not "forbidden").
    pub async fn visible_conversation(&self, caller: &Caller, id: Uuid) -> Result<Conversation> {
        self.store()
            .get_conversation(id)
            .await?
            .filter(|c| caller.can_see(c.owner.as_deref()))
            .ok_or_else(|| Error::NotFound(format!("no conversation {id}")))
    }
}
