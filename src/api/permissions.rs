//! `/api/v1/permissions`: the pending store as users see it.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use uuid::Uuid;

use super::extract::{AppJson, AppPath, AppQuery};
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::{Page, PermissionRequest};
use crate::permissions::Answer;
use crate::store::PermissionFilter;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/permissions", get(list))
        .route("/api/v1/permissions/{id}", get(show))
        .route("/api/v1/permissions/{id}/respond", post(respond))
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum StatusFilter {
    Pending,
    All,
}

#[derive(Deserialize)]
struct ListQuery {
    status: Option<StatusFilter>,
    conversation_id: Option<Uuid>,
}

async fn list(
    State(state): State<AppState>,
    caller: Caller,
    AppQuery(q): AppQuery<ListQuery>,
) -> Result<Json<Page<PermissionRequest>>> {
    let filter = PermissionFilter {
        pending_only: !matches!(q.status, Some(StatusFilter::All)),
        conversation_id: q.conversation_id,
        owner: caller.owner_filter(),
    };
    let items = state.store().list_permissions(&filter).await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

async fn show(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<PermissionRequest>> {
    visible_request(&state, &caller, id).await.map(Json)
}

/// The request, if it exists and belongs to a conversation the caller sees.
async fn visible_request(state: &AppState, caller: &Caller, id: Uuid) -> Result<PermissionRequest> {
    let request = state
        .store()
        .get_permission(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no permission request {id}")))?;
    state
        .visible_conversation(caller, request.conversation_id)
        .await
        .map_err(|_| Error::NotFound(format!("no permission request {id}")))?;
    Ok(request)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RespondBody {
    option_id: Option<String>,
    outcome: Option<String>,
}

impl RespondBody {
    fn answer(self) -> Result<Answer> {
        match (self.option_id, self.outcome.as_deref()) {
            (Some(id), None) => Ok(Answer::Option(id)),
            (None, Some("cancelled")) => Ok(Answer::Cancelled),
            (None, Some(other)) => Err(Error::Unprocessable(format!(
                "outcome must be \"cancelled\", got {other:?}"
            ))),
            _ => Err(Error::Unprocessable(
                "give exactly one of option_id or outcome".into(),
            )),
        }
    }
}

async fn respond(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<RespondBody>,
) -> Result<Json<PermissionRequest>> {
    let answer = body.answer()?;
    let request = visible_request(&state, &caller, id).await?;
    state
        .sessions()
        .respond(&request, answer, caller.decided_by())
        .await
        .map(Json)
}
