//! The FCM channel: native pushes to an app (a Flutter app, say) through
//! Firebase Cloud Messaging's HTTP v1 API, authorised with an OAuth 2 token
//! that the operator's service account earns (the JWT bearer grant, RFC
//! 7523, signed RS256 by `jsonwebtoken`).
//!
//! It knows nothing of sessions or targets: it is handed a device token and
//! a notification, and says what came of sending them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::render::headline;
use super::web_push::body_start;
use super::{DeliveryOutcome, Notification, NotificationEvent};
use crate::config::FcmConfig;

/// FCM's HTTP v1 API, unless `[notifications.fcm] api_base` says otherwise.
pub const DEFAULT_API_BASE: &str = "https://fcm.googleapis.com";
/// What the OAuth token may do: send messages, nothing else.
const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
/// A token is renewed this long before it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(5 * 60);
/// `apns-collapse-id` may have at most 64 bytes.
const MAX_COLLAPSE_KEY: usize = 64;
/// The most a message may carry, its notification's title and body and its
/// data (keys and values): FCM refuses a message with more (400).
pub const MAX_PAYLOAD: usize = 4000;

/// A sender for one Firebase project; cheap to clone, one token cache.
#[derive(Clone)]
pub struct Fcm {
    inner: Arc<Project>,
}

/// One Firebase project: its service account, where to send, and the
/// access token in use.
struct Project {
    client: reqwest::Client,
    project_id: String,
    client_email: String,
    private_key_id: Option<String>,
    key: jsonwebtoken::EncodingKey,
    token_uri: String,
    send_url: String,
    /// Held while a token is fetched, so one fetch runs at a time.
    token: tokio::sync::Mutex<Option<Token>>,
}

#[derive(Clone)]
struct Token {
    access_token: String,
    renew_at: Instant,
}

/// The fields of a service account's JSON key file that are used.
#[derive(Deserialize)]
struct ServiceAccount {
    project_id: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

impl Fcm {
    /// Reads the service account file named by `config`. `client` sends both
    /// the token requests and the messages.
    pub fn new(config: &FcmConfig, client: reqwest::Client) -> anyhow::Result<Fcm> {
        let file = &config.service_account_file;
        let text = std::fs::read_to_string(file).with_context(|| {
            format!(
                "Failed to read the FCM service account file {}",
                file.display()
            )
        })?;
        let account: ServiceAccount = serde_json::from_str(&text).with_context(|| {
            format!(
                "The FCM service account file {} is not a service account's JSON key",
                file.display()
            )
        })?;
        let field = |value: Option<String>, name: &str| {
            value.filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                anyhow::anyhow!(
                    "The FCM service account file {} has no `{name}`",
                    file.display()
                )
            })
        };
        let project_id = field(account.project_id, "project_id")?;
        let client_email = field(account.client_email, "client_email")?;
        let private_key = field(account.private_key, "private_key")?;
        let token_uri = field(account.token_uri, "token_uri")?;
        let key =
            jsonwebtoken::EncodingKey::from_rsa_pem(private_key.as_bytes()).with_context(|| {
                format!(
                    "The `private_key` of the FCM service account file {} is not an RSA key in PEM",
                    file.display()
                )
            })?;
        reqwest::Url::parse(&token_uri).with_context(|| {
            format!(
                "The `token_uri` of the FCM service account file {} is not a URL",
                file.display()
            )
        })?;
        let api_base = config.api_base.as_deref().unwrap_or(DEFAULT_API_BASE);
        let send_url = format!(
            "{}/v1/projects/{}/messages:send",
            api_base.trim_end_matches('/'),
            project_id
        );
        reqwest::Url::parse(&send_url)
            .with_context(|| format!("notifications.fcm.api_base {api_base:?} is not a URL"))?;
        Ok(Fcm {
            inner: Arc::new(Project {
                client,
                project_id,
                client_email,
                private_key_id: account.private_key_id,
                key,
                token_uri,
                send_url,
                token: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// The Firebase project messages go to.
    pub fn project_id(&self) -> &str {
        &self.inner.project_id
    }

    /// Sends `notification` to one app instance. `collapse_key`: a newer
    /// message with the same key replaces this one on the device (Android
    /// `collapse_key`, APNs `apns-collapse-id`).
    ///
    /// 2xx is delivered; 404 `UNREGISTERED`/`NOT_FOUND` says the device token
    /// is gone; 401 renews the OAuth token and tries once more; anything
    /// else failed.
    #[tracing::instrument(skip_all, fields(project = %self.inner.project_id))]
    pub async fn deliver(
        &self,
        device_token: &str,
        notification: &Notification,
        collapse_key: Option<&str>,
    ) -> DeliveryOutcome {
        let body = message(device_token, notification, collapse_key);
        let mut renewed = false;
        loop {
            let token = match self.token().await {
                Ok(token) => token,
                Err(failed) => return failed,
            };
            let response = self
                .inner
                .client
                .post(&self.inner.send_url)
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await;
            let response = match response {
                Ok(response) => response,
                Err(error) => return super::http::unanswered(error),
            };
            let status = response.status().as_u16();
            match status {
                200..=299 => return DeliveryOutcome::Delivered { status },
                401 if !renewed => {
                    tracing::info!("FCM refused the OAuth token; renewing it");
                    self.forget(&token).await;
                    renewed = true;
                }
                404 => {
                    let text = response.text().await.unwrap_or_default();
                    return if names_unregistered(&text) {
                        DeliveryOutcome::Gone { status }
                    } else {
                        DeliveryOutcome::Failed {
                            status: Some(status),
                            error: text.trim().chars().take(200).collect(),
                        }
                    };
                }
                _ => {
                    return DeliveryOutcome::Failed {
                        status: Some(status),
                        error: body_start(response).await,
                    }
                }
            }
        }
    }

    /// A valid access token: the cached one, or a new one (one fetch at a
    /// time: whoever waits for the lock finds the new token cached). Waiting
    /// for the lock behind a slow fetch counts against the attempt's bound
    /// (the outbox's `ATTEMPT`), which ends the wait.
    async fn token(&self) -> Result<String, DeliveryOutcome> {
        let mut cached = self.inner.token.lock().await;
        if let Some(token) = cached.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(token.access_token.clone());
        }
        let token = self.fetch_token().await?;
        let access_token = token.access_token.clone();
        *cached = Some(token);
        Ok(access_token)
    }

    /// Drops `used` from the cache (unless another caller replaced it).
    async fn forget(&self, used: &str) {
        let mut cached = self.inner.token.lock().await;
        if cached.as_ref().is_some_and(|t| t.access_token == used) {
            *cached = None;
        }
    }

    async fn fetch_token(&self) -> Result<Token, DeliveryOutcome> {
        let failed = |status: Option<u16>, error: String| DeliveryOutcome::Failed {
            status,
            error: format!("OAuth token: {error}"),
        };
        let assertion = self
            .assertion()
            .map_err(|error| failed(None, format!("{error:#}")))?;
        let asked = Instant::now();
        let response = self
            .inner
            .client
            .post(&self.inner.token_uri)
            .form(&[
                ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                ("assertion", assertion.as_str()),
            ])
            .send()
            .await
            .map_err(|error| failed(None, error.without_url().to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(failed(Some(status.as_u16()), body_start(response).await));
        }
        #[derive(Deserialize)]
        struct Granted {
            access_token: String,
            expires_in: Option<u64>,
        }
        let granted: Granted = response
            .json()
            .await
            .map_err(|error| failed(Some(status.as_u16()), error.without_url().to_string()))?;
        let lifetime = Duration::from_secs(granted.expires_in.unwrap_or(3600));
        Ok(Token {
            access_token: granted.access_token,
            renew_at: asked + lifetime.saturating_sub(RENEW_BEFORE),
        })
    }

    /// The JWT the service account proves itself with (an hour's validity).
    fn assertion(&self) -> anyhow::Result<String> {
        #[derive(Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            scope: &'a str,
            aud: &'a str,
            iat: u64,
            exp: u64,
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = Claims {
            iss: &self.inner.client_email,
            scope: SCOPE,
            aud: &self.inner.token_uri,
            iat: now,
            exp: now + 3600,
        };
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = self.inner.private_key_id.clone();
        jsonwebtoken::encode(&header, &claims, &self.inner.key)
            .context("signing the service account's JWT")
    }
}

/// Whether an FCM error body says the device token is no more: its
/// `errorCode` is `UNREGISTERED`, or its status `NOT_FOUND` (a 404 that is
/// no FCM error, from a wrong `api_base` say, does not disable targets).
fn names_unregistered(body: &str) -> bool {
    let Ok(body) = serde_json::from_str::<Value>(body) else {
        return false;
    };
    let error = &body["error"];
    error["status"] == "NOT_FOUND"
        || error["details"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["errorCode"] == "UNREGISTERED"))
}

/// Whether `notification` makes an FCM message within [`MAX_PAYLOAD`],
/// measured as the JSON of its `notification` and `data` (which counts more
/// than FCM does).
pub fn fits(notification: &Notification) -> bool {
    let (shown, data) = payload(notification);
    serde_json::to_vec(&json!({ "notification": shown, "data": data }))
        .is_ok_and(|json| json.len() <= MAX_PAYLOAD)
}

/// The FCM v1 message for `notification`: the shade's title and body, and
/// the notification's fields as `data` (FCM wants a map of strings; the
/// actions go as one JSON string). A notification that does not fit (one
/// stored by an older version) is shortened first.
fn message(device_token: &str, notification: &Notification, collapse_key: Option<&str>) -> Value {
    let fitted;
    let notification = if fits(notification) {
        notification
    } else {
        let mut shorter = notification.clone();
        super::fit::fit(&mut shorter, fits);
        fitted = shorter;
        &fitted
    };
    let (shown, data) = payload(notification);
    let urgent = matches!(
        notification.event,
        NotificationEvent::PermissionWaiting | NotificationEvent::PermissionReminder
    );
    let mut android = json!({ "priority": if urgent { "high" } else { "normal" } });
    let mut apns_headers = json!({ "apns-priority": if urgent { "10" } else { "5" } });
    if let Some(key) = collapse_key {
        let key = short_collapse_key(key);
        android["collapse_key"] = json!(key);
        apns_headers["apns-collapse-id"] = json!(key);
    }
    json!({
        "message": {
            "token": device_token,
            "notification": shown,
            "data": data,
            "android": android,
            "apns": { "headers": apns_headers },
        }
    })
}

/// What an FCM message carries of `notification`: the shade's title and
/// body, and the data.
fn payload(notification: &Notification) -> (Value, Map<String, Value>) {
    let (title, body) = headline(notification);
    let mut data = Map::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            data.insert(key.to_string(), Value::String(value));
        }
    };
    put("event", Some(notification.event.as_str().to_string()));
    put("delivery_id", Some(notification.delivery_id.to_string()));
    put("at", Some(notification.at.to_rfc3339()));
    put("user", Some(notification.user.clone()));
    put("count", Some(notification.count.to_string()));
    if let Some(c) = &notification.conversation {
        put("conversation_id", Some(c.id.to_string()));
        put("conversation_title", c.title.clone());
        put("agent", Some(c.agent.clone()));
    }
    if let Some(r) = &notification.request {
        put("request_id", Some(r.id.to_string()));
        put("request_title", r.title.clone());
        put("request_kind", r.kind.clone());
        put("command", r.command.clone());
    }
    if let Some(t) = &notification.turn {
        put("turn_id", Some(t.id.to_string()));
        put("stop_reason", t.stop_reason.clone());
        put("summary", t.summary.clone());
    }
    put(
        "actions",
        Some(serde_json::to_string(&notification.actions).unwrap_or_else(|_| "[]".into())),
    );
    (json!({ "title": title, "body": body }), data)
}

/// A collapse key within APNs' 64 bytes: as it is when it fits, else a
/// SHA-256 of it.
fn short_collapse_key(key: &str) -> String {
    if key.len() <= MAX_COLLAPSE_KEY {
        return key.to_string();
    }
    use base64::Engine as _;
    use sha2::Digest as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(key.as_bytes()))
}

/// Checks a service account file as [`Fcm::new`] would, without a client
/// (e.g. at start-up, so a bad file fails early and names itself).
pub fn check_service_account(path: &Path) -> anyhow::Result<()> {
    Fcm::new(
        &FcmConfig {
            service_account_file: path.to_path_buf(),
            api_base: None,
        },
        super::guard::client(false)?,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::Action;

    #[test]
    fn the_message_carries_the_headline_strings_and_collapse_keys() {
        let n = Notification {
            budget: None,
            actions: vec![Action {
                label: "Allow once".into(),
                option_id: "allow".into(),
                url: "https://g/a/1".into(),
            }],
            ..crate::notify::sample(NotificationEvent::PermissionWaiting, 1)
        };
        let m = message("dev", &n, Some(&"k".repeat(80)));
        let m = &m["message"];
        assert_eq!(m["token"], "dev");
        assert_eq!(
            m["notification"]["title"],
            "Claude Code asks: Run rm -rf build"
        );
        assert!(m["data"]
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_string));
        assert!(m["data"].get("command").is_none());
        let actions: Vec<Action> =
            serde_json::from_str(m["data"]["actions"].as_str().unwrap()).unwrap();
        assert_eq!(actions, n.actions);
        assert_eq!(m["android"]["priority"], "high");
        assert_eq!(m["apns"]["headers"]["apns-priority"], "10");
        let key = m["apns"]["headers"]["apns-collapse-id"].as_str().unwrap();
        assert!(key.len() <= MAX_COLLAPSE_KEY);
        assert_eq!(m["android"]["collapse_key"], key);
        assert!(message("dev", &n, None)["message"]["android"]
            .get("collapse_key")
            .is_none());
    }

    #[test]
    fn only_an_fcm_error_naming_the_token_unregistered_means_gone() {
        assert!(names_unregistered(
            r#"{"error": {"code": 404, "status": "NOT_FOUND", "details": [{"errorCode": "UNREGISTERED"}]}}"#
        ));
        assert!(names_unregistered(
            r#"{"error": {"code": 404, "details": [{"errorCode": "UNREGISTERED"}]}}"#
        ));
        assert!(!names_unregistered("<html>404 Not Found</html>"));
        assert!(!names_unregistered(
            r#"{"error": {"status": "PERMISSION_DENIED"}}"#
        ));
    }

    #[test]
    fn a_service_account_file_missing_a_field_is_named_with_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.json");
        std::fs::write(&path, r#"{"project_id": "p", "client_email": "a@b"}"#).unwrap();
        let error = format!("{:#}", check_service_account(&path).unwrap_err());
        assert!(error.contains("sa.json"), "{error}");
        assert!(error.contains("`private_key`"), "{error}");
        let error = format!(
            "{:#}",
            check_service_account(&dir.path().join("none")).unwrap_err()
        );
        assert!(error.contains("Failed to read"), "{error}");
        std::fs::write(
            &path,
            r#"{"project_id": "p", "client_email": "a@b", "private_key": "nope", "token_uri": "https://t"}"#,
        )
        .unwrap();
        let error = format!("{:#}", check_service_account(&path).unwrap_err());
        assert!(error.contains("not an RSA key"), "{error}");
    }
}
