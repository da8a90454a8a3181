//! `/api/v1/questions`: the agents' questions to a person (ACP elicitation),
//! the second kind of waiting item beside permission requests: listed,
//! shown, and answered through the same road (`Sessions::answer`), with a
//! form's content checked against the schema the agent asked with.

use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{AppJson, AppPath, AppQuery, Authed, Find, Visible};
use super::openapi::QuestionList;
use super::page::whole;
use super::permissions::{ListQuery, StatusFilter};
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::{Answer, Page, Question, WaitingKind};
use crate::session::answer::Answerer;
use crate::store::PermissionFilter;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show))
        .routes(routes!(respond))
}

/// The questions the caller can see, oldest first (filters as for
/// permission requests).
#[utoipa::path(
    get, operation_id = "listQuestions", path = "/api/v1/questions", tag = "questions",
    params(ListQuery),
    responses(
        (status = 200, description = "The questions", body = QuestionList),
        (status = 422, description = "Invalid filter"),
    )
)]
async fn list(
    Authed { state, caller }: Authed,
    AppQuery(q): AppQuery<ListQuery>,
) -> Result<Json<Page<Question>>> {
    let filter = PermissionFilter {
        pending_only: !matches!(q.status, Some(StatusFilter::All)),
        conversation_id: q.conversation_id,
        owner: caller.owner_filter(),
        kind: Some(WaitingKind::Question),
    };
    let items = state.store().list_permissions(&filter).await?;
    Ok(whole(items.iter().map(Question::from).collect()))
}

/// One question.
#[utoipa::path(
    get, operation_id = "getQuestion", path = "/api/v1/questions/{id}", tag = "questions",
    params(("id" = Uuid, Path, description = "The question")),
    responses(
        (status = 200, description = "The question", body = Question),
        (status = 404, description = "No such question (or not the caller's)"),
    )
)]
async fn show(Visible { item, .. }: Visible<Question>) -> Json<Question> {
    Json(item)
}

/// A question, if it exists and belongs to a conversation the caller sees.
impl Find for Question {
    async fn find(state: &AppState, caller: &Caller, id: Uuid) -> Result<Question> {
        let missing = || Error::NotFound(format!("no question {id}"));
        let asked = state
            .store()
            .get_permission(id)
            .await?
            .filter(|r| r.kind == WaitingKind::Question)
            .ok_or_else(missing)?;
        state
            .visible_conversation(caller, asked.conversation_id)
            .await
            .map_err(|_| missing())?;
        Ok(Question::from(&asked))
    }
}

/// What to do with the question.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = QuestionAction)]
enum Action {
    Accept,
    Decline,
    Cancel,
}

/// A reply to a question: `accept` with the content asked for (a form;
/// nothing for a URL), `decline` or `cancel`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = QuestionReply)]
struct ReplyBody {
    action: Action,
    /// With `accept`, in form mode: an object of the fields asked for,
    /// each a string, number, boolean or list of strings as its schema
    /// says (422 naming each field that does not match).
    #[schema(value_type = Option<Object>)]
    content: Option<Value>,
}

/// Answers a pending question: recorded, then the agent hears it, then
/// `question_resolved` is published. The first answer wins; repeating it
/// answers 200 again, another is 409 `already_resolved`.
#[utoipa::path(
    post, operation_id = "answerQuestion", path = "/api/v1/questions/{id}/respond", tag = "questions",
    params(("id" = Uuid, Path, description = "The question")),
    request_body = ReplyBody,
    responses(
        (status = 200, description = "Answered", body = Question),
        (status = 404, description = "No such question"),
        (status = 409, description = "`already_resolved` otherwise (member `question`), `agent_gone`, or `agent_away`"),
        (status = 422, description = "An action not of the three, content that does not match the schema (each field named), or content with another action than accept"),
        (status = 503, description = "The database is unreachable; try again"),
    )
)]
async fn respond(
    Authed { state, caller }: Authed,
    AppPath(id): AppPath<Uuid>,
    AppJson(body): AppJson<ReplyBody>,
) -> Result<Json<Question>> {
    let action = match body.action {
        Action::Accept => "accept",
        Action::Decline => "decline",
        Action::Cancel => "cancel",
    };
    let answer = Answer::Reply {
        action: action.to_owned(),
        content: body.content.filter(|c| !c.is_null()),
    };
    let who = Answerer {
        decided_by: caller.decided_by(),
        via: None,
        reason: None,
        steer: false,
        kind: Some(WaitingKind::Question),
        caller: Some(&caller),
    };
    let answered = state.sessions().answer(id, &who, answer).await?;
    Ok(Json(Question::from(&answered)))
}
