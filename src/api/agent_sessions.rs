//! `GET /api/v1/agents/{name}/sessions`: the agent's own sessions for the
//! caller (ACP `session/list`, paged by the agent's cursor), each with
//! whether a conversation of the gateway holds it. The agent is started as
//! the caller's conversation would start it (their home, their box) just to
//! list, then ended; a session one of these names is taken over with
//! `POST /api/v1/conversations` `{"agent", "cwd", "adopt"}`.

use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{AppPath, AppQuery, Authed};
use super::responses::AgentTimeout;
use super::state::AppState;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::Page;
use crate::workspace::cwd::conversation_cwd;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_sessions))
}

/// Longest cursor taken back, in characters.
const CURSOR_MAX_CHARS: usize = 2048;

/// The agent profile a path names (documentation only: `AppPath` reads it).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct AgentPath {
    /// The agent profile's name
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9_-]+$")]
    name: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SessionsQuery {
    /// Only the sessions of this directory (absolute; inside the profile's
    /// `allowed_roots`, else 403; there, else 404). Without it: every session
    /// the agent keeps for the caller whose directory the caller may use,
    /// the agent started in the profile's `cwd`.
    #[param(min_length = 1, max_length = 1024, pattern = "^/[^\\u0000]*$")]
    cwd: Option<String>,
    /// The `next_cursor` of the previous page (the agent's own, opaque).
    #[param(
        min_length = 1,
        max_length = 2048,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    cursor: Option<String>,
}

/// One of the agent's sessions.
#[derive(Serialize, ToSchema)]
pub struct AgentSessionInfo {
    /// The agent's id for it: what `adopt` takes.
    session_id: String,
    /// Its working directory.
    cwd: String,
    /// Its title, as the agent gives it.
    title: Option<String>,
    /// When it was last active, as the agent gives it (ISO 8601).
    updated_at: Option<String>,
    /// The open conversation of the caller's that holds it (its own session,
    /// or one it took over), if any: such a session cannot be adopted.
    held_by: Option<Uuid>,
}

/// The agent's sessions (a page; its cursor is the agent's).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct AgentSessionList {
    items: Vec<AgentSessionInfo>,
    /// The cursor of the next page; `null` on the last.
    next_cursor: Option<String>,
}

/// The agent's own sessions for the caller.
#[utoipa::path(
    get, operation_id = "listAgentSessions", path = "/api/v1/agents/{name}/sessions", tag = "agents",
    params(AgentPath, SessionsQuery),
    responses(
        (status = 200, description = "A page", body = AgentSessionList),
        (status = 403, description = "`cwd` is outside the profile's `allowed_roots`"),
        (status = 404, description = "No such agent profile, or no directory at `cwd`"),
        (status = 409, description = "`not_supported`: the agent does not offer `session/list`"),
        (status = 422, description = "Invalid `cwd` or `cursor`"),
        (status = 429, description = "All the agents the user may run are busy (`Retry-After`)"),
        (status = 502, description = "The agent could not be started, or failed to list"),
        (status = 503, description = "All `max_agents` agents are busy (`Retry-After`)"),
        AgentTimeout,
    )
)]
async fn list_sessions(
    Authed { state, caller }: Authed,
    AppPath(name): AppPath<String>,
    AppQuery(q): AppQuery<SessionsQuery>,
) -> Result<Json<Page<AgentSessionInfo>>> {
    limits::agent_name("name", &name)?;
    let profile = state
        .config()
        .agent(&name)
        .ok_or_else(|| Error::NotFound(format!("no agent named {name:?}")))?;
    if let Some(cursor) = &q.cursor {
        limits::id("cursor", cursor, CURSOR_MAX_CHARS)?;
    }
    let user = caller.user.as_str();
    let cwd = conversation_cwd(&profile, q.cwd.as_deref(), Some(user))?;
    let filter = q.cwd.as_ref().map(|_| cwd.to_string_lossy().into_owned());
    let page = state
        .sessions()
        .list_agent_sessions(&profile, user, &cwd, filter.as_deref(), q.cursor.as_deref())
        .await?;
    let text = |s: &Value, key: &str| s.get(key).and_then(Value::as_str).map(str::to_owned);
    // Only what the caller may use: a session elsewhere is none of theirs.
    let mine: Vec<(String, String, &Value)> = page
        .sessions
        .iter()
        .filter_map(|s| Some((text(s, "sessionId")?, text(s, "cwd")?, s)))
        .filter(|(_, dir, _)| conversation_cwd(&profile, Some(dir), Some(user)).is_ok())
        .collect();
    let ids: Vec<String> = mine.iter().map(|(id, _, _)| id.clone()).collect();
    let store = state.store();
    // Where users share the agent's home (`sandbox = "off"`), what another
    // user's conversations began is still theirs.
    let theirs = store.sessions_of_others(&profile.name, user, &ids).await?;
    let mine: Vec<_> = mine
        .into_iter()
        .filter(|(id, _, _)| !theirs.contains(id))
        .collect();
    let held = store
        .session_holders(&profile.name, Some(user), &ids)
        .await?;
    let items = mine
        .into_iter()
        .map(|(session_id, cwd, s)| AgentSessionInfo {
            held_by: held
                .iter()
                .find(|(id, _)| *id == session_id)
                .map(|(_, c)| *c),
            title: text(s, "title"),
            updated_at: text(s, "updatedAt"),
            session_id,
            cwd,
        })
        .collect();
    Ok(Json(Page {
        items,
        next_cursor: page.next_cursor,
    }))
}
