//! Answering from a notification: the action URLs a
//! notification carries, against the real demo agent through a real gateway
//! whose notifier hands what is due to a recorder.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use acp_gateway::notify::{Action, Enqueue, Outgoing};
use serde_json::{json, Value};
use tokio::sync::mpsc;

struct Recorder(mpsc::UnboundedSender<Outgoing>);

#[async_trait::async_trait]
impl Enqueue for Recorder {
    async fn enqueue(&self, outgoing: Outgoing) -> acp_gateway::error::Result<bool> {
        let _ = self.0.send(outgoing);
        Ok(true)
    }
}

const BASE: &str = "https://gateway.example";

/// A gateway, a conversation whose agent waits for an answer, and the
/// notification about it.
async fn waiting(db: &TestDb) -> (TestGateway, Ws, Value, Outgoing) {
    let mut config = Config::for_tests(db, vec![demo_profile("demo", &[])]);
    config.notifications.grace = Duration::from_millis(200);
    config.notifications.base_url = Some(BASE.into());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let notified = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("notified in time")
        .unwrap();
    (gw, ws, request, notified)
}

/// The path of an action (its URL on the gateway under test).
fn path(action: &Action) -> String {
    let path = action.url.strip_prefix("https://gateway.example").unwrap();
    assert!(path.starts_with("/api/v1/actions/"), "{}", action.url);
    path.to_owned()
}

fn action<'a>(notified: &'a Outgoing, option: &str) -> &'a Action {
    notified
        .body
        .actions
        .iter()
        .find(|a| a.option_id == option)
        .unwrap_or_else(|| panic!("no action for {option}: {:?}", notified.body.actions))
}

async fn an_action_answers_once_and_the_turn_goes_on(db: TestDb) {
    let (gw, mut ws, request, notified) = waiting(&db).await;
    let options: Vec<&str> = notified
        .body
        .actions
        .iter()
        .map(|a| a.option_id.as_str())
        .collect();
    assert_eq!(
        options,
        ["allow-once", "allow-always", "reject-once", "reject-always"]
    );
    assert_eq!(action(&notified, "allow-once").label, "Allow once");
    let allow = path(action(&notified, "allow-once"));
    // No bearer token needed, nothing else reachable with it.
    let (status, answered) = gw.post(&allow, Value::Null).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["id"], request["id"]);
    assert_eq!(answered["status"], "approved");
    assert_eq!(answered["decision"]["option_id"], "allow-once");
    assert_eq!(answered["decision"]["decided_by"], "user:anonymous");
    assert_eq!(answered["decision"]["via"], "notification");
    // The agent got that option: the tool call completes and the turn ends.
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(streamed_text(&frames, "agent_message_chunk"), "Done.");
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    // Used: 410. A tampered or unknown token is no action at all: 404.
    let (status, problem) = gw.post(&allow, Value::Null).await;
    assert_eq!(status, 410, "{problem}");
    let mut tampered = allow.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_eq!(gw.post(&tampered, Value::Null).await.0, 404);
    let resp = gw.http.get(gw.url(&tampered)).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(
        gw.post("/api/v1/actions/nonsense", Value::Null).await.0,
        404
    );
    // Another option's token of the answered request: someone answered first.
    let (status, problem) = gw
        .post(&path(action(&notified, "reject-once")), Value::Null)
        .await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "already_resolved");
    assert_eq!(problem["request"]["decision"]["via"], "notification");
    gw.stop().await;
}

async fn get_shows_a_page_and_answers_nothing(db: TestDb) {
    let (gw, _ws, request, notified) = waiting(&db).await;
    let reject = path(action(&notified, "reject-once"));
    let resp = gw.http.get(gw.url(&reject)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let csp = resp.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = resp.text().await.unwrap();
    assert!(html.contains("<form method=\"post\">"), "{html}");
    assert!(html.contains("Reject"), "{html}");
    assert!(!html.contains("<script"), "{html}");
    let (_, now) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(now["status"], "pending");
    // The button still works after the page was fetched.
    let (status, answered) = gw.post(&reject, Value::Null).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "rejected");
    // A used token's page says it is gone.
    let resp = gw.http.get(gw.url(&reject)).send().await.unwrap();
    assert_eq!(resp.status(), 410);
    gw.stop().await;
}

async fn an_action_racing_a_respond_has_exactly_one_winner(db: TestDb) {
    let (gw, mut ws, request, notified) = waiting(&db).await;
    let allow = path(action(&notified, "allow-once"));
    let respond = format!(
        "/api/v1/permissions/{}/respond",
        request["id"].as_str().unwrap()
    );
    let (by_action, by_respond) = tokio::join!(
        gw.post(&allow, Value::Null),
        gw.post(&respond, json!({"option_id": "reject-once"})),
    );
    let mut statuses = [by_action.0, by_respond.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{by_action:?} {by_respond:?}");
    let loser = if by_action.0 == 409 {
        &by_action.1
    } else {
        &by_respond.1
    };
    assert_eq!(loser["code"], "already_resolved");
    let (_, stored) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    let expected = if by_action.0 == 200 {
        "approved"
    } else {
        "rejected"
    };
    assert_eq!(stored["status"], expected);
    ws.until_type("turn_ended").await;
    // The action's token is used whatever came of it.
    assert_eq!(gw.post(&allow, Value::Null).await.0, 410);
    gw.stop().await;
}

async fn a_users_action_answers_as_them_and_ends_when_they_are_removed(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.notifications.grace = Duration::from_millis(200);
    config.notifications.base_url = Some(BASE.into());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let mut notifications = Vec::new();
    for _ in 0..2 {
        let conv = gw.with_token(&alice).create("demo").await;
        gw.with_token(&alice).prompt(&conv, "tool").await;
        let notified = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(notified.body.user, "alice");
        notifications.push(notified);
    }
    let (status, answered) = gw
        .post(&path(action(&notifications[0], "allow-once")), Value::Null)
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["decision"]["decided_by"], "user:alice");
    assert_eq!(answered["decision"]["via"], "notification");
    let (status, _) = gw.delete_as("/api/v1/users/alice", Some(&operator)).await;
    assert_eq!(status, 204);
    let (status, _) = gw
        .post(&path(action(&notifications[1], "allow-once")), Value::Null)
        .await;
    assert_eq!(status, 410);
    gw.stop().await;
}

async fn an_expired_action_is_gone_and_swept(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.notifications.grace = Duration::from_millis(200);
    config.notifications.base_url = Some(BASE.into());
    config.notifications.action_ttl = Duration::from_nanos(1);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let notified = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    let allow = path(action(&notified, "allow-once"));
    let resp = gw.http.get(gw.url(&allow)).send().await.unwrap();
    assert_eq!(resp.status(), 410);
    assert_eq!(gw.post(&allow, Value::Null).await.0, 410);
    let (_, now) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(now["status"], "pending");
    gw.stop().await;
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let swept = store
        .delete_expired_action_tokens(chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(swept, 4, "one token per option");
}

/// Failed lookups are limited per client address, and everyone behind one
/// proxy or NAT shares theirs: past the limit, a lookup that fails answers
/// 429, but a usable token from that address still answers.
async fn a_usable_action_answers_from_an_address_over_the_failure_limit(db: TestDb) {
    let (gw, mut ws, request, notified) = waiting(&db).await;
    // From an address of its own: failed lookups are counted per client
    // address, in this process, for every test's gateway (this test's
    // other backend shares it, so the limit may be reached sooner).
    let shared = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 4]))
        .build()
        .unwrap();
    let unknown = gw.url(&format!("/api/v1/actions/{}", "A".repeat(43)));
    let mut refused = None;
    for _ in 0..=20 {
        let resp = shared.post(&unknown).send().await.unwrap();
        match resp.status().as_u16() {
            404 => {}
            429 => {
                refused = Some(resp);
                break;
            }
            other => panic!("an unknown token answered {other}"),
        }
    }
    let refused = refused.expect("429 past 20 failed lookups");
    assert!(refused.headers().contains_key("retry-after"));
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["code"], "rate_limited", "{problem}");

    // The notification's own URL still works from there: its page, then
    // its answer.
    let allow = gw.url(&path(action(&notified, "allow-once")));
    let page = shared.get(&allow).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let answered = shared.post(&allow).send().await.unwrap();
    assert_eq!(answered.status(), 200);
    let answered: Value = answered.json().await.unwrap();
    assert_eq!(answered["id"], request["id"]);
    assert_eq!(answered["decision"]["via"], "notification");
    ws.until_type("turn_ended").await;

    // What fails from there is still refused: a used token (410 else), an
    // unknown one, its page.
    assert_eq!(shared.post(&allow).send().await.unwrap().status(), 429);
    assert_eq!(shared.post(&unknown).send().await.unwrap().status(), 429);
    assert_eq!(shared.get(&unknown).send().await.unwrap().status(), 429);
    // Other addresses are not: the used token is 410 from this one.
    assert_eq!(
        gw.post(&path(action(&notified, "allow-once")), Value::Null)
            .await
            .0,
        410
    );
    gw.stop().await;
}

backend_tests!(
    an_expired_action_is_gone_and_swept,
    a_users_action_answers_as_them_and_ends_when_they_are_removed,
    an_action_answers_once_and_the_turn_goes_on,
    get_shows_a_page_and_answers_nothing,
    an_action_racing_a_respond_has_exactly_one_winner,
    a_usable_action_answers_from_an_address_over_the_failure_limit,
);
