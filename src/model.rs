//! The gateway's own objects as the contract (`../shared/docs/api.md`) names
//! them. ACP objects inside them (updates, tool calls, content blocks,
//! permission options) are kept as raw JSON, verbatim.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A new time-ordered id.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

/// Now, at the microsecond precision Postgres keeps, so that what we publish
/// equals what we read back.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

/// A list in the contract's shape: one page of items, and the cursor of
/// the next page (`None`: this is the last).
#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// Lifecycle of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Conversation {
    pub id: Uuid,
    pub agent: String,
    pub title: Option<String>,
    pub cwd: String,
    pub status: ConversationStatus,
    pub acp_session_id: Option<String>,
    pub last_seq: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The user who started it (not part of the API object).
    #[serde(skip_serializing, default)]
    pub owner: Option<String>,
}

/// One entry of a conversation's event log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub seq: i64,
    pub conversation_id: Uuid,
    #[serde(rename = "type")]
    pub kind: String,
    pub at: DateTime<Utc>,
    pub data: Value,
}

/// Event type names.
pub mod event_type {
    pub const TURN_STARTED: &str = "turn_started";
    pub const SESSION_UPDATE: &str = "session_update";
    pub const PERMISSION_REQUESTED: &str = "permission_requested";
    pub const PERMISSION_RESOLVED: &str = "permission_resolved";
    pub const TURN_ENDED: &str = "turn_ended";
    pub const AGENT_STATUS: &str = "agent_status";
}

/// Who spoke a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// Consecutive chunks of one role within a turn.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub id: Uuid,
    pub turn_id: Option<Uuid>,
    pub role: MessageRole,
    pub content: Vec<Value>,
    pub created_at: DateTime<Utc>,
}

impl Message {
    /// Appends a content block, joining text to a preceding text block.
    pub fn push_block(&mut self, block: Value) {
        if let (Some(last), Some(text)) = (self.content.last_mut(), plain_text(&block)) {
            if let Some(prev) = plain_text(last) {
                let joined = format!("{prev}{text}");
                last["text"] = Value::String(joined);
                return;
            }
        }
        self.content.push(block);
    }
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

/// A tool call's state after every update has been applied.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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

/// Where a permission request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionStatus {
    Pending,
    Approved,
    Rejected,
    Cancelled,
    Expired,
    TimedOut,
}

impl PermissionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
            Self::TimedOut => "timed_out",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "rejected" => Self::Rejected,
            "cancelled" => Self::Cancelled,
            "expired" => Self::Expired,
            "timed_out" => Self::TimedOut,
            _ => return None,
        })
    }
}

/// How a permission request was answered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Decision {
    pub option_id: Option<String>,
    /// `selected` or `cancelled`, as in ACP.
    pub outcome: String,
    pub decided_by: String,
    pub reason: Option<String>,
    pub decided_at: DateTime<Utc>,
}

impl Decision {
    /// A decision made now: the option chosen, or (`None`) the cancelled outcome.
    pub fn new(option_id: Option<String>, decided_by: String, reason: Option<String>) -> Decision {
        Decision {
            outcome: if option_id.is_some() {
                "selected"
            } else {
                "cancelled"
            }
            .to_owned(),
            option_id,
            decided_by,
            reason,
            decided_at: now(),
        }
    }

    /// The ACP result sent back to the agent.
    pub fn acp_result(&self) -> Value {
        match &self.option_id {
            Some(option_id) if self.outcome == "selected" => {
                serde_json::json!({"outcome": {"outcome": "selected", "optionId": option_id}})
            }
            _ => serde_json::json!({"outcome": {"outcome": "cancelled"}}),
        }
    }
}

/// An agent's `session/request_permission`, parked until answered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PermissionRequest {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub turn_id: Option<Uuid>,
    pub tool_call: Value,
    pub options: Vec<Value>,
    pub status: PermissionStatus,
    pub decision: Option<Decision>,
    pub created_at: DateTime<Utc>,
}

impl PermissionRequest {
    /// The option with this id, if the agent offered it.
    pub fn option(&self, option_id: &str) -> Option<&Value> {
        self.options
            .iter()
            .find(|o| o.get("optionId").and_then(Value::as_str) == Some(option_id))
    }

    /// The status a selected option leads to: its kind decides.
    pub fn status_for_option(&self, option_id: &str) -> Option<PermissionStatus> {
        let kind = self.option(option_id)?.get("kind").and_then(Value::as_str);
        Some(match kind {
            Some(k) if k.starts_with("allow") => PermissionStatus::Approved,
            _ => PermissionStatus::Rejected,
        })
    }
}

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and answers only their own conversations.
    User,
    /// Sees everything; alone changes policies and tokens.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// A remembered "always" answer, scoped to one conversation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Rule {
    pub id: Uuid,
    pub conversation_id: Uuid,
    /// The tool call kind it covers.
    pub tool_kind: String,
    /// The program (`execute`), the path (path tools) or the title (others).
    pub subject: String,
    /// `allow_always` or `reject_always`.
    pub option_kind: String,
    /// The request whose answer created it.
    pub permission_id: Uuid,
    pub created_at: DateTime<Utc>,
}

/// What an operator policy rule decides (the rule's `decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
    Ask,
}

/// At most `count` automatic approvals by one rule per `window`, per
/// conversation; beyond it, a person is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub count: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

/// One operator rule, as written in the config file or sent to the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    pub name: String,
    /// Profile names, or `"*"` for every agent (the default).
    #[serde(default = "every_agent")]
    pub agents: Vec<String>,
    /// Tool call kinds it covers (empty: every kind).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Regexes; the rule covers a shell command part that one of them matches.
    #[serde(default)]
    pub commands: Vec<String>,
    /// Globs over normalised paths; `{cwd}` is the conversation's directory.
    #[serde(default)]
    pub paths: Vec<String>,
    pub decision: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_auto_per: Option<RateLimit>,
    /// Answer `allow` with the agent's `allow_always` option.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remember: bool,
}

fn every_agent() -> Vec<String> {
    vec!["*".into()]
}

/// The typed `data` of an event whose shape the gateway defines;
/// [`EventData::KIND`] is its `type`.
pub trait EventData: Serialize {
    const KIND: &'static str;
}

/// `turn_started`: a prompt was accepted.
#[derive(Debug, Serialize)]
pub struct TurnStarted<'a> {
    pub turn_id: Uuid,
    pub content: &'a [Value],
}

impl EventData for TurnStarted<'_> {
    const KIND: &'static str = event_type::TURN_STARTED;
}

/// `turn_ended`: the agent answered `session/prompt`, or the turn ended
/// without that answer (`stop_reason` `error`, with the reason in `error`).
#[derive(Debug, Serialize)]
pub struct TurnEnded {
    pub turn_id: Uuid,
    pub stop_reason: String,
    pub error: Option<String>,
}

impl EventData for TurnEnded {
    const KIND: &'static str = event_type::TURN_ENDED;
}

/// Where the agent process stands, as `agent_status` events say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    Starting,
    Ready,
    Exited,
    Failed,
}

/// `agent_status`: the agent process started, is ready, or went away (why,
/// with its last stderr lines, in `detail`). When a conversation's agent is
/// started again (resume), `context` says whether it still knows the earlier
/// turns: `loaded` (`session/load` restored them) or `reset` (a fresh
/// session).
#[derive(Debug, Serialize)]
pub struct AgentStatus {
    pub status: AgentState,
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<&'static str>,
}

impl AgentStatus {
    pub fn new(status: AgentState, detail: Option<String>) -> AgentStatus {
        AgentStatus {
            status,
            detail,
            context: None,
        }
    }
}

impl EventData for AgentStatus {
    const KIND: &'static str = event_type::AGENT_STATUS;
}

#[cfg(test)]
mod tests {
    use super::*;
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
        m.push_block(json!({"type":"text","text":"Hel"}));
        m.push_block(json!({"type":"text","text":"lo"}));
        m.push_block(json!({"type":"image","data":"AA==","mimeType":"image/png"}));
        m.push_block(json!({"type":"text","text":"!"}));
        assert_eq!(m.content.len(), 3);
        assert_eq!(m.content[0]["text"], "Hello");
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
}
