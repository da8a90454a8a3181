//! The event log's entries and the typed payloads of the events whose
//! shape the gateway defines.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

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
