//! Row shapes shared by both backends: every column type here decodes from
//! Postgres and from SQLite alike, so each backend only owns its SQL.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::Rule;
use crate::model::{
    Conversation, ConversationStatus, Decision, Event, EventBody, Message, MessageRole,
    PermissionRequest, PermissionStatus, ToolCall, WaitingKind,
};

/// A JSON document bound as its text: Postgres `json` (not `jsonb`, which
/// cannot hold the escape `\u0000`), SQLite `text`. The text is what
/// `serde_json` writes, so a NUL character in a string stays the six
/// characters `\u0000` and reads back as the NUL it was, on both backends.
pub struct JsonText(pub String);

impl JsonText {
    pub fn of<T: serde::Serialize + ?Sized>(value: &T) -> JsonText {
        JsonText(serde_json::to_string(value).expect("JSON values serialize"))
    }
}

/// Postgres' `json` and `json[]` type oids.
const PG_JSON: sqlx::postgres::types::Oid = sqlx::postgres::types::Oid(114);
const PG_JSON_ARRAY: sqlx::postgres::types::Oid = sqlx::postgres::types::Oid(199);

impl sqlx::Type<sqlx::Postgres> for JsonText {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(PG_JSON)
    }
}

impl sqlx::postgres::PgHasArrayType for JsonText {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(PG_JSON_ARRAY)
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for JsonText {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        // The binary form of `json` is its text.
        buf.extend_from_slice(self.0.as_bytes());
        Ok(sqlx::encode::IsNull::No)
    }
}

impl sqlx::Type<sqlx::Sqlite> for JsonText {
    fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
        <String as sqlx::Type<sqlx::Sqlite>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, sqlx::Sqlite> for JsonText {
    fn encode(
        self,
        args: &mut Vec<sqlx::sqlite::SqliteArgumentValue<'q>>,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <String as sqlx::Encode<'q, sqlx::Sqlite>>::encode(self.0, args)
    }

    fn encode_by_ref(
        &self,
        args: &mut Vec<sqlx::sqlite::SqliteArgumentValue<'q>>,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <String as sqlx::Encode<'q, sqlx::Sqlite>>::encode_by_ref(&self.0, args)
    }
}

/// Text an agent chose (tool call ids, titles, kinds, session ids) for a
/// plain `text` column, which in Postgres cannot hold a NUL character: NUL
/// becomes U+FFFD. The event log keeps the original, verbatim.
pub fn text_col(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

fn bad(what: &str, value: &str) -> Error {
    Error::Internal(anyhow::anyhow!("bad {what} {value:?} in the database"))
}

/// A conversation found by a search, with the text of its first matching
/// message (`None`: its title matched).
#[derive(sqlx::FromRow)]
pub struct SearchRow {
    #[sqlx(flatten)]
    pub conversation: ConversationRow,
    pub found: Option<String>,
}

#[derive(sqlx::FromRow)]
pub struct ConversationRow {
    id: Uuid,
    agent: String,
    title: Option<String>,
    cwd: String,
    status: String,
    acp_session_id: Option<String>,
    last_seq: i64,
    current_turn_id: Option<Uuid>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    owner: Option<String>,
    agent_state: Option<Json<Value>>,
    node_id: Option<Uuid>,
    prompt_queue: Option<Json<Value>>,
    forked_from: Option<Uuid>,
    forked_at: Option<Uuid>,
    adopted_session: Option<String>,
    worktree: Option<Json<Value>>,
    change_totals: Option<Json<Value>>,
    /// What it spent (`[{currency, amount}]`), where the query read it.
    #[sqlx(default)]
    spend: Option<Json<Vec<crate::model::Spend>>>,
    /// How many members it has, where the query counts them.
    #[sqlx(default)]
    members: Option<i64>,
    /// The reader's role as a member, where the query finds it.
    #[sqlx(default)]
    member_role: Option<String>,
}

impl ConversationRow {
    /// The conversation and the turn it was running.
    pub fn into_parts(self) -> Result<(Conversation, Option<Uuid>)> {
        let status = ConversationStatus::parse(&self.status)
            .ok_or_else(|| bad("conversation status", &self.status))?;
        Ok((
            Conversation {
                id: self.id,
                agent: self.agent,
                title: self.title,
                cwd: self.cwd,
                status,
                acp_session_id: self.acp_session_id,
                last_seq: self.last_seq,
                created_at: self.created_at,
                updated_at: self.updated_at,
                owner: self.owner,
                // Written by this gateway; what it cannot read is treated
                // as never reported (the agent reports it again).
                state: self
                    .agent_state
                    .and_then(|Json(v)| serde_json::from_value(v).ok())
                    .unwrap_or_default(),
                node_id: self.node_id,
                // Written by this gateway; one it cannot read is no queue
                // (never lost silently: see the log).
                queue: match self.prompt_queue {
                    None => Vec::new(),
                    Some(Json(v)) => serde_json::from_value(v).unwrap_or_else(|e| {
                        tracing::error!(conversation_id = %self.id, error = %e, "unreadable prompt queue");
                        Vec::new()
                    }),
                },
                forked_from: self
                    .forked_from
                    .map(|conversation_id| crate::model::ForkedFrom {
                        conversation_id,
                        message_id: self.forked_at,
                    }),
                adopted_session: self.adopted_session,
                // Written by this gateway when it made the worktree; one it
                // cannot read is logged (the conversation goes on without).
                worktree: self.worktree.and_then(|Json(v)| {
                    serde_json::from_value(v)
                        .inspect_err(|e| {
                            tracing::error!(conversation_id = %self.id, error = %e, "unreadable worktree")
                        })
                        .ok()
                }),
                changes: self
                    .change_totals
                    .and_then(|Json(v)| serde_json::from_value(v).ok()),
                spend: self.spend.map(|Json(s)| s).unwrap_or_default(),
                sharing: crate::model::Sharing {
                    members: self.members.unwrap_or(0),
                    role: self
                        .member_role
                        .as_deref()
                        .and_then(crate::model::MemberRole::parse),
                },
            },
            self.current_turn_id,
        ))
    }

    pub fn into_conversation(self) -> Result<Conversation> {
        Ok(self.into_parts()?.0)
    }
}

#[derive(sqlx::FromRow)]
pub struct EventRow {
    conversation_id: Uuid,
    seq: i64,
    #[sqlx(rename = "type")]
    kind: String,
    at: DateTime<Utc>,
    data: Json<Box<serde_json::value::RawValue>>,
}

impl From<EventRow> for Event {
    fn from(r: EventRow) -> Event {
        Event {
            seq: r.seq,
            conversation_id: r.conversation_id,
            at: r.at,
            body: EventBody::read_stored(&r.kind, r.data.0),
        }
    }
}

#[derive(sqlx::FromRow)]
pub struct MessageRow {
    id: Uuid,
    turn_id: Option<Uuid>,
    role: String,
    content: Json<Vec<Value>>,
    created_at: DateTime<Utc>,
    /// The data of the `turn_started` event holding the content of a
    /// prompt's message (see [`crate::model::MessagePart::content_in_event`]).
    prompt: Option<Json<Value>>,
}

impl TryFrom<MessageRow> for Message {
    type Error = Error;
    fn try_from(r: MessageRow) -> Result<Message> {
        let content = match r.prompt {
            Some(Json(Value::Object(mut data))) => match data.remove("content") {
                Some(Value::Array(content)) => content,
                _ => r.content.0,
            },
            _ => r.content.0,
        };
        Ok(Message {
            id: r.id,
            turn_id: r.turn_id,
            role: MessageRole::parse(&r.role).ok_or_else(|| bad("role", &r.role))?,
            content,
            created_at: r.created_at,
        })
    }
}

/// A later part of a message (see [`crate::model::MessagePart`]).
#[derive(sqlx::FromRow)]
pub struct MessagePartRow {
    pub message_id: Uuid,
    pub content: Json<Vec<Value>>,
}

#[derive(sqlx::FromRow)]
pub struct ToolCallRow {
    tool_call_id: String,
    turn_id: Option<Uuid>,
    title: Option<String>,
    kind: Option<String>,
    status: Option<String>,
    content: Option<Json<Value>>,
    locations: Option<Json<Value>>,
    raw_input: Option<Json<Value>>,
    raw_output: Option<Json<Value>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<ToolCallRow> for ToolCall {
    fn from(r: ToolCallRow) -> ToolCall {
        ToolCall {
            tool_call_id: r.tool_call_id,
            turn_id: r.turn_id,
            title: r.title,
            kind: r.kind,
            status: r.status,
            content: r.content.map(|j| j.0),
            locations: r.locations.map(|j| j.0),
            raw_input: r.raw_input.map(|j| j.0),
            raw_output: r.raw_output.map(|j| j.0),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub struct PermissionRow {
    id: Uuid,
    conversation_id: Uuid,
    turn_id: Option<Uuid>,
    tool_call: Json<Value>,
    options: Json<Vec<Value>>,
    status: String,
    decision: Option<Json<Decision>>,
    created_at: DateTime<Utc>,
    kind: String,
}

impl TryFrom<PermissionRow> for PermissionRequest {
    type Error = Error;
    fn try_from(r: PermissionRow) -> Result<PermissionRequest> {
        Ok(PermissionRequest {
            id: r.id,
            conversation_id: r.conversation_id,
            turn_id: r.turn_id,
            tool_call: r.tool_call.0,
            options: r.options.0,
            status: PermissionStatus::parse(&r.status)
                .ok_or_else(|| bad("permission status", &r.status))?,
            decision: r.decision.map(|j| j.0),
            created_at: r.created_at,
            kind: WaitingKind::parse(&r.kind).ok_or_else(|| bad("waiting item kind", &r.kind))?,
        })
    }
}

#[derive(sqlx::FromRow)]
pub struct RuleRow {
    id: Uuid,
    conversation_id: Uuid,
    tool_kind: String,
    subject: String,
    option_kind: String,
    permission_id: Uuid,
    created_at: DateTime<Utc>,
}

impl From<RuleRow> for Rule {
    fn from(r: RuleRow) -> Rule {
        Rule {
            id: r.id,
            conversation_id: r.conversation_id,
            tool_kind: r.tool_kind,
            subject: r.subject,
            option_kind: r.option_kind,
            permission_id: r.permission_id,
            created_at: r.created_at,
        }
    }
}
