//! `/api/v1/policies`: the operator's auto-approve rules, replaced as a
//! whole, and a dry run that evaluates a tool call exactly as the live path
//! does.

use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::conversations::{agent_schema, cwd_schema};
use super::extract::{AppJson, Authed, Operator};
use super::responses::NotOperator;
use super::state::AppState;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{self, Action, PolicyRule};
use crate::permissions::policy::input;
use crate::permissions::policy::{tool_paths, Facts, Policies, Refused};
use crate::store::PolicySet;
use crate::workspace::cwd::conversation_cwd;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(show, replace))
        .routes(routes!(evaluate))
}

/// The rules in force and where they come from.
#[derive(Serialize, ToSchema)]
#[schema(as = Policies)]
struct PolicyList {
    #[schema(value_type = Vec<RuleSchema>)]
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

/// The operator policies in force, in order (the first that covers a tool
/// call decides).
#[utoipa::path(
    get, operation_id = "getPolicies", path = "/api/v1/policies", tag = "policies",
    responses((status = 200, description = "The rules", body = PolicyList))
)]
async fn show(Authed { state, .. }: Authed) -> Result<Json<PolicyList>> {
    current(&state).await.map(Json)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewPolicies)]
struct ReplaceBody {
    /// At most 1000 rules; their names unique (else 409 `duplicate_name`).
    #[schema(value_type = Vec<RuleSchema>, max_items = 1000)]
    items: Vec<PolicyRule>,
}

/// One operator rule, as written in the config file or sent to the API:
/// an `allow` rule, which alone may be rate limited and remember, or a
/// `deny` or `ask` rule.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = PolicyRule)]
#[allow(dead_code)]
enum RuleSchema {
    Allow(AllowPolicyRule),
    DenyOrAsk(DenyOrAskPolicyRule),
}

/// The schema of a [`PolicyRule`] of one kind of decision: the fields all
/// rules have, and `$extra`.
macro_rules! rule_schema {
    ($(#[$doc:meta])* $name:ident { $($extra:tt)* }) => {
        $(#[$doc])*
        #[derive(Serialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct $name {
            #[schema(schema_with = input::name_schema)]
            name: String,
            #[serde(default)]
            #[schema(schema_with = input::agents_schema)]
            agents: Vec<String>,
            #[serde(default)]
            #[schema(schema_with = input::kinds_schema)]
            kinds: Vec<String>,
            #[serde(default)]
            #[schema(schema_with = input::commands_schema)]
            commands: Vec<String>,
            #[serde(default)]
            #[schema(schema_with = input::paths_schema)]
            paths: Vec<String>,
            $($extra)*
        }
    };
}

/// At most `count` automatic approvals by one rule per `window`, per
/// conversation; beyond it, a person is asked.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RateLimit)]
#[allow(dead_code)]
struct RateLimitSchema {
    #[schema(schema_with = input::count_schema)]
    count: u32,
    #[schema(schema_with = input::window_schema)]
    window: String,
}

rule_schema!(
    /// A rule that allows what it covers.
    AllowPolicyRule {
        #[schema(schema_with = input::allow_schema)]
        decision: Action,
        max_auto_per: Option<RateLimitSchema>,
        /// Answer with the agent's `allow_always` option.
        #[serde(default)]
        remember: bool,
    }
);

rule_schema!(
    /// A rule that denies what it covers, or asks a person.
    DenyOrAskPolicyRule {
        #[schema(schema_with = input::deny_or_ask_schema)]
        decision: Action,
        #[serde(default)]
        #[schema(schema_with = input::no_limit_schema)]
        max_auto_per: Option<RateLimitSchema>,
        #[serde(default)]
        #[schema(schema_with = input::no_remember_schema)]
        remember: bool,
    }
);

/// Replaces the whole list (operators only); an invalid rule changes
/// nothing.
#[utoipa::path(
    put, operation_id = "replacePolicies", path = "/api/v1/policies", tag = "policies",
    request_body = ReplaceBody,
    responses(
        (status = 200, description = "The rules now in force", body = PolicyList),
        NotOperator,
        (status = 409, description = "`duplicate_name`: two rules have one name (the detail names the second)"),
        (status = 422, description = "A rule the schema does not admit (the detail names it and the field)"),
    )
)]
async fn replace(
    Operator(Authed { state, caller }): Operator,
    AppJson(body): AppJson<ReplaceBody>,
) -> Result<Json<PolicyList>> {
    let policies = Policies::compile(&body.items).map_err(|e| match e {
        Refused::Invalid(detail) => Error::Unprocessable(detail),
        Refused::DuplicateName(detail) => Error::conflict("duplicate_name", detail),
    })?;
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PolicyQuestion)]
struct EvaluateBody {
    #[schema(schema_with = agent_schema)]
    agent: String,
    /// An ACP `ToolCall` object.
    #[schema(value_type = Object)]
    tool_call: Value,
    #[schema(schema_with = cwd_schema)]
    cwd: Option<String>,
    /// Take this conversation's remembered answers into account.
    conversation_id: Option<Uuid>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = PolicyVerdict)]
struct EvaluateResult {
    decision: Action,
    rule: Option<String>,
    reason: String,
}

/// A dry run: what would happen to this tool call now (rate limits are not
/// consumed, and not applied).
#[utoipa::path(
    post, operation_id = "evaluatePolicies", path = "/api/v1/policies/evaluate", tag = "policies",
    request_body = EvaluateBody,
    responses(
        (status = 200, description = "The verdict", body = EvaluateResult),
        (status = 404, description = "No such agent profile or conversation"),
        (status = 422, description = "Input the schema does not admit, or a `cwd` that is not a directory the profile may use"),
    )
)]
async fn evaluate(
    Authed { state, caller }: Authed,
    AppJson(body): AppJson<EvaluateBody>,
) -> Result<Json<EvaluateResult>> {
    limits::agent_name("agent", &body.agent)?;
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
    let cwd = conversation_cwd(&profile, body.cwd.as_deref(), Some(&caller.user))?;
    let remembered = match body.conversation_id {
        Some(id) => {
            state.visible_conversation(&caller, id).await?;
            state.store().list_rules(id).await?
        }
        None => Vec::new(),
    };
    let policies = state.sessions().policies().refresh(state.store()).await?;
    // As the live path does: its paths as they really are too, looked up
    // with the rights of the profile's user.
    let given = tool_paths(&body.tool_call, &cwd);
    let real_paths = match profile.user.as_deref().map(crate::sys::lookup_user) {
        None => crate::workspace::real_paths(None, given).await,
        Some(Ok(user)) => crate::workspace::real_paths(Some(user), given).await,
        // No such user: its agents start nowhere, nothing to look up as it.
        Some(Err(_)) => Vec::new(),
    };
    let facts = Facts {
        agent: &profile.name,
        tool_call: &body.tool_call,
        cwd: &cwd,
        mode: profile.mode,
        real_paths: &real_paths,
    };
    let verdict = policies.evaluate(&facts, &remembered, None, tokio::time::Instant::now());
    Ok(Json(EvaluateResult {
        decision: verdict.decision,
        rule: verdict.rule,
        reason: verdict.reason,
    }))
}
