//! The gateway's own objects as the API reference (`docs/api.md`) names
//! them. ACP objects inside them (updates, tool calls, content blocks,
//! permission options) are kept as raw JSON, verbatim.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
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
    pub state: SessionState,
    /// The gateway node whose agent runs it (see [`crate::cluster`]); not
    /// part of the API object.
    pub node_id: Option<Uuid>,
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
}

// The ACP objects a conversation carries, as the OpenAPI document shows
// them: the members clients use, as ACP defines them (the gateway passes
// on whatever else an agent sends).

/// ACP `SessionModeState`: the modes the agent offers and the current one.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SessionModeState {
    #[serde(rename = "currentModeId")]
    current_mode_id: String,
    #[serde(rename = "availableModes")]
    available_modes: Vec<SessionMode>,
}

/// ACP `SessionMode`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SessionMode {
    id: String,
    name: String,
    description: Option<String>,
}

/// ACP `SessionConfigOption`: a `select` (with `options`, flat or in
/// groups) or a `boolean`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SessionConfigOption {
    id: String,
    name: String,
    description: Option<String>,
    /// E.g. `model`, `mode`, `thought_level`.
    category: Option<String>,
    /// `select` or `boolean`.
    r#type: String,
    /// A select's value id, or a boolean.
    #[serde(rename = "currentValue")]
    current_value: Value,
    /// A select's values: `{value, name, description?}`, or groups of them
    /// `{group, name, options}`.
    #[schema(value_type = Option<Vec<Object>>)]
    options: Option<Value>,
}

/// ACP `AvailableCommand`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct AvailableCommand {
    name: String,
    description: String,
    /// `{hint}` when the command takes input.
    #[schema(value_type = Option<Object>)]
    input: Option<Value>,
}

/// ACP `UsageUpdate` without its tag: tokens in context, the context
/// window, and the session's cost so far.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct Usage {
    used: u64,
    size: u64,
    /// `{amount, currency}`.
    #[schema(value_type = Option<Object>)]
    cost: Option<Value>,
}

impl From<Conversation> for ConversationView {
    fn from(c: Conversation) -> Self {
        let SessionState {
            modes,
            config_options,
            available_commands,
            usage,
            title,
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
        }
    }
}

/// What an agent last reported about its session, as ACP objects, verbatim:
/// from the answers to `session/new`, `session/load` and `session/resume`,
/// and from its `current_mode_update`, `config_option_update`,
/// `available_commands_update`, `usage_update` and `session_info_update`.
/// `None` where it reported nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionState {
    /// `SessionModeState`: `currentModeId` and `availableModes`.
    pub modes: Option<Value>,
    /// `[SessionConfigOption]`.
    pub config_options: Option<Value>,
    /// `[AvailableCommand]`.
    pub available_commands: Option<Value>,
    /// The latest `usage_update`, without its `sessionUpdate` tag.
    pub usage: Option<Value>,
    /// The session's title, as the agent named it.
    pub title: Option<String>,
}

/// Longest title kept from an agent (in characters).
const AGENT_TITLE_MAX_CHARS: usize = 500;

impl SessionState {
    /// Applies an update from `session/update`; whether anything changed.
    /// Other kinds of update, and malformed ones, change nothing.
    pub fn apply_update(&mut self, update: &Value) -> bool {
        let field = |key: &str| update.get(key).filter(|v| v.is_array()).cloned();
        match update.get("sessionUpdate").and_then(Value::as_str) {
            Some("current_mode_update") => match update.get("currentModeId") {
                Some(Value::String(id)) => self.set_current_mode(id),
                _ => false,
            },
            Some("config_option_update") => {
                replace(&mut self.config_options, field("configOptions"))
            }
            Some("available_commands_update") => {
                replace(&mut self.available_commands, field("availableCommands"))
            }
            Some("usage_update") => {
                let mut usage = update.clone();
                if let Some(map) = usage.as_object_mut() {
                    map.remove("sessionUpdate");
                }
                replace(&mut self.usage, Some(usage))
            }
            Some("session_info_update") => match update.get("title") {
                Some(Value::String(title)) => {
                    let title = title.chars().take(AGENT_TITLE_MAX_CHARS).collect();
                    let changed = self.title.as_ref() != Some(&title);
                    self.title = Some(title);
                    changed
                }
                Some(Value::Null) => self.title.take().is_some(),
                _ => false,
            },
            _ => false,
        }
    }

    /// Takes what the answer to `session/new`, `session/load` or
    /// `session/resume` reports (`modes`, `configOptions`). A `fresh`
    /// session (`session/new`) is a new one for the agent: what the answer
    /// leaves out, and the earlier session's commands and usage, are gone. A
    /// restored session keeps what the answer leaves out.
    pub fn apply_opened(&mut self, result: &Value, fresh: bool) {
        let modes = result.get("modes").filter(|v| v.is_object()).cloned();
        let options = result
            .get("configOptions")
            .filter(|v| v.is_array())
            .cloned();
        if fresh {
            self.modes = modes;
            self.config_options = options;
            self.available_commands = None;
            self.usage = None;
        } else {
            if modes.is_some() {
                self.modes = modes;
            }
            if options.is_some() {
                self.config_options = options;
            }
        }
    }

    /// Records the current mode; whether it changed.
    pub fn set_current_mode(&mut self, id: &str) -> bool {
        match self.modes.as_mut().and_then(Value::as_object_mut) {
            Some(modes) => {
                if modes.get("currentModeId").and_then(Value::as_str) == Some(id) {
                    return false;
                }
                modes.insert("currentModeId".into(), Value::String(id.to_owned()));
                true
            }
            None => {
                self.modes = Some(serde_json::json!({"currentModeId": id, "availableModes": []}));
                true
            }
        }
    }

    /// Records the agent's full set of configuration options.
    pub fn set_config_options(&mut self, options: Value) -> bool {
        replace(
            &mut self.config_options,
            Some(options).filter(Value::is_array),
        )
    }

    /// Whether the agent offers mode `id`; else why not, for the user.
    pub fn check_mode(&self, id: &str) -> Result<(), String> {
        let offered: Vec<&str> = self
            .modes
            .as_ref()
            .and_then(|m| m.get("availableModes"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("id")?.as_str())
            .collect();
        if offered.is_empty() {
            return Err("the agent offers no session modes".into());
        }
        if offered.contains(&id) {
            Ok(())
        } else {
            Err(format!(
                "the agent offers no mode {id:?}; it offers: {}",
                offered.join(", ")
            ))
        }
    }

    /// The `session/set_config_option` params (but `sessionId`) that set
    /// option `config_id` to `value` (a string or a boolean), once checked
    /// against what the agent offers; else why not, for the user.
    pub fn config_request(&self, config_id: &str, value: &Value) -> Result<Value, String> {
        use serde_json::json;
        let options = self
            .config_options
            .as_ref()
            .and_then(Value::as_array)
            .filter(|o| !o.is_empty())
            .ok_or("the agent offers no configuration options")?;
        let id_of = |o: &Value| o.get("id").and_then(Value::as_str).map(str::to_owned);
        let Some(option) = options
            .iter()
            .find(|o| id_of(o).as_deref() == Some(config_id))
        else {
            let ids: Vec<String> = options.iter().filter_map(id_of).collect();
            return Err(format!(
                "the agent offers no configuration option {config_id:?}; it offers: {}",
                ids.join(", ")
            ));
        };
        match (option.get("type").and_then(Value::as_str), value) {
            (Some("select"), Value::String(v)) => {
                let values = select_values(option);
                if !values.contains(&v.as_str()) {
                    return Err(format!(
                        "{v:?} is not a value of option {config_id:?}; its values: {}",
                        values.join(", ")
                    ));
                }
                Ok(json!({"configId": config_id, "value": v}))
            }
            (Some("boolean"), Value::Bool(b)) => {
                Ok(json!({"configId": config_id, "type": "boolean", "value": b}))
            }
            (Some(kind @ ("select" | "boolean")), _) => Err(format!(
                "option {config_id:?} is a {kind} option: its value must be {}",
                if kind == "select" {
                    "a string"
                } else {
                    "true or false"
                }
            )),
            // A kind of option this gateway does not know: passed on as is.
            (_, Value::String(v)) => Ok(json!({"configId": config_id, "value": v})),
            (_, Value::Bool(b)) => {
                Ok(json!({"configId": config_id, "type": "boolean", "value": b}))
            }
            _ => Err("value must be a string or a boolean".into()),
        }
    }
}

/// Sets `slot` to `value` when that is something; whether it changed.
fn replace(slot: &mut Option<Value>, value: Option<Value>) -> bool {
    match value {
        Some(v) if slot.as_ref() != Some(&v) => {
            *slot = Some(v);
            true
        }
        _ => false,
    }
}

/// The values a `select` option offers, flat or in groups.
fn select_values(option: &Value) -> Vec<&str> {
    let entries = option.get("options").and_then(Value::as_array);
    entries
        .into_iter()
        .flatten()
        .flat_map(
            |entry| match entry.get("options").and_then(Value::as_array) {
                Some(group) => group.iter().collect::<Vec<_>>(),
                None => vec![entry],
            },
        )
        .filter_map(|o| o.get("value")?.as_str())
        .collect()
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
    pub const MODE_CHANGED: &str = "mode_changed";
    pub const CONFIG_OPTION_CHANGED: &str = "config_option_changed";
    pub const FILE_WRITTEN: &str = "file_written";
    pub const TERMINAL_OUTPUT: &str = "terminal_output";
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

/// Where a permission request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Decision {
    /// The option chosen; `null` with the `cancelled` outcome.
    pub option_id: Option<String>,
    /// `selected` or `cancelled`, as in ACP.
    #[schema(example = "selected")]
    pub outcome: String,
    /// `user:<name>`, `policy:<rule name>` or `system`.
    #[schema(example = "user:alice")]
    pub decided_by: String,
    /// Why, when the gateway or a policy decided.
    pub reason: Option<String>,
    pub decided_at: DateTime<Utc>,
    /// How a person's answer came: `notification` (an action URL); absent
    /// for the API and the web client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "notification")]
    pub via: Option<String>,
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
            via: None,
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PermissionRequest {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub turn_id: Option<Uuid>,
    /// The ACP `toolCall` of the request laid over what the agent announced
    /// of that call before: the call as the policies judged it.
    pub tool_call: Value,
    /// The ACP options, verbatim: `optionId`, `name`, `kind` (`allow_once`,
    /// `allow_always`, `reject_once`, `reject_always`).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
    Ask,
}

/// At most `count` automatic approvals by one rule per `window`, per
/// conversation; beyond it, a person is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub count: u32,
    /// A duration, e.g. `"1m"`, `"30s"`.
    #[serde(with = "humantime_serde")]
    #[schema(value_type = String, example = "1m")]
    pub window: Duration,
}

/// One operator rule, as written in the config file or sent to the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Unique in the list; at most 100 characters, one line.
    #[schema(min_length = 1, max_length = 100)]
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
#[derive(Debug, Serialize, ToSchema)]
pub struct TurnEnded {
    pub turn_id: Uuid,
    pub stop_reason: String,
    pub error: Option<String>,
}

impl EventData for TurnEnded {
    const KIND: &'static str = event_type::TURN_ENDED;
}

/// Where the agent process stands, as `agent_status` events say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
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

/// `mode_changed`: a user changed the session's mode and the agent
/// accepted; `modes` is the conversation's `modes` since.
#[derive(Debug, Serialize)]
pub struct ModeChanged<'a> {
    pub mode_id: &'a str,
    pub changed_by: &'a str,
    pub modes: &'a Option<Value>,
}

impl EventData for ModeChanged<'_> {
    const KIND: &'static str = event_type::MODE_CHANGED;
}

/// `config_option_changed`: a user set a configuration option and the agent
/// accepted; `config_options` is the full set the agent answered with.
#[derive(Debug, Serialize)]
pub struct ConfigOptionChanged<'a> {
    pub config_id: &'a str,
    pub value: &'a Value,
    pub changed_by: &'a str,
    pub config_options: &'a Option<Value>,
}

impl EventData for ConfigOptionChanged<'_> {
    const KIND: &'static str = event_type::CONFIG_OPTION_CHANGED;
}

/// `file_written`: the agent wrote a file through `fs/write_text_file`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileWritten {
    /// Where, resolved (symlinks followed): the file actually written,
    /// inside the conversation's directory.
    pub path: String,
    /// A unified diff against what the file held before (`--- /dev/null`
    /// for a new file), cut beyond 64 KiB with a line
    /// `[diff truncated: N more bytes]`. When the previous content was
    /// larger than a diff is made from (1 MiB), only the header and a line
    /// `[diff too large: …]`.
    pub diff: String,
    /// The previous content was larger than a diff is made from (1 MiB): it
    /// was not read, and `diff` says so instead of showing the change.
    #[serde(default)]
    pub diff_too_large: bool,
}

impl EventData for FileWritten {
    const KIND: &'static str = event_type::FILE_WRITTEN;
}

/// One write in a conversation's change list (`GET …/files`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileChange {
    /// The `file_written` event's `seq`.
    pub seq: i64,
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub written: FileWritten,
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

    fn offered() -> SessionState {
        let mut state = SessionState::default();
        state.apply_opened(
            &json!({
                "sessionId": "s",
                "modes": {"currentModeId": "ask", "availableModes": [
                    {"id": "ask", "name": "Ask"}, {"id": "plan", "name": "Plan"}]},
                "configOptions": [
                    {"id": "model", "name": "Model", "type": "select", "currentValue": "fast",
                     "options": [{"value": "fast", "name": "Fast"}, {"value": "deep", "name": "Deep"}]},
                    {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
                     "options": [{"group": "g", "name": "G", "options": [{"value": "low", "name": "Low"}]}]},
                    {"id": "brave", "name": "Brave", "type": "boolean", "currentValue": false}
                ]
            }),
            true,
        );
        state
    }

    #[test]
    fn session_state_follows_the_agents_updates() {
        let mut state = offered();
        assert!(state.apply_update(
            &json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
        ));
        assert_eq!(state.modes.as_ref().unwrap()["currentModeId"], "plan");
        assert_eq!(
            state.modes.as_ref().unwrap()["availableModes"][1]["id"],
            "plan"
        );
        assert!(!state.apply_update(
            &json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
        ));
        assert!(
            state.apply_update(&json!({"sessionUpdate": "available_commands_update",
            "availableCommands": [{"name": "init", "description": "Start"}]}))
        );
        assert_eq!(
            state.available_commands,
            Some(json!([{"name": "init", "description": "Start"}]))
        );
        assert!(state.apply_update(
            &json!({"sessionUpdate": "usage_update", "used": 5, "size": 10,
            "cost": {"amount": 0.5, "currency": "USD"}})
        ));
        assert_eq!(
            state.usage,
            Some(json!({"used": 5, "size": 10, "cost": {"amount": 0.5, "currency": "USD"}}))
        );
        assert!(
            state.apply_update(&json!({"sessionUpdate": "session_info_update", "title": "Fix it"}))
        );
        assert_eq!(state.title.as_deref(), Some("Fix it"));
        // Only a title present changes it; null clears it.
        assert!(
            !state.apply_update(&json!({"sessionUpdate": "session_info_update", "updatedAt": "x"}))
        );
        assert!(state.apply_update(&json!({"sessionUpdate": "session_info_update", "title": null})));
        assert_eq!(state.title, None);
        assert!(state
            .apply_update(&json!({"sessionUpdate": "config_option_update", "configOptions": []})));
        assert_eq!(state.config_options, Some(json!([])));
        // Malformed or unrelated updates change nothing.
        for update in [
            json!({"sessionUpdate": "config_option_update", "configOptions": "x"}),
            json!({"sessionUpdate": "current_mode_update"}),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}),
            json!({"sessionUpdate": "brand_new_kind", "title": "x"}),
            json!("not an object"),
        ] {
            assert!(!state.apply_update(&update), "{update}");
        }
    }

    #[test]
    fn a_fresh_session_forgets_what_a_restored_one_keeps() {
        let mut state = offered();
        state.apply_update(&json!({"sessionUpdate": "usage_update", "used": 1, "size": 2}));
        state.apply_update(&json!({"sessionUpdate": "session_info_update", "title": "T"}));
        let mut restored = state.clone();
        restored.apply_opened(&json!({}), false);
        assert_eq!(restored, state);
        restored.apply_opened(
            &json!({"modes": {"currentModeId": "x", "availableModes": []}}),
            false,
        );
        assert_eq!(restored.modes.as_ref().unwrap()["currentModeId"], "x");
        assert_eq!(restored.config_options, state.config_options);
        state.apply_opened(&json!({"sessionId": "new"}), true);
        assert_eq!(state.modes, None);
        assert_eq!(state.config_options, None);
        assert_eq!(state.usage, None);
        assert_eq!(
            state.title.as_deref(),
            Some("T"),
            "the conversation keeps its title"
        );
    }

    #[test]
    fn only_what_the_agent_offers_may_be_asked_for() {
        let state = offered();
        assert_eq!(state.check_mode("plan"), Ok(()));
        let err = state.check_mode("yolo").unwrap_err();
        assert!(err.contains("ask, plan"), "{err}");
        assert!(SessionState::default().check_mode("plan").is_err());

        assert_eq!(
            state.config_request("model", &json!("deep")),
            Ok(json!({"configId": "model", "value": "deep"}))
        );
        assert_eq!(
            state.config_request("effort", &json!("low")),
            Ok(json!({"configId": "effort", "value": "low"}))
        );
        assert_eq!(
            state.config_request("brave", &json!(true)),
            Ok(json!({"configId": "brave", "type": "boolean", "value": true}))
        );
        let err = state.config_request("model", &json!("huge")).unwrap_err();
        assert!(err.contains("fast, deep"), "{err}");
        assert!(state.config_request("model", &json!(true)).is_err());
        assert!(state.config_request("brave", &json!("yes")).is_err());
        let err = state.config_request("colour", &json!("red")).unwrap_err();
        assert!(err.contains("model, effort, brave"), "{err}");
        assert!(SessionState::default()
            .config_request("model", &json!("fast"))
            .is_err());
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
