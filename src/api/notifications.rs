//! `/api/v1/notification-targets`: where a user is notified (Web Push,
//! ntfy, a webhook, FCM), each target's deliveries, and a test send; and
//! `/api/v1/notifications/vapid-public-key` for `PushManager.subscribe`.
//! A user sees and manages only their own targets (another's is "not
//! found"); secrets and tokens are never listed back (a generated webhook
//! secret is shown once, at creation).

use axum::http::StatusCode;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{AppJson, Authed, Find, Visible};
use super::page::whole;
use super::responses::{no_content_if, NoTarget};
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::Page;
use crate::notify::guard::{self, Refusal};
use crate::notify::outbox::TargetConfig;
use crate::notify::{webhook, NotificationEvent};
use crate::store::notify::{AttemptRecord, TargetRecord};
use new_target::{CreateBody, Events};

mod new_target;

/// Targets one user may have.
const MAX_TARGETS: usize = 50;
/// Attempts `GET …/deliveries` answers (the newest).
const MAX_ATTEMPTS_LISTED: i64 = 200;

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
async fn list(Authed { state, caller }: Authed) -> Result<Json<Page<Target>>> {
    let items = state
        .store()
        .list_targets(&caller.user)
        .await?
        .iter()
        .map(Target::of)
        .collect();
    Ok(whole(items))
}

/// Checks a target URL (already of the document's pattern) against what
/// the operator allows, resolving its host.
async fn check_url(state: &AppState, url: &str, what: &str) -> Result<String> {
    let allow = state.config().notifications.allow_private_targets;
    match guard::check_url(url, allow).await {
        Ok(_) => Ok(url.to_owned()),
        Err(Refusal::Invalid(why)) => Err(Error::Unprocessable(format!("{what}: {why}"))),
        Err(Refusal::NotAllowed(why)) => Err(Error::Forbidden(format!("{what}: {why}"))),
        Err(Refusal::Unresolvable(why)) => Err(Error::conflict(
            "unresolvable_host",
            format!("{what}: {why}; try again once it does"),
        )),
    }
}

/// A key the document's pattern admitted, as stored: unpadded base64url.
fn key(value: &str) -> Result<String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map_err(|e| Error::Internal(anyhow::anyhow!("an admitted key does not decode: {e}")))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// Adds a notification target for the caller.
#[utoipa::path(
    post, operation_id = "createNotificationTarget", path = "/api/v1/notification-targets",
    tag = "notifications", request_body = CreateBody,
    responses(
        (status = 201, description = "Created (a generated webhook secret is shown this once)", body = Created),
        (status = 403, description = "The operator does not allow this target's address (`forbidden`): a plain `http://` URL, or a host that is or resolves to a loopback, private, link-local, CGNAT, unique-local, multicast, unspecified or metadata address (`notifications.allow_private_targets` allows them)"),
        (status = 409, description = "`not_configured`: kind `fcm` while the operator has not configured `[notifications.fcm]`; `unresolvable_host`: a URL's host does not resolve now; `too_many_targets`: the caller has 50 targets already"),
        (status = 422, description = "A body the schema refuses (`invalid_request`; `detail` names the member)"),
    )
)]
async fn create(
    Authed { state, caller }: Authed,
    AppJson(body): AppJson<CreateBody>,
) -> Result<(StatusCode, Json<Created>)> {
    let (label, events) = body.label_and_events();
    let label = label.map(|l| l.0.clone());
    let events = match events {
        None => NotificationEvent::ALL.to_vec(),
        Some(Events(names)) => {
            let mut chosen: Vec<NotificationEvent> = Vec::new();
            for event in names.iter().map(|name| name.event()) {
                if !chosen.contains(&event) {
                    chosen.push(event);
                }
            }
            chosen
        }
    };
    let events: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
    let mut generated = None;
    let config = match body {
        CreateBody::WebPush(b) => {
            let keys = &b.subscription.keys;
            TargetConfig::WebPush {
                endpoint: check_url(&state, &b.subscription.endpoint.0, "subscription.endpoint")
                    .await?,
                p256dh: key(&keys.p256dh.0)?,
                auth: key(&keys.auth.0)?,
            }
        }
        CreateBody::Ntfy(b) => TargetConfig::Ntfy {
            url: check_url(&state, &b.url.0, "url").await?,
            token: b.token.map(|t| t.0),
        },
        CreateBody::Webhook(b) => {
            let url = check_url(&state, &b.url.0, "url").await?;
            let secret = match b.secret {
                Some(secret) => secret.0,
                None => generated.insert(webhook::new_secret()).clone(),
            };
            TargetConfig::Webhook { url, secret }
        }
        CreateBody::Fcm(b) => {
            if !state.outbox().has_fcm() {
                return Err(Error::conflict(
                    "not_configured",
                    "kind fcm needs the operator to configure [notifications.fcm]",
                ));
            }
            TargetConfig::Fcm {
                device_token: b.device_token.0,
            }
        }
    };
    let existing = state.store().list_targets(&caller.user).await?;
    if existing.len() >= MAX_TARGETS {
        return Err(Error::conflict(
            "too_many_targets",
            format!("at most {MAX_TARGETS} notification targets per user: delete one first"),
        ));
    }
    let record = TargetRecord {
        id: Uuid::now_v7(),
        owner: caller.user.clone(),
        kind: config.kind().to_owned(),
        label,
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
impl Find for TargetRecord {
    async fn find(state: &AppState, caller: &Caller, id: Uuid) -> Result<TargetRecord> {
        state
            .store()
            .get_target(id)
            .await?
            .filter(|t| t.owner == caller.user)
            .ok_or_else(|| no_target(id))
    }
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
async fn remove(Visible { state, item, .. }: Visible<TargetRecord>) -> Result<StatusCode> {
    let deleted = state.store().delete_target(item.id, &item.owner).await?;
    no_content_if(deleted, || no_target(item.id))
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
    Visible {
        state,
        caller,
        item,
    }: Visible<TargetRecord>,
) -> Result<Json<Delivery>> {
    state.outbox().check_test_rate(&caller.user)?;
    Ok(Json(Delivery::of(state.outbox().send_test(&item).await)))
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
    Visible { state, item, .. }: Visible<TargetRecord>,
) -> Result<Json<Page<Delivery>>> {
    let items = state
        .store()
        .list_attempts(item.id, MAX_ATTEMPTS_LISTED)
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
async fn vapid_public_key(Authed { state, .. }: Authed) -> Json<VapidPublicKey> {
    Json(VapidPublicKey {
        public_key: state.outbox().vapid().public_b64.clone(),
    })
}
