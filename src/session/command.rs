//! What a live conversation's task is asked to do, and the handle that asks
//! it: the [`SessionHandle`] sends a [`Command`] down the task's channel
//! and waits for its answer.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::Result;
use crate::model::{PermissionRequest, SessionState};
use crate::permissions::Answer;

/// What the task is asked to do, with whom to answer.
pub(super) enum Command {
    Prompt {
        content: Vec<Value>,
        reply: oneshot::Sender<Result<Uuid>>,
    },
    Cancel {
        reply: oneshot::Sender<Result<()>>,
    },
    Respond {
        permission_id: Uuid,
        answer: Answer,
        decided_by: String,
        via: Option<String>,
        reply: oneshot::Sender<Result<Option<PermissionRequest>>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
    /// A user changes a session setting.
    Change(Change),
    /// Stop the agent if it is idle (to make room for another): `true` when
    /// it will.
    Release {
        reply: oneshot::Sender<bool>,
    },
}

/// A session setting a user asks the agent to change.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Setting {
    /// `session/set_mode`.
    Mode(String),
    /// `session/set_config_option`: a string or boolean `value`.
    ConfigOption { config_id: String, value: Value },
}

impl Setting {
    /// Whether an agent that reports `state` offers this; else why not.
    pub fn check(&self, state: &SessionState) -> std::result::Result<(), String> {
        match self {
            Setting::Mode(mode_id) => state.check_mode(mode_id),
            Setting::ConfigOption { config_id, value } => {
                state.config_request(config_id, value).map(drop)
            }
        }
    }
}

/// A change of a setting, and whom to tell once the agent answered.
pub struct Change {
    pub(super) setting: Setting,
    pub(super) changed_by: String,
    pub(super) reply: oneshot::Sender<Result<()>>,
}

/// The supervisor's handle to a live conversation. Every call answers
/// `None` once the session has ended.
#[derive(Clone)]
pub struct SessionHandle {
    pub(super) tx: mpsc::Sender<Command>,
    /// The conversation's owner (see [`crate::model::Conversation::owner`]).
    pub(super) owner: Option<Arc<str>>,
    /// Since when the agent has had no turn and no pending request.
    pub(super) idle: Arc<Mutex<Option<Instant>>>,
}

impl SessionHandle {
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        rx.await.ok()
    }

    /// Starts a turn; returns its id once `turn_started` is committed.
    pub async fn prompt(&self, content: Vec<Value>) -> Option<Result<Uuid>> {
        self.call(|reply| Command::Prompt { content, reply }).await
    }

    pub async fn cancel(&self) -> Option<Result<()>> {
        self.call(|reply| Command::Cancel { reply }).await
    }

    /// Answers a request this session holds; `Ok(None)`: it holds no such
    /// request (the store knows the rest).
    pub async fn respond(
        &self,
        permission_id: Uuid,
        answer: Answer,
        decided_by: String,
        via: Option<String>,
    ) -> Option<Result<Option<PermissionRequest>>> {
        self.call(|reply| Command::Respond {
            permission_id,
            answer,
            decided_by,
            via,
            reply,
        })
        .await
    }

    /// Changes a session setting; returns once the agent accepted it and
    /// the change is recorded.
    pub async fn change(&self, setting: Setting, changed_by: String) -> Option<Result<()>> {
        self.call(|reply| {
            Command::Change(Change {
                setting,
                changed_by,
                reply,
            })
        })
        .await
    }

    /// Closes the conversation; returns when the agent is gone.
    pub async fn close(&self) {
        self.call(|reply| Command::Close { reply }).await;
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the session has ended.
    pub async fn ended(&self) {
        self.tx.closed().await
    }

    /// Since when the agent has been idle (no turn, nothing pending).
    pub fn idle_since(&self) -> Option<Instant> {
        *self.idle.lock().unwrap()
    }

    /// Stops the agent if it is still idle, and returns once it is gone;
    /// whether it was stopped.
    pub async fn release(&self) -> bool {
        let released = self.call(|reply| Command::Release { reply }).await;
        if released == Some(true) {
            self.tx.closed().await;
        }
        released.unwrap_or(false)
    }
}
