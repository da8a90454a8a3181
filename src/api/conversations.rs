//! `/api/v1/conversations`: create, list, prompt, cancel, close, and read a
//! conversation's history.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::extract::{AppJson, AppPath, AppQuery};
use super::state::AppState;
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{self, Conversation, ConversationStatus, Event, Message, Page, Rule, ToolCall};
use crate::session::Setting;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/conversations", post(create).get(list))
        .route("/api/v1/conversations/{id}", get(show).delete(close))
        .route("/api/v1/conversations/{id}/prompts", post(prompt))
        .route("/api/v1/conversations/{id}/cancel", post(cancel))
        .route("/api/v1/conversations/{id}/mode", post(set_mode))
        .route(
            "/api/v1/conversations/{id}/config-options",
            post(set_config_option),
        )
        .route("/api/v1/conversations/{id}/messages", get(messages))
        .route("/api/v1/conversations/{id}/tool-calls", get(tool_calls))
        .route("/api/v1/conversations/{id}/events", get(events))
        .route(
            "/api/v1/conversations/{id}/rules",
            get(list_rules).delete(forget_rules),
        )
        .route(
            "/api/v1/conversations/{id}/rules/{rule_id}",
            get(show_rule).delete(forget_rule),
        )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    agent: String,
    title: Option<String>,
    cwd: Option<String>,
}

async fn create(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<CreateBody>,
) -> Result<impl IntoResponse> {
    limits::bytes("agent", &body.agent, limits::AGENT_NAME_MAX_BYTES)?;
    if let Some(title) = &body.title {
        limits::line("title", title, limits::TITLE_MAX_CHARS)?;
    }
    if let Some(cwd) = &body.cwd {
        limits::bytes("cwd", cwd, limits::CWD_MAX_BYTES)?;
    }
    let profile = state
        .config()
        .agent(&body.agent)
        .ok_or_else(|| Error::NotFound(format!("no agent named {:?}", body.agent)))?;
    let cwd = profile.conversation_cwd(body.cwd.as_deref())?;
    let now = model::now();
    let conversation = Conversation {
        id: model::new_id(),
        agent: profile.name.clone(),
        title: body.title,
        cwd: cwd.to_string_lossy().into_owned(),
        status: ConversationStatus::Starting,
        acp_session_id: None,
        last_seq: 0,
        created_at: now,
        updated_at: now,
        owner: Some(caller.user.clone()),
        state: Default::default(),
    };
    let conversation = state.sessions().start(profile, conversation).await?;
    Ok((StatusCode::CREATED, Json(conversation)))
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    caller: Caller,
    AppQuery(q): AppQuery<ListQuery>,
) -> Result<Json<Page<Conversation>>> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(Error::Unprocessable(
            "limit must be between 1 and 200".into(),
        ));
    }
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(
            Uuid::parse_str(c)
                .map_err(|_| Error::Unprocessable(format!("invalid cursor {c:?}")))?,
        ),
    };
    let owner = caller.owner_filter();
    let mut items = state
        .store()
        .list_conversations(limit + 1, before, owner.as_deref())
        .await?;
    let next_cursor = if items.len() as i64 > limit {
        items.truncate(limit as usize);
        items.last().map(|c| c.id.to_string())
    } else {
        None
    };
    Ok(Json(Page { items, next_cursor }))
}

async fn load(state: &AppState, caller: &Caller, id: Uuid) -> Result<Conversation> {
    state.visible_conversation(caller, id).await
}

async fn show(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<Conversation>> {
    load(&state, &caller, id).await.map(Json)
}

async fn close(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<StatusCode> {
    let conversation = load(&state, &caller, id).await?;
    state.sessions().close(&conversation).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptBody {
    text: Option<String>,
    content: Option<Vec<Value>>,
}

impl PromptBody {
    fn content(self) -> Result<Vec<Value>> {
        let content = match (self.text, self.content) {
            (Some(text), None) => vec![json!({"type": "text", "text": text})],
            (None, Some(content)) => content,
            _ => {
                return Err(Error::Unprocessable(
                    "give exactly one of text or content".into(),
                ))
            }
        };
        if content.is_empty() {
            return Err(Error::Unprocessable("content must not be empty".into()));
        }
        limits::count("content", content.len(), limits::PROMPT_MAX_BLOCKS)?;
        for (i, block) in content.iter().enumerate() {
            if block.get("type").and_then(Value::as_str).is_none() {
                return Err(Error::Unprocessable(format!(
                    "content[{i}] must be an ACP ContentBlock with a string \"type\""
                )));
            }
        }
        Ok(content)
    }
}

async fn prompt(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<PromptBody>,
) -> Result<impl IntoResponse> {
    let content = body.content()?;
    let conversation = load(&state, &caller, id).await?;
    state.auth().check_rate(&caller, Limited::Prompt)?;
    let turn_id = state.sessions().prompt(&conversation, content).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"turn_id": turn_id}))))
}

async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<impl IntoResponse> {
    let conversation = load(&state, &caller, id).await?;
    state.sessions().cancel(&conversation).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({}))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModeBody {
    mode_id: String,
}

/// `session/set_mode`: 200 with the conversation once the agent accepted.
async fn set_mode(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<ModeBody>,
) -> Result<Json<Conversation>> {
    limits::line("mode_id", &body.mode_id, limits::SETTING_ID_MAX_CHARS)?;
    change(&state, &caller, id, Setting::Mode(body.mode_id)).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigOptionBody {
    config_id: String,
    value: Value,
}

/// `session/set_config_option`: 200 with the conversation, carrying the
/// options the agent answered with.
async fn set_config_option(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<ConfigOptionBody>,
) -> Result<Json<Conversation>> {
    limits::line("config_id", &body.config_id, limits::SETTING_ID_MAX_CHARS)?;
    match &body.value {
        Value::String(v) => limits::line("value", v, limits::SETTING_ID_MAX_CHARS)?,
        Value::Bool(_) => {}
        _ => {
            return Err(Error::Unprocessable(
                "value must be a string or a boolean".into(),
            ))
        }
    }
    let setting = Setting::ConfigOption {
        config_id: body.config_id,
        value: body.value,
    };
    change(&state, &caller, id, setting).await
}

async fn change(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    setting: Setting,
) -> Result<Json<Conversation>> {
    let conversation = load(state, caller, id).await?;
    state
        .sessions()
        .change(&conversation, setting, caller.decided_by())
        .await?;
    load(state, caller, id).await.map(Json)
}

async fn messages(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<Page<Message>>> {
    load(&state, &caller, id).await?;
    let items = state.store().list_messages(id).await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

async fn tool_calls(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<Page<ToolCall>>> {
    load(&state, &caller, id).await?;
    let items = state.store().list_tool_calls(id).await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

#[derive(Deserialize)]
struct EventsQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

async fn events(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
    AppQuery(q): AppQuery<EventsQuery>,
) -> Result<Json<Page<Event>>> {
    load(&state, &caller, id).await?;
    let after = q.after.unwrap_or(0);
    let limit = q.limit.unwrap_or(1000);
    if after < 0 {
        return Err(Error::Unprocessable("after must not be negative".into()));
    }
    if !(1..=10_000).contains(&limit) {
        return Err(Error::Unprocessable(
            "limit must be between 1 and 10000".into(),
        ));
    }
    let items = state.store().list_events(id, after, limit).await?;
    let next_cursor = (items.len() as i64 == limit)
        .then(|| items.last().map(|e| e.seq.to_string()))
        .flatten();
    Ok(Json(Page { items, next_cursor }))
}

async fn list_rules(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<Page<Rule>>> {
    load(&state, &caller, id).await?;
    let items = state.store().list_rules(id).await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

async fn show_rule(
    State(state): State<AppState>,
    caller: Caller,
    AppPath((id, rule_id)): AppPath<(Uuid, Uuid)>,
) -> Result<Json<Rule>> {
    load(&state, &caller, id).await?;
    state
        .store()
        .list_rules(id)
        .await?
        .into_iter()
        .find(|r| r.id == rule_id)
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("no rule {rule_id} in conversation {id}")))
}

/// Forgets every remembered rule of the conversation.
async fn forget_rules(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<StatusCode> {
    load(&state, &caller, id).await?;
    for rule in state.store().list_rules(id).await? {
        state.store().delete_rule(id, rule.id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn forget_rule(
    State(state): State<AppState>,
    caller: Caller,
    AppPath((id, rule_id)): AppPath<(Uuid, Uuid)>,
) -> Result<StatusCode> {
    load(&state, &caller, id).await?;
    if state.store().delete_rule(id, rule_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::NotFound(format!(
            "no rule {rule_id} in conversation {id}"
        )))
    }
}
