//! The Web Push and FCM channels against stand-ins of their services on
//! loopback, which check what the gateway sends with libraries of their
//! own (Python `http_ece`, PyJWT, cryptography: see
//! `tests/notify-services/`), never with the gateway's code: first each
//! channel alone, then both through a real gateway's outbox (both
//! databases).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{Config, ForTests, TestDb, TestGateway, WAIT};
use acp_gateway::config::FcmConfig;
use acp_gateway::notify::fcm::Fcm;
use acp_gateway::notify::fit;
use acp_gateway::notify::render::headline;
use acp_gateway::notify::{
    vapid, web_push, Action, ConversationRef, DeliveryOutcome, Notification, NotificationEvent,
    RequestRef,
};
use acp_gateway::store::notify::AttemptRecord;
use base64::Engine as _;
use serde_json::{json, Value};
use uuid::Uuid;

/// A stand-in service: a Python subprocess, killed (by its pid) when this is
/// dropped, a failed test included.
pub(crate) struct Service {
    child: Child,
    /// The JSON line it printed when it listened.
    pub(crate) hello: Value,
    pub(crate) base: String,
}

impl Service {
    pub(crate) fn start(script: &str, args: &[&str]) -> Service {
        let python = crate::common::sdk_agents_dir().join(".venv/bin/python");
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/notify-services")
            .join(script);
        let mut child = Command::new(python)
            .arg(&script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the stand-in");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        // Owned from here: a panic below still kills it.
        let mut service = Service {
            child,
            hello: Value::Null,
            base: String::new(),
        };
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the stand-in says where it listens");
        service.hello = serde_json::from_str(&line)
            .unwrap_or_else(|_| panic!("{script:?} printed {line:?}, not its port"));
        service.base = format!("http://127.0.0.1:{}", service.hello["port"]);
        service
    }

    pub(crate) async fn seen(&self) -> Value {
        reqwest::get(format!("{}/seen", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn permission_waiting() -> Notification {
    Notification {
        event: NotificationEvent::PermissionWaiting,
        delivery_id: Uuid::new_v4(),
        at: chrono::Utc::now(),
        user: "ana".into(),
        conversation: Some(ConversationRef {
            id: Uuid::new_v4(),
            title: Some("Fix the build".into()),
            agent: "Claude Code".into(),
        }),
        request: Some(RequestRef {
            id: Uuid::new_v4(),
            title: Some("Run rm -rf build".into()),
            kind: Some("execute".into()),
            command: None,
        }),
        turn: None,
        count: 1,
        budget: None,
        actions: vec![
            Action {
                label: "Allow once".into(),
                option_id: "allow_once".into(),
                url: "https://gateway.example/api/v1/actions/a1".into(),
            },
            Action {
                label: "Reject".into(),
                option_id: "reject".into(),
                url: "https://gateway.example/api/v1/actions/r1".into(),
            },
        ],
    }
}

/// Sends `push` to the subscription with the default VAPID subject.
async fn push(
    client: &reqwest::Client,
    keys: &vapid::VapidKeys,
    endpoint: &str,
    p256dh: &str,
    auth: &str,
    push: web_push::Push<'_>,
) -> DeliveryOutcome {
    let sender = web_push::Sender {
        vapid: keys,
        subject: web_push::DEFAULT_SUBJECT,
    };
    let to = web_push::Subscription {
        endpoint,
        p256dh,
        auth,
    };
    web_push::deliver_as(client, &sender, &to, &push).await
}

#[tokio::test]
async fn web_push_sends_a_payload_the_subscription_decrypts_signed_by_the_gateways_vapid_key() {
    let keys = vapid::generate();
    let service = Service::start("push_service.py", &[&keys.public_b64]);
    let p256dh = service.hello["p256dh"].as_str().unwrap().to_owned();
    let auth = service.hello["auth"].as_str().unwrap().to_owned();
    let client = client();
    let endpoint = |mode: &str| format!("{}/push/{mode}", service.base);

    let payload = serde_json::to_vec(&permission_waiting()).unwrap();
    let topic = "conversation:0192f1a4-7c3e-7d2a-9b1e-3f4a5b6c7d8e";
    let outcome = push(
        &client,
        &keys,
        &endpoint("ok"),
        &p256dh,
        &auth,
        web_push::Push {
            payload: &payload,
            topic: Some(topic),
            ttl_seconds: 120,
        },
    )
    .await;
    assert_eq!(outcome, DeliveryOutcome::Delivered { status: 201 });

    // A payload that is no notification, without a topic.
    let outcome = push(
        &client,
        &keys,
        &endpoint("ok"),
        &p256dh,
        &auth,
        web_push::Push {
            payload: b"hello",
            topic: None,
            ttl_seconds: 0,
        },
    )
    .await;
    assert_eq!(outcome, DeliveryOutcome::Delivered { status: 201 });

    let seen = service.seen().await;
    let seen = seen.as_array().unwrap();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert!(seen.iter().all(|s| s["ok"] == true), "{seen:#?}");
    let decrypted = |s: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(s["payload_b64"].as_str().unwrap())
            .unwrap()
    };
    let (first, second) = (&seen[0], &seen[1]);
    assert_eq!(decrypted(first), payload);
    assert_eq!(first["jwt_verified"], true);
    assert_eq!(first["k"], keys.public_b64.as_str());
    assert_eq!(first["claims"]["aud"], service.base.as_str());
    assert_eq!(first["claims"]["sub"], web_push::DEFAULT_SUBJECT);
    let headers = &first["headers"];
    assert_eq!(headers["ttl"], "120");
    assert_eq!(headers["content-encoding"], "aes128gcm");
    assert_eq!(headers["topic"], web_push::topic_header(topic).as_str());
    assert_eq!(headers["urgency"], "high");
    assert_eq!(decrypted(second), b"hello");
    assert_eq!(second["headers"]["ttl"], "0");
    assert_eq!(second["headers"]["urgency"], "normal");
    assert!(second["headers"].get("topic").is_none());

    // The stand-in does check: a push signed with another key is refused.
    let other = vapid::generate();
    let outcome = push(
        &client,
        &other,
        &endpoint("ok"),
        &p256dh,
        &auth,
        web_push::Push {
            payload: b"x",
            topic: None,
            ttl_seconds: 60,
        },
    )
    .await;
    assert!(
        matches!(&outcome, DeliveryOutcome::Failed { status: Some(400), error } if error.contains("not the gateway's public key")),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn web_push_says_gone_for_410_and_failed_for_500_or_no_answer() {
    let keys = vapid::generate();
    let service = Service::start("push_service.py", &[&keys.public_b64]);
    let p256dh = service.hello["p256dh"].as_str().unwrap().to_owned();
    let auth = service.hello["auth"].as_str().unwrap().to_owned();
    let client = client();
    let send = |url: String| {
        let (client, keys, p256dh, auth) = (&client, &keys, &p256dh, &auth);
        async move {
            push(
                client,
                keys,
                &url,
                p256dh,
                auth,
                web_push::Push {
                    payload: b"x",
                    topic: None,
                    ttl_seconds: 60,
                },
            )
            .await
        }
    };

    let gone = send(format!("{}/push/gone", service.base)).await;
    assert_eq!(gone, DeliveryOutcome::Gone { status: 410 });

    let failed = send(format!("{}/push/fail", service.base)).await;
    match failed {
        DeliveryOutcome::Failed {
            status: Some(500),
            error,
        } => assert_eq!(error, "x".repeat(200), "the body's first 200 characters"),
        other => panic!("{other:?}"),
    }

    // Nobody listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let unreachable = send(format!("http://127.0.0.1:{port}/push/ok")).await;
    assert!(
        matches!(unreachable, DeliveryOutcome::Failed { status: None, .. }),
        "{unreachable:?}"
    );
}

/// An FCM stand-in, and an [`Fcm`] pointed at it.
fn fcm_stand_in() -> (Service, Fcm, tempfile::TempDir) {
    fcm_stand_in_issuing_tokens_for(3599)
}

/// An FCM stand-in whose tokens last `expires_in` seconds.
fn fcm_stand_in_issuing_tokens_for(expires_in: u32) -> (Service, Fcm, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("service-account.json");
    let lifetime = expires_in.to_string();
    let service = Service::start("fcm_service.py", &[file.to_str().unwrap(), &lifetime]);
    let config = FcmConfig {
        service_account_file: file,
        api_base: Some(service.base.clone()),
    };
    let fcm = Fcm::new(&config, client()).unwrap();
    (service, fcm, dir)
}

#[tokio::test]
async fn fcm_sends_with_a_token_the_service_account_earned_and_reuses_it() {
    let (service, fcm, _dir) = fcm_stand_in();
    assert_eq!(fcm.project_id(), "test-project");
    let notification = permission_waiting();

    for _ in 0..2 {
        let outcome = fcm
            .deliver("device-1", &notification, Some("conversation:1"))
            .await;
        assert_eq!(outcome, DeliveryOutcome::Delivered { status: 200 });
    }
    let seen = service.seen().await;
    let tokens = seen["token_requests"].as_array().unwrap();
    assert_eq!(tokens.len(), 1, "one token for two sends: {seen:#?}");
    assert_eq!(tokens[0]["ok"], true, "{seen:#?}");
    assert_eq!(
        tokens[0]["content_type"],
        "application/x-www-form-urlencoded"
    );
    let sends = seen["sends"].as_array().unwrap();
    assert_eq!(sends.len(), 2);
    assert!(sends.iter().all(|s| s["admitted"] == true), "{seen:#?}");

    let message = &sends[0]["body"]["message"];
    let (title, body) = headline(&notification);
    assert_eq!(title, "Claude Code asks: Run rm -rf build");
    assert_eq!(message["token"], "device-1");
    assert_eq!(message["notification"]["title"], title.as_str());
    assert_eq!(message["notification"]["body"], body.as_str());
    let data = &message["data"];
    assert!(data.as_object().unwrap().values().all(Value::is_string));
    assert_eq!(data["event"], "permission_waiting");
    assert_eq!(data["delivery_id"], notification.delivery_id.to_string());
    let conversation = notification.conversation.as_ref().unwrap();
    assert_eq!(data["conversation_id"], conversation.id.to_string());
    let request = notification.request.as_ref().unwrap();
    assert_eq!(data["request_id"], request.id.to_string());
    let actions: Vec<Action> = serde_json::from_str(data["actions"].as_str().unwrap()).unwrap();
    assert_eq!(actions, notification.actions);
    assert_eq!(message["android"]["collapse_key"], "conversation:1");
    assert_eq!(message["android"]["priority"], "high");
    assert_eq!(
        message["apns"]["headers"]["apns-collapse-id"],
        "conversation:1"
    );
    assert_eq!(message["apns"]["headers"]["apns-priority"], "10");
}

#[tokio::test]
async fn fcm_says_gone_for_an_unregistered_device_and_renews_a_refused_token_once() {
    let (service, fcm, _dir) = fcm_stand_in();
    let notification = permission_waiting();

    let gone = fcm.deliver("gone-device", &notification, None).await;
    assert_eq!(gone, DeliveryOutcome::Gone { status: 404 });

    // The service forgets its tokens: the next send is refused once, a new
    // token is fetched, and the send goes through with it.
    let revoked = client()
        .post(format!("{}/revoke", service.base))
        .send()
        .await
        .unwrap();
    assert!(revoked.status().is_success());
    let outcome = fcm.deliver("device-1", &notification, None).await;
    assert_eq!(outcome, DeliveryOutcome::Delivered { status: 200 });

    let seen = service.seen().await;
    let tokens = seen["token_requests"].as_array().unwrap();
    assert_eq!(tokens.len(), 2, "{seen:#?}");
    let admitted: Vec<bool> = seen["sends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["admitted"].as_bool().unwrap())
        .collect();
    assert_eq!(admitted, [true, false, true]);
}

#[tokio::test]
async fn fcm_sends_at_once_share_one_token_request() {
    let (service, fcm, _dir) = fcm_stand_in();
    let notification = permission_waiting();
    let outcomes = futures::future::join_all((0..5).map(|i| {
        let (fcm, notification) = (fcm.clone(), notification.clone());
        async move {
            fcm.deliver(&format!("device-{i}"), &notification, None)
                .await
        }
    }))
    .await;
    assert!(outcomes
        .iter()
        .all(|o| *o == DeliveryOutcome::Delivered { status: 200 }));
    let seen = service.seen().await;
    assert_eq!(seen["token_requests"].as_array().unwrap().len(), 1);
    assert_eq!(seen["sends"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn fcm_fetches_a_new_token_when_the_cached_one_is_about_to_expire() {
    // Tokens that expire within the renewal margin are never reused.
    let (service, fcm, _dir) = fcm_stand_in_issuing_tokens_for(120);
    let notification = permission_waiting();
    for _ in 0..2 {
        let outcome = fcm.deliver("device-1", &notification, None).await;
        assert_eq!(outcome, DeliveryOutcome::Delivered { status: 200 });
    }
    let seen = service.seen().await;
    assert_eq!(seen["token_requests"].as_array().unwrap().len(), 2);
    assert!(seen["sends"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["admitted"] == true));
}

#[tokio::test]
async fn fcm_does_not_call_a_404_that_is_no_fcm_error_gone() {
    // A wrong api_base: the front end's 404 must not disable every target.
    let (service, _fcm, dir) = fcm_stand_in();
    let config = FcmConfig {
        service_account_file: dir.path().join("service-account.json"),
        api_base: Some(format!("{}/wrong", service.base)),
    };
    let fcm = Fcm::new(&config, client()).unwrap();
    let outcome = fcm.deliver("device-1", &permission_waiting(), None).await;
    assert!(
        matches!(&outcome, DeliveryOutcome::Failed { status: Some(404), error } if error.contains("Not Found")),
        "{outcome:?}"
    );
}

// End to end: the same stand-ins as targets of a real gateway, reached
// through its outbox, for a test notification and for a real permission
// request of the demo agent left unanswered (nobody present: the
// WebSocket used to follow the conversation never says it is visible).

/// Where the gateway says it is reached: action URLs start with it.
pub(crate) const BASE: &str = "https://gateway.example";
/// The demo agent's scenario asking to run a command (its tool call
/// carries `rawInput.command`, so the detail rules have something to keep
/// or leave out).
const PROMPT: &str = "execute echo notified";

/// A gateway with the demo agent, admitting targets on loopback, notifying
/// a request 100 ms after it is made.
pub(crate) fn notifying_config(db: &TestDb) -> Config {
    let mut config = Config::for_tests(db, vec![crate::common::demo_profile("demo", &[])]);
    config.notifications.allow_private_targets = true;
    config.notifications.grace = Duration::from_millis(100);
    config.notifications.base_url = Some(BASE.into());
    config
}

/// Creates a target (no tokens: as the anonymous user); its id.
/// A Web Push target whose subscription is at `push_service` (its
/// `/push/ok` endpoint, with the keys it made); the target's id.
pub(crate) async fn web_push_target(gw: &TestGateway, push_service: &Service) -> String {
    create_target(
        gw,
        json!({
            "kind": "web_push",
            "subscription": {
                "endpoint": format!("{}/push/ok", push_service.base),
                "keys": {"p256dh": push_service.hello["p256dh"], "auth": push_service.hello["auth"]},
            },
        }),
    )
    .await
}

pub(crate) async fn create_target(gw: &TestGateway, body: Value) -> String {
    let (status, created) = gw
        .call("POST", "/api/v1/notification-targets", Some(body))
        .await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

/// `POST …/{id}/test`: the attempt it answers.
async fn test_target(gw: &TestGateway, id: &str) -> Value {
    let path = format!("/api/v1/notification-targets/{id}/test");
    let (status, answer) = gw.call("POST", &path, None).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The targets as listed, by id.
async fn listed_targets(gw: &TestGateway) -> std::collections::HashMap<String, Value> {
    let (status, body) = gw.call("GET", "/api/v1/notification-targets", None).await;
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_owned(), t.clone()))
        .collect()
}

/// The next attempts of `event` the outbox records, one per target in
/// `targets`, by target id.
pub(crate) async fn attempts_of(
    watch: &mut tokio::sync::broadcast::Receiver<AttemptRecord>,
    event: &str,
    targets: &[&str],
) -> std::collections::HashMap<String, AttemptRecord> {
    let mut got = std::collections::HashMap::new();
    while got.len() < targets.len() {
        let attempt = tokio::time::timeout(WAIT, watch.recv())
            .await
            .unwrap_or_else(|_| panic!("{event} is attempted for {targets:?} in time: {got:?}"))
            .unwrap();
        let target = attempt.target_id.to_string();
        if attempt.event == event && targets.contains(&target.as_str()) {
            assert!(
                got.insert(target, attempt.clone()).is_none(),
                "one attempt per target: {attempt:?}"
            );
        }
    }
    got
}

/// A conversation with the demo agent asking for permission to run a
/// command; its id, the WebSocket following it, and the request.
async fn waiting_request(gw: &TestGateway) -> (String, crate::common::Ws, Value) {
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, PROMPT).await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    (conversation, ws, request)
}

/// Answers a request through an action URL that a notification carried,
/// and waits until the turn ends.
async fn answer_through(
    gw: &TestGateway,
    ws: &mut crate::common::Ws,
    request: &Value,
    actions: &[Action],
) {
    let allow = actions
        .iter()
        .find(|a| a.option_id == "allow-once")
        .unwrap_or_else(|| panic!("an allow-once action: {actions:?}"));
    let path = allow.url.strip_prefix(BASE).unwrap();
    let (status, answered) = gw.post(path, Value::Null).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["id"], request["id"]);
    assert_eq!(answered["decision"]["via"], "notification");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

/// What the push stand-in decrypted of each push it admitted, as JSON.
pub(crate) fn decrypted_bodies(seen: &Value) -> Vec<(Value, Value)> {
    seen.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["ok"], true, "every push passed the checks: {s:#?}");
            let plain = base64::engine::general_purpose::STANDARD
                .decode(s["payload_b64"].as_str().unwrap())
                .unwrap();
            (serde_json::from_slice(&plain).unwrap(), s.clone())
        })
        .collect()
}

/// The gateway's VAPID public key, as a browser gets it to subscribe.
pub(crate) async fn vapid_public_key(gw: &TestGateway) -> String {
    let (status, key) = gw
        .call("GET", "/api/v1/notifications/vapid-public-key", None)
        .await;
    assert_eq!(status, 200, "{key}");
    key["public_key"].as_str().unwrap().to_owned()
}

async fn web_push_through_the_outbox_end_to_end(db: TestDb) {
    let gw = TestGateway::start_with(notifying_config(&db)).await;
    let vapid_key = vapid_public_key(&gw).await;
    // The stand-in verifies every JWT against the key the gateway published.
    let service = Service::start("push_service.py", &[&vapid_key]);
    let subscription = |mode: &str| {
        json!({
            "kind": "web_push",
            "subscription": {
                "endpoint": format!("{}/push/{mode}", service.base),
                "keys": {"p256dh": service.hello["p256dh"], "auth": service.hello["auth"]},
            },
        })
    };
    let ok = create_target(&gw, subscription("ok")).await;

    // (a) A test notification.
    let answer = test_target(&gw, &ok).await;
    assert_eq!(answer["outcome"], "delivered", "{answer}");
    assert_eq!(answer["http_status"], 201, "{answer}");
    let seen = decrypted_bodies(&service.seen().await);
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let (body, push) = &seen[0];
    assert_eq!(body["event"], "test", "{body}");
    assert_eq!(body["delivery_id"], answer["delivery_id"]);
    assert_eq!(body["user"], "anonymous");
    assert_eq!(push["jwt_verified"], true);
    assert_eq!(push["k"], vapid_key.as_str());
    assert_eq!(push["claims"]["aud"], service.base.as_str());
    assert_eq!(push["headers"]["urgency"], "normal");

    // (b) A real request, nobody present: one push to each target, the one
    // whose service answers 410 made gone.
    let gone = create_target(&gw, subscription("gone")).await;
    let mut watch = gw.outbox.watch();
    let (conversation, mut ws, request) = waiting_request(&gw).await;
    let attempts = attempts_of(&mut watch, "permission_waiting", &[&ok, &gone]).await;
    assert_eq!(attempts[&ok].outcome, "delivered", "{attempts:?}");
    assert_eq!(attempts[&ok].http_status, Some(201));
    assert_eq!(attempts[&gone].outcome, "gone", "{attempts:?}");
    assert_eq!(attempts[&gone].http_status, Some(410));

    let seen = decrypted_bodies(&service.seen().await);
    let waiting: Vec<&(Value, Value)> = seen
        .iter()
        .filter(|(body, _)| body["event"] == "permission_waiting")
        .collect();
    assert_eq!(waiting.len(), 1, "exactly one: {seen:#?}");
    let (body, push) = waiting[0];
    assert_eq!(body["delivery_id"], attempts[&ok].delivery_id.to_string());
    assert_eq!(body["user"], "anonymous");
    assert_eq!(body["count"], 1);
    assert_eq!(body["conversation"]["id"], conversation.as_str());
    assert_eq!(body["conversation"]["agent"], "demo");
    assert_eq!(body["request"]["id"], request["id"]);
    assert_eq!(body["request"]["title"], "Run echo notified");
    assert_eq!(body["request"]["kind"], "execute");
    // The default detail is minimal; Web Push is end-to-end encrypted and
    // gets the command all the same.
    assert_eq!(
        gw.config.notifications.detail,
        acp_gateway::config::NotificationDetail::Minimal
    );
    assert_eq!(body["request"]["command"], "echo notified", "{body}");
    assert_eq!(push["jwt_verified"], true);
    assert_eq!(push["k"], vapid_key.as_str());
    assert_eq!(push["headers"]["urgency"], "high");
    assert_eq!(
        push["headers"]["topic"],
        web_push::topic_header(&conversation).as_str()
    );
    assert_eq!(push["headers"]["ttl"], "3600");
    let actions: Vec<Action> = serde_json::from_value(body["actions"].clone()).unwrap();
    assert_eq!(actions.len(), 4, "{actions:?}");

    // Answered from the notification: the turn ends, nothing more is sent.
    answer_through(&gw, &mut ws, &request, &actions).await;
    let listed = listed_targets(&gw).await;
    assert_eq!(listed[&gone]["gone"], true, "{listed:?}");
    assert_eq!(listed[&gone]["last_delivery"]["outcome"], "gone");
    assert_eq!(listed[&ok]["gone"], false, "{listed:?}");
    assert_eq!(listed[&ok]["last_delivery"]["outcome"], "delivered");
    let again = decrypted_bodies(&service.seen().await);
    assert_eq!(
        again.len(),
        2,
        "the test and one permission_waiting: {again:#?}"
    );
    gw.stop().await;
}

async fn fcm_through_the_outbox_end_to_end(db: TestDb) {
    let (config, service, _dir) = fcm_notifying_config(&db);
    let gw = TestGateway::start_with(config).await;
    let device = create_target(&gw, json!({"kind": "fcm", "device_token": "device-e2e"})).await;

    let answer = test_target(&gw, &device).await;
    assert_eq!(answer["outcome"], "delivered", "{answer}");
    assert_eq!(answer["http_status"], 200, "{answer}");
    let seen = service.seen().await;
    let tokens = seen["token_requests"].as_array().unwrap();
    assert_eq!(tokens.len(), 1, "{seen:#?}");
    assert_eq!(tokens[0]["ok"], true, "the assertion verified: {seen:#?}");
    let sends = seen["sends"].as_array().unwrap();
    assert_eq!(sends.len(), 1, "{seen:#?}");
    assert_eq!(
        sends[0]["admitted"], true,
        "with the token it issued: {seen:#?}"
    );
    let message = &sends[0]["body"]["message"];
    assert_eq!(message["token"], "device-e2e");
    assert_eq!(message["notification"]["title"], "Test notification");
    assert_eq!(message["data"]["event"], "test");
    assert_eq!(message["data"]["delivery_id"], answer["delivery_id"]);

    // A real request, nobody present, at the default (minimal) detail.
    let gone = create_target(&gw, json!({"kind": "fcm", "device_token": "gone-device"})).await;
    let mut watch = gw.outbox.watch();
    let (conversation, mut ws, request) = waiting_request(&gw).await;
    let attempts = attempts_of(&mut watch, "permission_waiting", &[&device, &gone]).await;
    assert_eq!(attempts[&device].outcome, "delivered", "{attempts:?}");
    assert_eq!(attempts[&gone].outcome, "gone", "{attempts:?}");
    assert_eq!(attempts[&gone].http_status, Some(404));

    let seen = service.seen().await;
    assert_eq!(
        seen["token_requests"].as_array().unwrap().len(),
        1,
        "the token is reused: {seen:#?}"
    );
    let waiting: Vec<&Value> = seen["sends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["body"]["message"]["data"]["event"] == "permission_waiting")
        .collect();
    assert_eq!(waiting.len(), 2, "one per device: {seen:#?}");
    assert!(waiting.iter().all(|s| s["admitted"] == true), "{seen:#?}");
    let send = waiting
        .iter()
        .find(|s| s["body"]["message"]["token"] == "device-e2e")
        .unwrap();
    let message = &send["body"]["message"];
    assert_eq!(
        message["notification"]["title"],
        "demo asks: Run echo notified"
    );
    let data = message["data"].as_object().unwrap();
    assert!(data.values().all(Value::is_string), "{message}");
    assert_eq!(
        data["delivery_id"],
        attempts[&device].delivery_id.to_string()
    );
    assert_eq!(data["request_id"], request["id"]);
    assert_eq!(data["conversation_id"], conversation.as_str());
    assert_eq!(data["request_title"], "Run echo notified");
    assert!(!data.contains_key("command"), "minimal detail: {message}");
    assert_eq!(message["android"]["priority"], "high");
    // The conversation's next notification replaces this one.
    assert_eq!(message["android"]["collapse_key"], conversation.as_str());
    assert_eq!(
        message["apns"]["headers"]["apns-collapse-id"],
        conversation.as_str()
    );
    let actions: Vec<Action> = serde_json::from_str(data["actions"].as_str().unwrap()).unwrap();
    let options: Vec<&str> = actions.iter().map(|a| a.option_id.as_str()).collect();
    assert_eq!(
        options,
        ["allow-once", "allow-always", "reject-once", "reject-always"]
    );
    assert!(
        actions.iter().all(|a| a.url.starts_with(BASE)),
        "{actions:?}"
    );

    answer_through(&gw, &mut ws, &request, &actions).await;
    let listed = listed_targets(&gw).await;
    assert_eq!(listed[&gone]["gone"], true, "{listed:?}");
    assert_eq!(listed[&device]["gone"], false, "{listed:?}");
    gw.stop().await;
}

/// A notifying gateway's config with FCM on the stand-in service (which
/// writes the service account, its token_uri on loopback, before it says
/// where it listens); the directory holding that file goes with it.
fn fcm_notifying_config(db: &TestDb) -> (acp_gateway::config::Config, Service, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("service-account.json");
    let service = Service::start("fcm_service.py", &[file.to_str().unwrap()]);
    let mut config = notifying_config(db);
    config.notifications.fcm = Some(FcmConfig {
        service_account_file: file,
        api_base: Some(service.base.clone()),
    });
    (config, service, dir)
}

/// The other side of minimal: at `detail = "full"` FCM gets the command.
async fn fcm_at_full_detail_gets_the_command(db: TestDb) {
    let (mut config, service, _dir) = fcm_notifying_config(&db);
    config.notifications.detail = acp_gateway::config::NotificationDetail::Full;
    let gw = TestGateway::start_with(config).await;
    let device = create_target(&gw, json!({"kind": "fcm", "device_token": "device-e2e"})).await;
    let mut watch = gw.outbox.watch();
    let (_, mut ws, request) = waiting_request(&gw).await;
    let attempts = attempts_of(&mut watch, "permission_waiting", &[&device]).await;
    assert_eq!(attempts[&device].outcome, "delivered", "{attempts:?}");
    let seen = service.seen().await;
    let sends = seen["sends"].as_array().unwrap();
    assert_eq!(sends.len(), 1, "{seen:#?}");
    let data = &sends[0]["body"]["message"]["data"];
    assert_eq!(data["request_id"], request["id"]);
    assert_eq!(data["command"], "echo notified", "{data}");
    let actions: Vec<Action> = serde_json::from_str(data["actions"].as_str().unwrap()).unwrap();
    answer_through(&gw, &mut ws, &request, &actions).await;
    gw.stop().await;
}

/// A tool call titled with 5,000 characters (the agent chooses its titles):
/// Web Push (about 4 KB a payload) and FCM (4,000 bytes a message) each get
/// the request in one delivered attempt, its title cut to fit (on a
/// character, with an ellipsis), its actions with it.
async fn a_five_thousand_character_title_arrives_shortened_on_web_push_and_fcm(db: TestDb) {
    let (config, fcm_service, _dir) = fcm_notifying_config(&db);
    let gw = TestGateway::start_with(config).await;
    let push_service = Service::start("push_service.py", &[&vapid_public_key(&gw).await]);
    let push = web_push_target(&gw, &push_service).await;
    let device = create_target(&gw, json!({"kind": "fcm", "device_token": "device-long"})).await;
    let mut watch = gw.outbox.watch();

    // Two bytes a character: the title alone is twice what a push carries.
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, &format!("execute {}", "é".repeat(5000)))
        .await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let title = request["tool_call"]["title"].as_str().unwrap();
    assert_eq!(title.chars().count(), 5004, "Run and the command");

    let attempts = attempts_of(&mut watch, "permission_waiting", &[&push, &device]).await;
    for attempt in attempts.values() {
        assert_eq!(attempt.outcome, "delivered", "{attempts:?}");
        assert_eq!(attempt.attempt, 1, "{attempts:?}");
    }
    let shortened = |title: &str| {
        assert!(title.starts_with("Run éé"), "{title}");
        assert!(title.ends_with('…'), "{title}");
        assert!(title.chars().count() <= fit::TITLE_CHARS, "{title}");
    };

    let seen = decrypted_bodies(&push_service.seen().await);
    let waiting: Vec<&Value> = seen
        .iter()
        .map(|(body, _)| body)
        .filter(|body| body["event"] == "permission_waiting")
        .collect();
    assert_eq!(waiting.len(), 1, "one push: {seen:#?}");
    let body = waiting[0];
    assert_eq!(body["request"]["id"], request["id"]);
    shortened(body["request"]["title"].as_str().unwrap());
    let actions: Vec<Action> = serde_json::from_value(body["actions"].clone()).unwrap();
    assert_eq!(actions.len(), 4, "{actions:?}");

    let seen = fcm_service.seen().await;
    let sends: Vec<&Value> = seen["sends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["body"]["message"]["data"]["event"] == "permission_waiting")
        .collect();
    assert_eq!(sends.len(), 1, "one send: {seen:#?}");
    assert_eq!(sends[0]["admitted"], true, "{seen:#?}");
    assert!(sends[0]["size"].as_u64().unwrap() <= 4000, "{seen:#?}");
    let message = &sends[0]["body"]["message"];
    let data = &message["data"];
    assert_eq!(data["request_id"], request["id"]);
    shortened(data["request_title"].as_str().unwrap());
    let title = message["notification"]["title"].as_str().unwrap();
    assert!(title.starts_with("demo asks: Run éé"), "{title}");
    let actions: Vec<Action> = serde_json::from_str(data["actions"].as_str().unwrap()).unwrap();
    assert_eq!(actions.len(), 4, "{actions:?}");

    answer_through(&gw, &mut ws, &request, &actions).await;
    gw.stop().await;
}

/// FCM's OAuth endpoint hangs with several FCM deliveries under way: they
/// wait behind one token fetch. Each attempt, that wait included, ends
/// within its bound, well before its claim runs out (before, the fourth
/// waiter passed its 30 s claim, the worker claimed its row again and two
/// attempts sent it); once the endpoint answers, each delivery is sent once.
async fn fcm_deliveries_waiting_on_a_hanging_token_endpoint_are_each_sent_once(db: TestDb) {
    let (mut config, service, _dir) = fcm_notifying_config(&db);
    config.notifications.retry_base = Duration::from_millis(1);
    let gw = TestGateway::start_with(config).await;
    create_target(&gw, json!({"kind": "fcm", "device_token": "device-queued"})).await;
    let mut watch = gw.outbox.watch();
    let stall = |what: &'static str| {
        let url = format!("{}/{what}", service.base);
        async move {
            let resp = client().post(url).send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
    };
    stall("stall").await;
    const N: usize = 8;
    for i in 0..N {
        let body = Notification {
            user: "anonymous".into(),
            ..permission_waiting()
        };
        let outgoing = acp_gateway::notify::Outgoing {
            keys: vec![format!("permission_waiting:queued-{i}")],
            collapse_key: None,
            body,
        };
        assert!(acp_gateway::notify::Enqueue::enqueue(&*gw.outbox, outgoing)
            .await
            .unwrap());
    }
    // Every one has its first attempt end, failed, while the endpoint hangs
    // (each within its 10 s bound: the version that queued them behind
    // each other took 80 s). Only then does the endpoint answer: an attempt
    // still running then could be cut by its bound just after its request
    // reached the service, and be sent again, as at least once allows.
    let mut failed = std::collections::HashSet::new();
    while failed.len() < N {
        let attempt = tokio::time::timeout(3 * WAIT, watch.recv())
            .await
            .expect("attempts end while the token endpoint hangs")
            .unwrap();
        assert_eq!(attempt.outcome, "failed", "{attempt:?}");
        failed.insert(attempt.delivery_id);
    }
    stall("unstall").await;

    let mut delivered = std::collections::HashMap::new();
    while delivered.len() < N {
        let attempt = tokio::time::timeout(WAIT, watch.recv())
            .await
            .expect("every delivery is delivered in time")
            .unwrap();
        if attempt.outcome == "delivered" {
            let id = attempt.delivery_id;
            assert!(delivered.insert(id, attempt).is_none(), "{id} twice");
        }
    }
    let seen = service.seen().await;
    let mut sent: Vec<String> = seen["sends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["admitted"] == true)
        .map(|s| {
            s["body"]["message"]["data"]["delivery_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    sent.sort();
    let mut once = sent.clone();
    once.dedup();
    assert_eq!(once.len(), N, "{sent:#?}");
    assert_eq!(sent, once, "each delivery sent once");
    gw.stop().await;
}

backend_tests!(
    web_push_through_the_outbox_end_to_end,
    fcm_through_the_outbox_end_to_end,
    fcm_at_full_detail_gets_the_command,
    a_five_thousand_character_title_arrives_shortened_on_web_push_and_fcm,
    fcm_deliveries_waiting_on_a_hanging_token_endpoint_are_each_sent_once,
);
