//! The Web Push channel: one encrypted message to a browser's push
//! subscription (RFC 8030), its payload encrypted for the subscription
//! (RFC 8291, `Content-Encoding: aes128gcm`, by `web-push-native`) and the
//! request signed with the gateway's VAPID key (RFC 8292, an ES256 JWT by
//! `jsonwebtoken`).
//!
//! It knows nothing of sessions or targets: it is handed a subscription and
//! bytes, and says what came of sending them.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use super::vapid::VapidKeys;
use super::DeliveryOutcome;

/// The VAPID `sub` claim where nothing better is known: a contact for the
/// push service's operators. Apple's push service refuses a subject whose
/// host does not resolve (`localhost`, `.local`, `.invalid`: 403
/// `BadJwtToken`), while Google's and Mozilla's take it: give
/// [`deliver_as`] the subject [`subject_for`] makes of the gateway's
/// `notifications.base_url`.
pub const DEFAULT_SUBJECT: &str = "mailto:acp-gateway@localhost";

/// The VAPID subject for a gateway reachable at `base_url`: its `https://`
/// origin when it has one on a public-looking host, else [`DEFAULT_SUBJECT`].
pub fn subject_for(base_url: Option<&str>) -> String {
    let origin = base_url
        .and_then(|url| reqwest::Url::parse(url).ok())
        .filter(|url| url.scheme() == "https")
        .filter(|url| {
            let host = url.host_str().unwrap_or("").trim_end_matches('.');
            host.contains('.')
                && ![
                    "localhost",
                    ".local",
                    ".invalid",
                    ".test",
                    ".example",
                    ".internal",
                ]
                .iter()
                .any(|bad| host == bad.trim_start_matches('.') || host.ends_with(bad))
                && host.parse::<std::net::IpAddr>().is_err()
        })
        .map(|url| url.origin().ascii_serialization());
    origin.unwrap_or_else(|| DEFAULT_SUBJECT.to_string())
}

/// How long a VAPID JWT is valid (RFC 8292: at most 24 hours).
const JWT_LIFETIME_SECS: u64 = 12 * 60 * 60;

/// The largest plaintext one `aes128gcm` record of 4096 bytes can carry
/// (RFC 8291 §4).
pub const MAX_PAYLOAD: usize = 3993;

/// One push subscription, as the browser's `PushSubscription.toJSON()`
/// gives it.
pub struct Subscription<'a> {
    pub endpoint: &'a str,
    /// The browser's P-256 public key (base64url).
    pub p256dh: &'a str,
    /// The browser's 16-byte authentication secret (base64url).
    pub auth: &'a str,
}

/// One message to push.
pub struct Push<'a> {
    pub payload: &'a [u8],
    /// See [`topic_header`].
    pub topic: Option<&'a str>,
    pub ttl_seconds: u32,
}

/// Who pushes: the gateway's VAPID keys and the subject its JWTs name
/// (see [`subject_for`]; [`DEFAULT_SUBJECT`] where nothing better is known).
pub struct Sender<'a> {
    pub vapid: &'a VapidKeys,
    pub subject: &'a str,
}

/// Sends `push` encrypted to one push subscription, with the given client
/// (which carries the gateway's guard against private addresses).
///
/// Headers: `TTL: push.ttl_seconds`; `Topic` from `push.topic` (see [`topic_header`])
/// so the push service replaces an undelivered message with the same topic;
/// `Urgency: high` when the payload is a notification of a permission event
/// (a person is holding up an agent), `normal` otherwise.
///
/// 2xx is delivered; 404 and 410 say the subscription is gone; anything else,
/// or no answer, failed (with the start of the response body).
#[tracing::instrument(skip_all, fields(origin))]
pub async fn deliver_as(
    client: &reqwest::Client,
    sender: &Sender<'_>,
    to: &Subscription<'_>,
    push: &Push<'_>,
) -> DeliveryOutcome {
    let request = match build(sender, to, push) {
        Ok(request) => request,
        Err(error) => {
            return DeliveryOutcome::Failed {
                status: None,
                error: format!("{error:#}"),
            }
        }
    };
    tracing::Span::current().record("origin", request.audience.as_str());
    let mut builder = client
        .post(request.url)
        .header("TTL", request.ttl.to_string())
        .header("Content-Encoding", "aes128gcm")
        .header("Content-Type", "application/octet-stream")
        .header("Urgency", request.urgency)
        .header("Authorization", request.authorization)
        .body(request.body);
    if let Some(topic) = request.topic {
        builder = builder.header("Topic", topic);
    }
    outcome(builder.send().await).await
}

/// What [`deliver_as`] sends, made before anything goes out.
struct PushRequest {
    url: reqwest::Url,
    audience: String,
    authorization: String,
    ttl: u32,
    urgency: &'static str,
    topic: Option<String>,
    body: Vec<u8>,
}

fn build(sender: &Sender, to: &Subscription, push: &Push) -> anyhow::Result<PushRequest> {
    use anyhow::Context as _;
    let Push {
        payload,
        topic,
        ttl_seconds,
    } = *push;
    let Subscription {
        endpoint,
        p256dh,
        auth,
    } = *to;
    let url = reqwest::Url::parse(endpoint).context("the push endpoint is not a URL")?;
    anyhow::ensure!(
        matches!(url.scheme(), "https" | "http") && url.host().is_some(),
        "the push endpoint is not an http(s) URL"
    );
    anyhow::ensure!(
        payload.len() <= MAX_PAYLOAD,
        "the payload has {} bytes; Web Push carries at most {MAX_PAYLOAD}",
        payload.len()
    );
    let (ua_public, ua_auth) = subscription_keys(p256dh, auth)?;
    let body = web_push_native::encrypt(payload.to_vec(), &ua_public, &ua_auth)
        .map_err(|error| anyhow::anyhow!("encrypting the payload: {error}"))?;
    let audience = url.origin().ascii_serialization();
    let authorization = vapid_authorization(sender.vapid, &audience, sender.subject)?;
    Ok(PushRequest {
        url,
        audience,
        authorization,
        ttl: ttl_seconds,
        urgency: urgency(payload),
        topic: topic.map(topic_header),
        body,
    })
}

/// A subscription's keys as a browser hands them over (`p256dh`: a P-256
/// point; `auth`: 16 bytes; base64url). A target's keys are checked here,
/// when a payload is encrypted to them: their creation checks only what the
/// API document states (base64url, the sizes, an uncompressed point's first
/// byte), and a key that is no point of the curve makes a failed delivery.
fn subscription_keys(
    p256dh: &str,
    auth: &str,
) -> anyhow::Result<(web_push_native::p256::PublicKey, web_push_native::Auth)> {
    let point = decode_b64url(p256dh).ok_or_else(|| anyhow::anyhow!("p256dh is not base64url"))?;
    let public = web_push_native::p256::PublicKey::from_sec1_bytes(&point)
        .map_err(|_| anyhow::anyhow!("p256dh is not a P-256 public key"))?;
    let secret = decode_b64url(auth).ok_or_else(|| anyhow::anyhow!("auth is not base64url"))?;
    anyhow::ensure!(
        secret.len() == 16,
        "auth has {} bytes, not 16",
        secret.len()
    );
    Ok((public, web_push_native::Auth::clone_from_slice(&secret)))
}

/// Browsers give base64url without padding; some libraries pad, or use the
/// standard alphabet. All of them mean the same bytes.
fn decode_b64url(text: &str) -> Option<Vec<u8>> {
    let text: String = text
        .trim()
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    URL_SAFE_NO_PAD.decode(text).ok()
}

#[derive(Serialize)]
struct VapidClaims<'a> {
    aud: &'a str,
    exp: u64,
    sub: &'a str,
}

/// `vapid t=<JWT>, k=<public key>` (RFC 8292 §3).
fn vapid_authorization(vapid: &VapidKeys, audience: &str, subject: &str) -> anyhow::Result<String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let claims = VapidClaims {
        aud: audience,
        exp: now + JWT_LIFETIME_SECS,
        sub: subject,
    };
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    let token = jsonwebtoken::encode(&header, &claims, &vapid.signing_key()?)
        .map_err(|error| anyhow::anyhow!("signing the VAPID JWT: {error}"))?;
    Ok(format!("vapid t={token}, k={}", vapid.public_b64))
}

/// Web Push's `Topic` header: at most 32 characters of the base64url
/// alphabet (RFC 8030 §5.4). A key that is one already is sent as it is;
/// any other is replaced by the start of its SHA-256, base64url.
pub fn topic_header(key: &str) -> String {
    let fits = !key.is_empty()
        && key.len() <= 32
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if fits {
        return key.to_string();
    }
    let mut topic = URL_SAFE_NO_PAD.encode(Sha256::digest(key.as_bytes()));
    topic.truncate(32);
    topic
}

/// `high` for a notification of a permission event (an agent waits for a
/// person), `normal` for anything else, a payload that is no notification
/// included.
fn urgency(payload: &[u8]) -> &'static str {
    #[derive(serde::Deserialize)]
    struct Event {
        event: Option<String>,
    }
    match serde_json::from_slice::<Event>(payload) {
        Ok(Event { event: Some(event) })
            if matches!(event.as_str(), "permission_waiting" | "permission_reminder") =>
        {
            "high"
        }
        _ => "normal",
    }
}

/// What the push service's answer comes to.
async fn outcome(response: reqwest::Result<reqwest::Response>) -> DeliveryOutcome {
    let response = match response {
        Ok(response) => response,
        Err(error) => return super::http::unanswered(error),
    };
    let status = response.status().as_u16();
    match status {
        200..=299 => DeliveryOutcome::Delivered { status },
        404 | 410 => DeliveryOutcome::Gone { status },
        _ => DeliveryOutcome::Failed {
            status: Some(status),
            error: body_start(response).await,
        },
    }
}

/// The first 200 characters of a response body, for the delivery record.
pub(crate) async fn body_start(response: reqwest::Response) -> String {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let text: String = text.trim().chars().take(200).collect();
    if text.is_empty() {
        status.to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_fits_rfc_8030_whatever_the_key() {
        assert_eq!(topic_header("conv-1_A"), "conv-1_A");
        for key in [
            "conversation:0192f1a4-7c3e-7d2a-9b1e-3f4a5b6c7d8e",
            "a b",
            "",
            &"x".repeat(33),
        ] {
            let topic = topic_header(key);
            assert_eq!(topic.len(), 32, "{key:?}");
            assert!(topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        }
        assert_ne!(topic_header("a:1"), topic_header("a:2"));
    }

    #[test]
    fn the_subject_is_the_gateways_public_https_origin_when_it_has_one() {
        assert_eq!(
            subject_for(Some("https://gateway.acme.com:8443/acp/")),
            "https://gateway.acme.com:8443"
        );
        for base in [
            None,
            Some("http://gateway.acme.com"),
            Some("https://localhost:8080"),
            Some("https://box.local"),
            Some("https://10.0.0.1"),
            Some("not a url"),
        ] {
            assert_eq!(subject_for(base), DEFAULT_SUBJECT, "{base:?}");
        }
    }

    #[test]
    fn permission_events_are_urgent_and_the_rest_normal() {
        assert_eq!(urgency(br#"{"event":"permission_waiting"}"#), "high");
        assert_eq!(urgency(br#"{"event":"permission_reminder","x":1}"#), "high");
        assert_eq!(urgency(br#"{"event":"turn_ended"}"#), "normal");
        assert_eq!(urgency(b"hello"), "normal");
    }

    #[test]
    fn a_malformed_subscription_or_endpoint_fails_before_sending() {
        let vapid = super::super::vapid::generate();
        let good_key = vapid.public_b64.clone();
        let good_auth = URL_SAFE_NO_PAD.encode([7u8; 16]);
        let build = |endpoint: &str, key: &str, auth: &str, len: usize| {
            let sender = Sender {
                vapid: &vapid,
                subject: DEFAULT_SUBJECT,
            };
            let to = Subscription {
                endpoint,
                p256dh: key,
                auth,
            };
            let payload = vec![b'x'; len];
            let push = Push {
                payload: &payload,
                topic: None,
                ttl_seconds: 60,
            };
            build(&sender, &to, &push)
        };
        let ok = build("https://push.example:8443/p/1", &good_key, &good_auth, 10).unwrap();
        assert_eq!(ok.audience, "https://push.example:8443");
        assert!(ok.authorization.starts_with("vapid t="));
        assert!(build("https://push.example/p", &good_key, &good_auth, MAX_PAYLOAD).is_ok());
        assert!(build(
            "https://push.example/p",
            &good_key,
            &good_auth,
            MAX_PAYLOAD + 1
        )
        .is_err());
        assert!(build("ftp://push.example/p", &good_key, &good_auth, 1).is_err());
        assert!(build("https://push.example/p", "AAAA", &good_auth, 1).is_err());
        assert!(build("https://push.example/p", &good_key, "AAAA", 1).is_err());
        // Padded standard base64 is the same key.
        let padded = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
        subscription_keys(&good_key, &padded).unwrap();
    }
}
