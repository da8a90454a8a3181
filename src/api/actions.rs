//! `/api/v1/actions/{token}`: answering a permission request, or a
//! question in one tap, from a notification (see [`crate::notify::actions`]). The token is the only
//! credential: no bearer token is needed, and nothing but this one answer is
//! reachable with it.
//!
//! `POST` answers through the same path as `POST …/respond`, audited as
//! `decided_by: "user:<name>"` with `via: "notification"`, with the person's
//! `reason` where they gave one (JSON, or the page's form field). `GET` only
//! shows a page with one button that posts (and, for a reject, a box for the
//! reason), so link previewers and mail scanners that fetch URLs answer
//! nothing. A form post (the page's) is answered with a page too.
//!
//! A question's token accepts with the content it was minted for (a yes/no
//! or one choice), through the same road as `POST …/questions/{id}/respond`;
//! it takes no reason.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::openapi::Problem;
use super::permissions::answer_reason;
use super::responses::TooManyFailedLookups;
use super::state::AppState;
use crate::access::Access;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::{Answer, PermissionRequest, PermissionStatus, Question};
use crate::model::{Role, WaitingKind};
use crate::notify::actions::{choices, question_content, well_formed};
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

/// The most a `POST`'s body may hold: a reason of [`crate::limits::REASON_MAX_CHARS`]
/// characters, each percent-encoded, fits with room to spare.
const MAX_BODY_BYTES: usize = 64 * 1024;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(show, answer))
}

/// Failed lookups per client address, on this node.
fn failures() -> &'static Mutex<SlidingWindow<String>> {
    static FAILURES: OnceLock<Mutex<SlidingWindow<String>>> = OnceLock::new();
    FAILURES.get_or_init(Default::default)
}

/// The client's address (all clients behind one proxy share it), as this
/// node counts it: with the node's id, so that gateways sharing a process
/// (in tests) keep apart counts, as separate processes do.
fn client(state: &AppState, request: &Request) -> String {
    let ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_default();
    format!("{}/{ip}", state.sessions().node().id())
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

/// Whether the option is one that refuses (`reject_once`, `reject_always`).
fn is_reject(request: &PermissionRequest, option_id: &str) -> bool {
    request
        .option(option_id)
        .and_then(|o| o.get("kind"))
        .and_then(|k| k.as_str())
        .is_some_and(|k| k.starts_with("reject"))
}

/// The label of the token's option: the permission option's name, or a
/// question's one-tap answer ("Yes", a choice's title).
fn option_name(request: &PermissionRequest, option_id: &str) -> String {
    choices(request)
        .into_iter()
        .find(|(id, _)| id == option_id)
        .map(|(_, label)| label)
        .unwrap_or_else(|| match request.kind {
            WaitingKind::Permission => option_id.to_owned(),
            WaitingKind::Question => "Accept".to_owned(),
        })
}

/// What the notification was about: the tool call's title, or what the
/// agent asks.
fn subject(request: &PermissionRequest) -> &str {
    let (key, otherwise) = match request.kind {
        WaitingKind::Permission => ("title", "A tool call"),
        WaitingKind::Question => ("message", "The agent asks a question"),
    };
    request
        .tool_call
        .get(key)
        .and_then(|t| t.as_str())
        .unwrap_or(otherwise)
}

/// A page with one button that answers: fetching it answers nothing.
#[utoipa::path(
    get, operation_id = "showAction", path = "/api/v1/actions/{token}", tag = "notifications",
    security(()),
    params(("token" = String, Path, description = "The action URL's token", pattern = "^[A-Za-z0-9_-]{43}$")),
    responses(
        (status = 200, description = "A page with one button that `POST`s this URL", content_type = "text/html", body = String),
        (status = 404, description = "No such action (not one the gateway sent, or expired and swept)", content_type = "text/html", body = String),
        (status = 410, description = "Used, expired, its request answered, its user removed, or their membership of a shared conversation gone", content_type = "text/html", body = String),
        TooManyFailedLookups,
    )
)]
async fn show(
    State(state): State<AppState>,
    axum::extract::Path(token): axum::extract::Path<String>,
    request: Request,
) -> Result<Response> {
    let client = client(&state, &request);
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
    let title = subject(&request);
    // A reject may say why: the agent is told (see `answer`).
    let reason = if is_reject(&request, &row.option_id) {
        format!(
            "<p><label for=\"reason\">Why (optional; the agent is told)</label><br>\
             <textarea id=\"reason\" name=\"reason\" rows=\"4\" cols=\"32\" \
             maxlength=\"{max}\"></textarea></p>",
            max = crate::limits::REASON_MAX_CHARS
        )
    } else {
        String::new()
    };
    let choice = escape(&option_name(&request, &row.option_id));
    let answer = match request.kind {
        WaitingKind::Permission => String::new(),
        WaitingKind::Question => format!("<p>Your answer: <strong>{choice}</strong></p>"),
    };
    let body = format!(
        "<p>{}</p>{answer}<form method=\"post\">{reason}<button type=\"submit\">{choice}</button></form>",
        escape(title),
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

/// What a `POST` may carry: nothing, or the person's reason (JSON, or the
/// action page's form field `reason`).
#[derive(Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ActionAnswer)]
struct ActionBody {
    /// Why, in the person's words (at most 2000 characters; newlines and
    /// tabs allowed, no other control characters; blank is none): stored as
    /// the decision's `reason` and told to the agent, as `reason` in
    /// `POST …/permissions/{id}/respond` is. A form's line ends (CR LF) count
    /// as newlines.
    #[serde(default)]
    #[schema(
        max_length = 2000,
        pattern = "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$"
    )]
    reason: Option<String>,
}

/// What an action answered: the permission request, or the question.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = ActionAnswered)]
enum Answered {
    Request(PermissionRequest),
    Question(Question),
}

impl From<PermissionRequest> for Answered {
    fn from(answered: PermissionRequest) -> Answered {
        match answered.kind {
            WaitingKind::Permission => Answered::Request(answered),
            WaitingKind::Question => Answered::Question(Question::from(&answered)),
        }
    }
}

/// Whether the request is a form post (the action page's).
fn is_form(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        })
}

/// The body's reason, as given: none for an empty body or JSON `null`.
async fn body_reason(request: Request, form: bool) -> Result<Option<String>> {
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let v = v.trim_start().to_ascii_lowercase();
            v.starts_with("application/json") || v.starts_with("application/problem+json")
        });
    let bytes = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            Error::PayloadTooLarge(format!(
                "an action's body holds at most {MAX_BODY_BYTES} bytes"
            ))
        })?;
    let body: ActionBody = if form {
        let mut body = ActionBody::default();
        for (name, value) in url::form_urlencoded::parse(&bytes) {
            if name != "reason" || body.reason.is_some() {
                return Err(Error::Unprocessable(format!(
                    "the form holds one field, reason: not {name}"
                )));
            }
            // A browser sends a textarea's line ends as CR LF.
            body.reason = Some(value.replace("\r\n", "\n"));
        }
        body
    } else if bytes.iter().all(u8::is_ascii_whitespace) {
        ActionBody::default()
    } else if json != Some(false) {
        serde_json::from_slice::<Option<ActionBody>>(&bytes)
            .map_err(|e| match e.classify() {
                serde_json::error::Category::Data => {
                    Error::Unprocessable(format!("the body is not an answer: {e}"))
                }
                _ => Error::BadRequest(format!("the body is not JSON: {e}")),
            })?
            .unwrap_or_default()
    } else {
        return Err(Error::UnsupportedMediaType(
            "an action's body is JSON or a form (application/x-www-form-urlencoded)".into(),
        ));
    };
    Ok(body.reason)
}

/// Answers the request with the token's option, once: audited as
/// `decided_by: "user:<name>"`, `via: "notification"`, with the reason
/// given. The token is used whatever comes of it, once the body is read:
/// a body refused (a reason too long) answers nothing and leaves the token
/// as it was. A form post (the action page's) gets a page, whatever comes
/// of it, with the status below (as `text/html`).
#[utoipa::path(
    post, operation_id = "answerAction", path = "/api/v1/actions/{token}", tag = "notifications",
    security(()),
    params(("token" = String, Path, description = "The action URL's token", pattern = "^[A-Za-z0-9_-]{43}$")),
    request_body(
        description = "Optional: no body (or JSON `null`) answers without a reason",
        content(
            (Option<ActionBody> = "application/json"),
            (Option<ActionBody> = "application/x-www-form-urlencoded"),
        ),
    ),
    responses(
        (status = 200, description = "Answered: the permission request, or for a question's action the Question (a form post gets a page saying so)", content(
            (Answered = "application/json"),
            (String = "text/html"),
        )),
        (status = 404, description = "No such action (not one the gateway sent, or expired and swept)", content(
            (Problem = "application/problem+json"), (String = "text/html"),
        )),
        (status = 409, description = "`already_resolved` (member `request`, or `question` for a question's action): someone answered first; `agent_gone`; or `agent_away` (a remote agent whose connection was lost has not asked again yet: try later)", content(
            (Problem = "application/problem+json"), (String = "text/html"),
        )),
        (status = 410, description = "Used, expired, its request gone, its user removed, or their membership of a shared conversation gone", content(
            (Problem = "application/problem+json"), (String = "text/html"),
        )),
        (status = 413, description = "A body over 64 KiB", content(
            (Problem = "application/problem+json"), (String = "text/html"),
        )),
        (status = 415, description = "A body that is neither JSON nor a form"),
        (status = 422, description = "A bad reason (over 2000 characters, or control characters other than newlines and tabs), a reason with a question's action (it takes none), or a body of other members: nothing is answered, and the token can still be used (as after a 400, 413 or 415)", content(
            (Problem = "application/problem+json"), (String = "text/html"),
        )),
        (status = 429, description = "The token is not usable and this address failed 20 lookups in the last minute (`Retry-After`); a usable token still answers", content(
            (Problem = "application/problem+json"), (String = "text/html"),
        )),
    )
)]
async fn answer(
    State(state): State<AppState>,
    axum::extract::Path(token): axum::extract::Path<String>,
    request: Request,
) -> Result<Response> {
    let form = is_form(&request);
    let answered = answer_with(&state, &token, request, form).await;
    if !form {
        return answered.map(|(a, _)| Json(Answered::from(a)).into_response());
    }
    Ok(match answered {
        Ok((request, with_reason)) => answered_page(&request, with_reason),
        Err(error) => error_page(error),
    })
}

async fn answer_with(
    state: &AppState,
    token: &str,
    request: Request,
    form: bool,
) -> Result<(PermissionRequest, bool)> {
    let client = client(state, &request);
    if !well_formed(token) {
        return Err(unknown(client));
    }
    let reason = body_reason(request, form).await?;
    let hash = crate::auth::hash_token(token);
    // The reason is checked once the token is known (an unknown one is 404
    // whatever came with it), and before it is used: a bad one answers
    // nothing and leaves the token as it was.
    let Some(known) = state.store().find_action_token(&hash).await? else {
        return Err(unknown(client));
    };
    let reason = answer_reason(reason)?;
    if reason.is_some() {
        let asked = state.store().get_permission(known.request_id).await?;
        if asked.is_some_and(|r| r.kind == WaitingKind::Question) {
            return Err(Error::Unprocessable(
                "reason: a question's answer takes no reason (send no body)".into(),
            ));
        }
    }
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
        .ok_or_else(|| failed(client.clone()))?;
    if request.status != PermissionStatus::Pending {
        return Err(already_resolved(request));
    }
    // Minted for a member whose membership is gone since, or no longer
    // lets them answer (only the owner's links are theirs for good).
    let holder = Caller {
        user: row.user_name.clone(),
        role: Role::User,
        token_id: None,
    };
    let conversation = state.store().get_conversation(request.conversation_id);
    let owner = conversation.await?.and_then(|c| c.owner);
    let access = Access::find(
        state.store(),
        &holder,
        request.conversation_id,
        owner.as_deref(),
    );
    if access.await?.is_none_or(|a| a < Access::Approver) {
        return Err(failed(client));
    }
    // A question's token holds the content it accepts with; one that does
    // not (none is minted so) answers nothing.
    let answer = match request.kind {
        WaitingKind::Permission => Answer::Option(row.option_id.clone()),
        WaitingKind::Question => Answer::Reply {
            action: "accept".to_owned(),
            content: Some(question_content(&row.option_id).ok_or_else(|| failed(client))?),
        },
    };
    let with_reason = reason.is_some();
    let who = Answerer {
        decided_by: format!("user:{}", row.user_name),
        via: Some("notification".to_owned()),
        reason,
        steer: false,
        kind: Some(request.kind),
        caller: Some(&holder),
    };
    let answered = state.sessions().answer(request.id, &who, answer).await?;
    // The same answer given another way first reads back as success from
    // the shared road: only ours counts as this action's.
    match &answered.decision {
        Some(d) if d.via.as_deref() == Some("notification") => Ok((answered, with_reason)),
        _ => Err(already_resolved(answered)),
    }
}

/// The page a form post gets once it answered.
fn answered_page(request: &PermissionRequest, with_reason: bool) -> Response {
    let title = subject(request);
    let decision = request.decision.as_ref();
    let option = match request.kind {
        WaitingKind::Permission => decision
            .and_then(|d| d.option_id.as_deref())
            .map(|id| option_name(request, id)),
        // The one-tap answer whose content was sent.
        WaitingKind::Question => choices(request)
            .into_iter()
            .find(|(id, _)| question_content(id) == decision.and_then(|d| d.content.clone()))
            .map(|(_, label)| label),
    }
    .unwrap_or_else(|| request.status.as_str().to_owned());
    let mut body = format!("<p>{}: {}.</p>", escape(title), escape(&option));
    if let Some(reason) = decision
        .and_then(|d| d.reason.as_deref())
        .filter(|_| with_reason)
    {
        body.push_str(&format!(
            "<p>Your reason: {}</p><p>The agent is told it when its turn ends.</p>",
            escape(reason)
        ));
    }
    page(StatusCode::OK, "Answered", &body)
}

/// The page a form post gets when nothing was answered: what went wrong,
/// with the status (and `Retry-After`) the API gives.
fn error_page(error: Error) -> Response {
    let problem = error.problem();
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (heading, advice) = match (status.as_u16(), problem.code.as_str()) {
        (404, _) => ("No such action", "This link is not one the gateway sent, or it expired long ago."),
        (410, _) => ("This action is no longer available", "It was used already, it expired, or the request was answered."),
        (409, "already_resolved") => ("Already answered", "Someone answered this request first."),
        (422, _) | (413, _) => ("Nothing was answered", "Go back, shorten or correct the reason, and send it again: this action can still be used."),
        (429, _) => ("Too many tries", "Wait a minute and try again."),
        _ => ("Nothing was answered", "Try again, or answer in the app."),
    };
    let detail = if status.is_server_error() {
        String::new()
    } else {
        format!("<p>{}</p>", escape(&problem.detail))
    };
    let mut response = page(status, heading, &format!("{detail}<p>{advice}</p>"));
    if let Some(wait) = problem.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait));
    }
    response
}
