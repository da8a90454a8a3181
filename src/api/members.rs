//! `/api/v1/conversations/{id}/members`: who a conversation is shared with.
//! Its owner (or an operator) shares it with another user as a `viewer`,
//! an `approver` or a `collaborator` (see [`crate::access`]), changes their
//! role and removes them; every member sees the list. Each change is made
//! by the conversation's one writer and recorded as a `member_*` event;
//! a removal closes the member's sockets for it at once.

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::conversations::ConversationPath;
use super::extract::{Acting, AppJson, AppPath, Visible, OWNER};
use super::openapi::MemberList;
use super::page::whole;
use super::responses::NoConversation;
use super::state::AppState;
use crate::auth::valid_user_name;
use crate::error::{Error, Result};
use crate::model::{Conversation, Member, MemberOp, MemberRole, Page};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, add))
        .routes(routes!(change, remove))
}

/// A member of a conversation, as a path names them (documentation only).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct MemberPath {
    /// The conversation
    id: Uuid,
    /// The member's user name
    user: String,
}

/// Who to share a conversation with, and as what.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewMember)]
struct AddBody {
    /// A user (one who has had a token, not removed), not the owner.
    #[schema(max_length = 64, pattern = "^[A-Za-z0-9._@-]+$")]
    user: String,
    role: MemberRole,
}

/// A member's new role.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = MemberRoleChange)]
struct ChangeBody {
    role: MemberRole,
}

/// The users the conversation is shared with, in the order they were
/// added. Any member sees it.
#[utoipa::path(
    get, operation_id = "listMembers", path = "/api/v1/conversations/{id}/members", tag = "members",
    params(ConversationPath),
    responses(
        (status = 200, description = "Every member", body = MemberList),
        NoConversation,
    )
)]
async fn list(Visible { state, item, .. }: Visible<Conversation>) -> Result<Json<Page<Member>>> {
    Ok(whole(state.store().list_members(item.id).await?))
}

/// Shares the conversation with a user (its owner or an operator only):
/// recorded as a `member_added` event.
#[utoipa::path(
    post, operation_id = "addMember", path = "/api/v1/conversations/{id}/members", tag = "members",
    params(ConversationPath),
    request_body = AddBody,
    responses(
        (status = 201, description = "Shared", body = Member),
        (status = 403, description = "The caller is a member, not its owner or an operator"),
        NoConversation,
        (status = 409, description = "`already_member`: it is shared with that user already (`PATCH` changes a role); `unknown_user`: no such user (now); `is_owner`: the user owns it"),
        (status = 422, description = "Invalid input: not a user name, or an unknown role"),
    )
)]
async fn add(
    Acting(visible): Acting<OWNER>,
    AppJson(body): AppJson<AddBody>,
) -> Result<impl IntoResponse> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    if !valid_user_name(&body.user) {
        return Err(Error::Unprocessable(
            "user must be 1-64 characters of [A-Za-z0-9._@-]".into(),
        ));
    }
    if item.owner.as_deref() == Some(body.user.as_str()) {
        return Err(Error::conflict(
            "is_owner",
            format!(
                "{:?} owns the conversation: it is theirs already",
                body.user
            ),
        ));
    }
    if !state.store().known_user(&body.user).await? {
        return Err(Error::conflict(
            "unknown_user",
            format!("no user named {:?}", body.user),
        ));
    }
    let op = MemberOp::Add {
        user: body.user,
        role: body.role,
    };
    let member = state
        .sessions()
        .change_members(&item, op, caller.decided_by())
        .await?;
    Ok((StatusCode::CREATED, Json(member)))
}

/// Changes a member's role (its owner or an operator only): recorded as
/// a `member_changed` event.
#[utoipa::path(
    patch, operation_id = "changeMember", path = "/api/v1/conversations/{id}/members/{user}", tag = "members",
    params(MemberPath),
    request_body = ChangeBody,
    responses(
        (status = 200, description = "The member with their new role", body = Member),
        (status = 403, description = "The caller is a member, not its owner or an operator"),
        (status = 404, description = "No such conversation (or not the caller's), or no such member"),
        (status = 422, description = "Invalid input"),
    )
)]
async fn change(
    Acting(visible): Acting<OWNER>,
    AppPath((_id, user)): AppPath<(Uuid, String)>,
    AppJson(body): AppJson<ChangeBody>,
) -> Result<Json<Member>> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    let op = MemberOp::Change {
        user,
        role: body.role,
    };
    let member = state
        .sessions()
        .change_members(&item, op, caller.decided_by())
        .await?;
    Ok(Json(member))
}

/// Removes a member (its owner or an operator only): recorded as a
/// `member_removed` event; their WebSockets of the conversation close at
/// once (1008), their notifications of it stop and their action URLs of it
/// answer 410.
#[utoipa::path(
    delete, operation_id = "removeMember", path = "/api/v1/conversations/{id}/members/{user}", tag = "members",
    params(MemberPath),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "The caller is a member, not its owner or an operator"),
        (status = 404, description = "No such conversation (or not the caller's), or no such member"),
    )
)]
async fn remove(
    Acting(visible): Acting<OWNER>,
    AppPath((_id, user)): AppPath<(Uuid, String)>,
) -> Result<StatusCode> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    let op = MemberOp::Remove { user };
    state
        .sessions()
        .change_members(&item, op, caller.decided_by())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
