//! `/api/v1/permissions`: the pending store as users see it.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use uuid::Uuid;

use super::{AppJson, AppPath, AppQuery, AppState, Page};
use crate::error::{Error, Result};
use crate::model::PermissionRequest;
use crate::permissions::{answer_resolved, validate_answer, Answer};
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
    AppQuery(q): AppQuery<ListQuery>,
) -> Result<Json<Page<PermissionRequest>>> {
    let filter = PermissionFilter {
        pending_only: !matches!(q.status, Some(StatusFilter::All)),
        conversation_id: q.conversation_id,
    };
    let items = state.store().list_permissions(&filter).await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

async fn show(
    State(state): State<AppState>,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<PermissionRequest>> {
    state
        .store()
        .get_permission(id)
        .await?
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("no permission request {id}")))
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
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<RespondBody>,
) -> Result<Json<PermissionRequest>> {
    let answer = body.answer()?;
    let request = state
        .store()
        .get_permission(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no permission request {id}")))?;
    // Until there are user accounts every REST caller is the same user.
    let decided_by = "user:anonymous".to_owned();
    if let Some(session) = state.session(request.conversation_id) {
        if let Some(result) = session.respond(id, answer.clone(), decided_by).await {
            return result.map(Json);
        }
    }
    // No live agent: only a repeat of a recorded decision can succeed.
    let request = state
        .store()
        .get_permission(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no permission request {id}")))?;
    validate_answer(&request, &answer)?;
    if request.status == crate::model::PermissionStatus::Pending {
        return Err(Error::conflict(
            "agent_gone",
            "the agent that asked is no longer running",
        ));
    }
    answer_resolved(request, &answer).map(Json)
}
