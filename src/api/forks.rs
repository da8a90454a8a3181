//! `POST /api/v1/conversations/{id}/fork`: a new conversation whose agent
//! session is forked (ACP `session/fork`) from this one's, holding its
//! history so far; both go on independently.
//!
//! ACP's `session/fork` takes a session as it stands: it cannot fork at an
//! earlier point of its history. So a fork copies the whole stored history,
//! and `at` (a message id) says which message the client forks after: it
//! must be the newest (else 409 `not_supported`), so that what the person
//! saw is what the agent holds.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::conversations::ConversationPath;
use super::extract::{Acting, Visible, OWNER};
use super::responses::AgentTimeout;
use super::state::AppState;
use crate::auth::Limited;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{self, Conversation, ConversationStatus, ForkedFrom, SessionOffers};
use crate::session::Origin;
use crate::workspace::cwd::conversation_cwd;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(fork))
}

/// Where to fork (the body may be left out: the newest message).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Fork)]
struct ForkBody {
    /// The message the fork comes after: a message of this conversation,
    /// and its newest (the agent forks its whole session: ACP's
    /// `session/fork` has no point in history); else 409 `not_supported`.
    /// An id that is no message of this conversation is 422.
    at: Option<Uuid>,
}

/// Forks the conversation: a new one (same owner, agent and `cwd`, titled
/// "<title> (fork)") whose agent session is forked from this one's with
/// ACP `session/fork`, run by an agent process of its own, and holding this
/// one's messages and tool calls so far (copied, with new message ids).
#[utoipa::path(
    post, operation_id = "forkConversation", path = "/api/v1/conversations/{id}/fork", tag = "conversations",
    params(ConversationPath),
    request_body(content = Option<ForkBody>, description = "Optional: `{}` or no body forks after the newest message"),
    responses(
        (status = 201, description = "The new conversation, started", body = model::ConversationView),
        (status = 403, description = "The conversation's `cwd` is no longer inside its profile's `allowed_roots`"),
        (status = 404, description = "No such conversation (or not the caller's)"),
        (status = 409, description = "`not_supported`: the agent does not offer `session/fork`, the conversation has no agent session yet, or `at` is not its newest message; `agent_unavailable`: its profile is gone"),
        (status = 422, description = "Invalid body, or `at` names no message of this conversation"),
        (status = 429, description = "Too many new conversations for the user, or all the agents the user may run are busy (`Retry-After`)"),
        (status = 502, description = "The agent could not be started, or refused the fork (the detail says why)"),
        (status = 503, description = "All `max_agents` agents are busy (`Retry-After`)"),
        AgentTimeout,
    )
)]
async fn fork(
    Acting(visible): Acting<OWNER>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<impl IntoResponse> {
    let Visible {
        state,
        caller,
        item: source,
    } = visible;
    // As `AppJson` answers a body it cannot read (too large: 413).
    let body = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => Error::PayloadTooLarge("request body is too large".into()),
        _ => Error::BadRequest(rejection.body_text()),
    })?;
    let at = fork_body(&headers, &body)?.at;
    let not_supported = |detail: String| Error::conflict("not_supported", detail);
    let profile = state.config().agent(&source.agent).ok_or_else(|| {
        Error::conflict(
            "agent_unavailable",
            format!(
                "the agent profile {:?} is no longer configured",
                source.agent
            ),
        )
    })?;
    if source.worktree.is_some() {
        // Two conversations in one worktree would step on each other.
        return Err(not_supported(
            "a conversation made on a repository is not forked: start another on the repository"
                .into(),
        ));
    }
    if SessionOffers::of(&source.state).is_some_and(|offers| !offers.fork) {
        return Err(not_supported(format!(
            "the agent of profile {:?} does not offer session/fork",
            source.agent
        )));
    }
    let Some(source_session) = source.acp_session_id.clone() else {
        return Err(not_supported(
            "the conversation has no agent session to fork yet".into(),
        ));
    };
    let store = state.store();
    let messages = store.list_messages(source.id).await?;
    if let Some(at) = at {
        if !messages.iter().any(|m| m.id == at) {
            return Err(Error::Unprocessable(format!(
                "at: no message {at} in conversation {}",
                source.id
            )));
        }
        if messages.last().map(|m| m.id) != Some(at) {
            return Err(not_supported(format!(
                "at: message {at} is not the conversation's newest: the agent forks its whole \
                 session (ACP session/fork has no point in history), so a fork comes after the \
                 newest message"
            )));
        }
    }
    let tool_calls = store.list_tool_calls(source.id).await?;
    // Its directory as a new conversation's: still allowed.
    let cwd = conversation_cwd(&profile, Some(&source.cwd), source.owner.as_deref())?;
    state.auth().check_rate(&caller, Limited::Conversation)?;
    let now = model::now();
    let conversation = Conversation {
        id: model::new_id(),
        agent: source.agent.clone(),
        title: Some(fork_title(&source, &profile)),
        cwd: cwd.to_string_lossy().into_owned(),
        status: ConversationStatus::Starting,
        acp_session_id: None,
        last_seq: 0,
        created_at: now,
        updated_at: now,
        owner: source.owner.clone(),
        state: Default::default(),
        node_id: None,
        queue: Vec::new(),
        forked_from: Some(ForkedFrom {
            conversation_id: source.id,
            message_id: messages.last().map(|m| m.id),
        }),
        adopted_session: None,
        worktree: None,
        changes: None,
        spend: Vec::new(),
        sharing: Default::default(),
    };
    let origin = Origin::Fork {
        source_session,
        messages,
        tool_calls,
    };
    let forked = state
        .sessions()
        .begin(profile, conversation, Vec::new(), origin)
        .await?;
    Ok((StatusCode::CREATED, Json(forked)))
}

/// The body, which may be left out (empty): as `AppJson` reads one
/// (415, 400, 422).
fn fork_body(headers: &HeaderMap, body: &[u8]) -> Result<ForkBody> {
    if body.is_empty() {
        return Ok(ForkBody { at: None });
    }
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let mime = v.split(';').next().unwrap_or_default().trim();
            mime.eq_ignore_ascii_case("application/json")
                || mime.to_ascii_lowercase().ends_with("+json")
        });
    if !json {
        return Err(Error::UnsupportedMediaType(
            "expected a JSON body with Content-Type: application/json".into(),
        ));
    }
    // `null` is no body too (the document's body is optional).
    let body: Option<ForkBody> = serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Error::Unprocessable(e.to_string()),
        _ => Error::BadRequest(e.to_string()),
    })?;
    Ok(body.unwrap_or(ForkBody { at: None }))
}

/// "<title> (fork)", within the longest title.
fn fork_title(source: &Conversation, profile: &crate::config::AgentProfile) -> String {
    let title = source
        .title
        .clone()
        .or_else(|| source.state.title.clone())
        .unwrap_or_else(|| {
            profile
                .title
                .clone()
                .unwrap_or_else(|| profile.name.clone())
        });
    let suffix = " (fork)";
    let room = limits::TITLE_MAX_CHARS - suffix.chars().count();
    let title: String = title
        .chars()
        .filter(|c| !c.is_control())
        .take(room)
        .collect();
    format!("{title}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_body_may_be_left_out_and_is_read_as_json_otherwise() {
        let json = {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::header::CONTENT_TYPE,
                "application/json".parse().unwrap(),
            );
            h
        };
        assert_eq!(fork_body(&HeaderMap::new(), b"").unwrap().at, None);
        assert_eq!(fork_body(&json, b"{}").unwrap().at, None);
        let id = model::new_id();
        let at = fork_body(&json, format!(r#"{{"at":"{id}"}}"#).as_bytes()).unwrap();
        assert_eq!(at.at, Some(id));
        let code = |r: Result<ForkBody>| r.err().map(|e| e.problem().status);
        assert_eq!(code(fork_body(&json, b"{")), Some(400));
        assert_eq!(code(fork_body(&json, br#"{"at": 3}"#)), Some(422));
        assert_eq!(code(fork_body(&json, br#"{"when": 3}"#)), Some(422));
        assert_eq!(code(fork_body(&HeaderMap::new(), b"{}")), Some(415));
    }
}
