//! The HTTP API: one router per resource, merged in [`router`]. The contract
//! is `docs/api.md`; `openapi/openapi.yaml` describes it exactly.

mod acp;
mod forks;
mod agent_sessions;
mod policies;
mod share_links;
mod ws;
mod queue;
mod members;
mod changes;
mod questions;
mod conversations;
mod tokens;
mod budgets;
mod notifications;
mod search;
mod usage;
mod actions;
mod permissions;
mod extract;
mod state;
pub mod openapi;
mod responses;
mod page;
pub mod yaml11;
mod body;
mod budget;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::auth::Caller;
use crate::error::Error;
use crate::model::{ConversationStatus, Page};
use crate::telemetry;
use extract::Authed;
use page::whole;

pub use budget::SendBudget;
pub use extract::{AppJson, AppPath, AppQuery};
pub use state::AppState;

/// Every route, each with its OpenAPI description.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(list_agents))
        .routes(routes!(openapi_json))
        .merge(actions::router())
        .merge(conversations::router())
        .merge(queue::router())
        .merge(members::router())
        .merge(changes::router())
        .merge(forks::router())
        .merge(agent_sessions::router())
        .merge(search::router())
        .merge(usage::router())
        .merge(permissions::router())
        .merge(questions::router())
        .merge(policies::router())
        .merge(tokens::router())
        .merge(budgets::router())
        .merge(notifications::router())
        .merge(share_links::router())
        .merge(ws::router())
        .merge(acp::router())
}

/// The OpenAPI document of the whole API (what `openapi/openapi.yaml` holds).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = routes().split_for_parts();
    openapi::finish(&mut doc);
    doc
}

/// The OpenAPI document as YAML, as committed in `openapi/openapi.yaml`:
/// quoted so that YAML 1.1 parsers read the same strings ([`yaml11`]).
pub fn openapi_yaml() -> anyhow::Result<String> {
    yaml11::quote_for_yaml_1_1(&openapi().to_yaml()?)
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let max_body = state.config().max_body_bytes;
    let (routes, _) = routes().split_for_parts();
    routes
        .merge(crate::web::router())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(
            // Paths only: a query string may carry an access token.
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                |req: &axum::http::Request<axum::body::Body>| {
                    tracing::info_span!("http", method = %req.method(), path = %req.uri().path())
                },
            ),
        )
        .layer(cors(&state.config().cors_origins))
        // Outermost: whatever answers before a body is read, this settles it.
        .layer(axum::middleware::from_fn(body::drain_unread_body))
        .with_state(state)
}

/// This API's OpenAPI document (`openapi/openapi.yaml`, as JSON).
#[utoipa::path(
    get, operation_id = "openapi", path = "/api/v1/openapi.json", tag = "health", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object))
)]
async fn openapi_json() -> Json<serde_json::Value> {
    static DOC: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    let doc = DOC.get_or_init(|| serde_json::to_value(openapi()).expect("the document serializes"));
    Json(doc.clone())
}

/// A health answer.
#[derive(Serialize, ToSchema)]
struct Health {
    /// `ok`, `ready` or `unavailable`.
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    detail: Option<String>,
    /// `/readyz`: this gateway node's id (stable while the process runs;
    /// several nodes may share one Postgres).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    node_id: Option<uuid::Uuid>,
}

/// Answers while the process runs.
#[utoipa::path(
    get, operation_id = "health", path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "Running", body = Health))
)]
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Answers 200 while the database answers.
#[utoipa::path(
    get, operation_id = "ready", path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "The database does not answer", body = Health, content_type = "application/json"),
    )
)]
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let node_id = state.sessions().node().id();
    match state.store().ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "ready", "node_id": node_id})),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "database not reachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(
                    json!({"status": "unavailable", "detail": "database not reachable", "node_id": node_id}),
                ),
            )
        }
    }
}

/// Prometheus text: agents, conversations by status, pending requests,
/// events written, WebSocket clients, agent exits and restarts, commit
/// latency, the write buffer. Open, like the health checks.
#[utoipa::path(
    get, operation_id = "metrics", path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"))
)]
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // What the database knows is left as last seen while it is away: the
    // page matters most then.
    let counted = state.store().count_conversations_by_status().await.ok();
    let conversations_by_status = counted.map(|counted| {
        ConversationStatus::ALL
            .iter()
            .map(|status| {
                let count = counted
                    .iter()
                    .find(|(s, _)| s == status.as_str())
                    .map_or(0, |(_, n)| *n);
                (status.as_str().to_owned(), count)
            })
            .collect()
    });
    let page = telemetry::render(telemetry::Snapshot {
        node_id: state.sessions().node().id(),
        agents_running: state.sessions().running(),
        conversations_by_status,
        permissions_pending: state.store().count_pending_permissions().await.ok(),
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        page,
    )
}

/// An agent profile as clients see it.
#[derive(Serialize, ToSchema)]
struct Agent {
    name: String,
    title: String,
    /// Whether its command can be found and run (by its user), in its box;
    /// for a remote agent (`url`), whether it accepts a connection (and its
    /// token) now.
    available: bool,
    unavailable_reason: Option<String>,
    /// How its conversations are boxed on this machine, and what the box
    /// grants.
    sandbox: crate::sandbox::Effective,
    /// The Linux capabilities its agents and their terminal commands keep
    /// (its `capabilities`): none by default.
    capabilities: Vec<String>,
    /// What its agent offers for sessions (`fork`: conversations can be
    /// forked; `list` with `load` or `resume`: its own sessions can be
    /// listed and taken over), as its newest conversation's agent said in
    /// `initialize`; `null` while none of its agents has started yet (the
    /// gateway learns it then).
    session_capabilities: Option<crate::model::SessionOffers>,
}

/// Agent profiles.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct AgentList {
    items: Vec<Agent>,
    /// Always `null`: one page holds every profile.
    next_cursor: Option<String>,
}

/// The agent profiles, and whether each can be run.
#[utoipa::path(
    get, operation_id = "listAgents", path = "/api/v1/agents", tag = "agents",
    responses((status = 200, description = "Every profile", body = AgentList))
)]
async fn list_agents(Authed { state, .. }: Authed) -> Json<Page<Agent>> {
    let config = state.config();
    let profiles: Vec<_> = config
        .agents
        .iter()
        // As conversations start them: with the gateway-wide agent_user.
        .filter_map(|a| config.agent(&a.name))
        .collect();
    // Remote agents are reached now (or were lately), all at once, each
    // bounded.
    let reachable = futures::future::join_all(profiles.iter().map(|a| {
        let state = &state;
        async move {
            match a.url {
                Some(_) => state.remote_unavailable(a).await,
                None => None,
            }
        }
    }))
    .await;
    let mut offered = Vec::with_capacity(profiles.len());
    for a in &profiles {
        // Not worth failing the list for: unknown.
        let recorded = state.store().agent_session_capabilities(&a.name).await;
        offered.push(
            recorded
                .ok()
                .flatten()
                .and_then(|v| serde_json::from_value(v).ok()),
        );
    }
    let items = profiles
        .into_iter()
        .zip(reachable)
        .zip(offered)
        .map(|((a, unreachable), session_capabilities)| {
            let (sandbox, refused) = crate::sandbox::Effective::of(
                a.sandbox,
                a.allowed_tcp_ports.is_some(),
                crate::sandbox::landlock::kernel_abi(),
            );
            // As a conversation's box, its own parts named.
            let rules = crate::sandbox::profile::rules(
                &a,
                std::path::Path::new("{cwd}"),
                &crate::sandbox::Home::at(std::path::Path::new("{home}")),
                &config.state_dir(),
                sandbox.tcp_ports_enforced == Some(true),
            );
            let sandbox = sandbox.granting(&rules);
            let reason = crate::process::profile::unavailable_reason(&a)
                .or(unreachable)
                .or(refused);
            Agent {
                capabilities: a
                    .kept_capabilities()
                    .names()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
                title: a.title.clone().unwrap_or_else(|| a.name.clone()),
                name: a.name,
                available: reason.is_none(),
                unavailable_reason: reason,
                sandbox,
                session_capabilities,
            }
        })
        .collect();
    whole(items)
}

/// Unknown paths: 404, but only for a caller who may call the API at all
/// (without a valid token, 401 first, so the API's shape is not probed).
async fn not_found(_caller: Caller) -> Error {
    Error::NotFound("no such endpoint".into())
}

/// CORS for the configured origins only; none configured means no CORS
/// headers at all (browsers then refuse cross-origin calls).
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return CorsLayer::new();
    }
    let origins: Vec<axum::http::HeaderValue> =
        origins.iter().filter_map(|o| o.parse().ok()).collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([
            axum::http::Method::GET,
            axum::http::Method::POST,
            axum::http::Method::PUT,
            axum::http::Method::DELETE,
        ])
        .allow_headers([
            axum::http::header::AUTHORIZATION,
            axum::http::header::CONTENT_TYPE,
        ])
}
