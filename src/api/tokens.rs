//! `/api/v1/tokens`: operators create, list and revoke bearer tokens. A new
//! token's value is shown once, in the creation response; only its hash is
//! stored. `DELETE /api/v1/users/{name}` removes a user by revoking every
//! token of theirs.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::extract::{AppJson, AppPath};
use super::state::AppState;
use crate::auth::{issue_token, valid_user_name, Caller};
use crate::error::{Error, Result};
use crate::model::{Page, Role};
use crate::store::TokenInfo;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/tokens", get(list).post(create))
        .route("/api/v1/tokens/{id}", delete(revoke))
        .route("/api/v1/users/{name}", delete(remove_user))
}

async fn list(State(state): State<AppState>, caller: Caller) -> Result<Json<Page<TokenInfo>>> {
    caller.require_operator()?;
    let items = state.store().list_tokens().await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    user: String,
    #[serde(default = "default_role")]
    role: Role,
    label: Option<String>,
}

fn default_role() -> Role {
    Role::User
}

async fn create(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<CreateBody>,
) -> Result<(StatusCode, Json<Value>)> {
    caller.require_operator()?;
    let (info, token) =
        issue_token(state.store(), &body.user, body.role, body.label.as_deref()).await?;
    tracing::info!(token_id = %info.id, user = %info.user, by = %caller.user, "token created");
    let mut value = serde_json::to_value(&info).map_err(anyhow::Error::from)?;
    value["token"] = json!(token);
    Ok((StatusCode::CREATED, Json(value)))
}

async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<StatusCode> {
    caller.require_operator()?;
    if state.store().revoke_token(id).await? {
        tracing::info!(token_id = %id, by = %caller.user, "token revoked");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::NotFound(format!("no active token {id}")))
    }
}

/// Removes a user: every token of theirs is revoked (their open WebSockets
/// close); their conversations and history stay.
async fn remove_user(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(name): AppPath<String>,
) -> Result<StatusCode> {
    caller.require_operator()?;
    if valid_user_name(&name) && state.store().remove_user(&name).await? {
        tracing::info!(user = %name, by = %caller.user, "user removed");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::NotFound("no such user".into()))
    }
}
