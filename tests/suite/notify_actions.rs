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

/// Posts `body` as the action page's form does (`application/x-www-form-urlencoded`):
/// the status and the page answered.
async fn post_form(gw: &TestGateway, path: &str, body: &str) -> (u16, String) {
    let resp = gw
        .http
        .post(gw.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let html = resp.text().await.unwrap();
    (status, html)
}

async fn page_of(gw: &TestGateway, path: &str) -> String {
    let resp = gw.http.get(gw.url(path)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

async fn status_of(gw: &TestGateway, request: &Value) -> Value {
    let id = request["id"].as_str().unwrap();
    gw.get(&format!("/api/v1/permissions/{id}")).await.1
}

async fn a_reason_given_on_the_reject_page_is_stored_and_the_agent_is_told(db: TestDb) {
    let (gw, mut ws, request, notified) = waiting(&db).await;
    let reject = path(action(&notified, "reject-once"));
    // The reject's page has a box for the reason inside its form; an
    // allow's page has none.
    let html = page_of(&gw, &reject).await;
    assert!(
        html.contains("<textarea id=\"reason\" name=\"reason\""),
        "{html}"
    );
    assert!(html.contains("maxlength=\"2000\""), "{html}");
    let form = &html[html.find("<form").unwrap()..html.find("</form>").unwrap()];
    assert!(form.contains("<textarea"), "{form}");
    assert!(!html.contains("<script"), "{html}");
    let allow = page_of(&gw, &path(action(&notified, "allow-once"))).await;
    assert!(!allow.contains("<textarea"), "{allow}");

    // Too long: a page that says so, nothing answered, the token still good.
    let (status, page) = post_form(&gw, &reject, &format!("reason={}", "x".repeat(2001))).await;
    assert_eq!(status, 422, "{page}");
    assert!(page.contains("Nothing was answered"), "{page}");
    assert!(page.contains("at most 2000 characters"), "{page}");
    assert_eq!(status_of(&gw, &request).await["status"], "pending");
    // Another field than the reason: the same.
    let (status, _) = post_form(&gw, &reject, "option_id=allow-once").await;
    assert_eq!(status, 422);
    assert_eq!(status_of(&gw, &request).await["status"], "pending");

    // As a browser sends it: percent-encoded, its line end CR LF.
    let (status, page) = post_form(&gw, &reject, "reason=wrong+file%3A%0D%0Ause+notes.txt").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<h1>Answered</h1>"), "{page}");
    assert!(
        page.contains("Your reason: wrong file:\nuse notes.txt"),
        "{page}"
    );
    let stored = status_of(&gw, &request).await;
    assert_eq!(stored["status"], "rejected");
    assert_eq!(stored["decision"]["option_id"], "reject-once");
    assert_eq!(stored["decision"]["via"], "notification");
    assert_eq!(stored["decision"]["reason"], "wrong file:\nuse notes.txt");

    // The turn ends as the agent ends it; the next turn tells it why.
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let told = "The user refused your request to run \"Write hello.txt\" (\"Reject\"). Their reason: wrong file:\nuse notes.txt";
    let frames = ws
        .until(|e| e["type"] == "turn_started" && e["data"]["content"][0]["text"] == told)
        .await;
    let turn = frames.last().unwrap()["data"]["turn_id"].clone();
    let frames = ws
        .until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn)
        .await;
    let said = streamed_text(&frames, "agent_message_chunk");
    assert!(said.contains("Their reason: wrong file"), "{said}");
    // Used: the page says so. (From an address of its own: failed lookups
    // are counted per address across this process's gateways.)
    let own = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 5]))
        .build()
        .unwrap();
    let resp = own
        .post(gw.url(&reject))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("reason=again")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 410);
    let page = resp.text().await.unwrap();
    assert!(page.contains("no longer available"), "{page}");
    gw.stop().await;
}

async fn an_actions_json_body_may_carry_a_reason_and_a_bad_one_answers_nothing(db: TestDb) {
    let (gw, mut ws, request, notified) = waiting(&db).await;
    let reject = path(action(&notified, "reject-always"));
    for body in [
        json!({"reason": "y".repeat(2001)}),
        json!({"reason": "bell\u{7}"}),
        json!({"reason": 42}),
        json!({"reason": "fine", "steer": true}),
    ] {
        let (status, problem) = gw.post(&reject, body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["code"], "invalid_request", "{problem}");
    }
    let (status, problem) = gw.post_raw(&reject, "text/plain", "because").await;
    assert_eq!(status, 415, "{problem}");
    assert_eq!(status_of(&gw, &request).await["status"], "pending");
    let (status, answered) = gw.post(&reject, json!({"reason": "not that file"})).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "rejected");
    assert_eq!(answered["decision"]["reason"], "not that file");
    assert_eq!(answered["decision"]["via"], "notification");
    ws.until_type("turn_ended").await;
    gw.stop().await;
}

/// A gateway whose agent (on the official npm SDK) asks `ask`, the question
/// as `question_asked` showed it, and the notification about it.
async fn asking(db: &TestDb, ask: Value) -> (TestGateway, Ws, Value, Outgoing) {
    let mut config = Config::for_tests(db, vec![node_sdk_profile("node")]);
    config.notifications.grace = Duration::from_millis(200);
    config.notifications.base_url = Some(BASE.into());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let (conversation, mut ws) = gw.open_conversation("node").await;
    gw.prompt(&conversation, &format!("question {ask}")).await;
    let question = ws.until_type("question_asked").await.pop().unwrap()["data"].clone();
    let notified = tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("notified in time")
        .unwrap();
    (gw, ws, question, notified)
}

/// What the agent says it got for its question, once its turn ended.
async fn agent_got(ws: &mut Ws) -> Value {
    let frames = ws.until_type("turn_ended").await;
    serde_json::from_str(&streamed_text(&frames, "agent_message_chunk")).unwrap()
}

async fn a_yes_no_questions_action_answers_it_with_that_content(db: TestDb) {
    let ask = json!({"mode": "form", "message": "Deploy to production now?",
        "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}},
                            "required": ["go"]}});
    let (gw, mut ws, question, notified) = asking(&db, ask).await;
    let request = notified.body.request.as_ref().unwrap();
    assert_eq!(request.kind.as_deref(), Some("question"));
    assert_eq!(request.title.as_deref(), Some("Deploy to production now?"));
    let offered: Vec<(&str, &str)> = notified
        .body
        .actions
        .iter()
        .map(|a| (a.label.as_str(), a.option_id.as_str()))
        .collect();
    assert_eq!(
        offered,
        [
            ("Yes", r#"question-accept:{"go":true}"#),
            ("No", r#"question-accept:{"go":false}"#)
        ]
    );
    let yes = path(action(&notified, r#"question-accept:{"go":true}"#));
    let no = path(action(&notified, r#"question-accept:{"go":false}"#));

    // The page: what the agent asks, the choice, one button; it answers nothing.
    let html = page_of(&gw, &no).await;
    assert!(html.contains("<p>Deploy to production now?</p>"), "{html}");
    assert!(html.contains("Your answer: <strong>No</strong>"), "{html}");
    assert!(
        html.contains("<button type=\"submit\">No</button>"),
        "{html}"
    );
    assert!(!html.contains("textarea"), "{html}");
    let qid = question["id"].as_str().unwrap();
    let (_, now) = gw.get(&format!("/api/v1/questions/{qid}")).await;
    assert_eq!(now["status"], "pending");
    // A question's answer takes no reason: 422, and the token still works.
    let (status, problem) = gw.post(&no, json!({"reason": "not today"})).await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("no reason"),
        "{problem}"
    );

    // Used: the question is accepted with that content, the agent gets it.
    let (status, answered) = gw.post(&no, Value::Null).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["id"], question["id"]);
    assert_eq!(answered["status"], "accepted");
    assert_eq!(answered["answer"]["action"], "accept");
    assert_eq!(answered["answer"]["content"], json!({"go": false}));
    assert_eq!(answered["answer"]["decided_by"], "user:anonymous");
    assert_eq!(answered["answer"]["via"], "notification");
    assert_eq!(
        agent_got(&mut ws).await,
        json!({"action": "accept", "content": {"go": false}})
    );
    // A used token is gone; the other answer's: someone answered first.
    // (Failed lookups from an address of this test's own: they count
    // against a limit per address that the other tests share.)
    let own = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 5]))
        .build()
        .unwrap();
    let resp = own.post(gw.url(&no)).send().await.unwrap();
    assert_eq!(resp.status(), 410);
    let (status, problem) = gw.post(&yes, Value::Null).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "already_resolved");
    assert_eq!(
        problem["question"]["answer"]["content"],
        json!({"go": false})
    );
    let resp = own.get(gw.url(&yes)).send().await.unwrap();
    assert_eq!(resp.status(), 410);
    gw.stop().await;
}

async fn a_choice_questions_action_page_answers_with_the_choice(db: TestDb) {
    let ask = json!({"mode": "form", "message": "Which environment?",
        "requestedSchema": {"type": "object", "properties": {"env": {"type": "string", "oneOf": [
            {"const": "dev", "title": "Development"},
            {"const": "stage", "title": "Staging"},
            {"const": "prod", "title": "Production"}]}}}});
    let (gw, mut ws, question, notified) = asking(&db, ask).await;
    let labels: Vec<&str> = notified
        .body
        .actions
        .iter()
        .map(|a| a.label.as_str())
        .collect();
    assert_eq!(labels, ["Development", "Staging", "Production"]);
    let staging = path(action(&notified, r#"question-accept:{"env":"stage"}"#));
    let html = page_of(&gw, &staging).await;
    assert!(
        html.contains("Your answer: <strong>Staging</strong>"),
        "{html}"
    );
    // The page's button (a form post) answers, and says so in a page.
    let (status, html) = post_form(&gw, &staging, "").await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("Which environment?: Staging."), "{html}");
    assert_eq!(
        agent_got(&mut ws).await,
        json!({"action": "accept", "content": {"env": "stage"}})
    );
    let qid = question["id"].as_str().unwrap();
    let (_, answered) = gw.get(&format!("/api/v1/questions/{qid}")).await;
    assert_eq!(answered["answer"]["content"], json!({"env": "stage"}));
    assert_eq!(answered["answer"]["via"], "notification");
    gw.stop().await;
}

/// A form of more than one field, or a URL question, offers no one-tap answer.
async fn a_question_without_one_tap_answers_has_no_actions(db: TestDb) {
    let ask = json!({"mode": "url", "elicitationId": "e-1", "message": "Sign in",
                     "url": "https://login.example.org/device"});
    let (gw, _ws, _question, notified) = asking(&db, ask).await;
    assert_eq!(
        notified.body.request.as_ref().unwrap().kind.as_deref(),
        Some("question")
    );
    assert!(
        notified.body.actions.is_empty(),
        "{:?}",
        notified.body.actions
    );
    gw.stop().await;
}

backend_tests!(
    a_yes_no_questions_action_answers_it_with_that_content,
    a_choice_questions_action_page_answers_with_the_choice,
    a_question_without_one_tap_answers_has_no_actions,
    an_expired_action_is_gone_and_swept,
    a_users_action_answers_as_them_and_ends_when_they_are_removed,
    an_action_answers_once_and_the_turn_goes_on,
    get_shows_a_page_and_answers_nothing,
    an_action_racing_a_respond_has_exactly_one_winner,
    a_usable_action_answers_from_an_address_over_the_failure_limit,
    a_reason_given_on_the_reject_page_is_stored_and_the_agent_is_told,
    an_actions_json_body_may_carry_a_reason_and_a_bad_one_answers_nothing,
);
