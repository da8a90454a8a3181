//! `/api/v1/conversations/{id}/queue`: the prompts sent while a turn runs,
//! waiting to start; a person sees, edits, reorders and removes them, and
//! starts the first of a held queue.

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::conversations::{ConversationPath, Started};
use super::extract::{Acting, AppJson, AppPath, Visible, COLLABORATOR};
use super::openapi::QueuedPromptList;
use super::page::whole;
use super::responses::{AgentTimeout, AtCapacity, BudgetSpent, NoConversation};
use super::state::AppState;
use crate::auth::Limited;
use crate::error::{Error, Result};
use crate::model::{Conversation, Page, QueuedPrompt};
use crate::session::queue::{QueueEdit, QUEUE_MAX};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(edit, remove))
        .routes(routes!(resume))
}

/// A queued prompt of a conversation, as a path names it (documentation
/// only).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct QueuedPath {
    /// The conversation
    id: Uuid,
    /// The queued prompt
    prompt_id: Uuid,
}

/// The conversation's queued prompts, the next first.
#[utoipa::path(
    get, operation_id = "listQueue", path = "/api/v1/conversations/{id}/queue", tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 200, description = "The queue", body = QueuedPromptList),
        NoConversation,
    )
)]
async fn list(Visible { item, .. }: Visible<Conversation>) -> Json<Page<QueuedPrompt>> {
    whole(item.queue)
}

/// A change to a queued prompt: new text, a new place, or both.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = QueuedPromptChange)]
struct EditBody {
    /// The prompt's new text (its content becomes this one text block).
    text: Option<String>,
    /// Its new place: 0 starts next; past the end is last.
    #[schema(minimum = 0, maximum = 19)]
    #[serde(default, deserialize_with = "whole_position")]
    position: Option<u32>,
}

/// A place as JSON Schema's `integer` reads it: any number without a
/// fractional part, so `3.0` is 3 (a generated client may send it so).
fn whole_position<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u32>, D::Error> {
    use serde::de::Error as _;
    let Some(number) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let whole = number.as_u64().or_else(|| {
        number
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= f64::from(u32::MAX))
            .map(|f| f as u64)
    });
    whole
        .and_then(|n| u32::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| {
            D::Error::custom(format!(
                "position must be a whole number from 0, not {number}"
            ))
        })
}

/// Changes a queued prompt (its text, its place, or both), recorded as
/// `queue_changed`. A prompt that has started is 409 `already_started`.
#[utoipa::path(
    patch, operation_id = "editQueuedPrompt", path = "/api/v1/conversations/{id}/queue/{prompt_id}", tag = "conversations",
    params(QueuedPath),
    request_body = EditBody,
    responses(
        (status = 200, description = "The queue now", body = QueuedPromptList),
        (status = 404, description = "No such conversation or queued prompt"),
        (status = 409, description = "`already_started`: the prompt started a turn (its id is the turn's)"),
        (status = 422, description = "Invalid change"),
    )
)]
async fn edit(
    Acting(visible): Acting<COLLABORATOR>,
    AppPath((_id, prompt_id)): AppPath<(Uuid, Uuid)>,
    AppJson(body): AppJson<EditBody>,
) -> Result<Json<Page<QueuedPrompt>>> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    let content = body
        .text
        .map(|text| vec![json!({"type": "text", "text": text})]);
    if body.position.is_some_and(|p| p as usize >= QUEUE_MAX) {
        return Err(Error::Unprocessable(format!(
            "position must be 0 to {} (a queue holds at most {QUEUE_MAX})",
            QUEUE_MAX - 1
        )));
    }
    let edit = QueueEdit::Change {
        prompt: prompt_id,
        content,
        position: body.position.map(|p| p as usize),
    };
    let changed = state
        .sessions()
        .edit_queue(&item, edit, caller.decided_by())
        .await?;
    Ok(whole(changed.queue))
}

/// Removes a queued prompt, recorded as `queue_changed`. A prompt that has
/// started is 409 `already_started`.
#[utoipa::path(
    delete, operation_id = "removeQueuedPrompt", path = "/api/v1/conversations/{id}/queue/{prompt_id}", tag = "conversations",
    params(QueuedPath),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such conversation or queued prompt"),
        (status = 409, description = "`already_started`: the prompt started a turn"),
    )
)]
async fn remove(
    Acting(visible): Acting<COLLABORATOR>,
    AppPath((_id, prompt_id)): AppPath<(Uuid, Uuid)>,
) -> Result<StatusCode> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    let edit = QueueEdit::Remove { prompt: prompt_id };
    state
        .sessions()
        .edit_queue(&item, edit, caller.decided_by())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Starts the first queued prompt now: what a person does with a queue
/// held after a turn that did not end with `end_turn` (`queue_held`). An
/// agent that has gone is started again first.
#[utoipa::path(
    post, operation_id = "resumeQueue", path = "/api/v1/conversations/{id}/queue/resume", tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 202, description = "The first queued prompt started", body = Started),
        NoConversation,
        BudgetSpent,
        (status = 409, description = "`queue_empty`, `turn_in_progress`, `conversation_closed` or `agent_unavailable`"),
        (status = 429, description = "Too many prompts for the token, or all the agents the owner may run are busy; `Retry-After`"),
        (status = 502, description = "The agent could not be started again"),
        AtCapacity,
        AgentTimeout,
    )
)]
async fn resume(Acting(visible): Acting<COLLABORATOR>) -> Result<impl IntoResponse> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    state.auth().check_rate(&caller, Limited::Prompt)?;
    state.budgets().admit(&item).await?;
    let turn_id = state.sessions().resume_queue(&item).await?;
    Ok((StatusCode::ACCEPTED, Json(Started::new(turn_id))))
}
