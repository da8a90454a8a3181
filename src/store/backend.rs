//! What every backend offers: the [`Store`] trait and the values it takes
//! and returns.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;
use crate::model::Rule;
use crate::model::{
    AgentReport, Conversation, ConversationStatus, Decision, Event, Message, MessagePart,
    PermissionRequest, PermissionStatus, ToolCall,
};

/// One page of items read in order, bounded in count (`limit`) and in bytes
/// of JSON (`max_bytes`): it stops before the item that would pass the byte
/// bound, but always holds at least one, so that paging moves on.
#[derive(Debug)]
pub struct Bounded<T> {
    pub items: Vec<T>,
    /// Whether it stopped before the end: at `limit` items, or before an
    /// item that would have passed `max_bytes`.
    pub more: bool,
    bytes: usize,
    limit: usize,
    max_bytes: usize,
}

impl<T: serde::Serialize> Bounded<T> {
    pub fn new(limit: i64, max_bytes: usize) -> Self {
        Bounded {
            items: Vec::new(),
            more: false,
            bytes: 0,
            limit: usize::try_from(limit).unwrap_or(0),
            max_bytes,
        }
    }

    /// The bytes of JSON its items take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the page is full: read no more.
    pub fn is_full(&self) -> bool {
        self.more
    }

    /// Adds the next item, unless it would pass the byte bound (the first
    /// always fits); whether it was added.
    pub fn push(&mut self, item: T) -> bool {
        let size = json_size(&item);
        if !self.grow(size) {
            return false;
        }
        self.items.push(item);
        if self.items.len() >= self.limit {
            self.more = true;
        }
        true
    }

    /// Counts `size` more bytes for what the page holds, whatever the bound
    /// (its first item grew).
    pub fn count(&mut self, size: usize) {
        self.bytes = self.bytes.saturating_add(size);
    }

    /// Counts `size` more bytes for what the page holds (the last item grew,
    /// or is about to be added); `false`, and the page is full, when that
    /// would pass the byte bound and the page already holds an item.
    pub fn grow(&mut self, size: usize) -> bool {
        if !self.items.is_empty() && self.bytes.saturating_add(size) > self.max_bytes {
            self.more = true;
            return false;
        }
        self.bytes = self.bytes.saturating_add(size);
        true
    }
}

/// How many bytes `value` takes as JSON, without building the text.
pub fn json_size<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot serialize
    // counts what was written before it failed.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

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
    /// New conversation state, if it changed. Without it, the conversation's
    /// `last_seq` still moves up to the batch's events (see
    /// [`Store::commit`]).
    pub conversation: Option<ConversationPatch>,
    /// Who waits for this commit (see [`Lane`]).
    pub lane: Lane,
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
pub enum Lane {
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
    pub async fn enter(&self, lane: Lane) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match lane {
            Lane::Person => None,
            // Never closed.
            Lane::Agent => self.agents.acquire().await.ok(),
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
            + usize::from(self.conversation.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.messages.is_empty()
            && self.tool_calls.is_empty()
            && self.new_permissions.is_empty()
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

/// A list of operator policies and who set it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicySet {
    pub id: Uuid,
    pub rules: Vec<crate::model::PolicyRule>,
    pub updated_by: String,
    pub updated_at: DateTime<Utc>,
}

/// An agent process while it runs (see [`crate::process::procs`]): what a
/// gateway starting after a crash needs to find and kill what it left.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AgentProcessRecord {
    pub conversation_id: Uuid,
    /// Also its process group id.
    pub pid: i32,
    /// Clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: i64,
    pub boot_id: String,
    pub pid_namespace: String,
    pub hostname: String,
    pub started_at: DateTime<Utc>,
    /// The socket of the shim the agent runs under (then `pid` and
    /// `start_time` are the shim's); `None`: the gateway's own child.
    pub shim_socket: Option<String>,
    /// What a gateway reattaching to the shim needs ([`AgentLink`], as
    /// JSON), kept up to date with each commit.
    pub link: Option<String>,
}

impl AgentProcessRecord {
    /// The link state last committed, if there is one and it reads.
    pub fn agent_link(&self) -> Option<AgentLink> {
        serde_json::from_str(self.link.as_deref()?).ok()
    }
}

/// Where a conversation stands with an agent under a shim, committed with
/// the events it accounts for: a gateway reattaching carries on from here.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentLink {
    /// Every byte of the agent's output before this is committed.
    pub output_to: u64,
    /// `output_to` lies inside a line too long to use, whose rest a
    /// gateway reattaching there discards first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_inside_long_line: bool,
    /// The JSON-RPC id of the running turn's `session/prompt`.
    pub prompt_request: Option<u64>,
    /// The agent's JSON-RPC ids of its permission requests that wait for a
    /// person, by request id.
    pub waiting: std::collections::BTreeMap<Uuid, serde_json::Value>,
    /// Whether the agent takes `session/close`.
    pub can_close: bool,
    /// The agent's own pid and start time (the record's are the shim's).
    pub agent_pid: i32,
    pub agent_start_time: Option<u64>,
}

/// Which permission requests to list.
#[derive(Debug, Clone, Default)]
pub struct PermissionFilter {
    pub pending_only: bool,
    pub conversation_id: Option<Uuid>,
    /// Only requests of this user's conversations.
    pub owner: Option<String>,
}

/// The gateway's storage.
#[async_trait]
pub trait Store:
    super::notify::TargetStore
    + super::notify::OutboxStore
    + super::notify::AttemptStore
    + super::notify::NotifyKeyStore
    + super::tokens::TokenStore
    + super::cluster::Clustered
    + Send
    + Sync
    + 'static
{
    /// Answers when the database is reachable.
    async fn ping(&self) -> Result<()>;

    async fn insert_conversation(&self, conversation: &Conversation) -> Result<()>;
    async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>>;
    /// Newest first; `before` is the last id of the previous page; `owner`
    /// limits the list to one user's conversations.
    async fn list_conversations(
        &self,
        limit: i64,
        before: Option<Uuid>,
        owner: Option<&str>,
    ) -> Result<Vec<Conversation>>;
    /// Search (see [`search_words`]): conversations, newest first (paged
    /// like [`Store::list_conversations`]), whose title holds `q` or whose
    /// messages' text holds all its words; each with the text of its first
    /// matching message (`None`: its title matched).
    async fn search_conversations(
        &self,
        q: &str,
        limit: i64,
        before: Option<Uuid>,
        owner: Option<&str>,
    ) -> Result<Vec<(Conversation, Option<String>)>>;
    /// Up to `limit` conversations (in id order, after `after`) with
    /// messages in the search backlog: written before search existed, so not
    /// indexed yet (see [`crate::store::search_backlog`]).
    async fn search_backlog(&self, limit: i64, after: Option<Uuid>) -> Result<Vec<Uuid>>;
    /// Indexes these messages of the conversation (id, whole text) in one
    /// transaction, each only if it is still in the backlog, which it leaves
    /// (so each is indexed once, whichever node gets there first). Text a
    /// commit has indexed for a message since stays after it. With
    /// `rest_done`, the conversation's other backlog rows go too. Answers
    /// how many messages got text indexed.
    async fn index_backlog(
        &self,
        conversation_id: Uuid,
        texts: &[(Uuid, String)],
        rest_done: bool,
    ) -> Result<usize>;
    /// Conversations whose status says they were busy with their agent
    /// (starting, running a turn, awaiting a permission), each with the turn
    /// it was running.
    async fn live_conversations(&self) -> Result<Vec<(Conversation, Option<Uuid>)>>;

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

    /// The conversation's events with `seq > after`, ascending, at most
    /// `limit` (unbounded in bytes: for tools, not for clients).
    async fn list_events(
        &self,
        conversation_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>>;
    /// The `seq` of the conversation's newest stored event (0: none).
    async fn last_event_seq(&self, conversation_id: Uuid) -> Result<i64>;
    /// A page of the conversation's events with `seq > after`, ascending,
    /// bounded by `limit` and `max_bytes` (see [`Bounded`]); rows past the
    /// bound are not read.
    async fn list_events_page(
        &self,
        conversation_id: Uuid,
        after: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Bounded<Event>>;
    /// A page of the conversation's events of one `type` with `seq >
    /// after`, ascending, bounded as [`Store::list_events_page`].
    async fn list_events_of_type(
        &self,
        conversation_id: Uuid,
        kind: &str,
        after: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Bounded<Event>>;
    /// Every message of the conversation, oldest first.
    async fn list_messages(&self, conversation_id: Uuid) -> Result<Vec<Message>>;
    /// A page of the conversation's messages after the message `after` (from
    /// the first without), oldest first, bounded as
    /// [`Store::list_events_page`]: a message counts whole, its parts
    /// joined.
    async fn list_messages_page(
        &self,
        conversation_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Bounded<Message>>;
    async fn list_tool_calls(&self, conversation_id: Uuid) -> Result<Vec<ToolCall>>;
    /// The conversation's newest message (its content left empty) and the
    /// number of its next part, if it has any.
    async fn last_message(&self, conversation_id: Uuid) -> Result<Option<(Message, i32)>>;
    async fn get_permission(&self, id: Uuid) -> Result<Option<PermissionRequest>>;
    /// Oldest first.
    async fn list_permissions(&self, filter: &PermissionFilter) -> Result<Vec<PermissionRequest>>;

    /// Remembers a rule, replacing one with the same conversation and key.
    async fn upsert_rule(&self, rule: &Rule) -> Result<Rule>;
    /// Oldest first.
    async fn list_rules(&self, conversation_id: Uuid) -> Result<Vec<Rule>>;
    /// Forgets a rule; `false` if there was none with this id in the conversation.
    async fn delete_rule(&self, conversation_id: Uuid, rule_id: Uuid) -> Result<bool>;

    /// The operator policies in force, if they were ever set at run time.
    async fn current_policies(&self) -> Result<Option<PolicySet>>;
    /// Records a new list of operator policies (the history is kept).
    async fn save_policies(&self, set: &PolicySet) -> Result<()>;

    /// How many conversations have each status (statuses with none left out).
    async fn count_conversations_by_status(&self) -> Result<Vec<(String, i64)>>;
    /// How many permission requests are pending.
    async fn count_pending_permissions(&self) -> Result<i64>;

    /// Records a running agent process (replacing its conversation's earlier one).
    async fn record_agent_process(&self, record: &AgentProcessRecord) -> Result<()>;
    /// Deletes this record, if it is still the conversation's.
    async fn forget_agent_process(&self, record: &AgentProcessRecord) -> Result<()>;
    /// Every recorded agent process, of any machine.
    async fn list_agent_processes(&self) -> Result<Vec<AgentProcessRecord>>;
}

/// Most text of one message kept for search (what follows is not found).
pub const SEARCH_TEXT_MAX: usize = 64 * 1024;

/// The words of a search, as full-text matching takes them (letters and
/// digits; everything else separates them), at most 16.
pub fn search_words(q: &str) -> Vec<String> {
    q.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(16)
        .map(str::to_lowercase)
        .collect()
}

/// The text a message part adds to its message's search text: its text
/// blocks, at most [`SEARCH_TEXT_MAX`] bytes (cut at a character).
pub fn search_text(content: &[serde_json::Value]) -> String {
    let mut text = String::new();
    for block in content {
        if block.get("type").and_then(serde_json::Value::as_str) == Some("text") {
            if let Some(t) = block.get("text").and_then(serde_json::Value::as_str) {
                text.push_str(t);
            }
        }
        if text.len() >= SEARCH_TEXT_MAX {
            let mut end = SEARCH_TEXT_MAX;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            break;
        }
    }
    text
}
