//! When a person is notified, against the real demo agent through a real
//! gateway whose notifier hands what is due to a recorder.
//!
//! Nothing sleeps: "nothing was notified" is shown by a later notification
//! that would have come after it (the notifier hands notifications over in
//! the order they fall due).

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use acp_gateway::config::Config;
use acp_gateway::notify::{Enqueue, NotificationEvent, Outgoing};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Records every notification handed over, duplicates included (the outbox
/// would drop those by their keys: here the test sees them).
struct Recorder(mpsc::UnboundedSender<Outgoing>);

#[async_trait::async_trait]
impl Enqueue for Recorder {
    async fn enqueue(&self, outgoing: Outgoing) -> acp_gateway::error::Result<bool> {
        let _ = self.0.send(outgoing);
        Ok(true)
    }
}

struct Notified(mpsc::UnboundedReceiver<Outgoing>);

impl Notified {
    async fn next(&mut self) -> Outgoing {
        tokio::time::timeout(WAIT, self.0.recv())
            .await
            .expect("a notification in time")
            .expect("the notifier runs")
    }

    fn none_yet(&mut self) {
        if let Ok(o) = self.0.try_recv() {
            panic!("unexpected notification {o:?}");
        }
    }
}

fn config(db: &TestDb, agents: Vec<acp_gateway::config::AgentProfile>) -> Config {
    let mut config = Config::for_tests(db, agents);
    config.notifications.grace = Duration::from_millis(600);
    config.notifications.min_turn = Duration::from_millis(300);
    config.notifications.reminder_before = Duration::from_millis(1500);
    config
}

async fn start(config: Config) -> (TestGateway, Notified) {
    let (tx, rx) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    (gw, Notified(rx))
}

async fn requests(ws: &mut Ws, n: usize) -> Vec<Value> {
    let mut found = Vec::new();
    while found.len() < n {
        let frame = ws.until_type("permission_requested").await.pop().unwrap();
        found.push(frame["data"].clone());
    }
    found
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_owned()
}

/// A conversation with one request pending, as a sentinel: its notification
/// comes after any due earlier.
async fn pending_request(gw: &TestGateway) -> (String, Value) {
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "tool").await;
    let request = requests(&mut ws, 1).await.pop().unwrap();
    (conversation, request)
}

async fn a_burst_of_requests_makes_one_notification_and_none_twice(db: TestDb) {
    let mut config = config(&db, vec![demo_profile("demo", &[])]);
    // The burst comes while its owner is here, so nothing is due however far
    // apart a busy machine stamps the three requests (the rules' own test
    // shows requests due within `BATCH` of each other going together), and
    // with no grace all three are due at once when the owner goes.
    config.notifications.grace = Duration::ZERO;
    let (gw, mut notified) = start(config).await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    assert_eq!(inbox.next().await["type"], "snapshot");
    say_presence(&mut inbox, true).await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "parallel 3").await;
    let reqs = requests(&mut ws, 3).await;
    notified.none_yet();
    say_presence(&mut inbox, false).await;
    let got = notified.next().await;
    let body = &got.body;
    assert_eq!(body.event, NotificationEvent::PermissionWaiting);
    assert_eq!(body.count, 3);
    assert_eq!(body.user, "anonymous");
    let mut keys: Vec<String> = reqs
        .iter()
        .map(|r| format!("permission_waiting:{}", id(r)))
        .collect();
    let mut got_keys = got.keys.clone();
    keys.sort();
    got_keys.sort();
    assert_eq!(got_keys, keys);
    let conv = body.conversation.as_ref().unwrap();
    assert_eq!(conv.id.to_string(), conversation);
    assert_eq!(conv.agent, "demo");
    assert_eq!(got.collapse_key.as_deref(), Some(conversation.as_str()));
    let request = body.request.as_ref().unwrap();
    assert!(reqs.iter().any(|r| id(r) == request.id.to_string()));
    assert!(request.title.is_some());
    assert_eq!(body.delivery_id, uuid::Uuid::nil());
    assert!(body.actions.is_empty(), "no base_url: no actions");
    // Nothing more for those three: the next one is a later request's.
    let (_, sentinel) = pending_request(&gw).await;
    let next = notified.next().await;
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&sentinel))]);
    assert_eq!(next.body.count, 1);
    notified.none_yet();
    gw.stop().await;
}

async fn a_request_answered_within_the_grace_is_not_notified(db: TestDb) {
    let mut config = config(&db, vec![demo_profile("demo", &[])]);
    config.notifications.grace = Duration::from_secs(2);
    let (gw, mut notified) = start(config).await;
    let (_, request) = pending_request(&gw).await;
    let (status, _) = gw
        .post(
            &format!("/api/v1/permissions/{}/respond", id(&request)),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, sentinel) = pending_request(&gw).await;
    let next = notified.next().await;
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&sentinel))]);
    gw.stop().await;
}

/// Sends a presence frame and waits until the server has read it (the
/// answer to a ping sent after it).
async fn say_presence(ws: &mut Ws, visible: bool) {
    let frame = json!({"type": "presence", "visible": visible}).to_string();
    ws.stream.send(WsMessage::Text(frame.into())).await.unwrap();
    ws.stream
        .send(WsMessage::Ping(b"presence".to_vec().into()))
        .await
        .unwrap();
    loop {
        let msg = tokio::time::timeout(WAIT, ws.stream.next())
            .await
            .expect("pong in time")
            .expect("open")
            .expect("frame");
        if matches!(msg, WsMessage::Pong(ref p) if p.as_ref() == b"presence") {
            return;
        }
    }
}

async fn nothing_while_present_then_one_when_the_last_client_goes_away(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let (gw, mut notified) = start(config(&db, vec![demo_profile("demo", &[])])).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let mut phone = gw.ws(&format!("/api/v1/ws?access_token={alice}")).await;
    let mut laptop = gw.ws(&format!("/api/v1/ws?access_token={alice}")).await;
    assert_eq!(phone.next().await["type"], "snapshot");
    assert_eq!(laptop.next().await["type"], "snapshot");
    say_presence(&mut phone, true).await;
    say_presence(&mut laptop, true).await;
    let ask = |token: String| {
        let gw = &gw;
        async move {
            let conv = gw.with_token(&token).create("demo").await;
            let mut ws = gw
                .ws(&format!(
                    "/api/v1/conversations/{conv}/ws?access_token={token}"
                ))
                .await;
            gw.with_token(&token).prompt(&conv, "tool").await;
            requests(&mut ws, 1).await.pop().unwrap()
        }
    };
    let alices = ask(alice.clone()).await;
    // Bob's request, asked after Alice's, is notified: Alice's grace has
    // ended too, and hers would have come first.
    let bobs = ask(bob.clone()).await;
    let next = notified.next().await;
    assert_eq!(next.body.user, "bob");
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&bobs))]);
    notified.none_yet();
    // One client hides: the other is still present.
    say_presence(&mut phone, false).await;
    // Bob's second request as the next sentinel.
    let bobs2 = ask(bob.clone()).await;
    let next = notified.next().await;
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&bobs2))]);
    notified.none_yet();
    // The last one goes away: Alice's request, past its grace, is notified.
    laptop.close().await;
    let next = notified.next().await;
    assert_eq!(next.body.user, "alice");
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&alices))]);
    gw.stop().await;
}

async fn a_reminder_comes_before_the_permission_timeout(db: TestDb) {
    let mut profile = demo_profile("demo", &[]);
    profile.permission_timeout = Some(Duration::from_secs(4));
    let (gw, mut notified) = start(config(&db, vec![profile])).await;
    let (_, request) = pending_request(&gw).await;
    let first = notified.next().await;
    assert_eq!(first.body.event, NotificationEvent::PermissionWaiting);
    let reminder = notified.next().await;
    assert_eq!(reminder.body.event, NotificationEvent::PermissionReminder);
    assert_eq!(
        reminder.keys,
        [format!("permission_reminder:{}", id(&request))]
    );
    assert_eq!(
        reminder.body.request.as_ref().unwrap().id.to_string(),
        id(&request)
    );
    // It came before the timeout answered the request.
    let (_, now) = gw
        .get(&format!("/api/v1/permissions/{}", id(&request)))
        .await;
    assert_eq!(now["status"], "pending");
    gw.stop().await;
}

async fn a_long_turn_that_ended_while_away_is_notified_with_its_summary(db: TestDb) {
    let (gw, mut notified) = start(config(&db, vec![demo_profile("demo", &[])])).await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    let turn = gw.prompt(&conversation, "slow 10").await;
    ws.until_type("turn_ended").await;
    let got = notified.next().await;
    assert_eq!(got.body.event, NotificationEvent::TurnEnded);
    assert_eq!(got.keys, [format!("turn_ended:{turn}")]);
    let t = got.body.turn.as_ref().unwrap();
    assert_eq!(t.id.to_string(), turn);
    assert_eq!(t.stop_reason.as_deref(), Some("end_turn"));
    assert!(t.summary.as_deref().unwrap().starts_with("s0 s1 "), "{t:?}");
    // A short turn: nothing (the crash after it is the sentinel).
    gw.prompt(&conversation, "hello").await;
    ws.until_type("turn_ended").await;
    gw.prompt(&conversation, "crash").await;
    ws.until_agent_gone().await;
    let next = notified.next().await;
    assert_eq!(next.body.event, NotificationEvent::AgentFailed);
    gw.stop().await;
}

async fn an_agent_that_dies_during_a_turn_is_notified_once(db: TestDb) {
    let (gw, mut notified) = start(config(&db, vec![demo_profile("demo", &[])])).await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    let turn = gw.prompt(&conversation, "crash").await;
    ws.until_agent_gone().await;
    let got = notified.next().await;
    assert_eq!(got.body.event, NotificationEvent::AgentFailed);
    assert_eq!(got.keys, [format!("agent_failed:{turn}")]);
    assert_eq!(
        got.body.conversation.as_ref().unwrap().id.to_string(),
        conversation
    );
    let (_, sentinel) = pending_request(&gw).await;
    let next = notified.next().await;
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&sentinel))]);
    gw.stop().await;
}

/// Fails its first hand-over (as an outbox whose database is away would).
struct FailingOnce(
    mpsc::UnboundedSender<Outgoing>,
    std::sync::atomic::AtomicBool,
);

#[async_trait::async_trait]
impl Enqueue for FailingOnce {
    async fn enqueue(&self, outgoing: Outgoing) -> acp_gateway::error::Result<bool> {
        if !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(acp_gateway::error::Error::Unavailable(
                "database away".into(),
            ));
        }
        let _ = self.0.send(outgoing);
        Ok(true)
    }
}

async fn a_notification_that_could_not_be_handed_over_is_tried_again(db: TestDb) {
    let (tx, rx) = mpsc::unbounded_channel();
    let enqueue = FailingOnce(tx, Default::default());
    let gw = TestGateway::start_notifying(
        config(&db, vec![demo_profile("demo", &[])]),
        Some(Arc::new(enqueue)),
    )
    .await;
    let mut notified = Notified(rx);
    let (_, request) = pending_request(&gw).await;
    let got = notified.next().await;
    assert_eq!(got.keys, [format!("permission_waiting:{}", id(&request))]);
    gw.stop().await;
}

async fn an_agent_that_could_not_start_is_notified(db: TestDb) {
    let (gw, mut notified) = start(config(
        &db,
        vec![demo_profile("exits", &["--exit-on", "initialize"])],
    ))
    .await;
    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "exits"}))
        .await;
    assert_eq!(status, 502, "{body}");
    let got = notified.next().await;
    assert_eq!(got.body.event, NotificationEvent::AgentFailed);
    assert_eq!(got.body.conversation.as_ref().unwrap().agent, "exits");
    assert!(got.keys[0].starts_with("agent_failed:"), "{:?}", got.keys);
    gw.stop().await;
}

/// A stopping gateway cancels its requests (one that crashed has them
/// expire when it starts again): nothing of them is notified after the
/// restart; new ones are.
async fn after_a_restart_nothing_of_before_is_notified_again(db: TestDb) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut notified = Notified(rx);
    let config = config(&db, vec![demo_profile("demo", &[])]);
    let gw =
        TestGateway::start_notifying(config.clone(), Some(Arc::new(Recorder(tx.clone())))).await;
    let (_, before) = pending_request(&gw).await;
    let got = notified.next().await;
    assert_eq!(got.keys, [format!("permission_waiting:{}", id(&before))]);
    gw.stop().await;
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let (_, stored) = gw
        .get(&format!("/api/v1/permissions/{}", id(&before)))
        .await;
    assert_eq!(stored["status"], "cancelled");
    let (_, after) = pending_request(&gw).await;
    let next = notified.next().await;
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&after))]);
    gw.stop().await;
}

async fn a_queue_held_while_away_is_notified_and_not_while_present(db: TestDb) {
    let (gw, mut notified) = start(config(&db, vec![demo_profile("demo", &[])])).await;
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    let turn = gw.prompt(&conversation, "hang").await;
    let path = format!("/api/v1/conversations/{conversation}/prompts");
    for text in ["hello one", "hello two"] {
        let (status, _) = gw.post(&path, json!({"text": text})).await;
        assert_eq!(status, 202);
    }
    gw.cancel_turn(&mut ws, &conversation).await;
    ws.until_type("queue_held").await;
    // The cancelled turn may have been long enough to be told too.
    let got = loop {
        let got = notified.next().await;
        if got.body.event != NotificationEvent::TurnEnded {
            break got;
        }
    };
    assert_eq!(got.body.event, NotificationEvent::QueueHeld);
    assert_eq!(got.keys, [format!("queue_held:{turn}")]);
    assert_eq!(got.body.count, 2);
    let t = got.body.turn.as_ref().unwrap();
    assert_eq!(t.stop_reason.as_deref(), Some("cancelled"));
    assert_eq!(t.summary.as_deref(), Some("2 queued prompts wait"));
    // While the owner looks, nothing (a request asked while away after it
    // is the sentinel).
    say_presence(&mut ws, true).await;
    let (status, resumed) = gw
        .post(
            &format!("/api/v1/conversations/{conversation}/queue/resume"),
            json!({}),
        )
        .await;
    assert_eq!(status, 202, "{resumed}");
    // Both queued prompts run, one after the other.
    ws.until_type("turn_ended").await;
    ws.until_type("turn_ended").await;
    for text in ["hang", "hello three"] {
        let (status, _) = gw.post(&path, json!({"text": text})).await;
        assert_eq!(status, 202);
    }
    gw.cancel_turn(&mut ws, &conversation).await;
    ws.until_type("queue_held").await;
    say_presence(&mut ws, false).await;
    let (_, sentinel) = pending_request(&gw).await;
    let next = notified.next().await;
    assert_eq!(next.keys, [format!("permission_waiting:{}", id(&sentinel))]);
    gw.stop().await;
}

async fn an_agents_question_is_notified_with_its_message(db: TestDb) {
    let (gw, mut notified) = start(config(&db, vec![node_sdk_profile("node")])).await;
    let (conversation, mut ws) = gw.open_conversation("node").await;
    let form = json!({"mode": "form", "message": "Deploy to production?",
        "requestedSchema": {"properties": {"go": {"type": "boolean"}}}});
    gw.prompt(&conversation, &format!("question {form}")).await;
    let frames = ws.until_type("question_asked").await;
    let question = frames.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let got = notified.next().await;
    assert_eq!(got.body.event, NotificationEvent::PermissionWaiting);
    assert_eq!(got.keys, [format!("permission_waiting:{question}")]);
    let request = got.body.request.as_ref().unwrap();
    assert_eq!(request.id.to_string(), question);
    assert_eq!(request.title.as_deref(), Some("Deploy to production?"));
    assert_eq!(request.kind.as_deref(), Some("question"));
    gw.stop().await;
}

backend_tests!(
    an_agents_question_is_notified_with_its_message,
    a_queue_held_while_away_is_notified_and_not_while_present,
    after_a_restart_nothing_of_before_is_notified_again,
    an_agent_that_could_not_start_is_notified,
    a_notification_that_could_not_be_handed_over_is_tried_again,
    a_burst_of_requests_makes_one_notification_and_none_twice,
    a_request_answered_within_the_grace_is_not_notified,
    nothing_while_present_then_one_when_the_last_client_goes_away,
    a_reminder_comes_before_the_permission_timeout,
    a_long_turn_that_ended_while_away_is_notified_with_its_summary,
    an_agent_that_dies_during_a_turn_is_notified_once,
);
