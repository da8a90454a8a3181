//! The HTTP API: one router per resource, merged in [`router`]. The contract
//! is `../shared/docs/api.md`.

mod conversations;
mod extract;
mod permissions;
mod policies;
mod state;
mod tokens;
mod ws;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::auth::Caller;
use crate::error::Error;
use crate::model::ConversationStatus;
use crate::telemetry;

pub use extract::{AppJson, AppPath, AppQuery};
pub use state::AppState;

/// The whole API.
pub fn router(state: AppState) -> Router {
    let max_body = state.config().max_body_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/agents", get(list_agents))
        .merge(conversations::router())
        .merge(permissions::router())
        .merge(policies::router())
        .merge(tokens::router())
        .merge(ws::router())
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
        .with_state(state)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.store().ping().await {
        Ok(()) => (StatusCode::OK, Json(json!({"status": "ready"}))),
        Err(e) => {
            tracing::warn!(error = %e, "database not reachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "detail": "database not reachable"})),
            )
        }
    }
}

/// Prometheus text: agents, conversations by status, pending requests,
/// events written, WebSocket clients, agent exits and restarts, commit
/// latency, the write buffer. Open, like the health checks.
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

async fn list_agents(State(state): State<AppState>, _caller: Caller) -> Json<serde_json::Value> {
    let config = state.config();
    let items: Vec<_> = config
        .agents
        .iter()
        // As conversations start them: with the gateway-wide agent_user.
        .filter_map(|a| config.agent(&a.name))
        .map(|a| {
            let reason = a.unavailable_reason();
            json!({
                "name": a.name,
                "title": a.title.clone().unwrap_or_else(|| a.name.clone()),
                "available": reason.is_none(),
                "unavailable_reason": reason,
            })
        })
        .collect();
    Json(json!({"items": items, "next_cursor": null}))
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
