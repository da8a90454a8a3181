//! `/api/v1/permissions`: the pending store as users see it.

use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{exactly_one, AppJson, AppPath, AppQuery, Authed, Find, Visible};
use super::openapi::PermissionRequestList;
use super::page::whole;
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::Answer;
use crate::model::WaitingKind;
use crate::model::{Page, PermissionRequest};
use crate::session::answer::Answerer;
use crate::store::PermissionFilter;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show))
        .routes(routes!(respond))
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum StatusFilter {
    Pending,
    All,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// `pending` (the default) or `all`.
    #[param(inline)]
    pub(super) status: Option<StatusFilter>,
    /// Only this conversation's requests.
    pub(super) conversation_id: Option<Uuid>,
}

/// Permission requests the caller can see, oldest first: the permission
/// inbox.
#[utoipa::path(
    get, operation_id = "listPermissions", path = "/api/v1/permissions", tag = "permissions",
    params(ListQuery),
    responses(
        (status = 200, description = "The requests", body = PermissionRequestList),
        (status = 422, description = "Invalid filter"),
    )
)]
async fn list(
    Authed { state, caller }: Authed,
    AppQuery(q): AppQuery<ListQuery>,
) -> Result<Json<Page<PermissionRequest>>> {
    let filter = PermissionFilter {
        pending_only: !matches!(q.status, Some(StatusFilter::All)),
        conversation_id: q.conversation_id,
        owner: caller.owner_filter(),
        kind: Some(WaitingKind::Permission),
    };
    let items = state.store().list_permissions(&filter).await?;
    Ok(whole(items))
}

/// One permission request.
#[utoipa::path(
    get, operation_id = "getPermission", path = "/api/v1/permissions/{id}", tag = "permissions",
    params(("id" = Uuid, Path, description = "The request")),
    responses(
        (status = 200, description = "The request", body = PermissionRequest),
        (status = 404, description = "No such request (or not the caller's)"),
    )
)]
async fn show(Visible { item, .. }: Visible<PermissionRequest>) -> Json<PermissionRequest> {
    Json(item)
}

/// A request, if it exists and belongs to a conversation the caller sees.
impl Find for PermissionRequest {
    async fn find(state: &AppState, caller: &Caller, id: Uuid) -> Result<PermissionRequest> {
        let missing = || Error::NotFound(format!("no permission request {id}"));
        let request = state
            .store()
            .get_permission(id)
            .await?
            .filter(|r| r.kind == WaitingKind::Permission)
            .ok_or_else(missing)?;
        state
            .visible_conversation(caller, request.conversation_id)
            .await
            .map_err(|_| missing())?;
        Ok(request)
    }
}

/// An answer: exactly one of `option_id` and `outcome`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = PermissionAnswer)]
enum RespondBody {
    Option(OptionAnswer),
    Outcome(OutcomeAnswer),
}

/// The option the user picked.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PermissionOptionAnswer)]
struct OptionAnswer {
    /// One of the request's `options[].optionId` (another is 409
    /// `not_offered`).
    option_id: String,
    /// Why, in the person's words (at most 2000 characters): stored with
    /// the decision, and told to the agent as the first queued prompt, which
    /// starts when the turn ends.
    #[serde(default)]
    #[schema(
        max_length = 2000,
        pattern = "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$"
    )]
    reason: Option<String>,
    /// Tell the agent the reason at once: the running turn is cancelled
    /// after the answer (default `false`; without a reason there is
    /// nothing to tell, and it does nothing).
    #[serde(default)]
    steer: Option<bool>,
}

/// No option: the ACP `cancelled` outcome.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PermissionOutcomeAnswer)]
struct OutcomeAnswer {
    outcome: Outcome,
    /// Why, in the person's words (at most 2000 characters): stored with
    /// the decision, and told to the agent as the first queued prompt, which
    /// starts when the turn ends.
    #[serde(default)]
    #[schema(
        max_length = 2000,
        pattern = "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$"
    )]
    reason: Option<String>,
    /// Tell the agent the reason at once: the running turn is cancelled
    /// after the answer (default `false`; without a reason there is
    /// nothing to tell, and it does nothing).
    #[serde(default)]
    steer: Option<bool>,
}

/// The only outcome a user gives without an option.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    Cancelled,
}

impl<'de> Deserialize<'de> for RespondBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        exactly_one(
            d,
            ("option_id", RespondBody::Option),
            ("outcome", RespondBody::Outcome),
        )
    }
}

impl RespondBody {
    /// The answer the body gives (its shape is only the document's), and
    /// the reason given with it, checked, and whether it steers.
    fn answer(self) -> Result<(Answer, Option<String>, bool)> {
        let (answer, reason, steer) = match self {
            RespondBody::Option(OptionAnswer {
                option_id,
                reason,
                steer,
            }) => (Answer::Option(option_id), reason, steer),
            RespondBody::Outcome(OutcomeAnswer {
                outcome: Outcome::Cancelled,
                reason,
                steer,
            }) => (Answer::Cancelled, reason, steer),
        };
        let reason = answer_reason(reason)?;
        let steer = steer == Some(true) && reason.is_some();
        Ok((answer, reason, steer))
    }
}

/// A reason given with an answer: at most [`limits::REASON_MAX_CHARS`]
/// characters, newlines allowed but no other control characters; blank is
/// none.
pub(super) fn answer_reason(reason: Option<String>) -> Result<Option<String>> {
    let Some(reason) = reason.filter(|r| !r.trim().is_empty()) else {
        return Ok(None);
    };
    limits::text("reason", &reason, limits::REASON_MAX_CHARS)?;
    Ok(Some(reason))
}

/// Answers a pending request: persisted, then the agent is answered, then
/// `permission_resolved` is published. Repeating the recorded answer is
/// idempotent (200).
#[utoipa::path(
    post, operation_id = "answerPermission", path = "/api/v1/permissions/{id}/respond", tag = "permissions",
    params(("id" = Uuid, Path, description = "The request")),
    request_body = RespondBody,
    responses(
        (status = 200, description = "Answered", body = PermissionRequest),
        (status = 404, description = "No such request"),
        (status = 409, description = "`already_resolved` otherwise (member `request`), `agent_gone`, or `agent_away` (a remote agent whose connection was lost has not asked again yet: try later)"),
        (status = 422, description = "Not exactly one of option_id and outcome, or not of their type"),
        (status = 503, description = "The database is unreachable; try again"),
    )
)]
async fn respond(
    Authed { state, caller }: Authed,
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<RespondBody>,
) -> Result<Json<PermissionRequest>> {
    let (answer, reason, steer) = body.answer()?;
    let who = Answerer {
        decided_by: caller.decided_by(),
        via: None,
        reason,
        steer,
        kind: Some(WaitingKind::Permission),
        caller: Some(&caller),
    };
    let answered = state.sessions().answer(id, &who, answer).await?;
    Ok(Json(answered))
}
