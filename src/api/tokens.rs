//! `/api/v1/tokens`: operators create, list and revoke bearer tokens. A new
//! token's value is shown once, in the creation response; only its hash is
//! stored. `DELETE /api/v1/users/{name}` removes a user by revoking every
//! token of theirs.

use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{AppJson, AppPath, Authed, Operator};
use super::openapi::TokenList;
use super::page::whole;
use super::responses::NotOperator;
use super::state::AppState;
use crate::auth::{issue_token, valid_user_name};
use crate::error::{Error, Result};
use crate::model::{Page, Role};
use crate::store::TokenInfo;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(revoke))
        .routes(routes!(remove_user))
}

/// Every token, revoked ones included, oldest first (operators only).
#[utoipa::path(
    get, operation_id = "listTokens", path = "/api/v1/tokens", tag = "tokens",
    responses(
        (status = 200, description = "The tokens (never their values)", body = TokenList),
        NotOperator,
    )
)]
async fn list(Operator(Authed { state, .. }): Operator) -> Result<Json<Page<TokenInfo>>> {
    let items = state.store().list_tokens().await?;
    Ok(whole(items))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewToken)]
struct CreateBody {
    /// At most 64 characters of `[A-Za-z0-9._@-]`; created if new.
    #[schema(pattern = "^[A-Za-z0-9._@-]{1,64}$")]
    user: String,
    /// `user` (the default) or `operator`; sets the user's role.
    #[serde(default = "default_role")]
    role: Role,
    /// One line, at most 200 characters.
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    label: Option<String>,
}

/// A new token: its value is shown this once.
#[derive(Serialize, ToSchema)]
#[schema(as = IssuedToken)]
struct Issued {
    #[serde(flatten)]
    info: TokenInfo,
    /// The bearer token.
    token: String,
}

fn default_role() -> Role {
    Role::User
}

/// Creates a token (operators only).
#[utoipa::path(
    post, operation_id = "createToken", path = "/api/v1/tokens", tag = "tokens",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Created", body = Issued),
        NotOperator,
        (status = 422, description = "Invalid user name or label"),
    )
)]
async fn create(
    Operator(Authed { state, caller }): Operator,
    AppJson(body): AppJson<CreateBody>,
) -> Result<(StatusCode, Json<Issued>)> {
    let (info, token) =
        issue_token(state.store(), &body.user, body.role, body.label.as_deref()).await?;
    tracing::info!(token_id = %info.id, user = %info.user, by = %caller.user, "token created");
    Ok((StatusCode::CREATED, Json(Issued { info, token })))
}

/// Revokes a token; its WebSockets close (1008).
#[utoipa::path(
    delete, operation_id = "revokeToken", path = "/api/v1/tokens/{id}", tag = "tokens",
    params(("id" = Uuid, Path, description = "The token")),
    responses(
        (status = 204, description = "Revoked"),
        NotOperator,
        (status = 404, description = "No such active token"),
    )
)]
async fn revoke(
    Operator(Authed { state, caller }): Operator,
    AppPath(id): AppPath<Uuid>,
) -> Result<StatusCode> {
    if state.store().revoke_token(id).await? {
        tracing::info!(token_id = %id, by = %caller.user, "token revoked");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::NotFound(format!("no active token {id}")))
    }
}

/// Removes a user: every token of theirs is revoked (their open WebSockets
/// close), their notifications' action URLs stop working (410, those of
/// requests asked later too) and nothing more is sent to their notification
/// targets; their conversations and history stay. A new token for them
/// makes them a user again.
#[utoipa::path(
    delete, operation_id = "removeUser", path = "/api/v1/users/{name}", tag = "tokens",
    params(("name" = String, Path, description = "The user")),
    responses(
        (status = 204, description = "Removed"),
        NotOperator,
        (status = 404, description = "No such user"),
    )
)]
async fn remove_user(
    Operator(Authed { state, caller }): Operator,
    AppPath(name): AppPath<String>,
) -> Result<StatusCode> {
    if valid_user_name(&name) && state.store().remove_user(&name).await? {
        tracing::info!(user = %name, by = %caller.user, "user removed");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::NotFound("no such user".into()))
    }
}
