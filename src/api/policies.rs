//! `/api/v1/policies`: the operator's auto-approve rules, replaced as a
//! whole, and a dry run that evaluates a tool call exactly as the live path
//! does.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::extract::AppJson;
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{self, Action, PolicyRule};
use crate::permissions::policy::{Facts, Policies};
use crate::store::PolicySet;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/policies", get(show).put(replace))
        .route("/api/v1/policies/evaluate", post(evaluate))
}

/// The rules in force and where they come from.
#[derive(Serialize)]
struct PolicyList {
    items: Vec<PolicyRule>,
    next_cursor: Option<String>,
    /// `"config"` while the config file's rules are in force.
    updated_by: String,
    updated_at: Option<chrono::DateTime<chrono::Utc>>,
}

async fn current(state: &AppState) -> Result<PolicyList> {
    Ok(match state.store().current_policies().await? {
        Some(set) => PolicyList {
            items: set.rules,
            next_cursor: None,
            updated_by: set.updated_by,
            updated_at: Some(set.updated_at),
        },
        None => PolicyList {
            items: state.sessions().policies().config_rules().to_vec(),
            next_cursor: None,
            updated_by: "config".into(),
            updated_at: None,
        },
    })
}

async fn show(State(state): State<AppState>, _caller: Caller) -> Result<Json<PolicyList>> {
    current(&state).await.map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceBody {
    items: Vec<PolicyRule>,
}

/// Replaces the whole list; an invalid rule changes nothing (422).
async fn replace(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<ReplaceBody>,
) -> Result<Json<PolicyList>> {
    caller.require_operator()?;
    limits::count("items", body.items.len(), limits::POLICY_MAX_RULES)?;
    for (i, rule) in body.items.iter().enumerate() {
        let field = format!("items[{i}].name");
        limits::line(&field, &rule.name, limits::POLICY_NAME_MAX_CHARS)?;
    }
    let policies = Policies::compile(&body.items).map_err(Error::Unprocessable)?;
    let set = PolicySet {
        id: model::new_id(),
        rules: body.items,
        updated_by: caller.decided_by(),
        updated_at: model::now(),
    };
    state.store().save_policies(&set).await?;
    state.sessions().policies().replace(set.id, policies);
    tracing::info!(policy_set = %set.id, rules = set.rules.len(), by = %set.updated_by, "policies replaced");
    current(&state).await.map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EvaluateBody {
    agent: String,
    tool_call: Value,
    cwd: Option<String>,
    /// Take this conversation's remembered answers into account.
    conversation_id: Option<Uuid>,
}

#[derive(Serialize)]
struct EvaluateResult {
    decision: Action,
    rule: Option<String>,
    reason: String,
}

/// A dry run: what would happen to this tool call now (rate limits are not
/// consumed, and not applied).
async fn evaluate(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<EvaluateBody>,
) -> Result<Json<EvaluateResult>> {
    limits::bytes("agent", &body.agent, limits::AGENT_NAME_MAX_BYTES)?;
    let profile = state
        .config()
        .agent(&body.agent)
        .ok_or_else(|| Error::NotFound(format!("no agent named {:?}", body.agent)))?;
    if !body.tool_call.is_object() {
        return Err(Error::Unprocessable(
            "tool_call must be an ACP ToolCall object".into(),
        ));
    }
    // Resolved as for a new conversation, so the two agree on paths.
    let cwd = profile.conversation_cwd(body.cwd.as_deref())?;
    let remembered = match body.conversation_id {
        Some(id) => {
            state.visible_conversation(&caller, id).await?;
            state.store().list_rules(id).await?
        }
        None => Vec::new(),
    };
    let policies = state.sessions().policies().refresh(state.store()).await?;
    let facts = Facts {
        agent: &profile.name,
        tool_call: &body.tool_call,
        cwd: &cwd,
        mode: profile.mode,
    };
    let verdict = policies.evaluate(&facts, &remembered, None, tokio::time::Instant::now());
    Ok(Json(EvaluateResult {
        decision: verdict.decision,
        rule: verdict.rule,
        reason: verdict.reason,
    }))
}
