//! What a live conversation's task is asked to do, and the [`Handle`] that
//! asks it. One [`Command`] serves both ways it comes: from this node's API,
//! carrying the channel its answer goes back on (its [`Reply`], never
//! serialised), and from another gateway node through the database (see
//! [`crate::cluster`]), as JSON whose form is fixed: nodes of two versions
//! may share a database during a deploy.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use super::queue::QueueEdit;
use super::work::{ChangeDone, ChangeOp};
use crate::error::Result;
use crate::model::{AgentReport, Answer, Member, MemberOp, PermissionRequest, QueueChanged};

/// A command for a conversation, as the task gets it and as one node sends
/// it to another (`{"kind": "prompt", …}`). Each carries its own reply, of
/// the type its caller waits for; one read from another node's JSON carries
/// none (that node hears through the database).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Command {
    /// Start a turn with this content, or (while one runs) queue it as
    /// `while_running` says; the reply says which.
    Prompt {
        content: Vec<Value>,
        /// Absent from a node of an earlier version: refused while a turn
        /// runs, as it did.
        #[serde(default, skip_serializing_if = "WhileRunning::is_refuse")]
        while_running: WhileRunning,
        /// Who sent it (`user:<name>`), recorded with a queued prompt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        #[serde(skip)]
        reply: Reply<Result<Prompted>>,
    },
    /// A person's change to a queued prompt; the reply is what the
    /// `queue_changed` event says.
    Queue {
        edit: QueueEdit,
        by: String,
        #[serde(skip)]
        reply: Reply<Result<QueueChanged>>,
    },
    /// Start the first queued prompt now (a queue held after a turn that
    /// did not end with `end_turn`); the reply is the new turn's id.
    Resume {
        #[serde(skip)]
        reply: Reply<Result<Uuid>>,
    },
    /// Cancel the running turn, if any.
    Cancel {
        #[serde(skip)]
        reply: Reply<Result<()>>,
    },
    /// Close the conversation: the agent stops; the reply once it is gone.
    Close {
        #[serde(skip)]
        reply: Reply<()>,
    },
    /// A person's answer to the permission request `request`; the reply is
    /// the answered request (`None`: the task holds no such request).
    Respond {
        request: Uuid,
        answer: Answer,
        decided_by: String,
        /// How the answer came (`notification`), if not over the API.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<String>,
        /// Why, in the person's words: stored with the decision and told to
        /// the agent as a prompt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The reason is sent at once: the running turn is cancelled.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        steer: bool,
        #[serde(skip)]
        reply: Reply<Result<Option<PermissionRequest>>>,
    },
    /// A user changes a session setting; the reply once the agent accepted
    /// it and the change is recorded.
    Change {
        setting: Setting,
        changed_by: String,
        #[serde(skip)]
        reply: Reply<Result<()>>,
    },
    /// A person's commit, land or discard in the conversation's worktree,
    /// between turns; the reply is what it did.
    Changes {
        op: ChangeOp,
        by: String,
        #[serde(skip)]
        reply: Reply<Result<ChangeDone>>,
    },
    /// A budget's word on the conversation (see [`BudgetWord`]); the reply
    /// once its notices are committed and its stop asked for.
    Budget {
        word: BudgetWord,
        #[serde(skip)]
        reply: Reply<Result<()>>,
    },
    /// A person's change of the conversation's members; the reply is the
    /// member as they are now (removed: as they were).
    Members {
        op: MemberOp,
        by: String,
        #[serde(skip)]
        reply: Reply<Result<Member>>,
    },
    /// Stop the agent if it is idle (to make room for another); the reply
    /// says whether it will stop. Only ever asked of this node's own tasks:
    /// it is never sent to another node.
    #[serde(skip)]
    Release { reply: Reply<bool> },
}

/// What a budget says to a conversation (see `crate::budgets`): the
/// notices to record in its log, and whether to stop: cancel the running
/// turn (`cancel`) or let it finish (`finish_turn`), the queue held after
/// it either way, so that no queued prompt starts on its own while the
/// budget is spent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetWord {
    /// The budget's `id`.
    pub budget: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<crate::model::BudgetNotice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceeded: Option<crate::model::BudgetNotice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<crate::model::OnExceed>,
}

impl BudgetWord {
    /// The events it records.
    pub fn events(&self) -> impl Iterator<Item = crate::model::EventBody> + '_ {
        let warning = self
            .warning
            .clone()
            .map(crate::model::EventBody::BudgetWarning);
        let exceeded = self
            .exceeded
            .clone()
            .map(crate::model::EventBody::BudgetExceeded);
        warning.into_iter().chain(exceeded)
    }

    /// The budget whose spend stops the conversation, if it does.
    pub fn stopping(&self) -> Option<&str> {
        self.stop.map(|_| self.budget.as_str())
    }
}

impl Command {
    /// The command as JSON, for another node. Not for [`Command::Release`],
    /// which never leaves this node.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("commands serialize")
    }
}

/// Where a [`Command`]'s answer goes: the caller waiting on this node, or
/// nobody (a command as another node sent it, or made to be sent).
pub struct Reply<T>(Option<oneshot::Sender<T>>);

impl<T> Reply<T> {
    /// No one waits here for the answer.
    pub fn none() -> Reply<T> {
        Reply(None)
    }

    /// Answers the caller, if one waits (one that gave up hears nothing).
    pub fn send(self, answer: T) {
        if let Some(tx) = self.0 {
            let _ = tx.send(answer);
        }
    }
}

impl<T> Default for Reply<T> {
    fn default() -> Reply<T> {
        Reply::none()
    }
}

/// A reply is not part of what a command says.
impl<T> PartialEq for Reply<T> {
    fn eq(&self, _: &Reply<T>) -> bool {
        true
    }
}

impl<T> std::fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Reply" } else { "NoReply" })
    }
}

/// What a prompt sent while a turn runs does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhileRunning {
    /// Refused: 409 `turn_in_progress`.
    #[default]
    Refuse,
    /// Queued: it starts when the running turn ends with `end_turn`.
    Queue,
    /// The running turn is cancelled and this prompt starts next.
    Steer,
}

impl WhileRunning {
    fn is_refuse(&self) -> bool {
        *self == WhileRunning::Refuse
    }
}

/// What became of a prompt: a turn started (its id; the form a node of an
/// earlier version answers with), or it was queued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompted {
    Started(Uuid),
    Queued { id: Uuid, position: usize },
}

/// A person's answer to a permission request, besides the option: how it
/// came and what they said with it.
#[derive(Debug, Clone, Default)]
pub struct AnswerNote {
    /// How the answer came (`notification`), if not over the API.
    pub via: Option<String>,
    pub reason: Option<String>,
    pub steer: bool,
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
    pub(super) tx: mpsc::Sender<Command>,
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

    /// Sends the command `make` builds around a reply channel; its answer.
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(Reply(Some(tx)))).await.ok()?;
        rx.await.ok()
    }

    /// Starts a turn (its id once `turn_started` is committed), or queues
    /// the prompt while one runs as `while_running` says.
    pub async fn prompt(
        &self,
        content: Vec<Value>,
        while_running: WhileRunning,
        by: Option<String>,
    ) -> Option<Result<Prompted>> {
        self.ask(|reply| Command::Prompt {
            content,
            while_running,
            by,
            reply,
        })
        .await
    }

    /// Changes a queued prompt.
    pub async fn edit_queue(&self, edit: QueueEdit, by: String) -> Option<Result<QueueChanged>> {
        self.ask(|reply| Command::Queue { edit, by, reply }).await
    }

    /// A person's commit, land or discard in the worktree.
    pub async fn change_work(&self, op: ChangeOp, by: String) -> Option<Result<ChangeDone>> {
        self.ask(|reply| Command::Changes { op, by, reply }).await
    }

    /// A budget's word on the conversation.
    pub async fn budget(&self, word: BudgetWord) -> Option<Result<()>> {
        self.ask(|reply| Command::Budget { word, reply }).await
    }

    /// A person's change of the conversation's members.
    pub async fn change_members(&self, op: MemberOp, by: String) -> Option<Result<Member>> {
        self.ask(|reply| Command::Members { op, by, reply }).await
    }

    /// Starts the first queued prompt now.
    pub async fn resume_queue(&self) -> Option<Result<Uuid>> {
        self.ask(|reply| Command::Resume { reply }).await
    }

    /// Cancels the running turn, if any.
    pub async fn cancel(&self) -> Option<Result<()>> {
        self.ask(|reply| Command::Cancel { reply }).await
    }

    /// Answers a request this session holds; `Ok(None)`: it holds no such
    /// request (the store knows the rest).
    pub async fn answer(
        &self,
        request: Uuid,
        answer: Answer,
        decided_by: String,
        note: AnswerNote,
    ) -> Option<Result<Option<PermissionRequest>>> {
        self.ask(|reply| Command::Respond {
            request,
            answer,
            decided_by,
            via: note.via,
            reason: note.reason,
            steer: note.steer,
            reply,
        })
        .await
    }

    /// Changes a session setting; returns once the agent accepted it and
    /// the change is recorded.
    pub async fn change(&self, setting: Setting, changed_by: String) -> Option<Result<()>> {
        self.ask(|reply| Command::Change {
            setting,
            changed_by,
            reply,
        })
        .await
    }

    /// Closes the conversation; returns when the agent is gone.
    pub async fn close(&self) {
        self.ask(|reply| Command::Close { reply }).await;
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
        let released = self.ask(|reply| Command::Release { reply }).await;
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
                    while_running: WhileRunning::Refuse,
                    by: None,
                    reply: Reply::none(),
                },
                json!({"kind": "prompt", "content": [{"type": "text", "text": "hi"}]}),
            ),
            (
                Command::Prompt {
                    content: vec![json!({"type": "text", "text": "hi"})],
                    while_running: WhileRunning::Steer,
                    by: Some("user:alice".into()),
                    reply: Reply::none(),
                },
                json!({"kind": "prompt", "content": [{"type": "text", "text": "hi"}],
                       "while_running": "steer", "by": "user:alice"}),
            ),
            (
                Command::Queue {
                    edit: QueueEdit::Remove { prompt: request },
                    by: "user:alice".into(),
                    reply: Reply::none(),
                },
                json!({"kind": "queue", "edit": {"edit": "remove", "prompt": REQUEST},
                       "by": "user:alice"}),
            ),
            (
                Command::Resume {
                    reply: Reply::none(),
                },
                json!({"kind": "resume"}),
            ),
            (
                Command::Cancel {
                    reply: Reply::none(),
                },
                json!({"kind": "cancel"}),
            ),
            (
                Command::Close {
                    reply: Reply::none(),
                },
                json!({"kind": "close"}),
            ),
            (
                Command::Respond {
                    request,
                    answer: Answer::Option("allow_once".into()),
                    decided_by: "alice".into(),
                    via: None,
                    reason: None,
                    steer: false,
                    reply: Reply::none(),
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
                    reason: None,
                    steer: false,
                    reply: Reply::none(),
                },
                json!({"kind": "respond", "request": REQUEST, "answer": "Cancelled",
                       "decided_by": "bob", "via": "notification"}),
            ),
            (
                Command::Respond {
                    request,
                    answer: Answer::Option("no".into()),
                    decided_by: "bob".into(),
                    via: None,
                    reason: Some("wrong file".into()),
                    steer: true,
                    reply: Reply::none(),
                },
                json!({"kind": "respond", "request": REQUEST, "answer": {"Option": "no"},
                       "decided_by": "bob", "reason": "wrong file", "steer": true}),
            ),
            (
                Command::Change {
                    setting: Setting::Mode("plan".into()),
                    changed_by: "alice".into(),
                    reply: Reply::none(),
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
                    reply: Reply::none(),
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
        let release = Command::Release {
            reply: Reply::none(),
        };
        assert!(serde_json::to_value(release).is_err());
        assert!(serde_json::from_value::<Command>(json!({"kind": "release"})).is_err());
    }
}
