//! What every backend offers: the [`Store`] trait, whose parts by job are
//! its supertraits (each in its own file), and the values its appending
//! writes take: a commit's [`Batch`] and the [`CommitQueue`] it waits in, a
//! conversation's new state, a request's resolution.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::processes::AgentLink;
use crate::error::Result;
use crate::model::{
    AgentReport, ConversationStatus, Decision, Event, MessagePart, PermissionRequest,
    PermissionStatus, QueuedPrompt, ToolCall, UsageRecord,
};

/// What one commit changes in a conversation.
#[derive(Debug, Default)]
pub struct Batch {
    /// New events, with consecutive `seq`s following the conversation's `last_seq`.
    pub events: Vec<Event>,
    /// What to add to messages, in order.
    pub messages: Vec<MessagePart>,
    /// Tool-call states to insert or replace (by conversation and tool call id).
    pub tool_calls: Vec<ToolCall>,
    /// Permission requests to insert.
    pub new_permissions: Vec<PermissionRequest>,
    /// The agent's usage reports to keep, each with the `session_update`
    /// event that carried it (one of `events`, or one written before).
    pub usage: Vec<UsageRecord>,
    /// New conversation state, if it changed. Without it, the conversation's
    /// `last_seq` still moves up to the batch's events (see
    /// [`Store::commit`]).
    pub conversation: Option<ConversationPatch>,
    /// Who waits for this commit (see [`CommitQueue`]).
    pub lane: CommitQueue,
    /// The owner epoch the writer claimed the conversation with: where the
    /// conversation's epoch is another now, nothing is written and the
    /// commit fails with [`crate::error::Error::Fenced`]. `None`: unfenced
    /// (a gateway alone).
    pub fence: Option<i64>,
    /// The agent's link state as of this batch (an agent under a shim),
    /// written with it: see [`AgentLink`].
    pub link: Option<AgentLink>,
}

/// Who waits for a write, and so which goes first when writes queue for the
/// database. A person (a phone that answered a request, started a turn or
/// created a conversation) waits on the HTTP answer; an agent's output only
/// has to be stored in order and soon. So writes a person waits on go
/// straight to the connection pool, and agents' commits first take one of a
/// few places in a queue of their own: however many agents stream at once,
/// a person's write waits for at most that many commits. Nothing is dropped
/// or reordered within a conversation (its commits come from one task, one
/// after the other).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CommitQueue {
    /// What an agent sent.
    #[default]
    Agent,
    /// What a person is waiting for.
    Person,
}

/// The agents' lane: how many of their commits may use or wait for the
/// connection pool at once.
#[derive(Debug, Clone)]
pub struct Lanes {
    agents: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Lanes {
    pub fn new(agent_places: usize) -> Lanes {
        Lanes {
            agents: std::sync::Arc::new(tokio::sync::Semaphore::new(agent_places)),
        }
    }

    /// Waits for a place in `lane` (at once for a person); held until the
    /// write is done.
    pub async fn enter(&self, lane: CommitQueue) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match lane {
            CommitQueue::Person => None,
            // Never closed.
            CommitQueue::Agent => self.agents.acquire().await.ok(),
        }
    }
}

impl Batch {
    /// How many rows committing it writes.
    pub fn rows(&self) -> usize {
        self.events.len()
            + self.messages.len()
            + self.tool_calls.len()
            + self.new_permissions.len()
            + self.usage.len()
            + usize::from(self.conversation.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.messages.is_empty()
            && self.tool_calls.is_empty()
            && self.new_permissions.is_empty()
            && self.usage.is_empty()
            && self.conversation.is_none()
    }
}

/// The mutable columns of a conversation.
#[derive(Debug, Clone)]
pub struct ConversationPatch {
    pub status: ConversationStatus,
    pub acp_session_id: Option<String>,
    pub last_seq: i64,
    /// The turn in progress, if any.
    pub current_turn_id: Option<Uuid>,
    pub updated_at: DateTime<Utc>,
    /// What the agent reports about its session, when that changed.
    pub state: Option<AgentReport>,
    /// The prompt queue, when that changed.
    pub queue: Option<Vec<QueuedPrompt>>,
}

/// A decision on a pending permission request, applied only if it is still
/// pending (compare-and-set: of two concurrent answers exactly one wins).
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The request as it was stored while pending.
    pub request: PermissionRequest,
    pub status: PermissionStatus,
    pub decision: Decision,
}

impl Resolution {
    /// The request as it reads once resolved.
    pub fn resolved(&self) -> PermissionRequest {
        PermissionRequest {
            status: self.status,
            decision: Some(self.decision.clone()),
            ..self.request.clone()
        }
    }
}

/// The gateway's storage: the writes that append to a conversation's event
/// log (each backend's own, see `sql.rs`), and the parts by job, each its
/// supertrait written once for both backends: conversations, search,
/// events, messages and tool calls, permission requests and rules, agent
/// processes, usage, notifications (their targets, outbox, attempts and keys),
/// users and tokens, and the cluster's tables.
#[async_trait]
pub trait Store:
    super::conversations::ConversationStore
    + super::search::SearchStore
    + super::events::EventStore
    + super::messages::MessageStore
    + super::permissions::PermissionStore
    + super::processes::ProcessStore
    + super::usage::UsageStore
    + super::notify::TargetStore
    + super::notify::OutboxStore
    + super::notify::AttemptStore
    + super::notify::NotifyKeyStore
    + super::tokens::TokenStore
    + super::budgets::BudgetStore
    + super::share_links::ShareLinkStore
    + super::members::MemberStore
    + super::cluster::Clustered
    + Send
    + Sync
    + 'static
{
    /// Answers when the database is reachable.
    async fn ping(&self) -> Result<()>;

    /// Writes a batch atomically. A batch of events without the
    /// conversation's state (a piece of one the database refused) moves its
    /// `last_seq` up to them all the same: it is never behind a stored event.
    async fn commit(&self, conversation_id: Uuid, batch: &Batch) -> Result<()>;

    /// Applies `resolution` if the request is still pending and, in the same
    /// transaction, appends `event` (its data is replaced by the resolved
    /// request as stored) and moves the conversation to `patch`. Returns the resolved
    /// request, or `None` when it was no longer pending (nothing is written).
    async fn resolve_permission(
        &self,
        resolution: &Resolution,
        event: Event,
        patch: &ConversationPatch,
        fence: Option<i64>,
    ) -> Result<Option<(PermissionRequest, Event)>>;
}
