//! `/api/v1/budgets`: the budgets in force (`[[budgets]]` in the config),
//! each with where the caller's own spend stands against it, and an
//! operator's exceptions, which lift a budget for one user until its window
//! ends. (What WebSockets may hold for their clients, also a budget, is
//! `budget.rs`'s.)

use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::extract::{AppJson, AppPath, Authed, Operator};
use super::responses::{no_content_if, NotOperator};
use super::state::AppState;
use crate::auth::valid_user_name;
use crate::budgets::rules::Window;
use crate::config::Budget;
use crate::error::{Error, Result};
use crate::model::{BudgetException, BudgetScope, BudgetStanding};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(list_exceptions, add_exception))
        .routes(routes!(remove_exception))
}

/// A budget as configured, with where the caller stands against it.
#[derive(Serialize, ToSchema)]
#[schema(as = BudgetInForce)]
struct BudgetView {
    #[serde(flatten)]
    budget: Budget,
    /// The caller's own spend against it in the current window: for a
    /// `user` budget (for others, see `GET /api/v1/usage`).
    standing: Option<BudgetStanding>,
    /// Whether an exception lifts it for the caller now.
    excepted: bool,
}

/// The budgets in force.
#[derive(Serialize, ToSchema)]
#[schema(as = BudgetList)]
struct Budgets {
    items: Vec<BudgetView>,
}

/// The budgets in force, in the config's order, each with the caller's own
/// spend against it where it holds them as a user.
#[utoipa::path(
    get, operation_id = "listBudgets", path = "/api/v1/budgets", tag = "budgets",
    responses((status = 200, description = "The budgets", body = Budgets))
)]
async fn list(Authed { state, caller }: Authed) -> Result<Json<Budgets>> {
    let now = Utc::now();
    let budgets = state.budgets();
    let mut items = Vec::new();
    for budget in budgets.all() {
        let standing = match budget.scope {
            BudgetScope::User => Some(budgets.standing_of_user(budget, &caller.user, now).await?),
            _ => None,
        };
        let excepted = budgets.excepted(budget, Some(&caller.user), now).await?;
        items.push(BudgetView {
            budget: budget.clone(),
            standing,
            excepted,
        });
    }
    Ok(Json(Budgets { items }))
}

/// The exceptions of a budget in force.
#[derive(Serialize, ToSchema)]
#[schema(as = BudgetExceptionList)]
struct Exceptions {
    items: Vec<BudgetException>,
}

/// Who is excepted from the budget now (operators only).
#[utoipa::path(
    get, operation_id = "listBudgetExceptions", path = "/api/v1/budgets/{id}/exceptions", tag = "budgets",
    params(("id" = String, Path, description = "The budget's `id`")),
    responses(
        (status = 200, description = "The exceptions in force", body = Exceptions),
        NotOperator,
        (status = 404, description = "No such budget"),
    )
)]
async fn list_exceptions(
    Operator(Authed { state, .. }): Operator,
    AppPath(id): AppPath<String>,
) -> Result<Json<Exceptions>> {
    let budget = find(&state, &id)?;
    let items = state
        .store()
        .budget_exceptions(Some(&budget.id), Utc::now())
        .await?;
    Ok(Json(Exceptions { items }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewBudgetException)]
struct ExceptionBody {
    /// The user the budget no longer holds (their conversations), until
    /// the window ends.
    #[schema(pattern = "^[A-Za-z0-9._@-]{1,64}$")]
    user: String,
}

/// Lifts the budget for one user (their conversations) until its current
/// window ends (a `total` budget: until the exception is removed);
/// replaces an earlier exception of theirs. Operators only.
#[utoipa::path(
    post, operation_id = "addBudgetException", path = "/api/v1/budgets/{id}/exceptions", tag = "budgets",
    params(("id" = String, Path, description = "The budget's `id`")),
    request_body = ExceptionBody,
    responses(
        (status = 201, description = "The exception", body = BudgetException),
        NotOperator,
        (status = 404, description = "No such budget"),
        (status = 422, description = "Invalid body"),
    )
)]
async fn add_exception(
    Operator(Authed { state, caller }): Operator,
    AppPath(id): AppPath<String>,
    AppJson(body): AppJson<ExceptionBody>,
) -> Result<(StatusCode, Json<BudgetException>)> {
    let budget = find(&state, &id)?;
    if !valid_user_name(&body.user) {
        return Err(Error::Unprocessable(
            "user must be 1-64 characters of [A-Za-z0-9._@-]".into(),
        ));
    }
    let now = crate::model::now();
    let exception = BudgetException {
        budget: budget.id.clone(),
        user: body.user,
        until: Window::at(budget.window, now).end,
        created_by: caller.decided_by(),
        created_at: now,
    };
    state.store().put_budget_exception(&exception).await?;
    tracing::info!(budget = %exception.budget, user = %exception.user, by = %caller.user, "budget lifted for a user");
    Ok((StatusCode::CREATED, Json(exception)))
}

/// Ends a user's exception at once (operators only).
#[utoipa::path(
    delete, operation_id = "removeBudgetException", path = "/api/v1/budgets/{id}/exceptions/{user}", tag = "budgets",
    params(
        ("id" = String, Path, description = "The budget's `id`"),
        ("user" = String, Path, description = "The user"),
    ),
    responses(
        (status = 204, description = "Removed"),
        NotOperator,
        (status = 404, description = "No such budget, or no exception for the user"),
    )
)]
async fn remove_exception(
    Operator(Authed { state, .. }): Operator,
    AppPath((id, user)): AppPath<(String, String)>,
) -> Result<StatusCode> {
    let budget = find(&state, &id)?;
    let removed = state
        .store()
        .remove_budget_exception(&budget.id, &user)
        .await?;
    no_content_if(removed, || {
        Error::NotFound(format!("no exception of budget {id} for {user}"))
    })
}

fn find(state: &AppState, id: &str) -> Result<Budget> {
    state
        .budgets()
        .get(id)
        .cloned()
        .ok_or_else(|| Error::NotFound(format!("no budget {id}")))
}
