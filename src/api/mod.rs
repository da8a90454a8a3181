//! The HTTP API: one router per resource, merged in [`router`]. The contract
//! is `../shared/docs/api.md`.

mod conversations;
mod extract;
pub mod limits;
mod permissions;
mod policies;
mod tokens;
mod ws;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::config::Config;
use crate::journal::Sink;
use crate::policy::PolicyHandle;
use crate::session::SessionHandle;

pub use extract::{AppJson, AppPath, AppQuery};

/// Shared state of the API: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    config: Config,
    sink: Sink,
    sessions: Mutex<HashMap<Uuid, SessionHandle>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    policies: PolicyHandle,
    auth: crate::auth::Auth,
}

impl AppState {
    pub fn new(
        config: Config,
        sink: Sink,
        policies: PolicyHandle,
        auth: crate::auth::Auth,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        AppState {
            inner: Arc::new(Shared {
                config,
                sink,
                sessions: Mutex::new(HashMap::new()),
                shutdown,
                tasks,
                policies,
                auth,
            }),
        }
    }

    /// Authentication and rate limits.
    pub fn auth(&self) -> &crate::auth::Auth {
        &self.inner.auth
    }

    /// The conversation, if it exists and the caller may see it (another
    /// user's conversation is "not found", not "forbidden").
    pub async fn visible_conversation(
        &self,
        caller: &crate::auth::Caller,
        id: Uuid,
    ) -> crate::error::Result<crate::model::Conversation> {
        self.store()
            .get_conversation(id)
            .await?
            .filter(|c| caller.can_see(c.owner.as_deref()))
            .ok_or_else(|| crate::error::Error::NotFound(format!("no conversation {id}")))
    }

    /// The operator policies in force.
    pub fn policies(&self) -> &PolicyHandle {
        &self.inner.policies
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn sink(&self) -> &Sink {
        &self.inner.sink
    }

    pub fn store(&self) -> &dyn crate::store::Store {
        &*self.inner.sink.store
    }

    /// The live session of a conversation, if its agent runs on this node.
    pub fn session(&self, id: Uuid) -> Option<SessionHandle> {
        let sessions = self.inner.sessions.lock().unwrap();
        sessions.get(&id).filter(|h| !h.is_closed()).cloned()
    }

    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// Registers a started session and forgets it when its task ends.
    fn adopt(&self, id: Uuid, handle: SessionHandle, task: tokio::task::JoinHandle<()>) {
        self.inner.sessions.lock().unwrap().insert(id, handle);
        let state = self.clone();
        self.inner.tasks.spawn(async move {
            let _ = task.await;
            state.inner.sessions.lock().unwrap().remove(&id);
        });
    }
}

/// Lists in the contract's shape.
#[derive(Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let max_body = state.config().max_body_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
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

async fn list_agents(
    State(state): State<AppState>,
    _caller: crate::auth::Caller,
) -> Json<serde_json::Value> {
    let items: Vec<_> = state
        .config()
        .agents
        .iter()
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
async fn not_found(_caller: crate::auth::Caller) -> crate::error::Error {
    crate::error::Error::NotFound("no such endpoint".into())
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
