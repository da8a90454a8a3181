//! `/api/v1/actions/{token}`: answering a permission request from a
//! notification (see [`crate::notify::actions`]). The token is the only
//! credential: no bearer token is needed, and nothing but this one answer is
//! reachable with it.
//!
//! `POST` answers through the same path as `POST …/respond`, audited as
//! `decided_by: "user:<name>"` with `via: "notification"`. `GET` only shows a
//! page with one button that posts, so link previewers and mail scanners
//! that fetch URLs answer nothing.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::responses::TooManyFailedLookups;
use super::state::AppState;
use crate::error::{Error, Result};
use crate::model::WaitingKind;
use crate::model::{Answer, PermissionRequest, PermissionStatus};
use crate::notify::actions::well_formed;
use crate::permissions::already_resolved;
use crate::ratelimit::SlidingWindow;
use crate::session::answer::Answerer;
use crate::store::ActionToken;

/// Failed lookups (unknown, used or expired tokens) allowed per client
/// address per [`FAILURE_WINDOW`]; beyond, a lookup that fails answers 429
/// until the window moves on. A usable token is never refused: it is 32
/// random bytes, so the limit protects nothing it needs, and everyone
/// behind one proxy or NAT shares an address.
const MAX_FAILURES: u32 = 20;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The page's policy: no script, no style, a form that posts here only.
const PAGE_CSP: &str =
    "default-src 'none'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(show, answer))
}

/// Failed lookups per client address, on this node.
fn failures() -> &'static Mutex<SlidingWindow<String>> {
    static FAILURES: OnceLock<Mutex<SlidingWindow<String>>> = OnceLock::new();
    FAILURES.get_or_init(Default::default)
}

/// The client's address (all clients behind one proxy share it).
fn client(request: &Request) -> String {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_default()
}

/// A failed lookup by `client`: counted, and answered `answer` (404 or
/// 410), or 429 once `client` failed [`MAX_FAILURES`] times in the window
/// (a lookup refused so is not counted, so `Retry-After` holds).
fn failure<T>(client: String, answer: T) -> Result<T> {
    let now = tokio::time::Instant::now();
    match failures()
        .lock()
        .unwrap()
        .try_hit(client, MAX_FAILURES, FAILURE_WINDOW, now)
    {
        Ok(()) => Ok(answer),
        Err(wait) => Err(Error::TooManyRequests {
            detail: "too many unknown or used action tokens; try again later".into(),
            retry_after: wait.as_secs().max(1),
        }),
    }
}

/// A token that was minted but is no more: used, expired, its request
/// answered or gone, or its user removed.
fn failed(client: String) -> Error {
    failure(client, Error::Gone("this action is used or expired".into()))
        .unwrap_or_else(|too_many| too_many)
}

/// A token no action has (or no longer has: an expired one once swept).
fn unknown(client: String) -> Error {
    failure(client, Error::NotFound("no such action".into())).unwrap_or_else(|too_many| too_many)
}

/// The token's row and its request, if the token is well formed and known,
/// and whether its user was removed.
async fn lookup(
    state: &AppState,
    token: &str,
) -> Result<Option<(ActionToken, PermissionRequest, bool)>> {
    if !well_formed(token) {
        return Ok(None);
    }
    let hash = crate::auth::hash_token(token);
    let Some(row) = state.store().find_action_token(&hash).await? else {
        return Ok(None);
    };
    let Some(request) = state.store().get_permission(row.request_id).await? else {
        return Ok(None);
    };
    let removed = state.store().user_removed(&row.user_name).await?;
    Ok(Some((row, request, removed)))
}

fn option_name(request: &PermissionRequest, option_id: &str) -> String {
    request
        .option(option_id)
        .and_then(|o| o.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or(option_id)
        .to_owned()
}

/// A page with one button that answers: fetching it answers nothing.
#[utoipa::path(
    get, operation_id = "showAction", path = "/api/v1/actions/{token}", tag = "notifications",
    security(()),
    params(("token" = String, Path, description = "The action URL's token", pattern = "^[A-Za-z0-9_-]{43}$")),
    responses(
        (status = 200, description = "A page with one button that `POST`s this URL", content_type = "text/html", body = String),
        (status = 404, description = "No such action (not one the gateway sent, or expired and swept)", content_type = "text/html", body = String),
        (status = 410, description = "Used, expired, its request answered, or its user removed", content_type = "text/html", body = String),
        TooManyFailedLookups,
    )
)]
async fn show(
    State(state): State<AppState>,
    axum::extract::Path(token): axum::extract::Path<String>,
    request: Request,
) -> Result<Response> {
    let client = client(&request);
    let Some(found) = lookup(&state, &token).await? else {
        return failure(
            client,
            page(
                StatusCode::NOT_FOUND,
                "No such action",
                "<p>This link is not one the gateway sent, or it expired long ago.</p>",
            ),
        );
    };
    let usable = Some(found).filter(|(row, request, removed)| {
        row.used_at.is_none()
            && !removed
            && row.expires_at > crate::model::now()
            && request.status == PermissionStatus::Pending
    });
    let Some((row, request, _)) = usable else {
        return failure(
            client,
            page(
                StatusCode::GONE,
                "This action is no longer available",
                "<p>It was used already, it expired, or the request was answered.</p>",
            ),
        );
    };
    let title = request
        .tool_call
        .get("title")
        .and_then(|t| t.as_str())
        .unwrap_or("A tool call");
    let body = format!(
        "<p>{}</p><form method=\"post\"><button type=\"submit\">{}</button></form>",
        escape(title),
        escape(&option_name(&request, &row.option_id)),
    );
    Ok(page(StatusCode::OK, "Answer the agent", &body))
}

fn page(status: StatusCode, heading: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"referrer\" content=\"no-referrer\">\
         <title>{heading}</title></head><body><h1>{heading}</h1>{body}</body></html>"
    );
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(PAGE_CSP),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        html,
    )
        .into_response()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// Answers the request with the token's option, once: audited as
/// `decided_by: "user:<name>"`, `via: "notification"`. The token is used
/// whatever comes of it.
#[utoipa::path(
    post, operation_id = "answerAction", path = "/api/v1/actions/{token}", tag = "notifications",
    security(()),
    params(("token" = String, Path, description = "The action URL's token", pattern = "^[A-Za-z0-9_-]{43}$")),
    responses(
        (status = 200, description = "Answered", body = PermissionRequest),
        (status = 404, description = "No such action (not one the gateway sent, or expired and swept)"),
        (status = 409, description = "`already_resolved` (member `request`): someone answered first; `agent_gone`; or `agent_away` (a remote agent whose connection was lost has not asked again yet: try later)"),
        (status = 410, description = "Used, expired, its request gone, or its user removed"),
        TooManyFailedLookups,
    )
)]
async fn answer(
    State(state): State<AppState>,
    axum::extract::Path(token): axum::extract::Path<String>,
    request: Request,
) -> Result<Json<PermissionRequest>> {
    let client = client(&request);
    if !well_formed(&token) {
        return Err(unknown(client));
    }
    let hash = crate::auth::hash_token(&token);
    let now = crate::model::now();
    let Some((row, first)) = state.store().use_action_token(&hash, now).await? else {
        return Err(unknown(client));
    };
    if !first || row.expires_at <= now {
        return Err(failed(client));
    }
    // Minted for a user removed since (their conversations go on): it
    // ends with them, as those minted before did.
    if state.store().user_removed(&row.user_name).await? {
        return Err(failed(client));
    }
    let request = state
        .store()
        .get_permission(row.request_id)
        .await?
        .ok_or_else(|| failed(client))?;
    if request.status != PermissionStatus::Pending {
        return Err(already_resolved(request));
    }
    let user = row.user_name.clone();
    let may_see = move |owner: Option<&str>| owner == Some(user.as_str());
    let who = Answerer {
        decided_by: format!("user:{}", row.user_name),
        via: Some("notification".to_owned()),
        reason: None,
        steer: false,
        kind: Some(WaitingKind::Permission),
        may_see: Some(&may_see),
    };
    let answer = Answer::Option(row.option_id.clone());
    let answered = state.sessions().answer(request.id, &who, answer).await?;
    // The same answer given another way first reads back as success from
    // the shared road: only ours counts as this action's.
    match &answered.decision {
        Some(d) if d.via.as_deref() == Some("notification") => Ok(Json(answered)),
        _ => Err(already_resolved(answered)),
    }
}
