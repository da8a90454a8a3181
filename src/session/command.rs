//! What a live conversation's task is asked to do, and the [`Handle`] that
//! asks it. One [`Command`] serves both ways it comes: from this node's API
//! (with a [`Reply`] channel beside it, never serialised) and from another
//! gateway node through the database (see [`crate::cluster`]), as JSON
//! whose form is fixed: nodes of two versions may share a database during a
//! deploy.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::Result;
use crate::model::{AgentReport, PermissionRequest};
use crate::permissions::Answer;

/// A command for a conversation, as the task gets it and as one node sends
/// it to another (`{"kind": "prompt", …}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Command {
    /// Start a turn with this content.
    Prompt { content: Vec<Value> },
    /// Cancel the running turn, if any.
    Cancel,
    /// Close the conversation: the agent stops.
    Close,
    /// A person's answer to the permission request `request`.
    Respond {
        request: Uuid,
        answer: Answer,
        decided_by: String,
        /// How the answer came (`notification`), if not over the API.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<String>,
    },
    /// A user changes a session setting.
    Change {
        setting: Setting,
        changed_by: String,
    },
    /// Stop the agent if it is idle (to make room for another). Only ever
    /// asked of this node's own tasks: it is never sent to another node.
    #[serde(skip)]
    Release,
}

impl Command {
    /// The command as JSON, for another node. Not for [`Command::Release`],
    /// which never leaves this node.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("commands serialize")
    }
}

/// Whom to tell how a [`Command`] went: the caller waiting on this node.
/// Each command has its own kind of reply (see [`Handle`]).
pub(super) enum Reply {
    /// To [`Command::Prompt`]: the new turn's id.
    Started(oneshot::Sender<Result<Uuid>>),
    /// To [`Command::Cancel`] and [`Command::Change`].
    Done(oneshot::Sender<Result<()>>),
    /// To [`Command::Respond`]: the answered request (`None`: the task
    /// holds no such request).
    Answered(oneshot::Sender<Result<Option<PermissionRequest>>>),
    /// To [`Command::Close`], once the agent is gone.
    Closed(oneshot::Sender<()>),
    /// To [`Command::Release`]: whether the agent will stop.
    Released(oneshot::Sender<bool>),
}

/// A command for a local task, with its reply.
pub(super) struct Order {
    pub(super) command: Command,
    pub(super) reply: Reply,
}

/// A session setting a user asks the agent to change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Setting {
    /// `session/set_mode`.
    Mode(String),
    /// `session/set_config_option`: a string or boolean `value`.
    ConfigOption { config_id: String, value: Value },
}

impl Setting {
    /// Whether an agent that reports `state` offers this; else why not.
    pub fn check(&self, state: &AgentReport) -> std::result::Result<(), String> {
        match self {
            Setting::Mode(mode_id) => state.check_mode(mode_id),
            Setting::ConfigOption { config_id, value } => {
                state.config_request(config_id, value).map(drop)
            }
        }
    }
}

/// The supervisor's handle to a live conversation. Every call answers
/// `None` once the session has ended.
#[derive(Clone)]
pub struct Handle {
    pub(super) tx: mpsc::Sender<Order>,
    /// The conversation's owner (see [`crate::model::Conversation::owner`]).
    pub(super) owner: Option<Arc<str>>,
    /// Since when the agent has had no turn and no pending request.
    pub(super) idle: Arc<Mutex<Option<Instant>>>,
}

impl Handle {
    /// The conversation's owner.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Sends `command` with the reply channel `reply` makes; its answer.
    async fn ask<T>(&self, command: Command, reply: fn(oneshot::Sender<T>) -> Reply) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        let order = Order {
            command,
            reply: reply(tx),
        };
        self.tx.send(order).await.ok()?;
        rx.await.ok()
    }

    /// Starts a turn; returns its id once `turn_started` is committed.
    pub async fn prompt(&self, content: Vec<Value>) -> Option<Result<Uuid>> {
        self.ask(Command::Prompt { content }, Reply::Started).await
    }

    /// Cancels the running turn, if any.
    pub async fn cancel(&self) -> Option<Result<()>> {
        self.ask(Command::Cancel, Reply::Done).await
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
        let command = Command::Respond {
            request: permission_id,
            answer,
            decided_by,
            via,
        };
        self.ask(command, Reply::Answered).await
    }

    /// Changes a session setting; returns once the agent accepted it and
    /// the change is recorded.
    pub async fn change(&self, setting: Setting, changed_by: String) -> Option<Result<()>> {
        let command = Command::Change {
            setting,
            changed_by,
        };
        self.ask(command, Reply::Done).await
    }

    /// Closes the conversation; returns when the agent is gone.
    pub async fn close(&self) {
        self.ask(Command::Close, Reply::Closed).await;
    }

    /// Whether the session has ended.
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
        let released = self.ask(Command::Release, Reply::Released).await;
        if released == Some(true) {
            self.tx.closed().await;
        }
        released.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const REQUEST: &str = "0192d5e4-7a10-7000-8000-000000000001";

    /// Each forwarded command and the JSON it travels as between nodes, as
    /// the nodes of earlier versions send and read it.
    fn forwarded() -> Vec<(Command, Value)> {
        let request: Uuid = REQUEST.parse().unwrap();
        vec![
            (
                Command::Prompt {
                    content: vec![json!({"type": "text", "text": "hi"})],
                },
                json!({"kind": "prompt", "content": [{"type": "text", "text": "hi"}]}),
            ),
            (Command::Cancel, json!({"kind": "cancel"})),
            (Command::Close, json!({"kind": "close"})),
            (
                Command::Respond {
                    request,
                    answer: Answer::Option("allow_once".into()),
                    decided_by: "alice".into(),
                    via: None,
                },
                json!({"kind": "respond", "request": REQUEST,
                       "answer": {"Option": "allow_once"}, "decided_by": "alice"}),
            ),
            (
                Command::Respond {
                    request,
                    answer: Answer::Cancelled,
                    decided_by: "bob".into(),
                    via: Some("notification".into()),
                },
                json!({"kind": "respond", "request": REQUEST, "answer": "Cancelled",
                       "decided_by": "bob", "via": "notification"}),
            ),
            (
                Command::Change {
                    setting: Setting::Mode("plan".into()),
                    changed_by: "alice".into(),
                },
                json!({"kind": "change", "setting": {"Mode": "plan"}, "changed_by": "alice"}),
            ),
            (
                Command::Change {
                    setting: Setting::ConfigOption {
                        config_id: "model".into(),
                        value: json!(true),
                    },
                    changed_by: "alice".into(),
                },
                json!({"kind": "change",
                       "setting": {"ConfigOption": {"config_id": "model", "value": true}},
                       "changed_by": "alice"}),
            ),
        ]
    }

    #[test]
    fn forwarded_commands_travel_as_the_json_every_node_version_reads() {
        for (command, wire) in forwarded() {
            assert_eq!(command.to_value(), wire, "{command:?}");
            let read: Command = serde_json::from_value(wire).unwrap();
            assert_eq!(read, command);
        }
    }

    #[test]
    fn release_never_travels_between_nodes() {
        assert!(serde_json::to_value(Command::Release).is_err());
        assert!(serde_json::from_value::<Command>(json!({"kind": "release"})).is_err());
    }
}
