//! What gateway nodes sharing one database keep there: the `nodes` table
//! (who is alive), who owns each conversation (`conversations.node_id`),
//! the `commands` one node sends another, and the notifications (LISTEN /
//! NOTIFY) that tell nodes of events, commands and answers. Postgres only:
//! SQLite serves one node, so [`Clustered::cluster`] is `None` there.
//!
//! The statements are in `cluster_pg.rs`; what they mean for a node is in
//! [`crate::cluster`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use crate::error::Result;

/// Where a node announces the events it committed.
pub(super) const EVENTS: &str = "acp_gateway_events";
/// Where a node is told of a command sent to it.
pub(super) const COMMANDS: &str = "acp_gateway_commands";
/// Where a sender is told that its command was answered.
pub(super) const ANSWERS: &str = "acp_gateway_answers";

/// A store that other gateway nodes may share.
pub trait Clustered {
    /// What the nodes share, when they can (Postgres); `None` on SQLite.
    fn cluster(&self) -> Option<Arc<dyn ClusterStore>>;
}

/// A node's row as it registers: the node and the process that is it.
#[derive(Debug, Clone)]
pub struct NodeRecord {
    pub id: Uuid,
    /// Empty when the machine cannot be told apart (no `/proc`).
    pub hostname: String,
    pub boot_id: String,
    pub pid_namespace: String,
    pub pid: i32,
    /// Clock ticks after boot (0 when unknown).
    pub start_time: i64,
}

/// What tells whether a node is alive: its lease, and its process.
#[derive(Debug, Clone)]
pub struct NodeLease {
    pub boot_id: String,
    pub pid_namespace: String,
    pub pid: i32,
    pub start_time: i64,
    /// Whether its lease still holds.
    pub leased: bool,
}

/// A command one node sends the owner of a conversation.
#[derive(Debug, Clone, Copy)]
pub struct SentCommand<'a> {
    pub id: Uuid,
    /// The node it is for.
    pub node: Uuid,
    pub conversation: Uuid,
    pub kind: &'a str,
    pub body: &'a Value,
}

/// Which notification a node heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Events,
    Commands,
    Answers,
}

/// One notification: its channel and its text (as the sender wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub channel: Channel,
    pub payload: String,
}

/// What the nodes sharing a database read and write there.
#[async_trait]
pub trait ClusterStore: Send + Sync + 'static {
    /// Writes the node's row, its lease starting now and lasting `lease`
    /// (`again`: it may be there already, and is then left as it is).
    async fn register_node(&self, node: &NodeRecord, lease: Duration, again: bool) -> Result<()>;
    /// Extends the node's lease to `lease` from now; `false` when its row is
    /// gone (another node took it for dead).
    async fn renew_lease(&self, node: Uuid, lease: Duration) -> Result<bool>;
    /// Deletes the node's row.
    async fn delete_node(&self, node: Uuid) -> Result<()>;
    /// The node's lease and process, if it has a row.
    async fn node_lease(&self, node: Uuid) -> Result<Option<NodeLease>>;
    /// Deletes the rows of nodes whose lease ran out and that own nothing.
    async fn delete_dead_nodes(&self) -> Result<()>;

    /// The node that owns `conversation`: `None` when there is no such
    /// conversation, `Some(None)` when no node owns it.
    async fn conversation_node(&self, conversation: Uuid) -> Result<Option<Option<Uuid>>>;
    /// Gives `conversation` to `to` if `from` still owns it, raising its
    /// owner epoch: the new epoch, `None` when it did not.
    async fn move_conversation(
        &self,
        conversation: Uuid,
        from: Option<Uuid>,
        to: Uuid,
    ) -> Result<Option<i64>>;
    /// Leaves `conversation` to no node, if `node` owns it.
    async fn release_conversation(&self, conversation: Uuid, node: Uuid) -> Result<()>;
    /// Leaves every conversation `node` owns to no node.
    async fn release_all(&self, node: Uuid) -> Result<()>;
    /// Every owned conversation with its owner, but those of `node`.
    async fn owned_by_others(&self, node: Uuid) -> Result<Vec<(Uuid, Uuid)>>;
    /// Every node but `node` that owns a conversation.
    async fn other_owners(&self, node: Uuid) -> Result<Vec<Uuid>>;
    /// The conversations `node` owns.
    async fn owned_by(&self, node: Uuid) -> Result<Vec<Uuid>>;

    /// Writes `command` and, once written, notifies its node with `notice`.
    async fn send_command(&self, command: SentCommand<'_>, notice: &str) -> Result<()>;
    /// The command's answer, once there is one.
    async fn command_answer(&self, id: Uuid) -> Result<Option<Value>>;
    /// Deletes the command.
    async fn delete_command(&self, id: Uuid) -> Result<()>;
    /// Deletes the command unless its node took it; whether it did.
    async fn withdraw_command(&self, id: Uuid) -> Result<bool>;
    /// Deletes the command; its answer, if it had one.
    async fn delete_answered_command(&self, id: Uuid) -> Result<Option<Value>>;
    /// The commands sent to `node` that it has not taken, oldest first.
    async fn waiting_commands(&self, node: Uuid) -> Result<Vec<Uuid>>;
    /// Marks the command taken by `node` unless it was already:
    /// `(conversation, body)` when this call took it.
    async fn mark_command_taken(&self, id: Uuid, node: Uuid) -> Result<Option<(Uuid, Value)>>;
    /// Stores the command's answer and, once stored, notifies its sender
    /// with `notice`.
    async fn answer_command(&self, id: Uuid, answer: &Value, notice: &str) -> Result<()>;
    /// Deletes the commands made more than `age` ago.
    async fn delete_commands_older_than(&self, age: Duration) -> Result<()>;

    /// Notifies every node of new events, one notification per payload.
    async fn notify_events(&self, payloads: &[String]) -> Result<()>;
    /// A connection of its own that hears every node's notifications.
    async fn listen(&self) -> Result<Box<dyn Listener>>;
}

/// Hears the notifications of every node.
#[async_trait]
pub trait Listener: Send {
    /// The next notification; `None` when the connection was lost (it is
    /// made again on the next call; what was said meanwhile is lost).
    async fn recv(&mut self) -> Result<Option<Notice>>;
}
