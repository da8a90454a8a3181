//! The event log: [`Event`], one entry of a conversation's log, and
//! [`EventBody`], what happened, one variant per event type with its typed
//! `data`. The one definition of an event: it serialises to the wire (REST,
//! WebSocket, stored rows, relays between nodes), reads back from it, and
//! documents itself in the OpenAPI document.
//!
//! On the wire an event is `{"seq", "conversation_id", "type", "at",
//! "data"}`, in that order: `type` names the variant, `data` is its payload.
//!
//! `event/session_update.rs` holds the data of `session_update`, the event
//! an agent's stream is made of: how its text chunks join, and its JSON
//! text made once for the store and the bus alike.

use std::borrow::Cow;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::de::Error as _;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use super::agent_report::SettingValue;
use super::budget::BudgetNotice;
use super::changes::{ChangesCommitted, ChangesDiscarded, ChangesLanded, ChangesUpdated};
use super::members::MemberChange;
use super::permission::{PermissionRequest, WaitingKind};
use super::question::Question;
use super::queue::{QueueChanged, QueueHeld};

mod session_update;

pub use session_update::{ChunkKind, SessionUpdate};

/// One entry of a conversation's event log, by its `type`. A WebSocket
/// sends each as one text frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// From 1, one more per event of the conversation.
    pub seq: i64,
    pub conversation_id: Uuid,
    pub at: DateTime<Utc>,
    /// What happened: the event's `type` and `data`.
    pub body: EventBody,
}

/// Event type names: the `type` of each [`EventBody`] variant on the wire.
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
    pub const QUEUE_CHANGED: &str = "queue_changed";
    pub const QUEUE_HELD: &str = "queue_held";
    pub const QUESTION_ASKED: &str = "question_asked";
    pub const QUESTION_RESOLVED: &str = "question_resolved";
    pub const CHANGES_UPDATED: &str = "changes_updated";
    pub const CHANGES_COMMITTED: &str = "changes_committed";
    pub const CHANGES_LANDED: &str = "changes_landed";
    pub const CHANGES_DISCARDED: &str = "changes_discarded";
    pub const BUDGET_WARNING: &str = "budget_warning";
    pub const BUDGET_EXCEEDED: &str = "budget_exceeded";
    pub const MEMBER_ADDED: &str = "member_added";
    pub const MEMBER_CHANGED: &str = "member_changed";
    pub const MEMBER_REMOVED: &str = "member_removed";
}

/// What an event says happened: its `type`, and its `data` typed.
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// `turn_started`: a prompt was accepted.
    TurnStarted(TurnStarted),
    /// `session_update`: an update from the agent, verbatim.
    SessionUpdate(SessionUpdate),
    /// `permission_requested`: the agent asks; the request as stored.
    PermissionRequested(PermissionRequest),
    /// `permission_resolved`: the request with its decision.
    PermissionResolved(PermissionRequest),
    /// `turn_ended`: the agent answered the prompt, or the turn ended
    /// without that answer (`stop_reason` `error`).
    TurnEnded(TurnEnded),
    /// `agent_status`: the agent process started, is ready, or went away.
    AgentStatus(AgentStatus),
    /// `mode_changed`: a user changed the session mode and the agent accepted.
    ModeChanged(ModeChanged),
    /// `config_option_changed`: a user set a configuration option and the
    /// agent accepted.
    ConfigOptionChanged(ConfigOptionChanged),
    /// `file_written`: the agent wrote a file through `fs/write_text_file`
    /// (profiles with `client_fs`).
    FileWritten(FileWritten),
    /// `terminal_output`: output of a command the agent runs through
    /// `terminal/create` (profiles with `client_terminal`).
    TerminalOutput(TerminalOutput),
    /// `queue_changed`: a prompt was queued, edited, moved, removed or
    /// started; the whole queue now.
    QueueChanged(QueueChanged),
    /// `queue_held`: a turn ended other than with `end_turn` while prompts
    /// were queued; they wait for a person.
    QueueHeld(QueueHeld),
    /// `changes_updated`: after a turn, what differs from the base in the
    /// conversation's worktree now (files, lines added and removed).
    ChangesUpdated(ChangesUpdated),
    /// `changes_committed`: a person committed what the worktree held.
    ChangesCommitted(ChangesCommitted),
    /// `changes_landed`: a person brought the branch into its base.
    ChangesLanded(ChangesLanded),
    /// `changes_discarded`: a person threw away what the worktree held
    /// since its last commit.
    ChangesDiscarded(ChangesDiscarded),
    /// `budget_warning`: 80 % of a budget is spent.
    BudgetWarning(BudgetNotice),
    /// `budget_exceeded`: a budget is spent; no new prompt in its scope
    /// starts until its window ends.
    BudgetExceeded(BudgetNotice),
    /// `question_asked`: the agent asks a person a question (ACP
    /// elicitation); the question as stored.
    QuestionAsked(Question),
    /// `question_resolved`: the question with its answer.
    QuestionResolved(Question),
    /// `member_added`: the conversation was shared with a user.
    MemberAdded(MemberChange),
    /// `member_changed`: a member's role changed.
    MemberChanged(MemberChange),
    /// `member_removed`: a member was removed (with the role they had).
    MemberRemoved(MemberChange),
    /// An event whose `data` is not its type's shape, kept verbatim: a
    /// stand-in for one the database refused (`data.unstorable` says why),
    /// or one read back in a shape this gateway does not know. Not in the
    /// OpenAPI document: clients see it as its `type`, with `data` short of
    /// members.
    Verbatim { kind: String, data: Value },
}

impl Event {
    /// Its `data` as a JSON value (a copy), for readers that look members
    /// up by name.
    pub fn data_value(&self) -> Value {
        serde_json::to_value(self.body.data()).expect("event data serializes")
    }
}

impl EventBody {
    /// `permission_requested`, or `question_asked` for a question.
    pub fn asked(request: PermissionRequest) -> EventBody {
        match request.kind {
            WaitingKind::Permission => EventBody::PermissionRequested(request),
            WaitingKind::Question => EventBody::QuestionAsked(Question::from(&request)),
        }
    }

    /// `permission_resolved`, or `question_resolved` for a question.
    pub fn resolved(request: PermissionRequest) -> EventBody {
        match request.kind {
            WaitingKind::Permission => EventBody::PermissionResolved(request),
            WaitingKind::Question => EventBody::QuestionResolved(Question::from(&request)),
        }
    }

    /// The event's `type`.
    pub fn kind(&self) -> &str {
        use event_type::*;
        match self {
            EventBody::TurnStarted(_) => TURN_STARTED,
            EventBody::SessionUpdate(_) => SESSION_UPDATE,
            EventBody::PermissionRequested(_) => PERMISSION_REQUESTED,
            EventBody::PermissionResolved(_) => PERMISSION_RESOLVED,
            EventBody::TurnEnded(_) => TURN_ENDED,
            EventBody::AgentStatus(_) => AGENT_STATUS,
            EventBody::ModeChanged(_) => MODE_CHANGED,
            EventBody::ConfigOptionChanged(_) => CONFIG_OPTION_CHANGED,
            EventBody::FileWritten(_) => FILE_WRITTEN,
            EventBody::TerminalOutput(_) => TERMINAL_OUTPUT,
            EventBody::QueueChanged(_) => QUEUE_CHANGED,
            EventBody::QueueHeld(_) => QUEUE_HELD,
            EventBody::QuestionAsked(_) => QUESTION_ASKED,
            EventBody::QuestionResolved(_) => QUESTION_RESOLVED,
            EventBody::ChangesUpdated(_) => CHANGES_UPDATED,
            EventBody::ChangesCommitted(_) => CHANGES_COMMITTED,
            EventBody::ChangesLanded(_) => CHANGES_LANDED,
            EventBody::ChangesDiscarded(_) => CHANGES_DISCARDED,
            EventBody::BudgetWarning(_) => BUDGET_WARNING,
            EventBody::BudgetExceeded(_) => BUDGET_EXCEEDED,
            EventBody::MemberAdded(_) => MEMBER_ADDED,
            EventBody::MemberChanged(_) => MEMBER_CHANGED,
            EventBody::MemberRemoved(_) => MEMBER_REMOVED,
            EventBody::Verbatim { kind, .. } => kind,
        }
    }

    /// The event's `data`, to serialise.
    pub fn data(&self) -> EventBodyData<'_> {
        EventBodyData(self)
    }

    /// The body of an event read back as `type` and `data` (from the store,
    /// or from an event's JSON). A stand-in (`data.unstorable`), or `data`
    /// not of its type's shape, stays [`EventBody::Verbatim`], so that it
    /// is sent on exactly as it was stored.
    pub fn read(kind: &str, data: Value) -> EventBody {
        if data.get("unstorable").is_some() {
            return EventBody::Verbatim {
                kind: kind.to_owned(),
                data,
            };
        }
        Self::typed(kind, data)
    }

    /// [`EventBody::read`] of `data` as stored, its JSON text: an update
    /// keeps that text and is sent on as stored, its JSON not made again.
    pub fn read_stored(kind: &str, data: Box<RawValue>) -> EventBody {
        let value = serde_json::from_str(data.get()).unwrap_or(Value::Null);
        let body = Self::read(kind, value);
        if let EventBody::SessionUpdate(update) = &body {
            update.keep_json(Arc::from(data));
        }
        body
    }

    /// Makes the JSON text an update is sent and stored as now, so that
    /// copies made from here on (the events published before their commit
    /// while the database is away) share it rather than make it again.
    pub fn make_json(&self) {
        if let EventBody::SessionUpdate(update) = self {
            update.make_json();
        }
    }

    /// What a [`EventBody::Verbatim`] stand-in still says, typed where its
    /// members allow (its `unstorable` note ignored); any other body as it
    /// is. For readers that act on events (notifications, the change list,
    /// export), as they did on the members a stand-in keeps.
    pub fn lenient(self) -> EventBody {
        match self {
            EventBody::Verbatim { kind, data } => Self::typed(&kind, data),
            typed => typed,
        }
    }

    /// `data` as the variant `kind` names, else verbatim.
    fn typed(kind: &str, data: Value) -> EventBody {
        use event_type::*;
        fn parse<T: serde::de::DeserializeOwned>(
            data: Value,
            variant: fn(T) -> EventBody,
            kind: &str,
        ) -> EventBody {
            match T::deserialize(&data) {
                Ok(typed) => variant(typed),
                Err(_) => EventBody::Verbatim {
                    kind: kind.to_owned(),
                    data,
                },
            }
        }
        match kind {
            // Moved, not copied: an update may be megabytes long.
            SESSION_UPDATE => match SessionUpdate::from_value(data) {
                Ok(update) => EventBody::SessionUpdate(update),
                Err(data) => EventBody::Verbatim {
                    kind: kind.to_owned(),
                    data,
                },
            },
            TURN_STARTED => parse(data, EventBody::TurnStarted, kind),
            PERMISSION_REQUESTED => parse(data, EventBody::PermissionRequested, kind),
            PERMISSION_RESOLVED => parse(data, EventBody::PermissionResolved, kind),
            TURN_ENDED => parse(data, EventBody::TurnEnded, kind),
            AGENT_STATUS => parse(data, EventBody::AgentStatus, kind),
            MODE_CHANGED => parse(data, EventBody::ModeChanged, kind),
            CONFIG_OPTION_CHANGED => parse(data, EventBody::ConfigOptionChanged, kind),
            FILE_WRITTEN => parse(data, EventBody::FileWritten, kind),
            TERMINAL_OUTPUT => parse(data, EventBody::TerminalOutput, kind),
            QUEUE_CHANGED => parse(data, EventBody::QueueChanged, kind),
            QUEUE_HELD => parse(data, EventBody::QueueHeld, kind),
            QUESTION_ASKED => parse(data, EventBody::QuestionAsked, kind),
            QUESTION_RESOLVED => parse(data, EventBody::QuestionResolved, kind),
            CHANGES_UPDATED => parse(data, EventBody::ChangesUpdated, kind),
            CHANGES_COMMITTED => parse(data, EventBody::ChangesCommitted, kind),
            CHANGES_LANDED => parse(data, EventBody::ChangesLanded, kind),
            CHANGES_DISCARDED => parse(data, EventBody::ChangesDiscarded, kind),
            BUDGET_WARNING => parse(data, EventBody::BudgetWarning, kind),
            BUDGET_EXCEEDED => parse(data, EventBody::BudgetExceeded, kind),
            MEMBER_ADDED => parse(data, EventBody::MemberAdded, kind),
            MEMBER_CHANGED => parse(data, EventBody::MemberChanged, kind),
            MEMBER_REMOVED => parse(data, EventBody::MemberRemoved, kind),
            _ => EventBody::Verbatim {
                kind: kind.to_owned(),
                data,
            },
        }
    }
}

/// An event's `data` (see [`EventBody::data`]): serialises the payload alone.
pub struct EventBodyData<'a>(&'a EventBody);

impl Serialize for EventBodyData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            EventBody::TurnStarted(d) => d.serialize(s),
            EventBody::SessionUpdate(d) => d.serialize_shared(s),
            EventBody::PermissionRequested(d) | EventBody::PermissionResolved(d) => d.serialize(s),
            EventBody::TurnEnded(d) => d.serialize(s),
            EventBody::AgentStatus(d) => d.serialize(s),
            EventBody::ModeChanged(d) => d.serialize(s),
            EventBody::ConfigOptionChanged(d) => d.serialize(s),
            EventBody::FileWritten(d) => d.serialize(s),
            EventBody::TerminalOutput(d) => d.serialize(s),
            EventBody::QueueChanged(d) => d.serialize(s),
            EventBody::QueueHeld(d) => d.serialize(s),
            EventBody::QuestionAsked(d) | EventBody::QuestionResolved(d) => d.serialize(s),
            EventBody::ChangesUpdated(d) => d.serialize(s),
            EventBody::ChangesCommitted(d) => d.serialize(s),
            EventBody::ChangesLanded(d) => d.serialize(s),
            EventBody::ChangesDiscarded(d) => d.serialize(s),
            EventBody::BudgetWarning(d) | EventBody::BudgetExceeded(d) => d.serialize(s),
            EventBody::MemberAdded(d)
            | EventBody::MemberChanged(d)
            | EventBody::MemberRemoved(d) => d.serialize(s),
            EventBody::Verbatim { data, .. } => data.serialize(s),
        }
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut event = s.serialize_struct("Event", 5)?;
        event.serialize_field("seq", &self.seq)?;
        event.serialize_field("conversation_id", &self.conversation_id)?;
        event.serialize_field("type", self.body.kind())?;
        event.serialize_field("at", &self.at)?;
        event.serialize_field("data", &self.body.data())?;
        event.end()
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire<'a> {
            seq: i64,
            conversation_id: Uuid,
            #[serde(rename = "type", borrow)]
            kind: Cow<'a, str>,
            at: DateTime<Utc>,
            data: Value,
        }
        let wire = Wire::deserialize(d)?;
        if wire.kind.is_empty() {
            return Err(D::Error::custom("an event's type is empty"));
        }
        Ok(Event {
            seq: wire.seq,
            conversation_id: wire.conversation_id,
            at: wire.at,
            body: EventBody::read(&wire.kind, wire.data),
        })
    }
}

macro_rules! body_from {
    ($($payload:ident),*) => {$(
        impl From<$payload> for EventBody {
            fn from(data: $payload) -> EventBody {
                EventBody::$payload(data)
            }
        }
    )*};
}

body_from!(
    TurnStarted,
    SessionUpdate,
    TurnEnded,
    AgentStatus,
    ModeChanged,
    ConfigOptionChanged,
    FileWritten,
    TerminalOutput,
    QueueChanged,
    QueueHeld,
    ChangesUpdated,
    ChangesCommitted,
    ChangesLanded,
    ChangesDiscarded
);

/// `turn_started`: a prompt was accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = TurnStartedData)]
pub struct TurnStarted {
    pub turn_id: Uuid,
    /// The user's prompt: ACP content blocks.
    pub content: Vec<Value>,
    /// Who prompted (`user:<name>`; a queued prompt: who queued it; a
    /// reason given with an answer: who answered). Absent where the
    /// gateway itself prompted, and from events recorded before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub by: Option<String>,
}

/// `turn_ended`: the agent answered `session/prompt`, or the turn ended
/// without that answer (`stop_reason` `error`, with the reason in `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TurnEnded {
    pub turn_id: Uuid,
    pub stop_reason: String,
    pub error: Option<String>,
}

/// Where the agent process stands, as `agent_status` events say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = AgentStatusData)]
pub struct AgentStatus {
    pub status: AgentState,
    /// Why (its exit and last stderr lines when it went away).
    pub detail: Option<String>,
    /// Only when an agent is started again for an existing conversation:
    /// `loaded` (it restored the session: `session/resume` or
    /// `session/load`) or `reset` (a fresh session: it forgot earlier
    /// turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, nullable = false)]
    pub context: Option<Cow<'static, str>>,
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

/// `mode_changed`: a user changed the session's mode and the agent
/// accepted; `modes` is the conversation's `modes` since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ModeChangedData)]
pub struct ModeChanged {
    pub mode_id: String,
    /// `user:<name>`.
    pub changed_by: String,
    /// The conversation's `modes` since (ACP `SessionModeState`).
    pub modes: Option<Value>,
}

/// `config_option_changed`: a user set a configuration option and the agent
/// accepted; `config_options` is the full set the agent answered with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = ConfigOptionChangedData)]
pub struct ConfigOptionChanged {
    pub config_id: String,
    #[schema(value_type = SettingValue)]
    pub value: Value,
    /// `user:<name>`.
    pub changed_by: String,
    /// The full set the agent answered with (ACP `SessionConfigOption`s).
    pub config_options: Option<Value>,
}

/// `file_written`: the agent wrote a file through `fs/write_text_file`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

/// One write in a conversation's change list (`GET …/files`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileChange {
    /// The `file_written` event's `seq`.
    pub seq: i64,
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub written: FileWritten,
}

/// `terminal_output`: a piece of a terminal's output; the first says what
/// runs (`command`, `cwd`), the last how it ended (`exit_status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = TerminalOutputData)]
pub struct TerminalOutput {
    /// The id `terminal/create` answered the agent.
    pub terminal_id: String,
    /// Output since the last event (stdout and stderr as they came; empty
    /// in the first and last event of a terminal).
    pub output: String,
    /// First event only: the program and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub command: Option<Vec<String>>,
    /// First event only: where it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cwd: Option<String>,
    /// Last event only: how it ended (ACP `TerminalExitStatus`:
    /// `exitCode`, `signal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exit_status: Option<Value>,
}

/// How the OpenAPI document shows one type of event: as `<name>Event`,
/// with its `type` as `<name>Type`.
struct Documented {
    name: &'static str,
    kind: &'static str,
    description: &'static str,
    /// The schema of its `data`.
    data: fn() -> Component,
}

/// The events as the OpenAPI document shows them, one schema per type.
const DOCUMENTED: [Documented; 23] = {
    use event_type::*;
    [
        Documented {
            name: "TurnStarted",
            kind: TURN_STARTED,
            description: "`turn_started`: a prompt was accepted.",
            data: component::<TurnStarted>,
        },
        Documented {
            name: "SessionUpdate",
            kind: SESSION_UPDATE,
            description: "`session_update`: an update from the agent, verbatim.",
            data: component::<SessionUpdate>,
        },
        Documented {
            name: "PermissionRequested",
            kind: PERMISSION_REQUESTED,
            description: "`permission_requested`: the agent asks; the request as stored.",
            data: component::<PermissionRequest>,
        },
        Documented {
            name: "PermissionResolved",
            kind: PERMISSION_RESOLVED,
            description: "`permission_resolved`: the request with its decision.",
            data: component::<PermissionRequest>,
        },
        Documented {
            name: "TurnEnded",
            kind: TURN_ENDED,
            description: "`turn_ended`: the agent answered the prompt, or the turn ended\nwithout that answer (`stop_reason` `error`).",
            data: component::<TurnEnded>,
        },
        Documented {
            name: "AgentStatus",
            kind: AGENT_STATUS,
            description: "`agent_status`: the agent process started, is ready, or went away.",
            data: component::<AgentStatus>,
        },
        Documented {
            name: "ModeChanged",
            kind: MODE_CHANGED,
            description: "`mode_changed`: a user changed the session mode and the agent accepted.",
            data: component::<ModeChanged>,
        },
        Documented {
            name: "ConfigOptionChanged",
            kind: CONFIG_OPTION_CHANGED,
            description: "`config_option_changed`: a user set a configuration option and the\nagent accepted.",
            data: component::<ConfigOptionChanged>,
        },
        Documented {
            name: "FileWritten",
            kind: FILE_WRITTEN,
            description: "`file_written`: the agent wrote a file through `fs/write_text_file`\n(profiles with `client_fs`).",
            data: component::<FileWritten>,
        },
        Documented {
            name: "TerminalOutput",
            kind: TERMINAL_OUTPUT,
            description: "`terminal_output`: output of a command the agent runs through\n`terminal/create` (profiles with `client_terminal`).",
            data: component::<TerminalOutput>,
        },
        Documented {
            name: "QueueChanged",
            kind: QUEUE_CHANGED,
            description: "`queue_changed`: a prompt was queued, edited, moved, removed or\nstarted; the whole queue now.",
            data: component::<QueueChanged>,
        },
        Documented {
            name: "QueueHeld",
            kind: QUEUE_HELD,
            description: "`queue_held`: a turn ended other than with `end_turn` while prompts\nwere queued; they wait for a person.",
            data: component::<QueueHeld>,
        },
        Documented {
            name: "ChangesUpdated",
            kind: CHANGES_UPDATED,
            description: "`changes_updated`: after a turn, what differs from the base in the\nconversation's worktree now (files, lines added and removed).",
            data: component::<ChangesUpdated>,
        },
        Documented {
            name: "ChangesCommitted",
            kind: CHANGES_COMMITTED,
            description: "`changes_committed`: a person committed what the worktree held.",
            data: component::<ChangesCommitted>,
        },
        Documented {
            name: "ChangesLanded",
            kind: CHANGES_LANDED,
            description: "`changes_landed`: a person brought the branch into its base.",
            data: component::<ChangesLanded>,
        },
        Documented {
            name: "ChangesDiscarded",
            kind: CHANGES_DISCARDED,
            description: "`changes_discarded`: a person threw away what the worktree held\nsince its last commit.",
            data: component::<ChangesDiscarded>,
        },
        Documented {
            name: "BudgetWarning",
            kind: BUDGET_WARNING,
            description: "`budget_warning`: 80 % of a budget is spent (once per budget, scope\nand window).",
            data: component::<BudgetNotice>,
        },
        Documented {
            name: "BudgetExceeded",
            kind: BUDGET_EXCEEDED,
            description: "`budget_exceeded`: a budget is spent (once per budget, scope and\nwindow): the turn that crossed it is cancelled or finishes as\n`on_exceed` says, and no new prompt in its scope starts until the\nwindow ends.",
            data: component::<BudgetNotice>,
        },
        Documented {
            name: "QuestionAsked",
            kind: QUESTION_ASKED,
            description: "`question_asked`: the agent asks a person a question (ACP\nelicitation); the question as stored.",
            data: component::<Question>,
        },
        Documented {
            name: "QuestionResolved",
            kind: QUESTION_RESOLVED,
            description: "`question_resolved`: the question with its answer.",
            data: component::<Question>,
        },
        Documented {
            name: "MemberAdded",
            kind: MEMBER_ADDED,
            description: "`member_added`: the conversation was shared with a user.",
            data: component::<MemberChange>,
        },
        Documented {
            name: "MemberChanged",
            kind: MEMBER_CHANGED,
            description: "`member_changed`: a member's role changed.",
            data: component::<MemberChange>,
        },
        Documented {
            name: "MemberRemoved",
            kind: MEMBER_REMOVED,
            description: "`member_removed`: a member was removed (with the role they had).",
            data: component::<MemberChange>,
        },
    ]
};

/// A named schema and those it refers to.
type Component = (String, Vec<(String, RefOr<Schema>)>);

fn component<T: ToSchema>() -> Component {
    let mut refs = vec![(T::name().into_owned(), T::schema())];
    T::schemas(&mut refs);
    (T::name().into_owned(), refs)
}

impl PartialSchema for Event {
    fn schema() -> RefOr<Schema> {
        DOCUMENTED
            .iter()
            .fold(OneOfBuilder::new(), |one_of, event| {
                one_of.item(Ref::from_schema_name(format!("{}Event", event.name)))
            })
            .description(Some(
                "One entry of a conversation's event log, by its `type`. A WebSocket\n\
                 sends each as one text frame.",
            ))
            .into()
    }
}

impl ToSchema for Event {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        for Documented {
            name,
            kind,
            description,
            data,
        } in DOCUMENTED
        {
            let (data, refs) = data();
            let envelope = ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(description))
                .required("seq")
                .required("conversation_id")
                .required("type")
                .required("at")
                .required("data")
                .property(
                    "seq",
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                        .description(Some("From 1, one more per event of the conversation.")),
                )
                .property(
                    "conversation_id",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid))),
                )
                .property("type", Ref::from_schema_name(format!("{name}Type")))
                .property(
                    "at",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
                )
                .property("data", Ref::from_schema_name(data));
            let tag = ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([kind]));
            schemas.push((format!("{name}Event"), envelope.into()));
            schemas.push((format!("{name}Type"), tag.into()));
            schemas.extend(refs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::permission::{Decision, PermissionStatus};
    use serde_json::json;

    const CONVERSATION: &str = "01900000-0000-7000-8000-000000000001";
    const TURN: &str = "01900000-0000-7000-8000-000000000002";
    const AT: &str = "2026-11-25T12:00:00.123456Z";

    fn event(seq: i64, body: impl Into<EventBody>) -> Event {
        Event {
            seq,
            conversation_id: CONVERSATION.parse().unwrap(),
            at: AT.parse().unwrap(),
            body: body.into(),
        }
    }

    #[test]
    fn an_update_read_from_the_store_is_sent_as_stored_and_other_events_as_made() {
        // Spaced as no serialiser of ours writes it: the text sent is the
        // one read, not one made again.
        let stored = r#"{"turn_id": null, "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}"#;
        let raw = RawValue::from_string(stored.to_owned()).unwrap();
        let body = EventBody::read_stored(event_type::SESSION_UPDATE, raw);
        assert!(matches!(body, EventBody::SessionUpdate(_)));
        assert_eq!(serde_json::to_string(&body.data()).unwrap(), stored);
        let ended = r#"{"turn_id": "01900000-0000-7000-8000-000000000002", "stop_reason": "end_turn", "error": null}"#;
        let raw = RawValue::from_string(ended.to_owned()).unwrap();
        let body = EventBody::read_stored(event_type::TURN_ENDED, raw);
        assert!(matches!(body, EventBody::TurnEnded(_)));
        assert_eq!(
            serde_json::to_value(body.data()).unwrap(),
            serde_json::from_str::<Value>(ended).unwrap()
        );
    }

    fn request() -> PermissionRequest {
        PermissionRequest {
            id: "01900000-0000-7000-8000-000000000003".parse().unwrap(),
            conversation_id: CONVERSATION.parse().unwrap(),
            turn_id: Some(TURN.parse().unwrap()),
            tool_call: json!({"toolCallId": "c1", "title": "Run"}),
            options: vec![json!({"optionId": "ok", "name": "OK", "kind": "allow_once"})],
            status: PermissionStatus::Pending,
            decision: None,
            created_at: AT.parse().unwrap(),
            kind: Default::default(),
        }
    }

    /// The envelope of an event's JSON, up to its `data`.
    fn head(seq: i64, kind: &str) -> String {
        format!(
            r#"{{"seq":{seq},"conversation_id":"{CONVERSATION}","type":"{kind}","at":"{AT}","data":"#
        )
    }

    /// Each type's JSON, exactly as clients have always received it.
    fn pinned() -> Vec<(Event, String)> {
        let mut all = pinned_turn();
        all.extend(pinned_since_agent_status());
        all
    }

    /// [`pinned`] of a turn: its start, updates, a permission request, its end.
    fn pinned_turn() -> Vec<(Event, String)> {
        let turn: Uuid = TURN.parse().unwrap();
        let resolved = PermissionRequest {
            status: PermissionStatus::Approved,
            decision: Some(Decision {
                option_id: Some("ok".into()),
                outcome: "selected".into(),
                decided_by: "user:alice".into(),
                reason: None,
                decided_at: AT.parse().unwrap(),
                via: None,
                content: None,
            }),
            ..request()
        };
        let request_json = format!(
            r#"{{"id":"01900000-0000-7000-8000-000000000003","conversation_id":"{CONVERSATION}","turn_id":"{TURN}","tool_call":{{"toolCallId":"c1","title":"Run"}},"options":[{{"optionId":"ok","name":"OK","kind":"allow_once"}}],"status":"#
        );
        vec![
            (
                event(
                    1,
                    TurnStarted {
                        turn_id: turn,
                        content: vec![json!({"type": "text", "text": "hi"})],
                        by: None,
                    },
                ),
                format!(
                    r#"{}{{"turn_id":"{TURN}","content":[{{"type":"text","text":"hi"}}]}}}}"#,
                    head(1, "turn_started")
                ),
            ),
            (
                event(
                    2,
                    SessionUpdate::new(
                        Some(turn),
                        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hel"}}),
                    ),
                ),
                format!(
                    r#"{}{{"turn_id":"{TURN}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"Hel"}}}}}}}}"#,
                    head(2, "session_update")
                ),
            ),
            (
                event(
                    3,
                    SessionUpdate::new(
                        None,
                        json!({"sessionUpdate": "usage_update", "used": 1, "size": 2}),
                    ),
                ),
                format!(
                    r#"{}{{"turn_id":null,"update":{{"sessionUpdate":"usage_update","used":1,"size":2}}}}}}"#,
                    head(3, "session_update")
                ),
            ),
            (
                event(4, EventBody::PermissionRequested(request())),
                format!(
                    r#"{}{request_json}"pending","decision":null,"created_at":"{AT}"}}}}"#,
                    head(4, "permission_requested")
                ),
            ),
            (
                event(5, EventBody::PermissionResolved(resolved)),
                format!(
                    r#"{}{request_json}"approved","decision":{{"option_id":"ok","outcome":"selected","decided_by":"user:alice","reason":null,"decided_at":"{AT}"}},"created_at":"{AT}"}}}}"#,
                    head(5, "permission_resolved")
                ),
            ),
            (
                event(
                    6,
                    TurnEnded {
                        turn_id: turn,
                        stop_reason: "end_turn".into(),
                        error: None,
                    },
                ),
                format!(
                    r#"{}{{"turn_id":"{TURN}","stop_reason":"end_turn","error":null}}}}"#,
                    head(6, "turn_ended")
                ),
            ),
        ]
    }

    /// [`pinned`] from the agent's status on: its settings, files, terminals.
    fn pinned_since_agent_status() -> Vec<(Event, String)> {
        vec![
            (
                event(
                    7,
                    AgentStatus::new(AgentState::Exited, Some("exit status 1".into())),
                ),
                format!(
                    r#"{}{{"status":"exited","detail":"exit status 1"}}}}"#,
                    head(7, "agent_status")
                ),
            ),
            (
                event(
                    8,
                    AgentStatus {
                        context: Some("loaded".into()),
                        ..AgentStatus::new(AgentState::Ready, None)
                    },
                ),
                format!(
                    r#"{}{{"status":"ready","detail":null,"context":"loaded"}}}}"#,
                    head(8, "agent_status")
                ),
            ),
            (
                event(
                    9,
                    ModeChanged {
                        mode_id: "plan".into(),
                        changed_by: "user:alice".into(),
                        modes: Some(json!({"currentModeId": "plan", "availableModes": []})),
                    },
                ),
                format!(
                    r#"{}{{"mode_id":"plan","changed_by":"user:alice","modes":{{"currentModeId":"plan","availableModes":[]}}}}}}"#,
                    head(9, "mode_changed")
                ),
            ),
            (
                event(
                    10,
                    ConfigOptionChanged {
                        config_id: "brave".into(),
                        value: json!(true),
                        changed_by: "user:alice".into(),
                        config_options: None,
                    },
                ),
                format!(
                    r#"{}{{"config_id":"brave","value":true,"changed_by":"user:alice","config_options":null}}}}"#,
                    head(10, "config_option_changed")
                ),
            ),
            (
                event(
                    11,
                    FileWritten {
                        path: "/w/a.txt".into(),
                        diff: "--- /dev/null\n".into(),
                        diff_too_large: false,
                    },
                ),
                format!(
                    r#"{}{{"path":"/w/a.txt","diff":"--- /dev/null\n","diff_too_large":false}}}}"#,
                    head(11, "file_written")
                ),
            ),
            (
                event(
                    12,
                    TerminalOutput {
                        terminal_id: "t1".into(),
                        output: String::new(),
                        command: Some(vec!["ls".into()]),
                        cwd: Some("/w".into()),
                        exit_status: None,
                    },
                ),
                format!(
                    r#"{}{{"terminal_id":"t1","output":"","command":["ls"],"cwd":"/w"}}}}"#,
                    head(12, "terminal_output")
                ),
            ),
            (
                event(
                    13,
                    TerminalOutput {
                        terminal_id: "t1".into(),
                        output: "x".into(),
                        command: None,
                        cwd: None,
                        exit_status: Some(json!({"exitCode": 0, "signal": null})),
                    },
                ),
                format!(
                    r#"{}{{"terminal_id":"t1","output":"x","exit_status":{{"exitCode":0,"signal":null}}}}}}"#,
                    head(13, "terminal_output")
                ),
            ),
            (
                event(
                    14,
                    EventBody::Verbatim {
                        kind: "turn_ended".into(),
                        data: json!({"turn_id": TURN, "unstorable": "why"}),
                    },
                ),
                format!(
                    r#"{}{{"turn_id":"{TURN}","unstorable":"why"}}}}"#,
                    head(14, "turn_ended")
                ),
            ),
        ]
    }

    #[test]
    fn every_type_of_event_keeps_its_json_to_the_byte() {
        for (event, json) in pinned() {
            assert_eq!(serde_json::to_string(&event).unwrap(), json);
        }
    }

    #[test]
    fn an_event_reads_back_as_it_was_written() {
        for (event, json) in pinned() {
            let read: Event = serde_json::from_str(&json).unwrap();
            assert_eq!(read, event, "{json}");
            assert_eq!(serde_json::to_string(&read).unwrap(), json);
            // As the store reads it: its type and data apart.
            let data = serde_json::to_value(event.body.data()).unwrap();
            assert_eq!(EventBody::read(event.body.kind(), data), event.body);
        }
    }

    #[test]
    fn data_not_of_its_types_shape_is_kept_verbatim() {
        for (kind, data) in [
            (
                "turn_ended",
                json!({"turn_id": TURN, "stop_reason": "end_turn", "unstorable": "x"}),
            ),
            ("session_update", json!({"update": {}, "turn_id": null})),
            (
                "session_update",
                json!({"turn_id": "not a uuid", "update": {}}),
            ),
            ("agent_status", json!({"status": "dreaming"})),
            ("brand_new", json!({"a": 1})),
        ] {
            let body = EventBody::read(kind, data.clone());
            assert_eq!(
                body,
                EventBody::Verbatim {
                    kind: kind.into(),
                    data: data.clone()
                }
            );
            assert_eq!(serde_json::to_value(body.data()).unwrap(), data);
        }
        // A stand-in still says what its members say.
        let stand_in = EventBody::read(
            "turn_ended",
            json!({"turn_id": TURN, "stop_reason": "end_turn", "unstorable": "x"}),
        );
        assert!(
            matches!(stand_in.lenient(), EventBody::TurnEnded(t) if t.stop_reason == "end_turn")
        );
    }
}
