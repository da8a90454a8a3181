//! The body of `POST /api/v1/notification-targets`: one object per kind,
//! each with only its own members, and every rule on a member stated once,
//! here, for both sides: the OpenAPI document's schema (`pattern`,
//! `minLength`, `maxLength`, `enum`, `minItems`, `additionalProperties:
//! false`) and the check made when a body is read, from the same
//! constants. A body the document calls valid is read; one it calls
//! invalid is refused (422) before anything else happens.
//!
//! What the document cannot know is left to the handler, with statuses of
//! their own: whether the operator allows an address (plain `http://`, a
//! private one), whether a host resolves, whether `[notifications.fcm]` is
//! configured, whether the caller has room for another target.
//!
//! The patterns are ECMA-262 and Rust `regex` alike: ASCII classes and
//! `\uXXXX` escapes only, anchored, no lookaround.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use utoipa::openapi::schema::{Discriminator, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::notify::NotificationEvent;

/// A target URL's longest form, in characters (ASCII: the pattern admits no
/// other).
const MAX_URL: usize = 2048;

/// `0` to `255`, no leading zeros (the URL parser would read `010` as
/// octal).
macro_rules! dec_octet {
    () => {
        "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    };
}
macro_rules! ipv4 {
    () => {
        concat!(dec_octet!(), "(?:\\.", dec_octet!(), "){3}")
    };
}
macro_rules! h16 {
    () => {
        "[0-9A-Fa-f]{1,4}"
    };
}
macro_rules! ls32 {
    () => {
        concat!("(?:", h16!(), ":", h16!(), "|", ipv4!(), ")")
    };
}
/// RFC 3986's `IPv6address`, without zone.
macro_rules! ipv6 {
    () => {
        concat!(
            "(?:",
            "(?:",
            h16!(),
            ":){6}",
            ls32!(),
            "|::(?:",
            h16!(),
            ":){5}",
            ls32!(),
            "|(?:",
            h16!(),
            ")?::(?:",
            h16!(),
            ":){4}",
            ls32!(),
            "|(?:(?:",
            h16!(),
            ":)?",
            h16!(),
            ")?::(?:",
            h16!(),
            ":){3}",
            ls32!(),
            "|(?:(?:",
            h16!(),
            ":){0,2}",
            h16!(),
            ")?::(?:",
            h16!(),
            ":){2}",
            ls32!(),
            "|(?:(?:",
            h16!(),
            ":){0,3}",
            h16!(),
            ")?::",
            h16!(),
            ":",
            ls32!(),
            "|(?:(?:",
            h16!(),
            ":){0,4}",
            h16!(),
            ")?::",
            ls32!(),
            "|(?:(?:",
            h16!(),
            ":){0,5}",
            h16!(),
            ")?::",
            h16!(),
            "|(?:(?:",
            h16!(),
            ":){0,6}",
            h16!(),
            ")?::",
            ")"
        )
    };
}
/// One label of a host name: letters, digits and inner hyphens, at most 63,
/// and not `--` in its third and fourth places (RFC 5891's reserved form:
/// `xn--` labels are IDNA A-labels, which the URL parser decodes and may
/// refuse).
macro_rules! dns_label {
    ($first:literal) => {
        concat!(
            "(?:",
            $first,
            "[A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,58}[A-Za-z0-9]",
            "|",
            $first,
            "(?:[A-Za-z0-9-]{0,2}[A-Za-z0-9])?",
            ")"
        )
    };
}
/// A host name whose last label starts with a letter (one that ends in a
/// number is read as an IPv4 address).
macro_rules! host_name {
    () => {
        concat!(
            "(?:",
            dns_label!("[A-Za-z0-9]"),
            "\\.)*",
            dns_label!("[A-Za-z]")
        )
    };
}
macro_rules! authority {
    () => {
        concat!(
            "^https?://(?:",
            host_name!(),
            "|",
            ipv4!(),
            "|\\[",
            ipv6!(),
            "\\])",
            "(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}|0))?"
        )
    };
}
/// What a path or query may hold: RFC 3986's unreserved and sub-delims,
/// `:`, `@`, `%` (the URL parser keeps them as they are), and `/` (the
/// hyphen first: a class's literal one).
macro_rules! path_chars {
    () => {
        "-A-Za-z0-9._~!$&'()*+,;=:@%/"
    };
}

/// `http(s)://host[:port][/path][?query]`. (Path and query are one
/// class, repeated: a generator can make one of any length in no time.)
const TARGET_URL: &str = concat!(authority!(), "(?:[/?][", path_chars!(), "?]*)?$");
/// The same, its last path segment an ntfy topic.
const NTFY_URL: &str = concat!(
    authority!(),
    "(?:/[",
    path_chars!(),
    "]*)?/[A-Za-z0-9_-]{1,64}/?(?:\\?[",
    path_chars!(),
    "?]*)?$"
);
/// Printable ASCII, no space.
const VISIBLE_ASCII: &str = "^[!-~]*$";
/// No control character (Unicode's `Cc`: what `char::is_control` says).
const NO_CONTROL: &str = r"^[^\u0000-\u001F\u007F-\u009F]*$";
/// base64url of 65 bytes, the first 0x04 (an uncompressed P-256 point);
/// unpadded, or padded with its one `=`.
const P256DH: &str = "^B[A-P][A-Za-z0-9_-]{84}[AEIMQUYcgkosw048]=?$";
/// base64url of 16 bytes; unpadded, or padded with its `==`.
const AUTH: &str = "^[A-Za-z0-9_-]{21}[AQgw](?:==)?$";

/// A string member's rule: its schema and its check.
struct StringRule {
    description: &'static str,
    pattern: &'static str,
    min: usize,
    max: usize,
    /// What the refusal says (after the member's path).
    refusal: &'static str,
}

impl StringRule {
    fn schema(&self) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(self.description))
            .min_length((self.min > 0).then_some(self.min))
            .max_length(Some(self.max))
            .pattern(Some(self.pattern))
            .into()
    }

    fn admits(&self, regex: &Regex, value: &str) -> bool {
        let n = value.chars().count();
        (self.min..=self.max).contains(&n) && regex.is_match(value)
    }
}

/// A string checked by its [`StringRule`] when read; its schema states the
/// same rule.
macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident as $schema:literal, $rule:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name(pub String);

        impl $name {
            const RULE: StringRule = $rule;

            fn regex() -> &'static Regex {
                static REGEX: LazyLock<Regex> =
                    LazyLock::new(|| Regex::new($name::RULE.pattern).expect("a valid pattern"));
                &REGEX
            }

            /// Whether the rule admits `value`.
            pub fn admits(value: &str) -> bool {
                Self::RULE.admits(Self::regex(), value)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = String::deserialize(deserializer)?;
                if !Self::admits(&value) {
                    return Err(D::Error::custom(Self::RULE.refusal));
                }
                Ok($name(value))
            }
        }

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                Self::RULE.schema()
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($schema)
            }
        }
    };
}

checked_string!(
    /// Where a webhook is POSTed, or a push service's endpoint.
    TargetUrl as "NotificationTargetUrl",
    StringRule {
        description: "`http(s)://host[:port][/path][?query]`, at most 2048 characters: a host \
            name (letters, digits, inner hyphens; its last label starting with a letter; no `--` \
            in a label's third and fourth places, so no `xn--` labels), an IPv4 address (no \
            leading zeros) or an IPv6 one in brackets; no credentials, no fragment; path and \
            query of RFC 3986's unreserved and sub-delims characters, `:`, `@`, `%`, `/` and \
            `?`. Plain `http://`, and hosts that are or resolve to loopback, private, \
            link-local or metadata addresses, only where the operator allows them (else 403).",
        pattern: TARGET_URL,
        min: 0,
        max: MAX_URL,
        refusal: "must be http(s)://host[:port][/path][?query] (a host name, an IPv4 address or \
            a bracketed IPv6 one; no credentials, no fragment; at most 2048 characters)",
    }
);

checked_string!(
    /// An ntfy topic's URL.
    NtfyUrl as "NtfyTopicUrl",
    StringRule {
        description: "`https://server[/path]/TOPIC`, TOPIC 1 to 64 of `[A-Za-z0-9_-]`; \
            otherwise as a `NotificationTargetUrl`.",
        pattern: NTFY_URL,
        min: 0,
        max: MAX_URL,
        refusal: "must be http(s)://host[:port][/path]/TOPIC, the topic 1 to 64 characters of \
            [A-Za-z0-9_-] (no credentials, no fragment; at most 2048 characters)",
    }
);

checked_string!(
    /// A target's label.
    Label as "NotificationTargetLabel",
    StringRule {
        description: "One line, at most 200 characters, no control characters.",
        pattern: NO_CONTROL,
        min: 0,
        max: 200,
        refusal: "must be at most 200 characters without control characters (one line)",
    }
);

checked_string!(
    /// An ntfy access token.
    NtfyToken as "NtfyAccessToken",
    StringRule {
        description: "An ntfy access token, sent as `Authorization: Bearer`: 1 to 512 \
            printable ASCII characters, no space.",
        pattern: VISIBLE_ASCII,
        min: 1,
        max: 512,
        refusal: "must be 1 to 512 printable ASCII characters without spaces",
    }
);

checked_string!(
    /// A webhook's signing secret.
    WebhookSecret as "WebhookSecret",
    StringRule {
        description: "The signing secret: 16 to 256 printable ASCII characters, no space. \
            Left out: one is generated (32 random bytes, hex) and answered once.",
        pattern: VISIBLE_ASCII,
        min: 16,
        max: 256,
        refusal: "must be 16 to 256 printable ASCII characters without spaces",
    }
);

checked_string!(
    /// An FCM registration token.
    DeviceToken as "FcmDeviceToken",
    StringRule {
        description: "The app's FCM registration token: 1 to 4096 printable ASCII \
            characters, no space.",
        pattern: VISIBLE_ASCII,
        min: 1,
        max: 4096,
        refusal: "must be 1 to 4096 printable ASCII characters without spaces",
    }
);

checked_string!(
    /// A push subscription's public key.
    P256dh as "PushP256dhKey",
    StringRule {
        description: "base64url of the subscription's P-256 public key: 65 bytes, the \
            uncompressed point (first byte 4), so 87 characters (88 padded with `=`). Whether \
            it is a point of the curve shows when a notification is encrypted to it (a failed \
            delivery).",
        pattern: P256DH,
        min: 87,
        max: 88,
        refusal: "must be base64url of 65 bytes, the first 0x04 (an uncompressed P-256 point)",
    }
);

checked_string!(
    /// A push subscription's authentication secret.
    Auth as "PushAuthSecret",
    StringRule {
        description: "base64url of the subscription's 16-byte authentication secret: 22 \
            characters (24 padded with `==`).",
        pattern: AUTH,
        min: 22,
        max: 24,
        refusal: "must be base64url of 16 bytes",
    }
);

/// What a target may be notified of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ToSchema)]
#[schema(as = NotificationEventName, rename_all = "snake_case")]
pub enum EventName {
    PermissionWaiting,
    PermissionReminder,
    TurnEnded,
    AgentFailed,
    QueueHeld,
    BudgetWarning,
    BudgetExceeded,
}

impl EventName {
    const ALL: [EventName; 7] = [
        EventName::PermissionWaiting,
        EventName::PermissionReminder,
        EventName::TurnEnded,
        EventName::AgentFailed,
        EventName::QueueHeld,
        EventName::BudgetWarning,
        EventName::BudgetExceeded,
    ];

    pub fn event(self) -> NotificationEvent {
        match self {
            EventName::PermissionWaiting => NotificationEvent::PermissionWaiting,
            EventName::PermissionReminder => NotificationEvent::PermissionReminder,
            EventName::TurnEnded => NotificationEvent::TurnEnded,
            EventName::AgentFailed => NotificationEvent::AgentFailed,
            EventName::QueueHeld => NotificationEvent::QueueHeld,
            EventName::BudgetWarning => NotificationEvent::BudgetWarning,
            EventName::BudgetExceeded => NotificationEvent::BudgetExceeded,
        }
    }

    fn named(name: &str) -> Option<EventName> {
        Self::ALL.into_iter().find(|e| e.event().as_str() == name)
    }
}

/// Which events a target gets: at least one (a name twice counts once).
#[derive(Debug, Clone)]
pub struct Events(pub Vec<EventName>);

impl<'de> Deserialize<'de> for Events {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        if names.is_empty() {
            return Err(D::Error::custom("must name at least one event"));
        }
        let events = names.iter().map(|name| {
            EventName::named(name).ok_or_else(|| {
                D::Error::custom(format_args!(
                    "names {name:?}: not one of permission_waiting, permission_reminder, \
                     turn_ended, agent_failed, queue_held, budget_warning, budget_exceeded"
                ))
            })
        });
        Ok(Events(events.collect::<Result<_, _>>()?))
    }
}

impl PartialSchema for Events {
    fn schema() -> RefOr<Schema> {
        utoipa::openapi::schema::ArrayBuilder::new()
            .items(Ref::from_schema_name(EventName::name()))
            .min_items(Some(1))
            .description(Some(
                "Which events the target gets (default: all); a name given twice counts once.",
            ))
            .into()
    }
}

impl ToSchema for Events {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("NotificationTargetEvents")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((EventName::name().into_owned(), EventName::schema()));
    }
}

/// The kind: `web_push`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebPushKind {
    WebPush,
}

/// The kind: `ntfy`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NtfyKind {
    Ntfy,
}

/// The kind: `webhook`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookKind {
    Webhook,
}

/// The kind: `fcm`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FcmKind {
    Fcm,
}

/// A browser's Push API subscription (`PushSubscription.toJSON()`); other
/// members are ignored.
#[derive(Deserialize, ToSchema)]
#[schema(as = PushSubscription)]
pub struct Subscription {
    pub endpoint: TargetUrl,
    pub keys: SubscriptionKeys,
    /// Ignored (browsers send it).
    #[serde(default, rename = "expirationTime")]
    #[allow(dead_code)]
    expiration_time: Option<serde_json::Value>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PushSubscriptionKeys)]
pub struct SubscriptionKeys {
    pub p256dh: P256dh,
    pub auth: Auth,
}

/// A browser (Web Push).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewWebPushTarget)]
pub struct WebPushBody {
    #[schema(inline)]
    #[allow(dead_code)]
    kind: WebPushKind,
    pub subscription: Subscription,
    pub label: Option<Label>,
    pub events: Option<Events>,
}

/// An ntfy topic.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewNtfyTarget)]
pub struct NtfyBody {
    #[schema(inline)]
    #[allow(dead_code)]
    kind: NtfyKind,
    pub url: NtfyUrl,
    pub token: Option<NtfyToken>,
    pub label: Option<Label>,
    pub events: Option<Events>,
}

/// A webhook, its bodies signed with the secret.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewWebhookTarget)]
pub struct WebhookBody {
    #[schema(inline)]
    #[allow(dead_code)]
    kind: WebhookKind,
    pub url: TargetUrl,
    pub secret: Option<WebhookSecret>,
    pub label: Option<Label>,
    pub events: Option<Events>,
}

/// An app, through Firebase Cloud Messaging (where the operator configured
/// `[notifications.fcm]`; else 409 `not_configured`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewFcmTarget)]
pub struct FcmBody {
    #[schema(inline)]
    #[allow(dead_code)]
    kind: FcmKind,
    pub device_token: DeviceToken,
    pub label: Option<Label>,
    pub events: Option<Events>,
}

/// A new target, by its `kind`.
pub enum CreateBody {
    WebPush(WebPushBody),
    Ntfy(NtfyBody),
    Webhook(WebhookBody),
    Fcm(FcmBody),
}

/// The kinds, each with its schema's name.
const KINDS: [(&str, &str); 4] = [
    ("web_push", "NewWebPushTarget"),
    ("ntfy", "NewNtfyTarget"),
    ("webhook", "NewWebhookTarget"),
    ("fcm", "NewFcmTarget"),
];

impl CreateBody {
    /// The members every kind has.
    pub fn label_and_events(&self) -> (Option<&Label>, Option<&Events>) {
        match self {
            CreateBody::WebPush(b) => (b.label.as_ref(), b.events.as_ref()),
            CreateBody::Ntfy(b) => (b.label.as_ref(), b.events.as_ref()),
            CreateBody::Webhook(b) => (b.label.as_ref(), b.events.as_ref()),
            CreateBody::Fcm(b) => (b.label.as_ref(), b.events.as_ref()),
        }
    }
}

impl<'de> Deserialize<'de> for CreateBody {
    /// By `kind`, then as that kind's object (so a member of another kind
    /// is an unknown field).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let Some(object) = value.as_object() else {
            return Err(D::Error::custom("expected an object with a kind"));
        };
        let kind = match object.get("kind") {
            None => return Err(D::Error::missing_field("kind")),
            Some(kind) => kind.as_str().unwrap_or_default().to_owned(),
        };
        fn read<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
            serde_path_to_error::deserialize(value).map_err(|e| match e.path().to_string() {
                path if path == "." => e.inner().to_string(),
                path => format!("{path}: {}", e.inner()),
            })
        }
        let body = match kind.as_str() {
            "web_push" => read(value).map(CreateBody::WebPush),
            "ntfy" => read(value).map(CreateBody::Ntfy),
            "webhook" => read(value).map(CreateBody::Webhook),
            "fcm" => read(value).map(CreateBody::Fcm),
            _ => {
                return Err(D::Error::custom(format_args!(
                    "kind: must be one of web_push, ntfy, webhook, fcm (not {})",
                    object["kind"]
                )))
            }
        };
        body.map_err(|e| D::Error::custom(format_args!("(kind {kind}) {e}")))
    }
}

impl PartialSchema for CreateBody {
    fn schema() -> RefOr<Schema> {
        KINDS
            .iter()
            .fold(OneOfBuilder::new(), |one_of, (_, schema)| {
                one_of.item(Ref::from_schema_name(*schema))
            })
            .discriminator(Some(Discriminator::with_mapping(
                "kind",
                KINDS.map(|(kind, schema)| (kind, format!("#/components/schemas/{schema}"))),
            )))
            .description(Some(
                "A new target: `kind` says which, and which members it takes (no other).",
            ))
            .into()
    }
}

impl ToSchema for CreateBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("NewNotificationTarget")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        fn add<T: ToSchema>(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((T::name().into_owned(), T::schema()));
            T::schemas(schemas);
        }
        add::<WebPushBody>(schemas);
        add::<NtfyBody>(schemas);
        add::<WebhookBody>(schemas);
        add::<FcmBody>(schemas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url_admitted(url: &str) -> bool {
        TargetUrl::admits(url)
    }

    /// Whatever the pattern admits, the URL parser takes, as the same
    /// host: the handler's later checks never meet an unparsable URL.
    #[test]
    fn admitted_urls_parse() {
        for url in [
            "https://example.com",
            "https://example.com/",
            "https://a.b.example.com:8443/hook/x?y=1&z=%20",
            "http://localhost:9/x",
            "https://127.0.0.1/",
            "https://93.184.216.34:65535/",
            "https://[::1]/",
            "https://[2001:db8::1]:443/push",
            "https://[::ffff:1.2.3.4]/",
            "https://[1:2:3:4:5:6:7:8]/",
            "https://[1::]/",
            "https://fcm.googleapis.com/fcm/send/abc:APA91bHun4MxP5egoKMwt2KZFBaFUH-1RYqx",
            "https://updates.push.services.mozilla.com/wpush/v2/gAAAAABh_x-y=",
            "https://wns2-par02p.notify.windows.com/w/?token=BQYAAA%2b",
            "https://a1-b.c/",
            "https://x.a/%2e%2e/y",
            "https://x.a/%zz?a/b?c",
            "https://x.a?q",
        ] {
            assert!(url_admitted(url), "{url}");
            let parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(parsed.host().is_some(), "{url}");
        }
    }

    #[test]
    fn urls_the_parser_would_refuse_or_change_are_not_admitted() {
        for url in [
            "",
            "example.com",
            "ftp://example.com/",
            "https://",
            "https://u:p@example.com/",
            "https://@example.com/",
            "https://example.com/#x",
            "https://example.com:65536/",
            "https://example.com:/",
            "https://xn--a.com/",
            "https://XN--bcher-kva.com/",
            "https://ab--cd.com/",
            "https://-a.com/",
            "https://a-.com/",
            "https://a.1/",
            "https://1.2.3/",
            "https://a.0x1/",
            "https://256.1.1.1/",
            "https://010.0.0.1/",
            "https://[::1%25eth0]/",
            "https://[1:2:3:4:5:6:7:8:9]/",
            "https://[:::]/",
            "https://example.com/a b",
            "https://example.com/a\\b",
            "https://example.com/\n",
            "https://example.com/<script>",
            "https://example.com/\"",
            "https://example.com\n",
        ] {
            assert!(!url_admitted(url), "{url:?}");
        }
        assert!(!url_admitted(&format!(
            "https://example.com/{}",
            "a".repeat(MAX_URL)
        )));
    }

    #[test]
    fn an_ntfy_url_ends_in_a_topic() {
        for url in [
            "https://ntfy.sh/my-topic",
            "https://ntfy.sh/my-topic/",
            "https://ntfy.example:8080/base/path/Topic_1?x=1",
            "https://ntfy.sh/a/../topic",
        ] {
            assert!(NtfyUrl::admits(url), "{url}");
            crate::notify::ntfy::split_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        for url in [
            "https://ntfy.sh",
            "https://ntfy.sh/",
            "https://ntfy.sh/a.b",
            "https://ntfy.sh/topic/..",
            "https://ntfy.sh/topic//",
            &format!("https://ntfy.sh/{}", "a".repeat(65)),
        ] {
            assert!(!NtfyUrl::admits(url), "{url}");
        }
    }

    #[test]
    fn keys_are_base64url_of_their_sizes() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let point = crate::notify::vapid::generate().public_b64;
        assert!(P256dh::admits(&point), "{point}");
        assert!(P256dh::admits(&format!("{point}=")));
        assert!(!P256dh::admits(&format!("{point}==")));
        assert!(!P256dh::admits(&format!("A{}", &point[1..])));
        let auth = URL_SAFE_NO_PAD.encode([7u8; 16]);
        assert!(Auth::admits(&auth), "{auth}");
        assert!(Auth::admits(&format!("{auth}==")));
        assert!(!Auth::admits(&format!("{auth}=")));
        // The standard alphabet is not base64url.
        assert!(!Auth::admits(&format!("{}+/A", "A".repeat(19))));
        // What the pattern admits decodes to exactly the bytes it says.
        for last in ['A', 'E', '8', 'w'] {
            let key = format!("BA{}{last}", "x".repeat(84));
            assert!(P256dh::admits(&key));
            let bytes = URL_SAFE_NO_PAD.decode(&key).unwrap();
            assert_eq!((bytes.len(), bytes[0]), (65, 4));
        }
        for last in ['B', 'F', '9', 'x'] {
            let key = format!("BA{}{last}", "x".repeat(84));
            assert!(!P256dh::admits(&key), "{key}");
        }
        for last in ['A', 'Q', 'g', 'w'] {
            let key = format!("{}{last}", "-".repeat(21));
            assert!(Auth::admits(&key));
            assert_eq!(URL_SAFE_NO_PAD.decode(&key).unwrap().len(), 16);
        }
    }

    #[test]
    fn the_documented_event_names_are_the_ones_read() {
        let schema = serde_json::to_value(EventName::schema()).unwrap();
        let names: Vec<&str> = EventName::ALL.iter().map(|e| e.event().as_str()).collect();
        assert_eq!(schema["enum"], serde_json::json!(names));
        assert_eq!(
            NotificationEvent::ALL.map(|e| e.as_str()).to_vec(),
            names,
            "every event a target may get"
        );
    }

    #[test]
    fn labels_are_one_line_of_at_most_200_characters() {
        for good in [
            "",
            "My phone",
            "Téléphone — 📱",
            &"é".repeat(200),
            "a\u{2028}b",
        ] {
            assert!(Label::admits(good), "{good:?}");
        }
        for bad in [
            "a\nb",
            "tab\there",
            "\u{7f}",
            "\u{85}",
            "\u{9f}",
            &"a".repeat(201),
        ] {
            assert!(!Label::admits(bad), "{bad:?}");
        }
        // The same predicate as char::is_control, over every control
        // character there is.
        for c in (0u32..0x110000).filter_map(char::from_u32) {
            assert_eq!(
                Label::admits(&c.to_string()),
                !c.is_control(),
                "U+{:04X}",
                c as u32
            );
        }
    }
}
