//! Notification targets, the durable outbox and its webhook and ntfy
//! channels, against real receivers on loopback: a Python receiver that
//! checks the webhook signature with its own HMAC (`tests/notify/receiver.py`)
//! and records what it got. What the rules would hand over is enqueued
//! directly into the gateway's outbox. Nothing sleeps: every wait is on a
//! receiver's line or on an attempt being recorded.

use std::time::Duration;

use crate::common::*;
use acp_gateway::notify::outbox::Outbox;
use acp_gateway::notify::{
    Action, ConversationRef, Enqueue, Notification, NotificationEvent, Outgoing, RequestRef,
};
use acp_gateway::store::notify::AttemptRecord;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

/// A receiver subprocess (killed when dropped).
pub(crate) struct Receiver {
    _child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    port: u16,
}

impl Receiver {
    pub(crate) async fn start(secret: Option<&str>, statuses: &[u16]) -> Receiver {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/notify/receiver.py");
        let mut command = tokio::process::Command::new("python3");
        command.arg(script);
        if let Some(secret) = secret {
            command.args(["--secret", secret]);
        }
        let statuses: Vec<String> = statuses.iter().map(u16::to_string).collect();
        command.args(["--statuses", &statuses.join(",")]);
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the receiver");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the receiver starts")
            .unwrap()
            .unwrap();
        let port = serde_json::from_str::<Value>(&first).unwrap()["port"]
            .as_u64()
            .unwrap() as u16;
        Receiver {
            _child: child,
            lines,
            port,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The next request it got.
    pub(crate) async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .expect("the receiver gets a request in time")
            .unwrap()
            .expect("the receiver runs");
        serde_json::from_str(&line).unwrap()
    }

    /// Whether a request line is already there (every send whose attempt
    /// was recorded has printed its line before it was answered).
    async fn has_more(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(0), self.lines.next_line())
            .await
            .is_ok()
    }
}

/// A gateway that admits receivers on loopback and retries at once.
async fn gateway(db: &TestDb) -> TestGateway {
    TestGateway::start_with(config(db, true)).await
}

fn config(db: &TestDb, allow_private: bool) -> acp_gateway::config::Config {
    let mut config = Config::for_tests(db, vec![]);
    config.notifications.allow_private_targets = allow_private;
    config.notifications.retry_base = Duration::from_millis(1);
    config
}

/// Tokens for an operator, and for users ann and bob, made before the
/// gateway starts.
fn tokens(db: &TestDb) -> (String, String) {
    cli_token(db, "root", "operator");
    (cli_token(db, "ann", "user"), cli_token(db, "bob", "user"))
}

fn waiting(user: &str, key: &str) -> Outgoing {
    Outgoing {
        keys: vec![format!("permission_waiting:{key}")],
        collapse_key: Some("conversation-1".into()),
        body: Notification {
            event: NotificationEvent::PermissionWaiting,
            delivery_id: Uuid::nil(),
            at: chrono::Utc::now(),
            user: user.into(),
            conversation: Some(ConversationRef {
                id: Uuid::now_v7(),
                title: Some("Fix the build".into()),
                agent: "demo".into(),
            }),
            request: Some(RequestRef {
                id: Uuid::now_v7(),
                title: Some("Run cargo test".into()),
                kind: Some("execute".into()),
                command: Some("cargo test --all".into()),
            }),
            turn: None,
            count: 1,
            budget: None,
            actions: vec![
                Action {
                    label: "Allow once".into(),
                    option_id: "allow".into(),
                    url: "https://gw.example/api/v1/actions/aaaa".into(),
                },
                Action {
                    label: "Reject".into(),
                    option_id: "reject".into(),
                    url: "https://gw.example/api/v1/actions/bbbb".into(),
                },
            ],
        },
    }
}

/// Asserts `instance` matches the OpenAPI document's schema `name`.
fn documented(name: &str, instance: &Value) {
    let doc = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    let root =
        json!({"$ref": format!("#/components/schemas/{name}"), "components": doc["components"]});
    let validator = jsonschema::validator_for(&root).expect("a valid JSON Schema");
    let violations: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| e.to_string())
        .collect();
    assert!(
        violations.is_empty(),
        "{name}: {violations:?}\nin {instance}"
    );
}

async fn create(gw: &TestGateway, token: &str, body: Value) -> Value {
    let (status, created) = gw
        .post_as("/api/v1/notification-targets", Some(token), body)
        .await;
    assert_eq!(status, 201, "{created}");
    documented("CreatedNotificationTarget", &created);
    created
}

/// The next `n` attempts the outbox records.
async fn attempts(
    watch: &mut tokio::sync::broadcast::Receiver<AttemptRecord>,
    n: usize,
) -> Vec<AttemptRecord> {
    let mut got = Vec::new();
    while got.len() < n {
        got.push(
            tokio::time::timeout(WAIT, watch.recv())
                .await
                .expect("an attempt is recorded in time")
                .unwrap(),
        );
    }
    got
}

async fn deliveries(gw: &TestGateway, token: &str, id: &str) -> Vec<Value> {
    let (status, body) = gw
        .get_as(
            &format!("/api/v1/notification-targets/{id}/deliveries"),
            Some(token),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    documented("NotificationDeliveryList", &body);
    body["items"].as_array().unwrap().clone()
}

async fn targets(gw: &TestGateway, token: &str) -> Vec<Value> {
    let (status, body) = gw.get_as("/api/v1/notification-targets", Some(token)).await;
    assert_eq!(status, 200, "{body}");
    documented("NotificationTargetList", &body);
    body["items"].as_array().unwrap().clone()
}

async fn webhook_delivery_is_signed_minimal_and_recorded(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let mut watch = gw.outbox.watch();
    let probe = Receiver::start(None, &[]).await;
    // A generated secret, shown once.
    let created = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": probe.url("/hook"), "label": "CI bridge"}),
    )
    .await;
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert_eq!(secret.len(), 64, "{created}");
    drop(probe);
    let mut receiver = Receiver::start(Some(&secret), &[]).await;
    let created = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/hook"), "secret": secret}),
    )
    .await;
    assert!(
        created.get("secret").is_none(),
        "a given secret is not answered back: {created}"
    );
    let id = created["id"].as_str().unwrap().to_owned();
    // The first target points at a receiver that is gone: delete it.
    let first = targets(&gw, &ann).await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = gw
        .delete_as(&format!("/api/v1/notification-targets/{first}"), Some(&ann))
        .await;
    assert_eq!(status, 204);

    assert!(gw.outbox.enqueue(waiting("ann", "r1")).await.unwrap());
    let got = receiver.next().await;
    assert_eq!(got["path"], "/hook");
    assert_eq!(got["signature_ok"], true, "{got}");
    assert_eq!(got["headers"]["content-type"], "application/json");
    let body = &got["body"];
    assert_eq!(body["event"], "permission_waiting");
    assert_eq!(body["user"], "ann");
    assert_eq!(
        got["headers"]["x-acp-gateway-delivery"], body["delivery_id"],
        "{got}"
    );
    assert_eq!(body["request"]["title"], "Run cargo test");
    assert!(
        body["request"].get("command").is_none(),
        "minimal detail: {body}"
    );
    assert_eq!(
        body["actions"][0]["url"],
        "https://gw.example/api/v1/actions/aaaa"
    );

    let recorded = attempts(&mut watch, 1).await;
    assert_eq!(recorded[0].outcome, "delivered");
    let listed = targets(&gw, &ann).await;
    assert_eq!(listed.len(), 1);
    let target = &listed[0];
    assert_eq!(target["id"], id.as_str());
    assert_eq!(target["kind"], "webhook");
    assert_eq!(target["gone"], false);
    assert_eq!(target["last_delivery"]["outcome"], "delivered");
    assert!(
        target.get("secret").is_none() && target.get("url").is_none(),
        "{target}"
    );
    let attempts = deliveries(&gw, &ann, &id).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["delivery_id"], body["delivery_id"]);
    assert_eq!(attempts[0]["event"], "permission_waiting");
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["http_status"], 200);

    let metrics = gw
        .http
        .get(gw.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"acp_gateway_notifications_total{kind="webhook",outcome="delivered"}"#),
        "{metrics}"
    );
    gw.stop().await;
}

async fn ntfy_gets_its_json_format_with_http_actions(db: TestDb) {
    let (ann, _) = tokens(&db);
    let mut config = config(&db, true);
    config.notifications.detail = acp_gateway::config::NotificationDetail::Full;
    let gw = TestGateway::start_with(config).await;
    let mut receiver = Receiver::start(None, &[]).await;
    create(&gw, &ann, json!({"kind": "ntfy", "url": receiver.url("/ntfy/alerts"), "token": "tk_123", "events": ["permission_waiting"]})).await;
    assert!(gw.outbox.enqueue(waiting("ann", "r1")).await.unwrap());
    let got = receiver.next().await;
    assert_eq!(got["path"], "/ntfy/", "published to the server's root");
    assert_eq!(got["headers"]["authorization"], "Bearer tk_123");
    assert!(got["headers"]["x-acp-gateway-delivery"].is_string());
    let body = &got["body"];
    assert_eq!(body["topic"], "alerts");
    assert_eq!(body["title"], "Permission needed: Fix the build");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cargo test --all"),
        "full detail: {body}"
    );
    assert_eq!(body["priority"], 4);
    assert_eq!(
        body["actions"],
        json!([
            {"action": "http", "label": "Allow once", "url": "https://gw.example/api/v1/actions/aaaa", "method": "POST", "clear": true},
            {"action": "http", "label": "Reject", "url": "https://gw.example/api/v1/actions/bbbb", "method": "POST", "clear": true},
        ])
    );
    gw.stop().await;
}

async fn the_test_endpoint_answers_the_outcome_and_410_marks_the_target_gone(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let mut ok = Receiver::start(Some("0123456789abcdef"), &[]).await;
    let target = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": ok.url("/"), "secret": "0123456789abcdef"}),
    )
    .await;
    let id = target["id"].as_str().unwrap();
    let (status, answer) = send_test(&gw, &ann, id).await;
    assert_eq!(status, 200, "{answer}");
    documented("NotificationDelivery", &answer);
    assert_eq!(answer["outcome"], "delivered");
    assert_eq!(answer["event"], "test");
    assert_eq!(answer["http_status"], 200);
    let got = ok.next().await;
    assert_eq!(
        (got["body"]["event"].clone(), got["signature_ok"].clone()),
        (json!("test"), json!(true))
    );
    assert_eq!(deliveries(&gw, &ann, id).await.len(), 1);
    let mut gone = Receiver::start(None, &[410]).await;
    let target = create(&gw, &ann, json!({"kind": "ntfy", "url": gone.url("/t")})).await;
    let gone_id = target["id"].as_str().unwrap();
    let (status, answer) = send_test(&gw, &ann, gone_id).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["outcome"].clone(), answer["http_status"].clone()),
        (json!("gone"), json!(410))
    );
    gone.next().await;
    let listed = targets(&gw, &ann).await;
    let listed_gone = listed.iter().find(|t| t["id"] == gone_id).unwrap();
    assert_eq!(listed_gone["gone"], true);
    assert_eq!(listed_gone["last_delivery"]["outcome"], "gone");

    // Nothing more for the gone target: the live one gets the next.
    let mut watch = gw.outbox.watch();
    assert!(gw.outbox.enqueue(waiting("ann", "r2")).await.unwrap());
    assert_eq!(ok.next().await["body"]["event"], "permission_waiting");
    attempts(&mut watch, 1).await;
    assert_eq!(deliveries(&gw, &ann, gone_id).await.len(), 1);
    assert!(!gone.has_more().await);
    gw.stop().await;
}

async fn a_receiver_failing_twice_gets_three_attempts_and_one_delivery(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let mut watch = gw.outbox.watch();
    let mut receiver = Receiver::start(Some("0123456789abcdef"), &[500, 503, 200]).await;
    let target = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/"), "secret": "0123456789abcdef"}),
    )
    .await;
    assert!(gw.outbox.enqueue(waiting("ann", "r1")).await.unwrap());
    let got: Vec<Value> = vec![
        receiver.next().await,
        receiver.next().await,
        receiver.next().await,
    ];
    let ids: Vec<&Value> = got.iter().map(|g| &g["body"]["delivery_id"]).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "one delivery: {ids:?}");
    assert!(got.iter().all(|g| g["signature_ok"] == true));
    let recorded = attempts(&mut watch, 3).await;
    let outcomes: Vec<(&str, i32)> = recorded
        .iter()
        .map(|a| (a.outcome.as_str(), a.attempt))
        .collect();
    assert_eq!(outcomes, [("failed", 1), ("failed", 2), ("delivered", 3)]);
    let listed = deliveries(&gw, &ann, target["id"].as_str().unwrap()).await;
    let statuses: Vec<(Value, Value)> = listed
        .iter()
        .map(|a| (a["attempt"].clone(), a["http_status"].clone()))
        .collect();
    assert_eq!(
        statuses,
        [
            (json!(3), json!(200)),
            (json!(2), json!(503)),
            (json!(1), json!(500))
        ]
    );
    assert!(!receiver.has_more().await);
    gw.stop().await;
}

async fn the_same_keys_are_notified_once(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let mut watch = gw.outbox.watch();
    let mut receiver = Receiver::start(None, &[]).await;
    let target = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    assert!(gw.outbox.enqueue(waiting("ann", "r1")).await.unwrap());
    assert!(!gw.outbox.enqueue(waiting("ann", "r1")).await.unwrap());
    let mut other = waiting("ann", "r2");
    other.body.count = 2;
    assert!(gw.outbox.enqueue(other).await.unwrap());
    attempts(&mut watch, 2).await;
    let counts = [receiver.next().await, receiver.next().await].map(|g| g["body"]["count"].clone());
    assert!(
        counts.contains(&json!(1)) && counts.contains(&json!(2)),
        "{counts:?}"
    );
    assert!(!receiver.has_more().await);
    assert_eq!(
        deliveries(&gw, &ann, target["id"].as_str().unwrap())
            .await
            .len(),
        2
    );
    gw.stop().await;
}

/// What was due when the gateway stopped (here: put in the outbox while it
/// was down, as a crash between enqueue and send leaves it) is sent after
/// it starts again.
async fn a_pending_delivery_is_sent_after_a_restart(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let mut receiver = Receiver::start(None, &[]).await;
    create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    let config = gw.stop().await;
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    assert!(acp_gateway::notify::outbox::enqueue_into(
        &*store,
        config.notifications.detail,
        &waiting("ann", "r1")
    )
    .await
    .unwrap());
    drop(store);
    let gw = TestGateway::start_with(config).await;
    assert_eq!(receiver.next().await["body"]["user"], "ann");
    gw.stop().await;
}

/// The gateway killed (SIGKILL) while a receiver holds its request
/// unanswered: the delivery is sent again, with its `delivery_id`, by the
/// gateway started after it.
async fn a_gateway_killed_mid_delivery_delivers_after_restart(db: TestDb) {
    let config =
        "node_lease = \"1s\"\n[notifications]\nallow_private_targets = true\nretry_base = \"1ms\"";
    let gw = GatewayProcess::start_configured(&db, &[], "info", config);
    let mut receiver = Receiver::start(None, &[0]).await;
    let (status, created) = gw
        .call(
            "POST",
            "/api/v1/notification-targets",
            Some(json!({"kind": "webhook", "url": receiver.url("/")})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    // What the rules would hand over, put in the outbox through the store
    // (the gateway finds it when it next looks).
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let outgoing = waiting("anonymous", "r1");
    let detail = acp_gateway::config::NotificationDetail::Minimal;
    assert!(
        acp_gateway::notify::outbox::enqueue_into(&*store, detail, &outgoing)
            .await
            .unwrap()
    );
    drop(store);
    let first = receiver.next().await;
    gw.kill();
    let gw = GatewayProcess::start_configured(&db, &[], "info", config);
    let again = receiver.next().await;
    assert_eq!(again["body"]["delivery_id"], first["body"]["delivery_id"]);
    assert_eq!(
        again["headers"]["x-acp-gateway-delivery"],
        first["headers"]["x-acp-gateway-delivery"]
    );
    let id = created["id"].as_str().unwrap();
    let (_, listed) = gw
        .call(
            "GET",
            &format!("/api/v1/notification-targets/{id}/deliveries"),
            None,
        )
        .await;
    let items = listed["items"].as_array().unwrap();
    // The killed gateway recorded nothing; the second one's attempt may
    // still be on its way to the database: at most that one.
    assert!(
        items.len() <= 1 && items.iter().all(|a| a["outcome"] == "delivered"),
        "{listed}"
    );
    gw.stop();
}

/// Keys, finished deliveries and attempts past the retention are
/// forgotten; nothing younger is.
async fn old_notification_records_are_forgotten(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let mut watch = gw.outbox.watch();
    let mut receiver = Receiver::start(None, &[]).await;
    let target = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    let id: Uuid = target["id"].as_str().unwrap().parse().unwrap();
    assert!(gw.outbox.enqueue(waiting("ann", "r1")).await.unwrap());
    receiver.next().await;
    attempts(&mut watch, 1).await;
    let config = gw.stop().await;
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let now = chrono::Utc::now();
    assert_eq!(
        store
            .sweep_notifications(now - chrono::Duration::days(30))
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.list_attempts(id, 10).await.unwrap().len(), 1);
    // Key, delivery and attempt: three rows.
    assert_eq!(
        store
            .sweep_notifications(now + chrono::Duration::days(1))
            .await
            .unwrap(),
        3
    );
    assert!(store.list_attempts(id, 10).await.unwrap().is_empty());
    let detail = config.notifications.detail;
    assert!(
        acp_gateway::notify::outbox::enqueue_into(&*store, detail, &waiting("ann", "r1"))
            .await
            .unwrap(),
        "a forgotten key is new again"
    );
}

async fn test_notifications_are_limited_per_user(db: TestDb) {
    let (ann, bob) = tokens(&db);
    let gw = gateway(&db).await;
    let mut receiver = Receiver::start(None, &[]).await;
    let mine = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    let theirs = create(
        &gw,
        &bob,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    let test = |target: &Value| {
        format!(
            "/api/v1/notification-targets/{}/test",
            target["id"].as_str().unwrap()
        )
    };
    for _ in 0..10 {
        let (status, answer) = gw.call_as("POST", &test(&mine), Some(&ann), None).await;
        assert_eq!(status, 200, "{answer}");
        receiver.next().await;
    }
    let (status, problem) = gw.call_as("POST", &test(&mine), Some(&ann), None).await;
    assert_eq!(status, 429, "{problem}");
    assert!(!receiver.has_more().await);
    // Per user: bob's are not counted with ann's.
    let (status, _) = gw.call_as("POST", &test(&theirs), Some(&bob), None).await;
    assert_eq!(status, 200);
    gw.stop().await;
}

async fn users_see_and_delete_only_their_own_targets(db: TestDb) {
    let (ann, bob) = tokens(&db);
    let gw = gateway(&db).await;
    let receiver = Receiver::start(None, &[]).await;
    let target = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    let id = target["id"].as_str().unwrap();
    assert!(targets(&gw, &bob).await.is_empty());
    for (method, path) in [
        ("DELETE", format!("/api/v1/notification-targets/{id}")),
        ("POST", format!("/api/v1/notification-targets/{id}/test")),
        (
            "GET",
            format!("/api/v1/notification-targets/{id}/deliveries"),
        ),
    ] {
        let (status, body) = gw.call_as(method, &path, Some(&bob), None).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let (status, _) = gw.call("GET", "/api/v1/notification-targets", None).await;
    assert_eq!(status, 401);
    let (status, _) = gw
        .get_as("/api/v1/notification-targets/nope/deliveries", Some(&ann))
        .await;
    assert_eq!(status, 404);
    // Nothing is enqueued for bob from ann's targets.
    assert!(gw.outbox.enqueue(waiting("bob", "r1")).await.unwrap());
    assert_eq!(targets(&gw, &ann).await.len(), 1);
    let (status, _) = gw
        .delete_as(&format!("/api/v1/notification-targets/{id}"), Some(&ann))
        .await;
    assert_eq!(status, 204);
    assert!(targets(&gw, &ann).await.is_empty());
    gw.stop().await;
}

async fn bad_targets_are_refused_with_422(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let key65 = format!("B{}", "A".repeat(86));
    let cases = [
        (json!({"kind": "webhook"}), "url"),
        (json!({"kind": "webhook", "url": "not a url"}), "url"),
        (
            json!({"kind": "webhook", "url": "ftp://example.com/"}),
            "url",
        ),
        (
            json!({"kind": "webhook", "url": format!("https://example.com/{}", "a".repeat(2100))}),
            "url",
        ),
        (
            json!({"kind": "webhook", "url": "https://example.com/", "secret": "short"}),
            "secret",
        ),
        (
            json!({"kind": "webhook", "url": "https://example.com/", "events": ["nope"]}),
            "events",
        ),
        (
            json!({"kind": "webhook", "url": "https://example.com/", "events": []}),
            "events",
        ),
        (
            json!({"kind": "webhook", "url": "https://example.com/", "label": "a\nb"}),
            "label",
        ),
        (
            json!({"kind": "webhook", "url": "https://example.com/", "device_token": "x"}),
            "device_token",
        ),
        (
            json!({"kind": "ntfy", "url": "https://ntfy.example/"}),
            "topic",
        ),
        (json!({"kind": "web_push"}), "subscription"),
        (
            json!({"kind": "web_push", "subscription": {"endpoint": "https://push.example/x", "keys": {"p256dh": "AAAA", "auth": "AAAAAAAAAAAAAAAAAAAAAA"}}}),
            "p256dh",
        ),
        (
            json!({"kind": "web_push", "subscription": {"endpoint": "https://push.example/x", "keys": {"p256dh": key65, "auth": "AAAA"}}}),
            "auth",
        ),
        (
            json!({"kind": "web_push", "subscription": {"endpoint": "https://push.example/x", "keys": {"p256dh": key65, "auth": "!!!!"}}}),
            "base64url",
        ),
        (json!({"kind": "carrier_pigeon"}), "kind"),
    ];
    for (body, says) in cases {
        let (status, problem) = gw
            .post_as("/api/v1/notification-targets", Some(&ann), body.clone())
            .await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{body}: {problem}"
        );
    }
    // 65 bytes that are not a point of the curve: taken (the document
    // cannot say what a point is), and nothing can be encrypted to it, which
    // its first delivery says.
    let not_a_point = format!("BA{}", "A".repeat(85));
    let target = create(
        &gw,
        &ann,
        json!({"kind": "web_push", "subscription": {"endpoint": "http://127.0.0.1:9/push", "keys": {"p256dh": not_a_point, "auth": "AAAAAAAAAAAAAAAAAAAAAA"}}}),
    )
    .await;
    let (status, answer) = gw
        .call_as(
            "POST",
            &format!(
                "/api/v1/notification-targets/{}/test",
                target["id"].as_str().unwrap()
            ),
            Some(&ann),
            None,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcome"], "failed", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("not a P-256 public key"),
        "{answer}"
    );
    // A valid subscription is taken (a real point, its 16 bytes padded or not).
    let key65 = acp_gateway::notify::vapid::generate().public_b64;
    create(&gw, &ann, json!({"kind": "web_push", "subscription": {"endpoint": "http://127.0.0.1:9/push", "keys": {"p256dh": key65, "auth": "AAAAAAAAAAAAAAAAAAAAAA=="}}})).await;
    gw.stop().await;
}

/// Refused with 403: the operator's setting decides, not the document.
async fn private_addresses_are_refused_unless_allowed(db: TestDb) {
    let (ann, _) = tokens(&db);
    let gw = TestGateway::start_with(config(&db, false)).await;
    for url in [
        "http://example.com/plain-http",
        "https://127.0.0.1/hook",
        "https://localhost/hook",
        "https://10.0.0.1/hook",
        "https://192.168.1.10/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.0.1/hook",
        "https://[::1]/hook",
        "https://[fd00:ec2::254]/hook",
        "https://[fe80::1]/hook",
    ] {
        let (status, problem) = gw
            .post_as(
                "/api/v1/notification-targets",
                Some(&ann),
                json!({"kind": "webhook", "url": url}),
            )
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (403, Some("forbidden")),
            "{url}: {problem}"
        );
    }
    gw.stop().await;
    // Allowed: a receiver on this machine.
    let gw = gateway(&db).await;
    let mut receiver = Receiver::start(None, &[]).await;
    let target = create(
        &gw,
        &ann,
        json!({"kind": "webhook", "url": format!("http://localhost:{}/", receiver.port)}),
    )
    .await;
    let id = target["id"].as_str().unwrap().to_owned();
    let (_, answer) = send_test(&gw, &ann, &id).await;
    assert_eq!(answer["outcome"], "delivered", "{answer}");
    receiver.next().await;
    // No longer allowed: the same name, resolving to 127.0.0.1, is refused
    // at delivery, after resolution.
    gw.stop().await;
    let gw = TestGateway::start_with(config(&db, false)).await;
    let (status, answer) = send_test(&gw, &ann, &id).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcome"], "failed", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("private or local"),
        "{answer}"
    );
    assert!(!receiver.has_more().await);
    gw.stop().await;
}

async fn the_vapid_public_key_is_made_once_and_kept(db: TestDb) {
    use base64::Engine;
    let (ann, _) = tokens(&db);
    let gw = gateway(&db).await;
    let (status, body) = gw
        .get_as("/api/v1/notifications/vapid-public-key", Some(&ann))
        .await;
    assert_eq!(status, 200, "{body}");
    documented("VapidPublicKey", &body);
    let key = body["public_key"].as_str().unwrap().to_owned();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&key)
        .unwrap();
    assert_eq!((bytes.len(), bytes[0]), (65, 4));
    let gw = gw.restart().await;
    let (_, again) = gw
        .get_as("/api/v1/notifications/vapid-public-key", Some(&ann))
        .await;
    assert_eq!(again["public_key"], key.as_str());
    gw.stop().await;
}

/// A user removed while their request waits out its grace: their
/// conversation goes on, but nothing of it reaches them. Bob's request,
/// asked after the removal and so due after hers, is notified; hers never
/// is (no delivery, no action URL minted), an action URL minted for her
/// afterwards answers nothing, and a delivery already in the outbox for her
/// is not sent.
async fn a_removed_user_is_notified_nothing_and_no_later_action_of_theirs_answers(db: TestDb) {
    let operator = cli_token(&db, "root", "operator");
    let (alice, bob) = (
        cli_token(&db, "alice", "user"),
        cli_token(&db, "bob", "user"),
    );
    let grace = Duration::from_secs(2);
    let mut config = config(&db, true);
    config.agents = vec![demo_profile("demo", &[])];
    config.notifications.grace = grace;
    config.notifications.base_url = Some("https://gw.example".into());
    let gw = TestGateway::start_with(config).await;
    let mut watch = gw.outbox.watch();
    let mut receiver = Receiver::start(None, &[]).await;
    let mut target = String::new();
    for token in [&alice, &bob] {
        let created = create(
            &gw,
            token,
            json!({"kind": "webhook", "url": receiver.url("/"), "secret": "0123456789abcdef"}),
        )
        .await;
        target = created["id"].as_str().unwrap().to_owned();
    }
    let bobs_target = target;

    let as_alice = gw.with_token(&alice);
    let (conversation, mut ws) = as_alice.open_conversation("demo").await;
    as_alice.prompt(&conversation, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let (status, _) = gw.delete_as("/api/v1/users/alice", Some(&operator)).await;
    assert_eq!(status, 204);
    let asked: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(request["created_at"].clone()).unwrap();
    assert!(
        chrono::Utc::now() < asked + chrono::Duration::from_std(grace).unwrap(),
        "removed before her request was due"
    );

    let as_bob = gw.with_token(&bob);
    let (theirs, mut bobs_ws) = as_bob.open_conversation("demo").await;
    as_bob.prompt(&theirs, "tool").await;
    bobs_ws.until_type("permission_requested").await;
    let got = receiver.next().await;
    assert_eq!(got["body"]["user"], "bob", "{got}");
    assert_eq!(got["body"]["event"], "permission_waiting");
    let recorded = attempts(&mut watch, 1).await;
    assert_eq!(recorded[0].target_id.to_string(), bobs_target);
    // Hers was due first, and the notifier hands over one at a time: had it
    // been handed over, it would be in the outbox by now.
    assert!(!receiver.has_more().await);
    let of_alice = |table: &str| {
        format!(
            "select count(*) from {table} d join notification_targets t on t.id = d.target_id
             where t.owner = 'alice'"
        )
    };
    assert_eq!(db.number(&of_alice("notification_deliveries")).await, 0);
    assert_eq!(
        db.number(
            "select count(*) from action_tokens where user_name = 'alice' and used_at is null"
        )
        .await,
        0,
        "no action URL minted for her"
    );

    // An action URL minted for her now (as a notifier that missed the
    // removal would) answers nothing, and her request still waits.
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let id: Uuid = serde_json::from_value(request["id"].clone()).unwrap();
    let pending = store.get_permission(id).await.unwrap().unwrap();
    let minter = acp_gateway::notify::actions::Minter {
        store: store.clone(),
        base_url: "https://gw.example".into(),
        ttl: Duration::from_secs(3600),
    };
    use acp_gateway::notify::notifier::MintActions as _;
    let minted = minter.mint(&pending, "alice").await.unwrap();
    let url = gw.url(minted[0].url.strip_prefix("https://gw.example").unwrap());
    // From an address of its own: failed lookups are counted per client
    // address, in this process, for every test's gateway.
    let client = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 3]))
        .build()
        .unwrap();
    let page = client.get(&url).send().await.unwrap();
    assert_eq!(page.status(), 410);
    let answered = client.post(&url).send().await.unwrap();
    assert_eq!(answered.status(), 410);
    let (_, now) = gw
        .get_as(&format!("/api/v1/permissions/{id}"), Some(&operator))
        .await;
    assert_eq!(now["status"], "pending", "{now}");

    // A delivery for her already in the outbox (enqueued before her
    // removal, or waiting for a retry) is not sent, nor tried again.
    assert!(gw.outbox.enqueue(waiting("alice", "r1")).await.unwrap());
    let recorded = attempts(&mut watch, 1).await;
    assert_eq!(recorded[0].outcome, "failed");
    assert_eq!(
        recorded[0].error.as_deref(),
        Some("its user was removed: not sent")
    );
    assert_eq!(
        db.number(&format!(
            "{} and d.status = 'pending'",
            of_alice("notification_deliveries")
        ))
        .await,
        0,
        "not tried again"
    );
    assert!(!receiver.has_more().await);
    drop(ws);
    drop(bobs_ws);
    gw.stop().await;
}

backend_tests!(
    webhook_delivery_is_signed_minimal_and_recorded,
    ntfy_gets_its_json_format_with_http_actions,
    the_test_endpoint_answers_the_outcome_and_410_marks_the_target_gone,
    a_receiver_failing_twice_gets_three_attempts_and_one_delivery,
    the_same_keys_are_notified_once,
    a_pending_delivery_is_sent_after_a_restart,
    a_gateway_killed_mid_delivery_delivers_after_restart,
    old_notification_records_are_forgotten,
    test_notifications_are_limited_per_user,
    users_see_and_delete_only_their_own_targets,
    bad_targets_are_refused_with_422,
    private_addresses_are_refused_unless_allowed,
    the_vapid_public_key_is_made_once_and_kept,
    a_removed_user_is_notified_nothing_and_no_later_action_of_theirs_answers,
);

/// Two gateway nodes on one Postgres, both sending: every delivery is sent
/// once (a second send would also record a second attempt 1, which the
/// attempts' key refuses).
#[tokio::test]
async fn two_nodes_on_one_postgres_send_each_delivery_once() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (ann, _) = tokens(&db);
    let a = gateway(&db).await;
    let b = gateway(&db).await;
    let mut receiver = Receiver::start(None, &[]).await;
    create(
        &a,
        &ann,
        json!({"kind": "webhook", "url": receiver.url("/")}),
    )
    .await;
    let (mut watch_a, mut watch_b) = (a.outbox.watch(), b.outbox.watch());
    const N: usize = 40;
    let nodes: [&Outbox; 2] = [&a.outbox, &b.outbox];
    for i in 0..N {
        assert!(nodes[i % 2]
            .enqueue(waiting("ann", &format!("r{i}")))
            .await
            .unwrap());
    }
    let mut recorded = Vec::new();
    while recorded.len() < N {
        let next = tokio::time::timeout(WAIT, async {
            tokio::select! {
                a = watch_a.recv() => ('a', a.unwrap()),
                b = watch_b.recv() => ('b', b.unwrap()),
            }
        })
        .await
        .expect("every delivery is recorded in time");
        recorded.push(next);
    }
    let by_a = recorded.iter().filter(|(node, _)| *node == 'a').count();
    eprintln!("node a sent {by_a} of {N}, node b the rest");
    let recorded: Vec<AttemptRecord> = recorded.into_iter().map(|(_, r)| r).collect();
    let mut ids: Vec<Uuid> = recorded.iter().map(|r| r.delivery_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), N);
    assert!(recorded
        .iter()
        .all(|r| r.outcome == "delivered" && r.attempt == 1));
    let mut got = Vec::new();
    for _ in 0..N {
        got.push(receiver.next().await["body"]["delivery_id"].clone());
    }
    assert!(!receiver.has_more().await, "no delivery was sent twice");
    got.sort_by_key(|v| v.to_string());
    got.dedup();
    assert_eq!(got.len(), N);
    a.stop().await;
    b.stop().await;
}

/// `POST …/notification-targets/{id}/test` as the holder of `token`.
async fn send_test(gw: &Client, token: &str, id: &str) -> (u16, Value) {
    let path = format!("/api/v1/notification-targets/{id}/test");
    gw.call_as("POST", &path, Some(token), None).await
}
