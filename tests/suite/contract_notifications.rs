//! The document of the notification-target operations against the gateway
//! (what `scripts/contract` checks with generated inputs, here with chosen
//! ones): for every rule the gateway holds a new target to, a body breaking
//! it is refused by the document's request schema and by the gateway (422);
//! valid bodies of every kind pass both (201); and what the document cannot
//! know gets a status it documents, which a client generated from it
//! expects: 403 for an address the operator does not allow, 409 for a host
//! that does not resolve, for `fcm` without `[notifications.fcm]`, and for a
//! user with 50 targets.

use crate::common::*;
use crate::contract::Document;
use acp_gateway::config::FcmConfig;
use serde_json::{json, Value};

const TARGETS: &str = "/api/v1/notification-targets";

/// A subscription as a browser makes it: a real P-256 point, 16 random
/// bytes.
fn subscription(endpoint: &str) -> Value {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0x5au8; 16]);
    json!({
        "endpoint": endpoint,
        "keys": {"p256dh": acp_gateway::notify::vapid::generate().public_b64, "auth": auth},
    })
}

/// Public addresses written as such: nothing to resolve, nothing sent (no
/// test notification is asked for).
const HOOK: &str = "https://93.184.216.34/hook";
const NTFY: &str = "https://93.184.216.34/my-topic";

/// Bodies that break one rule each, and what the refusal names.
fn invalid_bodies() -> Vec<(&'static str, Value, &'static str)> {
    let push = subscription("https://93.184.216.34/push/abc");
    let keys = |p256dh: &str, auth: &str| json!({"kind": "web_push", "subscription": {"endpoint": "https://93.184.216.34/p", "keys": {"p256dh": p256dh, "auth": auth}}});
    let point = push["keys"]["p256dh"].as_str().unwrap().to_owned();
    let auth = push["keys"]["auth"].as_str().unwrap().to_owned();
    let webhook = |member: &str, value: Value| {
        let mut body = json!({"kind": "webhook", "url": HOOK});
        body[member] = value;
        body
    };
    vec![
        // `kind`, and the members of each kind.
        ("no kind", json!({"url": HOOK}), "kind"),
        ("an unknown kind", json!({"kind": "carrier_pigeon"}), "kind"),
        ("kind not a string", json!({"kind": 5, "url": HOOK}), "kind"),
        ("not an object", json!(["webhook", HOOK]), "object"),
        (
            "fcm with an empty url (schemathesis' find)",
            json!({"kind": "fcm", "device_token": "x", "url": ""}),
            "url",
        ),
        (
            "a webhook with an ntfy token",
            webhook("token", json!("t")),
            "token",
        ),
        (
            "ntfy with a webhook secret",
            json!({"kind": "ntfy", "url": NTFY, "secret": "0123456789abcdef"}),
            "secret",
        ),
        (
            "web_push with a url",
            json!({"kind": "web_push", "subscription": push, "url": HOOK}),
            "url",
        ),
        (
            "a webhook with a device token",
            webhook("device_token", json!("x")),
            "device_token",
        ),
        (
            "an unknown member",
            webhook("colour", json!("red")),
            "colour",
        ),
        ("a webhook without url", json!({"kind": "webhook"}), "url"),
        ("ntfy without url", json!({"kind": "ntfy"}), "url"),
        (
            "web_push without subscription",
            json!({"kind": "web_push"}),
            "subscription",
        ),
        (
            "fcm without device_token",
            json!({"kind": "fcm"}),
            "device_token",
        ),
        // URLs.
        ("not a URL", webhook("url", json!("not a url")), "url"),
        (
            "another scheme",
            webhook("url", json!("ftp://93.184.216.34/")),
            "url",
        ),
        (
            "credentials",
            webhook("url", json!("https://u:p@93.184.216.34/")),
            "url",
        ),
        (
            "a fragment",
            webhook("url", json!("https://93.184.216.34/hook#x")),
            "url",
        ),
        (
            "a space",
            webhook("url", json!("https://93.184.216.34/a b")),
            "url",
        ),
        (
            "a trailing newline",
            webhook("url", json!("https://93.184.216.34/hook\n")),
            "url",
        ),
        (
            "an IDNA label",
            webhook("url", json!("https://xn--a.example/hook")),
            "url",
        ),
        (
            "a host ending in a number",
            webhook("url", json!("https://a.1/hook")),
            "url",
        ),
        (
            "an IPv4 address out of range",
            webhook("url", json!("https://256.1.1.1/hook")),
            "url",
        ),
        (
            "an octal-looking IPv4 address",
            webhook("url", json!("https://010.0.0.1/hook")),
            "url",
        ),
        (
            "a port out of range",
            webhook("url", json!("https://93.184.216.34:65536/")),
            "url",
        ),
        (
            "a URL over 2048 characters",
            webhook(
                "url",
                json!(format!("https://93.184.216.34/{}", "a".repeat(2030))),
            ),
            "url",
        ),
        (
            "a url not a string",
            webhook("url", json!(["https://93.184.216.34/"])),
            "url",
        ),
        (
            "an ntfy URL without topic",
            json!({"kind": "ntfy", "url": "https://93.184.216.34/"}),
            "topic",
        ),
        (
            "an ntfy topic with a dot",
            json!({"kind": "ntfy", "url": "https://93.184.216.34/a.b"}),
            "topic",
        ),
        (
            "an ntfy topic of 65 characters",
            json!({"kind": "ntfy", "url": format!("https://93.184.216.34/{}", "t".repeat(65))}),
            "topic",
        ),
        (
            "a push endpoint that is no URL",
            json!({"kind": "web_push", "subscription": {"endpoint": "push", "keys": push["keys"]}}),
            "subscription.endpoint",
        ),
        // Secrets and tokens.
        (
            "a secret of 15 characters",
            webhook("secret", json!("0123456789abcde")),
            "secret",
        ),
        (
            "a secret of 257 characters",
            webhook("secret", json!("s".repeat(257))),
            "secret",
        ),
        (
            "a secret with a space",
            webhook("secret", json!("0123456789 abcdef")),
            "secret",
        ),
        (
            "a secret not ASCII",
            webhook("secret", json!("0123456789abcdéf")),
            "secret",
        ),
        (
            "an empty ntfy token",
            json!({"kind": "ntfy", "url": NTFY, "token": ""}),
            "token",
        ),
        (
            "an ntfy token with a space",
            json!({"kind": "ntfy", "url": NTFY, "token": "tk abc"}),
            "token",
        ),
        (
            "an ntfy token of 513 characters",
            json!({"kind": "ntfy", "url": NTFY, "token": "t".repeat(513)}),
            "token",
        ),
        (
            "an empty device token",
            json!({"kind": "fcm", "device_token": ""}),
            "device_token",
        ),
        (
            "a device token with a newline",
            json!({"kind": "fcm", "device_token": "abc\ndef"}),
            "device_token",
        ),
        (
            "a device token of 4097 characters",
            json!({"kind": "fcm", "device_token": "d".repeat(4097)}),
            "device_token",
        ),
        // Labels and events.
        (
            "a label of two lines",
            webhook("label", json!("a\nb")),
            "label",
        ),
        (
            "a label with a C1 control",
            webhook("label", json!("a\u{85}b")),
            "label",
        ),
        (
            "a label of 201 characters",
            webhook("label", json!("é".repeat(201))),
            "label",
        ),
        ("a label not a string", webhook("label", json!(5)), "label"),
        ("no event", webhook("events", json!([])), "events"),
        (
            "an unknown event",
            webhook("events", json!(["turn_ended", "nope"])),
            "events",
        ),
        (
            "the test event",
            webhook("events", json!(["test"])),
            "events",
        ),
        (
            "events not a list",
            webhook("events", json!("turn_ended")),
            "events",
        ),
        // Subscription keys.
        ("a short p256dh", keys("BAAA", &auth), "p256dh"),
        ("a p256dh of 64 bytes", keys(&point[..86], &auth), "p256dh"),
        (
            "a p256dh not of an uncompressed point",
            keys(&format!("A{}", &point[1..]), &auth),
            "p256dh",
        ),
        (
            "a p256dh with bits past its 65 bytes",
            keys(&format!("{}B", &point[..86]), &auth),
            "p256dh",
        ),
        (
            "a p256dh in the standard alphabet",
            keys(&format!("BA+/{}", &point[4..]), &auth),
            "p256dh",
        ),
        ("a short auth", keys(&point, "AAAA"), "auth"),
        (
            "auth not base64",
            keys(&point, "!!!!!!!!!!!!!!!!!!!!!!"),
            "auth",
        ),
        (
            "auth padded with one =",
            keys(&point, &format!("{auth}=")),
            "auth",
        ),
        (
            "keys with another member",
            json!({"kind": "web_push", "subscription": {"endpoint": "https://93.184.216.34/p", "keys": {"p256dh": point, "auth": auth, "extra": "x"}}}),
            "extra",
        ),
        (
            "a subscription without keys",
            json!({"kind": "web_push", "subscription": {"endpoint": "https://93.184.216.34/p"}}),
            "keys",
        ),
    ]
}

/// Valid bodies of every kind, with every member they may have, as a
/// client generated from the document (or the web client) sends them.
fn valid_bodies() -> Vec<(&'static str, Value)> {
    let mut padded = subscription("https://93.184.216.34/push/x?y=1");
    padded["keys"]["p256dh"] = json!(format!("{}=", padded["keys"]["p256dh"].as_str().unwrap()));
    padded["keys"]["auth"] = json!(format!("{}==", padded["keys"]["auth"].as_str().unwrap()));
    // A push service's endpoint has its address written out here: the
    // test needs no DNS.
    let mut browser = subscription("https://93.184.216.34/fcm/send/dXk:APA91bH-x_y~z");
    browser["expirationTime"] = Value::Null;
    browser["somethingNew"] = json!(1);
    vec![
        ("a webhook", json!({"kind": "webhook", "url": HOOK})),
        (
            "a webhook with everything",
            json!({"kind": "webhook", "url": "https://93.184.216.34:8443/a/b;c?d=1&e=%2F", "secret": "!#$%&'()*+,-./0123456789:;<=>?@[]^_`{|}~",
                   "label": "Téléphone — 📱 [work]", "events": ["turn_ended", "turn_ended", "agent_failed"]}),
        ),
        (
            "a webhook with nulls",
            json!({"kind": "webhook", "url": HOOK, "secret": null, "label": null, "events": null}),
        ),
        ("an ntfy topic", json!({"kind": "ntfy", "url": NTFY})),
        (
            "an ntfy topic with everything",
            json!({"kind": "ntfy", "url": "https://[2606:4700::1111]/base/Topic_1-x/?x=1", "token": "tk_AbC-123",
                   "label": "", "events": ["permission_waiting", "permission_reminder"]}),
        ),
        (
            "a browser's subscription, as the web client sends it",
            json!({"kind": "web_push", "label": "This device (Linux)", "subscription": browser}),
        ),
        (
            "a padded subscription",
            json!({"kind": "web_push", "subscription": padded, "events": ["permission_waiting"]}),
        ),
        (
            "an app",
            json!({"kind": "fcm", "device_token": "fcm:APA91b-x_y.z", "label": "Pixel"}),
        ),
    ]
}

async fn every_rule_is_in_the_document_and_enforced(db: TestDb) {
    let document = Document::new();
    let gw = TestGateway::start(&db, vec![]).await;
    for (what, body, names) in invalid_bodies() {
        assert!(
            !document.body_violations("post", TARGETS, &body).is_empty(),
            "{what}: the document admits {body}"
        );
        let (status, problem) = gw.call("POST", TARGETS, Some(body.clone())).await;
        assert_eq!(status, 422, "{what}: {body}: {problem}");
        assert_eq!(problem["code"], "invalid_request", "{what}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(names),
            "{what}: {detail:?} names no {names}"
        );
    }
    assert!(document.documents("post", TARGETS, 422));
    let (_, listed) = gw.call("GET", TARGETS, None).await;
    assert_eq!(listed["items"], json!([]), "nothing was made");
    gw.stop().await;
}

async fn valid_bodies_of_every_kind_are_taken(db: TestDb) {
    let document = Document::new();
    // The FCM stand-in writes the service account the gateway reads.
    let dir = tempfile::tempdir().unwrap();
    let account = dir.path().join("service-account.json");
    let fcm =
        crate::notify_channels::Service::start("fcm_service.py", &[account.to_str().unwrap()]);
    let mut config = Config::for_tests(&db, vec![]);
    config.notifications.fcm = Some(FcmConfig {
        service_account_file: account,
        api_base: Some(fcm.base.clone()),
    });
    let gw = TestGateway::start_with(config).await;
    for (what, body) in valid_bodies() {
        let refusals = document.body_violations("post", TARGETS, &body);
        assert!(refusals.is_empty(), "{what}: {refusals:?} in {body}");
        let (status, created) = gw.call("POST", TARGETS, Some(body.clone())).await;
        assert_eq!(status, 201, "{what}: {body}: {created}");
        let kind = body["kind"].as_str().unwrap();
        assert_eq!(created["kind"], kind, "{what}");
        // A webhook's secret is answered only when it was generated.
        let generated = kind == "webhook" && body["secret"].is_null();
        assert_eq!(
            created["secret"].is_string(),
            generated,
            "{what}: {created}"
        );
        if body["events"].is_array() {
            let mut named: Vec<&Value> = body["events"].as_array().unwrap().iter().collect();
            named.dedup();
            assert_eq!(created["events"], json!(named), "{what}: once each");
        }
    }
    let (_, listed) = gw.call("GET", TARGETS, None).await;
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        valid_bodies().len()
    );
    gw.stop().await;
}

/// What the document cannot know: the operator's settings, DNS, how many
/// targets the user has. Each is a status the operation documents and a
/// generated client takes for "not now" or "not allowed", never for a body
/// it built wrong.
async fn what_the_document_cannot_know_has_its_documented_status(db: TestDb) {
    let document = Document::new();
    let gw = TestGateway::start(&db, vec![]).await;
    let refused = [
        ("plain http", "http://93.184.216.34/hook", 403, "forbidden"),
        ("loopback", "https://127.0.0.1/hook", 403, "forbidden"),
        ("IPv6 loopback", "https://[::1]/hook", 403, "forbidden"),
        ("private", "https://10.0.0.1/hook", 403, "forbidden"),
        (
            "metadata",
            "https://169.254.169.254/latest",
            403,
            "forbidden",
        ),
        (
            "a name of this machine",
            "https://localhost/hook",
            403,
            "forbidden",
        ),
        (
            "a name that never resolves",
            "https://nothing.invalid/hook",
            409,
            "unresolvable_host",
        ),
    ];
    for (what, url, status, code) in refused {
        let body = json!({"kind": "webhook", "url": url});
        let refusals = document.body_violations("post", TARGETS, &body);
        assert!(refusals.is_empty(), "{what}: {refusals:?}");
        let (got, problem) = gw.call("POST", TARGETS, Some(body)).await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{what}: {problem}"
        );
        assert!(document.documents("post", TARGETS, status));
    }
    // The same for a push endpoint.
    let body = json!({"kind": "web_push", "subscription": subscription("http://127.0.0.1:9/push")});
    let (status, problem) = gw.call("POST", TARGETS, Some(body)).await;
    assert_eq!(status, 403, "{problem}");

    // FCM where the operator did not configure it.
    let body = json!({"kind": "fcm", "device_token": "device-1"});
    assert!(document.body_violations("post", TARGETS, &body).is_empty());
    let (status, problem) = gw.call("POST", TARGETS, Some(body)).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("not_configured")),
        "{problem}"
    );

    // 50 targets a user.
    for i in 0..50 {
        let body = json!({"kind": "webhook", "url": format!("{HOOK}/{i}")});
        let (status, created) = gw.call("POST", TARGETS, Some(body)).await;
        assert_eq!(status, 201, "{created}");
    }
    let (status, problem) = gw
        .call("POST", TARGETS, Some(json!({"kind": "ntfy", "url": NTFY})))
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("too_many_targets")),
        "{problem}"
    );
    assert!(document.documents("post", TARGETS, 409));
    gw.stop().await;
}

/// The key of a subscription is checked as far as the document can say
/// (base64url, sizes, an uncompressed point's first byte); whether it is a
/// point of the curve shows at the first delivery, which fails.
async fn a_key_off_the_curve_is_taken_and_its_delivery_fails(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![]);
    config.notifications.allow_private_targets = true;
    let gw = TestGateway::start_with(config).await;
    let body = json!({"kind": "web_push", "subscription": {"endpoint": "http://127.0.0.1:9/push",
        "keys": {"p256dh": format!("BA{}", "A".repeat(85)), "auth": "AAAAAAAAAAAAAAAAAAAAAA"}}});
    assert!(Document::new()
        .body_violations("post", TARGETS, &body)
        .is_empty());
    let (status, created) = gw.call("POST", TARGETS, Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let (status, attempt) = gw.call("POST", &format!("{TARGETS}/{id}/test"), None).await;
    assert_eq!(status, 200, "{attempt}");
    assert_eq!(attempt["outcome"], "failed", "{attempt}");
    assert!(
        attempt["error"]
            .as_str()
            .unwrap()
            .contains("not a P-256 public key"),
        "{attempt}"
    );
    gw.stop().await;
}

/// The other operations have no body; their path's id is a UUID, and one
/// that is not is "no such target" (404, documented), as another user's is.
async fn the_other_operations_document_what_they_answer(db: TestDb) {
    let document = Document::new();
    let gw = TestGateway::start(&db, vec![]).await;
    let (status, created) = gw
        .call(
            "POST",
            TARGETS,
            Some(json!({"kind": "webhook", "url": HOOK})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    for (method, path, template, expected) in [
        ("GET", TARGETS.to_owned(), TARGETS.to_owned(), 200),
        (
            "GET",
            format!("{TARGETS}/{id}/deliveries"),
            format!("{TARGETS}/{{id}}/deliveries"),
            200,
        ),
        (
            "GET",
            format!("{TARGETS}/not-a-uuid/deliveries"),
            format!("{TARGETS}/{{id}}/deliveries"),
            404,
        ),
        (
            "POST",
            format!("{TARGETS}/{}/test", uuid::Uuid::now_v7()),
            format!("{TARGETS}/{{id}}/test"),
            404,
        ),
        (
            "GET",
            "/api/v1/notifications/vapid-public-key".to_owned(),
            "/api/v1/notifications/vapid-public-key".to_owned(),
            200,
        ),
        (
            "DELETE",
            format!("{TARGETS}/{id}"),
            format!("{TARGETS}/{{id}}"),
            204,
        ),
        (
            "DELETE",
            format!("{TARGETS}/{id}"),
            format!("{TARGETS}/{{id}}"),
            404,
        ),
    ] {
        let (status, answer) = gw.call(method, &path, None).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert!(
            document.documents(&method.to_lowercase(), &template, status),
            "{method} {template} does not document {status}"
        );
    }
    gw.stop().await;
}

backend_tests!(
    every_rule_is_in_the_document_and_enforced,
    valid_bodies_of_every_kind_are_taken,
    what_the_document_cannot_know_has_its_documented_status,
    a_key_off_the_curve_is_taken_and_its_delivery_fails,
    the_other_operations_document_what_they_answer,
);
