//! What several operations answer alike: [`no_content_if`], and the
//! responses they document alike, each written once (`responses(...)` of
//! `#[utoipa::path]` takes these types next to an operation's own tuples).
//! Those types only describe: no handler returns them (the errors themselves
//! are [`Error`]s, as problem details).

// Nothing builds the response types: they only carry their documentation.
#![allow(dead_code)]

use axum::http::StatusCode;
use utoipa::IntoResponses;

use crate::error::{Error, Result};

/// 204 where the thing was there (and is now removed), else `missing` (a
/// 404).
pub fn no_content_if(found: bool, missing: impl FnOnce() -> Error) -> Result<StatusCode> {
    if found {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(missing())
    }
}

/// A budget that holds the conversation is spent (`[[budgets]]`).
#[derive(IntoResponses)]
#[response(
    status = 402,
    description = "`budget_exceeded`: a budget that holds the conversation is spent; the problem names it (`budget`, `scope`, `key`) and says its `limit`, what was `spent` and when it `resets_at`"
)]
pub struct BudgetSpent;

/// A conversation in the path that does not exist, or is not the caller's.
#[derive(IntoResponses)]
#[response(status = 404, description = "No such conversation")]
pub struct NoConversation;

/// A conversation, or a remembered rule of it, in the path that does not
/// exist.
#[derive(IntoResponses)]
#[response(status = 404, description = "No such conversation or rule")]
pub struct NoRule;

/// A page of a conversation's history asked with a bad `after` or `limit`.
#[derive(IntoResponses)]
#[response(status = 422, description = "Invalid after or limit")]
pub struct InvalidPage;

/// Operators only.
#[derive(IntoResponses)]
#[response(status = 403, description = "Not an operator")]
pub struct NotOperator;

/// A notification target in the path that does not exist, or is another
/// user's.
#[derive(IntoResponses)]
#[response(status = 404, description = "No such target of the caller's")]
pub struct NoTarget;

/// An operation that waits for the agent's answer.
#[derive(IntoResponses)]
#[response(status = 504, description = "The agent did not answer in time")]
pub struct AgentTimeout;

/// An operation on a conversation whose agent has gone: it is started again
/// first, if `max_agents` allows.
#[derive(IntoResponses)]
#[response(status = 503, description = "At capacity (`max_agents`)")]
pub struct AtCapacity;

/// Changing a session setting: the agent is asked, and started again first
/// where it has gone.
#[derive(IntoResponses)]
pub enum SettingChange {
    #[response(
        status = 409,
        description = "`not_offered` (a mode, option or value the agent does not offer; it depends on the agent, so the document cannot list them), `conversation_closed` or `agent_unavailable`"
    )]
    Unavailable,
    #[response(
        status = 429,
        description = "The agent has to be started again and all the agents the owner may run are busy (`max_agents_per_user`; `Retry-After`)"
    )]
    OwnerBusy,
    #[response(
        status = 502,
        description = "The agent refused (its message in the detail) or went away"
    )]
    Refused,
}

/// A WebSocket endpoint: the request must be an upgrade, and connections
/// are rate limited.
#[derive(IntoResponses)]
pub enum WebSocketRefused {
    #[response(
        status = 400,
        description = "Not a WebSocket handshake (`not_a_websocket_handshake`): a header the parameters name is missing or wrong"
    )]
    NotAHandshake,
    #[response(status = 429, description = "Too many connections (`Retry-After`)")]
    TooManyConnections,
}

/// An action URL's token, looked up: failed lookups are rate limited per
/// client address (a usable token never is).
#[derive(IntoResponses)]
#[response(
    status = 429,
    description = "The token is not usable and this address failed 20 lookups in the last minute (`Retry-After`); a usable token still answers"
)]
pub struct TooManyFailedLookups;
