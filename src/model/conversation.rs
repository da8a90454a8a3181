//! A conversation and its transcript: its lifecycle, the object the API
//! shows, messages and tool calls.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::agent_report::{
    AgentReport, AvailableCommand, PromptCapabilities, SessionConfigOption, SessionModeState,
    SessionOffers, Usage,
};
use super::changes::{ChangeTotals, Worktree};
use super::members::{MemberRole, Sharing};
use super::queue::QueuedPrompt;
use super::usage::Spend;

/// Lifecycle of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConversationStatus {
    Starting,
    Idle,
    Running,
    AwaitingPermission,
    Closed,
    Failed,
}

impl ConversationStatus {
    pub const ALL: [ConversationStatus; 6] = [
        Self::Starting,
        Self::Idle,
        Self::Running,
        Self::AwaitingPermission,
        Self::Closed,
        Self::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Idle => "idle",
            Self::Running => "running",
            Self::AwaitingPermission => "awaiting_permission",
            Self::Closed => "closed",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "starting" => Self::Starting,
            "idle" => Self::Idle,
            "running" => Self::Running,
            "awaiting_permission" => Self::AwaitingPermission,
            "closed" => Self::Closed,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// One ACP session with one agent profile, plus its persisted history.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(into = "ConversationView")]
pub struct Conversation {
    pub id: Uuid,
    pub agent: String,
    /// The title the user gave (the API shows the agent's where this is none).
    pub title: Option<String>,
    pub cwd: String,
    pub status: ConversationStatus,
    pub acp_session_id: Option<String>,
    pub last_seq: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The user who started it (not part of the API object).
    pub owner: Option<String>,
    /// What the agent last reported about its session.
    pub state: AgentReport,
    /// The gateway node whose agent runs it (see [`crate::cluster`]); not
    /// part of the API object.
    pub node_id: Option<Uuid>,
    /// Prompts waiting for the running turn to end (see
    /// [`super::queue`]); not part of the API object (`…/queue` is).
    pub queue: Vec<QueuedPrompt>,
    /// The conversation it was forked from, if it was.
    pub forked_from: Option<ForkedFrom>,
    /// The agent session begun elsewhere it took over (`adopt`), if it did.
    pub adopted_session: Option<String>,
    /// The git worktree it was made on, if it was made on a repository.
    pub worktree: Option<Worktree>,
    /// How much its worktree differs from its base, as last recorded.
    pub changes: Option<ChangeTotals>,
    /// What its agent spent, per currency (see [`super::usage`]); empty
    /// where nothing was, or where it was not read.
    pub spend: Vec<Spend>,
    /// Who it is shared with, as its reader sees it (see
    /// [`super::members`]).
    pub sharing: Sharing,
}

/// Where a forked conversation came from: the conversation, and the message
/// its history was copied up to (`None`: the source had no message yet).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ForkedFrom {
    /// The source conversation.
    pub conversation_id: Uuid,
    /// The source's last message the fork holds (its messages up to this one
    /// were copied, with new ids); `null` where the source had none.
    pub message_id: Option<Uuid>,
}

/// A conversation: one ACP session with one agent profile, plus its
/// persisted history. `modes`, `config_options`, `available_commands` and
/// `usage` are what the agent last reported, as ACP objects, verbatim
/// (`null` where it reported none).
#[derive(Serialize, ToSchema)]
#[schema(as = Conversation)]
pub struct ConversationView {
    id: Uuid,
    /// The agent profile's name.
    agent: String,
    /// The user's title, else the agent's (`session_info_update`).
    title: Option<String>,
    /// The agent's working directory (absolute).
    cwd: String,
    status: ConversationStatus,
    /// The agent's id for the session.
    acp_session_id: Option<String>,
    /// The seq of its newest event (0: none yet).
    last_seq: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    /// ACP `SessionModeState`.
    #[schema(value_type = Option<SessionModeState>)]
    modes: Option<Value>,
    /// ACP `SessionConfigOption`s (a model choice has `category: "model"`).
    #[schema(value_type = Option<Vec<SessionConfigOption>>)]
    config_options: Option<Value>,
    /// ACP `AvailableCommand`s: the agent's slash commands.
    #[schema(value_type = Option<Vec<AvailableCommand>>)]
    available_commands: Option<Value>,
    /// The latest ACP `usage_update`, without its `sessionUpdate` tag.
    #[schema(value_type = Option<Usage>)]
    usage: Option<Value>,
    /// What a prompt may carry (ACP `PromptCapabilities`, from the agent's
    /// `initialize`): `image` blocks where `image` is true, embedded
    /// `resource` blocks where `embeddedContext` is.
    #[schema(value_type = Option<PromptCapabilities>)]
    prompt_capabilities: Option<Value>,
    /// What the agent offers for its sessions beyond prompts (from its
    /// `initialize`): `fork` (`POST …/fork` works), `list` and `load` or
    /// `resume` (its sessions can be listed and taken over). `null` until
    /// its agent has started once.
    #[schema(value_type = Option<SessionOffers>)]
    session_capabilities: Option<Value>,
    /// Set when this conversation was forked from another
    /// (`POST /api/v1/conversations/{id}/fork`).
    forked_from: Option<ForkedFrom>,
    /// The agent's session id this conversation took over (`adopt`), when it
    /// was made to continue a session begun elsewhere.
    adopted_session: Option<String>,
    /// The git worktree it works in, when it was made on a repository
    /// (`repository`): its `cwd`, on a branch of its own.
    worktree: Option<WorktreeView>,
    /// How much its worktree differs from its base (files, lines, commits),
    /// as recorded after its last turn, commit, land or discard; `null`
    /// without a worktree or before the first record.
    changes: Option<ChangeTotals>,
    /// What its agent spent so far, per currency (the sum of the cost
    /// increases of its usage reports: see `GET /api/v1/usage`); `[]`
    /// where its agent reported no cost.
    spend: Vec<Spend>,
    /// How many users it is shared with (`POST …/members`); 0: none.
    members: i64,
    /// The caller's role where the conversation is shared with them (not
    /// theirs: someone else's); `null` for its owner (and an operator who
    /// is not a member).
    role: Option<MemberRole>,
}

/// A conversation's worktree as the API shows it.
#[derive(Serialize, ToSchema)]
#[schema(as = Worktree)]
pub struct WorktreeView {
    /// The repository (its top directory).
    repository: String,
    /// The branch the work started from and lands on.
    #[schema(example = "main")]
    base: String,
    /// The conversation's own branch.
    #[schema(example = "acp/5f1c2a9e")]
    branch: String,
    /// The worktree's directory; gone once the conversation is closed (its
    /// branch stays).
    path: String,
}

impl From<Worktree> for WorktreeView {
    fn from(w: Worktree) -> Self {
        WorktreeView {
            repository: w.repository,
            base: w.base,
            branch: w.branch,
            path: w.path,
        }
    }
}

impl From<Conversation> for ConversationView {
    fn from(c: Conversation) -> Self {
        let AgentReport {
            modes,
            config_options,
            available_commands,
            usage,
            title,
            prompt_capabilities,
            session_capabilities,
            last_cost: _,
        } = c.state;
        ConversationView {
            id: c.id,
            agent: c.agent,
            title: c.title.or(title),
            cwd: c.cwd,
            status: c.status,
            acp_session_id: c.acp_session_id,
            last_seq: c.last_seq,
            created_at: c.created_at,
            updated_at: c.updated_at,
            modes,
            config_options,
            available_commands,
            usage,
            prompt_capabilities,
            session_capabilities,
            forked_from: c.forked_from,
            adopted_session: c.adopted_session,
            worktree: c.worktree.map(WorktreeView::from),
            changes: c.changes,
            spend: c.spend,
            members: c.sharing.members,
            role: c.sharing.role,
        }
    }
}

/// Who spoke a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    User,
    Agent,
    Thought,
}

impl MessageRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Agent => "agent",
            Self::Thought => "thought",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "user" => Self::User,
            "agent" => Self::Agent,
            "thought" => Self::Thought,
            _ => return None,
        })
    }
}

/// Consecutive chunks of one role within a turn (text joined).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Message {
    pub id: Uuid,
    pub turn_id: Option<Uuid>,
    pub role: MessageRole,
    /// ACP content blocks.
    pub content: Vec<Value>,
    pub created_at: DateTime<Utc>,
}

impl Message {
    /// Appends a content block, joining text to a preceding text block (in
    /// place: a message may grow to megabytes, one chunk at a time).
    pub fn push_block(&mut self, block: &Value) {
        if !self.join_text(plain_text(block)) {
            self.content.push(block.clone());
        }
    }

    /// Appends text, as [`Message::push_block`] a plain text block.
    pub fn push_text(&mut self, text: &str) {
        if !self.join_text(Some(text)) {
            self.content
                .push(serde_json::json!({"type": "text", "text": text}));
        }
    }

    /// Appends the blocks of a later part of the message (see
    /// [`MessagePart`]).
    pub fn extend(&mut self, blocks: Vec<Value>) {
        for block in blocks {
            if !self.join_text(plain_text(&block)) {
                self.content.push(block);
            }
        }
    }

    /// Appends `text` (of a plain text block) to the last block when that is
    /// plain text too; whether it did.
    fn join_text(&mut self, text: Option<&str>) -> bool {
        match (text, self.content.last_mut().and_then(plain_text_mut)) {
            (Some(text), Some(prev)) => {
                prev.push_str(text);
                true
            }
            _ => false,
        }
    }
}

/// What one commit adds to a message: part 0 creates it, each later part
/// appends blocks to it, so that writing a long message costs what was
/// added, not what it holds. Reading joins the parts in order (text to a
/// preceding text block, as [`Message::push_block`] does).
#[derive(Debug, Clone, PartialEq)]
pub struct MessagePart {
    /// 0 for the first; then consecutive.
    pub part: i32,
    /// The message, with `content` holding only this part's blocks.
    pub message: Message,
    /// The seq of the event whose `data.content` is this part's content (a
    /// prompt's `turn_started`): the content is stored there only, and read
    /// back from it.
    pub content_in_event: Option<i64>,
}

/// The text of a `{"type":"text","text":...}` block that carries nothing else
/// (annotations or `_meta` would be lost by joining).
pub fn plain_text(block: &Value) -> Option<&str> {
    let obj = block.as_object()?;
    if obj.get("type")?.as_str()? != "text" || obj.len() != 2 {
        return None;
    }
    obj.get("text")?.as_str()
}

/// [`plain_text`], to append to.
pub fn plain_text_mut(block: &mut Value) -> Option<&mut String> {
    plain_text(block)?;
    match block.get_mut("text") {
        Some(Value::String(text)) => Some(text),
        _ => None,
    }
}

/// A tool call's state after every `tool_call_update` has been applied
/// (ACP fields, verbatim).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ToolCall {
    pub tool_call_id: String,
    pub turn_id: Option<Uuid>,
    pub title: Option<String>,
    pub kind: Option<String>,
    pub status: Option<String>,
    pub content: Option<Value>,
    pub locations: Option<Value>,
    pub raw_input: Option<Value>,
    pub raw_output: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl ToolCall {
    /// A tool call seen for the first time.
    pub fn new(tool_call_id: String, turn_id: Option<Uuid>, at: DateTime<Utc>) -> Self {
        ToolCall {
            tool_call_id,
            turn_id,
            title: None,
            kind: None,
            status: None,
            content: None,
            locations: None,
            raw_input: None,
            raw_output: None,
            created_at: at,
            updated_at: at,
        }
    }

    /// Applies the fields an ACP `tool_call` or `tool_call_update` carries;
    /// absent fields keep their value, `content` and `locations` replace.
    pub fn apply(&mut self, update: &Value, at: DateTime<Utc>) {
        let str_field = |k: &str| update.get(k).and_then(Value::as_str).map(str::to_owned);
        if let Some(v) = str_field("title") {
            self.title = Some(v);
        }
        if let Some(v) = str_field("kind") {
            self.kind = Some(v);
        }
        if let Some(v) = str_field("status") {
            self.status = Some(v);
        }
        for (key, slot) in [
            ("content", &mut self.content),
            ("locations", &mut self.locations),
            ("rawInput", &mut self.raw_input),
            ("rawOutput", &mut self.raw_output),
        ] {
            if let Some(v) = update.get(key) {
                if !v.is_null() {
                    *slot = Some(v.clone());
                }
            }
        }
        self.updated_at = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::agent_report::tests::offered;
    use crate::model::stamp::{new_id, now};
    use serde_json::json;

    #[test]
    fn text_blocks_are_joined_and_others_kept_apart() {
        let mut m = Message {
            id: new_id(),
            turn_id: None,
            role: MessageRole::Agent,
            content: vec![],
            created_at: now(),
        };
        m.push_block(&json!({"type":"text","text":"Hel"}));
        m.push_block(&json!({"type":"text","text":"lo"}));
        m.push_block(&json!({"type":"image","data":"AA==","mimeType":"image/png"}));
        m.push_block(&json!({"type":"text","text":"!"}));
        assert_eq!(m.content.len(), 3);
        assert_eq!(m.content[0]["text"], "Hello");
        // A later part joins the same way.
        m.extend(vec![
            json!({"type":"text","text":"?"}),
            json!({"type":"text","text":"!","annotations":{"priority":1}}),
            json!({"type":"text","text":"x"}),
        ]);
        assert_eq!(m.content.len(), 5);
        assert_eq!(m.content[2]["text"], "!?");
        assert_eq!(m.content[3]["annotations"]["priority"], 1);
        assert_eq!(m.content[4]["text"], "x", "nor joined to");
    }

    #[test]
    fn tool_call_updates_replace_only_the_fields_they_carry() {
        let at = now();
        let mut call = ToolCall::new("c1".into(), None, at);
        call.apply(
            &json!({"title":"Write","kind":"edit","status":"pending","locations":[{"path":"/a"}]}),
            at,
        );
        call.apply(
            &json!({"toolCallId":"c1","status":"completed","content":[]}),
            at,
        );
        assert_eq!(call.title.as_deref(), Some("Write"));
        assert_eq!(call.status.as_deref(), Some("completed"));
        assert_eq!(call.locations, Some(json!([{"path":"/a"}])));
        assert_eq!(call.content, Some(json!([])));
    }

    #[test]
    fn the_api_shows_the_agents_title_where_the_user_gave_none() {
        let mut c = Conversation {
            id: new_id(),
            agent: "a".into(),
            title: None,
            cwd: "/".into(),
            status: ConversationStatus::Idle,
            acp_session_id: None,
            last_seq: 0,
            created_at: now(),
            updated_at: now(),
            owner: Some("alice".into()),
            state: offered(),
            node_id: None,
            queue: Vec::new(),
            forked_from: None,
            adopted_session: None,
            worktree: None,
            changes: None,
            spend: Vec::new(),
            sharing: Default::default(),
        };
        c.state.title = Some("Agent's".into());
        let shown = serde_json::to_value(&c).unwrap();
        assert_eq!(shown["title"], "Agent's");
        assert_eq!(shown["modes"]["currentModeId"], "ask");
        assert_eq!(shown["available_commands"], Value::Null);
        assert!(shown.get("owner").is_none() && shown.get("state").is_none());
        c.title = Some("Mine".into());
        assert_eq!(serde_json::to_value(&c).unwrap()["title"], "Mine");
    }
}
