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

use super::{AppJson, AppPath, AppState, Page};
use crate::auth::{hash_token, new_token, Caller, Role};
use crate::error::{Error, Result};
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

/// Checks a user name: `[A-Za-z0-9._@-]+`, at most 64 characters.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
}

async fn create(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<CreateBody>,
) -> Result<(StatusCode, Json<Value>)> {
    caller.require_operator()?;
    if !valid_user_name(&body.user) {
        return Err(Error::Unprocessable(
            "user must be 1-64 characters of [A-Za-z0-9._@-]".into(),
        ));
    }
    if let Some(label) = &body.label {
        super::limits::line("label", label, super::limits::LABEL_MAX_CHARS)?;
    }
    let token = new_token();
    let info = state
        .store()
        .create_token(
            &body.user,
            body.role,
            body.label.as_deref(),
            &hash_token(&token),
        )
        .await?;
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
