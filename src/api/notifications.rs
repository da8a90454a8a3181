//! `/api/v1/notification-targets`: where a user is notified (Web Push,
//! ntfy, a webhook, FCM), each target's deliveries, and a test send; and
//! `/api/v1/notifications/vapid-public-key` for `PushManager.subscribe`.
//! A user sees and manages only their own targets (another's is "not
//! found"); secrets and tokens are never listed back (a generated webhook
//! secret is shown once, at creation).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{AppJson, AppPath};
use super::page::whole;
use super::responses::{no_content_if, NoTarget};
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::Page;
use crate::notify::outbox::TargetConfig;
use crate::notify::{guard, ntfy, webhook, NotificationEvent};
use crate::store::notify::{AttemptRecord, TargetRecord};

/// Targets one user may have.
const MAX_TARGETS: usize = 50;
/// Attempts `GET …/deliveries` answers (the newest).
const MAX_ATTEMPTS_LISTED: i64 = 200;
const MAX_URL: usize = 2048;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(remove))
        .routes(routes!(test))
        .routes(routes!(deliveries))
        .routes(routes!(vapid_public_key))
}

/// The kind of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = NotificationTargetKind)]
enum TargetKind {
    WebPush,
    Ntfy,
    Webhook,
    Fcm,
}

/// A browser's Push API subscription (`PushSubscription.toJSON()`).
#[derive(Deserialize, ToSchema)]
#[schema(as = PushSubscription)]
struct Subscription {
    endpoint: String,
    keys: SubscriptionKeys,
    /// Ignored (browsers send it).
    #[serde(default, rename = "expirationTime")]
    #[allow(dead_code)]
    expiration_time: Option<serde_json::Value>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PushSubscriptionKeys)]
struct SubscriptionKeys {
    /// base64url: the subscription's P-256 public key (65 bytes).
    p256dh: String,
    /// base64url: its authentication secret (16 bytes).
    auth: String,
}

/// A new target: `kind` says which of the other members it takes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewNotificationTarget)]
struct CreateBody {
    kind: TargetKind,
    /// `web_push`: the browser's subscription.
    subscription: Option<Subscription>,
    /// `ntfy`: `https://server/TOPIC`; `webhook`: where to POST.
    #[schema(max_length = 2048)]
    url: Option<String>,
    /// `ntfy`: an access token, sent as `Authorization: Bearer`.
    #[schema(max_length = 512)]
    token: Option<String>,
    /// `webhook`: the signing secret (16 to 256 characters); generated (32
    /// random bytes, hex) and answered once when left out.
    #[schema(min_length = 16, max_length = 256)]
    secret: Option<String>,
    /// `fcm`: the app's registration token (needs `[notifications.fcm]`).
    #[schema(max_length = 4096)]
    device_token: Option<String>,
    /// One line, at most 200 characters.
    #[schema(max_length = 200)]
    label: Option<String>,
    /// Which of `permission_waiting`, `permission_reminder`, `turn_ended`,
    /// `agent_failed` it gets (default: all).
    events: Option<Vec<String>>,
}

/// The last attempt to deliver to a target.
#[derive(Serialize, ToSchema)]
#[schema(as = NotificationLastDelivery)]
struct LastDelivery {
    at: DateTime<Utc>,
    /// `delivered`, `failed` or `gone`.
    outcome: String,
    /// `HTTP <status>`, or what went wrong.
    detail: Option<String>,
}

/// A notification target (never its secrets).
#[derive(Serialize, ToSchema)]
#[schema(as = NotificationTarget)]
struct Target {
    id: Uuid,
    kind: TargetKind,
    label: Option<String>,
    events: Vec<String>,
    created_at: DateTime<Utc>,
    last_delivery: Option<LastDelivery>,
    /// The service said the target is no more (404 or 410): nothing is
    /// sent to it any more.
    gone: bool,
}

impl Target {
    fn of(record: &TargetRecord) -> Target {
        Target {
            id: record.id,
            kind: match record.kind.as_str() {
                "web_push" => TargetKind::WebPush,
                "ntfy" => TargetKind::Ntfy,
                "fcm" => TargetKind::Fcm,
                // Only ever written from a TargetConfig's kind.
                _ => TargetKind::Webhook,
            },
            label: record.label.clone(),
            events: serde_json::from_str(&record.events).unwrap_or_default(),
            created_at: record.created_at,
            last_delivery: record.last_at.map(|at| LastDelivery {
                at,
                outcome: record.last_outcome.clone().unwrap_or_default(),
                detail: record.last_detail.clone(),
            }),
            gone: record.gone,
        }
    }
}

/// A new target; a webhook's generated secret is shown this once.
#[derive(Serialize, ToSchema)]
#[schema(as = CreatedNotificationTarget)]
struct Created {
    #[serde(flatten)]
    target: Target,
    /// `webhook` only, when the secret was generated.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    secret: Option<String>,
}

/// The caller's targets.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct NotificationTargetList {
    items: Vec<Target>,
    /// Always `null`: one page holds every target.
    next_cursor: Option<String>,
}

/// One attempt to deliver a notification to a target.
#[derive(Serialize, ToSchema)]
#[schema(as = NotificationDelivery)]
struct Delivery {
    /// The same for every attempt of one delivery (receivers deduplicate
    /// on it; header `X-Acp-Gateway-Delivery`).
    delivery_id: Uuid,
    /// The event, or `test`.
    event: String,
    /// From 1.
    attempt: i32,
    /// `delivered`, `failed` or `gone`.
    outcome: String,
    http_status: Option<i32>,
    error: Option<String>,
    at: DateTime<Utc>,
}

impl Delivery {
    fn of(a: AttemptRecord) -> Delivery {
        Delivery {
            delivery_id: a.delivery_id,
            event: a.event,
            attempt: a.attempt,
            outcome: a.outcome,
            http_status: a.http_status,
            error: a.error,
            at: a.at,
        }
    }
}

/// A target's attempts, newest first.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct NotificationDeliveryList {
    items: Vec<Delivery>,
    /// Always `null`: the newest 200 attempts.
    next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct VapidPublicKey {
    /// base64url (unpadded): the uncompressed P-256 point, 65 bytes, as
    /// `PushManager.subscribe`'s `applicationServerKey`.
    public_key: String,
}

/// The caller's notification targets, oldest first.
#[utoipa::path(
    get, operation_id = "listNotificationTargets", path = "/api/v1/notification-targets",
    tag = "notifications",
    responses((status = 200, description = "The caller's targets", body = NotificationTargetList))
)]
async fn list(State(state): State<AppState>, caller: Caller) -> Result<Json<Page<Target>>> {
    let items = state
        .store()
        .list_targets(&caller.user)
        .await?
        .iter()
        .map(Target::of)
        .collect();
    Ok(whole(items))
}

fn unprocessable(what: &str, why: impl std::fmt::Display) -> Error {
    Error::Unprocessable(format!("{what} {why}"))
}

fn required<'a>(value: &'a Option<String>, what: &str, kind: &str) -> Result<&'a str> {
    value
        .as_deref()
        .ok_or_else(|| unprocessable(what, format_args!("is required for kind {kind}")))
}

/// Printable, one line, at most `max` characters.
fn check_text(value: &str, what: &str, min: usize, max: usize) -> Result<()> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(unprocessable(
            what,
            format_args!("must be {min} to {max} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(unprocessable(what, "must not hold control characters"));
    }
    Ok(())
}

/// Printable ASCII without spaces (tokens, secrets).
fn check_token(value: &str, what: &str, min: usize, max: usize) -> Result<()> {
    check_text(value, what, min, max)?;
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unprocessable(
            what,
            "must be printable ASCII without spaces",
        ));
    }
    Ok(())
}

async fn check_url(state: &AppState, value: &str, what: &str) -> Result<String> {
    if value.len() > MAX_URL {
        return Err(unprocessable(
            what,
            format_args!("must be at most {MAX_URL} bytes"),
        ));
    }
    let allow = state.config().notifications.allow_private_targets;
    guard::check_url(value, allow)
        .await
        .map_err(|e| unprocessable(what, e))?;
    Ok(value.to_owned())
}

fn check_key(value: &str, what: &str, len: usize) -> Result<String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map_err(|_| unprocessable(what, "must be base64url"))?;
    if bytes.len() != len || (len == 65 && bytes[0] != 4) {
        return Err(unprocessable(
            what,
            format_args!(
                "must decode to {len} bytes{}",
                if len == 65 {
                    " (an uncompressed P-256 point)"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// Adds a notification target for the caller.
#[utoipa::path(
    post, operation_id = "createNotificationTarget", path = "/api/v1/notification-targets",
    tag = "notifications", request_body = CreateBody,
    responses(
        (status = 201, description = "Created (a generated webhook secret is shown this once)", body = Created),
        (status = 422, description = "Invalid input: a URL that is not https://, resolves to a private address, a key of the wrong size, an unknown event, kind fcm without [notifications.fcm], more than 50 targets"),
    )
)]
async fn create(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<CreateBody>,
) -> Result<(StatusCode, Json<Created>)> {
    let kind_name = serde_json::to_value(body.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    // Members of other kinds: refused, so a mistake is not silently dropped.
    let given = [
        (
            "subscription",
            body.subscription.is_some(),
            TargetKind::WebPush,
        ),
        ("url", body.url.is_some(), TargetKind::Ntfy),
        ("token", body.token.is_some(), TargetKind::Ntfy),
        ("secret", body.secret.is_some(), TargetKind::Webhook),
        ("device_token", body.device_token.is_some(), TargetKind::Fcm),
    ];
    for (member, present, owner) in given {
        let fits = owner == body.kind || (member == "url" && body.kind == TargetKind::Webhook);
        if present && !fits {
            return Err(unprocessable(
                member,
                format_args!("does not apply to kind {kind_name}"),
            ));
        }
    }
    if let Some(label) = &body.label {
        check_text(label, "label", 0, 200)?;
    }
    let events = match &body.events {
        None => NotificationEvent::ALL
            .iter()
            .map(|e| e.as_str().to_owned())
            .collect(),
        Some(events) => {
            let mut chosen: Vec<String> = Vec::new();
            for e in events {
                if !NotificationEvent::ALL
                    .iter()
                    .any(|known| known.as_str() == e)
                {
                    return Err(unprocessable(
                        "events",
                        format_args!("names {e:?}: not one of permission_waiting, permission_reminder, turn_ended, agent_failed"),
                    ));
                }
                if !chosen.contains(e) {
                    chosen.push(e.clone());
                }
            }
            if chosen.is_empty() {
                return Err(unprocessable("events", "names no event"));
            }
            chosen
        }
    };
    let mut generated = None;
    let config = match body.kind {
        TargetKind::WebPush => {
            let Some(sub) = &body.subscription else {
                return Err(unprocessable(
                    "subscription",
                    "is required for kind web_push",
                ));
            };
            let p256dh = check_key(&sub.keys.p256dh, "subscription.keys.p256dh", 65)?;
            let auth = check_key(&sub.keys.auth, "subscription.keys.auth", 16)?;
            // 65 bytes, and a point of the curve: payloads can be encrypted to it.
            crate::notify::web_push::check_subscription(&p256dh, &auth)
                .map_err(|e| unprocessable("subscription.keys", e))?;
            TargetConfig::WebPush {
                endpoint: check_url(&state, &sub.endpoint, "subscription.endpoint").await?,
                p256dh,
                auth,
            }
        }
        TargetKind::Ntfy => {
            let url = check_url(&state, required(&body.url, "url", "ntfy")?, "url").await?;
            ntfy::split_url(&url).map_err(|e| unprocessable("url", e))?;
            if let Some(token) = &body.token {
                check_token(token, "token", 1, 512)?;
            }
            TargetConfig::Ntfy {
                url,
                token: body.token.clone(),
            }
        }
        TargetKind::Webhook => {
            let url = check_url(&state, required(&body.url, "url", "webhook")?, "url").await?;
            let secret = match &body.secret {
                Some(secret) => {
                    check_token(secret, "secret", 16, 256)?;
                    secret.clone()
                }
                None => generated.insert(webhook::new_secret()).clone(),
            };
            TargetConfig::Webhook { url, secret }
        }
        TargetKind::Fcm => {
            if !state.outbox().has_fcm() {
                return Err(Error::Unprocessable(
                    "kind fcm needs the operator to configure [notifications.fcm]".into(),
                ));
            }
            let token = required(&body.device_token, "device_token", "fcm")?;
            check_token(token, "device_token", 1, 4096)?;
            TargetConfig::Fcm {
                device_token: token.to_owned(),
            }
        }
    };
    let existing = state.store().list_targets(&caller.user).await?;
    if existing.len() >= MAX_TARGETS {
        return Err(Error::Unprocessable(format!(
            "at most {MAX_TARGETS} notification targets per user"
        )));
    }
    let record = TargetRecord {
        id: Uuid::now_v7(),
        owner: caller.user.clone(),
        kind: config.kind().to_owned(),
        label: body.label.clone(),
        events: serde_json::to_string(&events).expect("strings serialize"),
        config: serde_json::to_string(&config).expect("settings serialize"),
        created_at: DateTime::from_timestamp_millis(Utc::now().timestamp_millis())
            .unwrap_or_else(Utc::now),
        gone: false,
        last_at: None,
        last_outcome: None,
        last_detail: None,
    };
    state.store().insert_target(&record).await?;
    tracing::info!(target_id = %record.id, kind = %record.kind, user = %caller.user, "notification target created");
    Ok((
        StatusCode::CREATED,
        Json(Created {
            target: Target::of(&record),
            secret: generated,
        }),
    ))
}

/// The caller's target `id` ("not found" for another user's).
async fn own_target(state: &AppState, caller: &Caller, id: Uuid) -> Result<TargetRecord> {
    state
        .store()
        .get_target(id)
        .await?
        .filter(|t| t.owner == caller.user)
        .ok_or_else(|| no_target(id))
}

fn no_target(id: Uuid) -> Error {
    Error::NotFound(format!("no notification target {id}"))
}

/// Removes a target, with its deliveries.
#[utoipa::path(
    delete, operation_id = "deleteNotificationTarget", path = "/api/v1/notification-targets/{id}",
    tag = "notifications",
    params(("id" = Uuid, Path, description = "The target")),
    responses(
        (status = 204, description = "Removed"),
        NoTarget,
    )
)]
async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<StatusCode> {
    let deleted = state.store().delete_target(id, &caller.user).await?;
    no_content_if(deleted, || no_target(id))
}

/// Sends a test notification (event `test`) to a target now, and answers
/// what came of it (also recorded with its deliveries).
#[utoipa::path(
    post, operation_id = "testNotificationTarget", path = "/api/v1/notification-targets/{id}/test",
    tag = "notifications",
    params(("id" = Uuid, Path, description = "The target")),
    responses(
        (status = 200, description = "The attempt (its outcome may be failed or gone)", body = Delivery),
        NoTarget,
        (status = 429, description = "More than 10 test notifications this minute (the caller's)"),
    )
)]
async fn test(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<Delivery>> {
    let target = own_target(&state, &caller, id).await?;
    state.outbox().check_test_rate(&caller.user)?;
    Ok(Json(Delivery::of(state.outbox().send_test(&target).await)))
}

/// A target's delivery attempts, newest first (the newest 200, kept 30
/// days).
#[utoipa::path(
    get, operation_id = "listNotificationDeliveries", path = "/api/v1/notification-targets/{id}/deliveries",
    tag = "notifications",
    params(("id" = Uuid, Path, description = "The target")),
    responses(
        (status = 200, description = "Its attempts", body = NotificationDeliveryList),
        NoTarget,
    )
)]
async fn deliveries(
    State(state): State<AppState>,
    caller: Caller,
    AppPath(id): AppPath<Uuid>,
) -> Result<Json<Page<Delivery>>> {
    own_target(&state, &caller, id).await?;
    let items = state
        .store()
        .list_attempts(id, MAX_ATTEMPTS_LISTED)
        .await?
        .into_iter()
        .map(Delivery::of)
        .collect();
    Ok(whole(items))
}

/// The gateway's VAPID public key, for `PushManager.subscribe`.
#[utoipa::path(
    get, operation_id = "vapidPublicKey", path = "/api/v1/notifications/vapid-public-key",
    tag = "notifications",
    responses((status = 200, description = "The key", body = VapidPublicKey))
)]
async fn vapid_public_key(State(state): State<AppState>, _caller: Caller) -> Json<VapidPublicKey> {
    Json(VapidPublicKey {
        public_key: state.outbox().vapid().public_b64.clone(),
    })
}
