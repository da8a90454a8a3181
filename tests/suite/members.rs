//! A conversation shared with other users, each with a role: what each
//! role may do and is refused (403) over REST, WebSocket and action URLs,
//! what a non-member cannot see (404), and a removal taking effect at once.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use acp_gateway::notify::{Enqueue, Outgoing};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A gateway with tokens for alice (the owner), vera (a viewer), abe (an
/// approver), cole (a collaborator) and nick (no member), and a
/// conversation of alice's shared with the three.
struct Shared {
    gw: TestGateway,
    operator: String,
    alice: Client,
    vera: Client,
    abe: Client,
    cole: Client,
    nick: Client,
    id: String,
}

async fn shared_with(gw: TestGateway, db: &TestDb, operator: String) -> Shared {
    let _ = db;
    let mut tokens = Vec::new();
    for user in ["alice", "vera", "abe", "cole", "nick"] {
        tokens.push(gw.make_token(&operator, user, "user").await.0);
    }
    let client = |i: usize| gw.with_token(&tokens[i]);
    let (alice, vera, abe, cole, nick) = (client(0), client(1), client(2), client(3), client(4));
    let (status, created) = alice
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": "Shared osprey plan"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    for (user, role) in [
        ("vera", "viewer"),
        ("abe", "approver"),
        ("cole", "collaborator"),
    ] {
        let (status, member) = alice
            .post(&members(&id), json!({"user": user, "role": role}))
            .await;
        assert_eq!(status, 201, "{member}");
        assert_eq!(member["user"], user);
        assert_eq!(member["role"], role);
        assert_eq!(member["added_by"], "user:alice");
    }
    Shared {
        gw,
        operator,
        alice,
        vera,
        abe,
        cole,
        nick,
        id,
    }
}

async fn world(db: &TestDb) -> Shared {
    let operator = cli_token(db, "root-op", "operator");
    let gw = TestGateway::start(db, vec![demo_profile("demo", &[])]).await;
    shared_with(gw, db, operator).await
}

fn members(id: &str) -> String {
    format!("/api/v1/conversations/{id}/members")
}

/// A pending permission request of the conversation, asked by a prompt of
/// alice's (`ws` follows the conversation).
async fn asked(s: &Shared, ws: &mut Ws) -> String {
    s.alice.prompt(&s.id, "tool").await;
    ws.until_type("permission_requested").await.pop().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn respond(client: &Client, request: &str) -> (u16, Value) {
    client
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await
}

async fn each_role_may_do_what_it_may_and_is_refused_the_rest(db: TestDb) {
    let s = world(&db).await;
    let id = &s.id;
    let c = |p: &str| format!("/api/v1/conversations/{id}{p}");

    // Everyone shared with sees it, with their role; the owner sees how
    // many it is shared with. Lists and search include it.
    let owned = s.alice.conversation(id).await;
    assert_eq!(owned["members"], 3, "{owned}");
    assert_eq!(owned["role"], Value::Null);
    for (client, role) in [
        (&s.vera, "viewer"),
        (&s.abe, "approver"),
        (&s.cole, "collaborator"),
    ] {
        let seen = client.conversation(id).await;
        assert_eq!(seen["role"], role, "{seen}");
        assert_eq!(seen["members"], 3);
        for path in [
            "/events",
            "/messages",
            "/tool-calls",
            "/files",
            "/queue",
            "/rules",
            "/members",
        ] {
            let (status, body) = client.get(&c(path)).await;
            assert_eq!(status, 200, "{path}: {body}");
        }
        let (_, list) = client.get("/api/v1/conversations").await;
        assert_eq!(list["items"][0]["id"], id.as_str(), "{list}");
        assert_eq!(list["items"][0]["role"], role);
        let (_, found) = client.get("/api/v1/search?q=osprey").await;
        assert_eq!(found["items"].as_array().unwrap().len(), 1, "{found}");
    }
    let (_, listed) = s.vera.get(&members(id)).await;
    let users: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["user"].as_str().unwrap())
        .collect();
    assert_eq!(users.len(), 3, "{listed}");

    // A non-member sees nothing of it: 404, as ever.
    for path in ["", "/events", "/members"] {
        assert_eq!(s.nick.get(&c(path)).await.0, 404, "{path}");
    }
    assert_eq!(s.nick.try_prompt(id, "hello").await.0, 404);
    let (_, list) = s.nick.get("/api/v1/conversations").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");
    let (_, found) = s.nick.get("/api/v1/search?q=osprey").await;
    assert_eq!(found["items"].as_array().unwrap().len(), 0, "{found}");

    // A viewer and an approver may not prompt, cancel, change settings or
    // the queue: 403, naming the role needed.
    for client in [&s.vera, &s.abe] {
        let refused = assert_problem(client.try_prompt(id, "hello").await, 403, "collaborator");
        assert_eq!(refused["code"], "forbidden");
        assert_problem(
            client.post(&c("/cancel"), json!({})).await,
            403,
            "collaborator",
        );
        assert_problem(client.set_mode(id, "plan").await, 403, "collaborator");
        assert_problem(
            client.post(&c("/queue/resume"), json!({})).await,
            403,
            "collaborator",
        );
        // Refused before the body is read: a bad one is 403 all the same.
        let bad = client.post(&c("/prompts"), json!({"bogus": 1})).await;
        assert_problem(bad, 403, "collaborator");
    }
    // Only the owner (or an operator) closes, shares, forks or forgets.
    for client in [&s.vera, &s.abe, &s.cole] {
        assert_problem(client.delete(&c("")).await, 403, "owner");
        assert_problem(
            client
                .post(&members(id), json!({"user": "nick", "role": "viewer"}))
                .await,
            403,
            "owner",
        );
        assert_problem(
            client
                .call(
                    "PATCH",
                    &format!("{}/vera", members(id)),
                    Some(json!({"role": "approver"})),
                )
                .await,
            403,
            "owner",
        );
        assert_problem(
            client.delete(&format!("{}/vera", members(id))).await,
            403,
            "owner",
        );
        assert_problem(client.delete(&c("/rules")).await, 403, "owner");
        assert_problem(client.post(&c("/fork"), json!({})).await, 403, "owner");
    }

    // A collaborator prompts, recorded as theirs; and changes the mode.
    let mut ws = s.alice.conversation_ws(id, 0).await;
    assert_eq!(s.cole.try_prompt(id, "hello").await.0, 202);
    let started = ws.until_type("turn_started").await.pop().unwrap();
    assert_eq!(started["data"]["by"], "user:cole", "{started}");
    ws.until_type("turn_ended").await;
    let (status, changed) = s.cole.set_mode(id, "plan").await;
    assert_eq!(status, 200, "{changed}");
    // The owner's prompts are recorded as hers.
    s.alice.prompt(id, "hello").await;
    let started = ws.until_type("turn_started").await.pop().unwrap();
    assert_eq!(started["data"]["by"], "user:alice");
    ws.until_type("turn_ended").await;

    // A viewer may not answer a permission request (403); an approver and a
    // collaborator may, recorded as theirs; a non-member cannot see it.
    for (client, name) in [(&s.abe, "abe"), (&s.cole, "cole")] {
        let request = asked(&s, &mut ws).await;
        assert_eq!(
            s.nick
                .get(&format!("/api/v1/permissions/{request}"))
                .await
                .0,
            404
        );
        assert_eq!(respond(&s.nick, &request).await.0, 404);
        assert_problem(respond(&s.vera, &request).await, 403, "approver");
        let (status, answered) = respond(client, &request).await;
        assert_eq!(status, 200, "{answered}");
        assert_eq!(answered["decision"]["decided_by"], format!("user:{name}"));
        ws.until_type("turn_ended").await;
    }

    // The owner's changes of members: bad input refused, nothing lost.
    assert_problem(
        s.alice
            .post(&members(id), json!({"user": "nobody", "role": "viewer"}))
            .await,
        409,
        "no user",
    );
    assert_problem(
        s.alice
            .post(&members(id), json!({"user": "alice", "role": "viewer"}))
            .await,
        409,
        "owns",
    );
    assert_problem(
        s.alice
            .post(&members(id), json!({"user": "nick", "role": "owner"}))
            .await,
        422,
        "",
    );
    assert_problem(
        s.alice
            .post(&members(id), json!({"user": "bad name!", "role": "viewer"}))
            .await,
        422,
        "user",
    );
    let again = assert_problem(
        s.alice
            .post(&members(id), json!({"user": "vera", "role": "approver"}))
            .await,
        409,
        "already",
    );
    assert_eq!(again["code"], "already_member");
    assert_eq!(
        s.alice
            .call(
                "PATCH",
                &format!("{}/nick", members(id)),
                Some(json!({"role": "viewer"}))
            )
            .await
            .0,
        404
    );
    assert_eq!(
        s.alice.delete(&format!("{}/nick", members(id))).await.0,
        404
    );
    assert_eq!(s.alice.conversation(id).await["members"], 3);

    // A viewer made an approver answers from then on.
    let (status, changed) = s
        .alice
        .call(
            "PATCH",
            &format!("{}/vera", members(id)),
            Some(json!({"role": "approver"})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["role"], "approver");
    let request = asked(&s, &mut ws).await;
    assert_eq!(respond(&s.vera, &request).await.0, 200);
    ws.until_type("turn_ended").await;

    // An operator shares anyone's conversation.
    let operator = s.gw.with_token(&s.operator);
    let (status, member) = operator
        .post(&members(id), json!({"user": "nick", "role": "viewer"}))
        .await;
    assert_eq!(status, 201, "{member}");
    assert_eq!(member["added_by"], "user:root-op");
    assert_eq!(s.nick.conversation(id).await["role"], "viewer");

    // Every change is in the conversation's log, with who made it.
    let events = s.alice.events(id).await;
    let changes: Vec<(String, String, String)> = events
        .iter()
        .filter(|e| e["type"].as_str().unwrap().starts_with("member_"))
        .map(|e| {
            let d = &e["data"];
            (
                e["type"].as_str().unwrap().to_owned(),
                d["user"].as_str().unwrap().to_owned(),
                d["by"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(changes.len(), 5, "{changes:?}");
    assert_eq!(
        changes[3],
        ("member_changed".into(), "vera".into(), "user:alice".into())
    );
    assert_eq!(
        changes[4],
        ("member_added".into(), "nick".into(), "user:root-op".into())
    );

    // Removed: nothing of it any more.
    assert_eq!(
        s.alice.delete(&format!("{}/nick", members(id))).await.0,
        204
    );
    assert_eq!(s.nick.get(&c("")).await.0, 404);
    // The owner closes it.
    assert_eq!(s.alice.delete(&c("")).await.0, 204);
    s.gw.stop().await;
}

async fn sockets_follow_membership_and_a_removal_closes_them_at_once(db: TestDb) {
    let s = world(&db).await;
    let id = &s.id;
    // A viewer follows it live; an approver's inbox holds its requests, a
    // viewer's does not.
    let mut vera_ws = s.vera.conversation_ws(id, 0).await;
    let mut owner_ws = s.alice.conversation_ws(id, 0).await;
    let request = asked(&s, &mut owner_ws).await;
    let seen = vera_ws
        .until_type("permission_requested")
        .await
        .pop()
        .unwrap();
    assert_eq!(seen["data"]["id"], request.as_str());
    let mut abe_inbox = s.abe.ws("/api/v1/ws").await;
    let snapshot = abe_inbox.next().await;
    assert_eq!(
        snapshot["pending_permissions"][0]["id"],
        request.as_str(),
        "{snapshot}"
    );
    let mut vera_inbox = s.vera.ws("/api/v1/ws").await;
    let snapshot = vera_inbox.next().await;
    assert_eq!(snapshot["pending_permissions"], json!([]), "{snapshot}");
    let mut nick_inbox = s.nick.ws("/api/v1/ws").await;
    assert_eq!(nick_inbox.next().await["pending_permissions"], json!([]));
    // A non-member's socket of it: 404 before the upgrade.
    let (status, _) = s.nick.get(&format!("/api/v1/conversations/{id}/ws")).await;
    assert_eq!(status, 404);

    // The approver answers from the inbox's request; the event reaches
    // their inbox, not the viewer's.
    assert_eq!(respond(&s.abe, &request).await.0, 200);
    let resolved = abe_inbox
        .until_type("permission_resolved")
        .await
        .pop()
        .unwrap();
    assert_eq!(resolved["data"]["decision"]["decided_by"], "user:abe");
    owner_ws.until_type("turn_ended").await;

    // Removed, the viewer's socket closes at once (1008), the approver's
    // inbox sees the removal and nothing of the conversation after it.
    assert_eq!(
        s.alice.delete(&format!("{}/vera", members(id))).await.0,
        204
    );
    let (_, code) = vera_ws.until_closed().await;
    assert_eq!(code, 1008);
    assert_eq!(s.alice.delete(&format!("{}/abe", members(id))).await.0, 204);
    let removed = abe_inbox
        .until(|e| e["type"] == "member_removed" && e["data"]["user"] == "abe")
        .await;
    assert_eq!(removed.last().unwrap()["data"]["role"], "approver");
    // Nothing more of it reaches the old inbox: the next frame there is of
    // another conversation, shared with abe afterwards.
    s.alice.prompt(id, "hello").await;
    owner_ws.until_type("turn_ended").await;
    let (status, other) = s
        .alice
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await;
    assert_eq!(status, 201, "{other}");
    let other = other["id"].as_str().unwrap();
    let (status, _) = s
        .alice
        .post(&members(other), json!({"user": "abe", "role": "approver"}))
        .await;
    assert_eq!(status, 201);
    let next = abe_inbox.next().await;
    assert_eq!(next["conversation_id"], other, "{next}");
    assert_eq!(next["type"], "member_added");
    // Their new socket of the first one is refused.
    assert_eq!(
        s.vera
            .get(&format!("/api/v1/conversations/{id}/ws"))
            .await
            .0,
        404
    );
    s.gw.stop().await;
}

struct Recorder(mpsc::UnboundedSender<Outgoing>);

#[async_trait::async_trait]
impl Enqueue for Recorder {
    async fn enqueue(&self, outgoing: Outgoing) -> acp_gateway::error::Result<bool> {
        let _ = self.0.send(outgoing);
        Ok(true)
    }
}

/// The notifications of `request` for each of `users` (those of others, or
/// of other requests, skipped; never the viewer's).
async fn notified(
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    request: &str,
    users: &[&str],
) -> Vec<Outgoing> {
    let mut found: Vec<Option<Outgoing>> = users.iter().map(|_| None).collect();
    while found.iter().any(Option::is_none) {
        let next = notified_any(rx).await;
        assert_ne!(next.body.user, "vera", "a viewer is not notified");
        let of = next.body.request.as_ref().map(|r| r.id.to_string());
        if of.as_deref() != Some(request) {
            continue;
        }
        if let Some(i) = users.iter().position(|u| *u == next.body.user) {
            found[i] = Some(next);
        }
    }
    found.into_iter().map(Option::unwrap).collect()
}

/// The path of the action URL of `option` in a notification.
fn action(notified: &Outgoing, option: &str) -> String {
    let action = notified
        .body
        .actions
        .iter()
        .find(|a| a.option_id == option)
        .unwrap_or_else(|| panic!("no action for {option}: {:?}", notified.body.actions));
    action
        .url
        .strip_prefix("https://gateway.example")
        .unwrap()
        .to_owned()
}

async fn an_approvers_action_url_answers_until_their_membership_is_gone(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.notifications.grace = Duration::from_millis(200);
    config.notifications.base_url = Some("https://gateway.example".into());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gw = TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx)))).await;
    let s = shared_with(gw, &db, operator).await;
    let mut ws = s.alice.conversation_ws(&s.id, 0).await;

    // The owner and the approver are each notified, each with their own
    // action URLs; the viewer is not. The approver's answers.
    let request = asked(&s, &mut ws).await;
    let [owners, abes]: [Outgoing; 2] = notified(&mut rx, &request, &["alice", "abe"])
        .await
        .try_into()
        .unwrap();
    assert_ne!(action(&owners, "allow-once"), action(&abes, "allow-once"));
    let (status, answered) = s.gw.post(&action(&abes, "allow-once"), Value::Null).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["decision"]["decided_by"], "user:abe");
    assert_eq!(answered["decision"]["via"], "notification");
    ws.until_type("turn_ended").await;

    // Notified of the next, then removed: their URL answers 410, the
    // owner's still answers.
    let request = asked(&s, &mut ws).await;
    let [owners, abes]: [Outgoing; 2] = notified(&mut rx, &request, &["alice", "abe"])
        .await
        .try_into()
        .unwrap();
    assert_eq!(
        s.alice.delete(&format!("{}/abe", members(&s.id))).await.0,
        204
    );
    let (status, problem) = s.gw.post(&action(&abes, "allow-once"), Value::Null).await;
    assert_eq!(status, 410, "{problem}");
    let (status, _) =
        s.gw.post(&action(&owners, "reject-once"), Value::Null)
            .await;
    assert_eq!(status, 200);
    ws.until_type("turn_ended").await;

    // The next request is the owner's and the collaborator's to hear of,
    // no longer the removed approver's; never the viewer's.
    let request = asked(&s, &mut ws).await;
    notified(&mut rx, &request, &["alice", "cole"]).await;
    // Due together: had abe's been due, it was handed over with theirs.
    while let Ok(next) = rx.try_recv() {
        assert_ne!(next.body.user, "abe", "a removed member is not notified");
    }
    s.gw.stop().await;
}

async fn notified_any(rx: &mut mpsc::UnboundedReceiver<Outgoing>) -> Outgoing {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("notified in time")
        .unwrap()
}

/// Two nodes on one Postgres: a membership added, changed and removed
/// through either node takes effect on the other (its REST, its sockets).
#[tokio::test]
async fn membership_changed_on_one_node_takes_effect_on_the_other() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let alice = cli_token(&db, "alice", "user");
    let vera = cli_token(&db, "vera", "user");
    let start = || {
        GatewayProcess::start_configured(
            &db,
            &[demo_profile("demo", &[])],
            "info",
            "node_lease = \"1s\"",
        )
    };
    let (a, b) = (start(), start());
    let (alice_a, alice_b) = (a.with_token(&alice), b.with_token(&alice));
    let vera_b = b.with_token(&vera);
    let id = alice_a.create("demo").await;
    let path = format!("/api/v1/conversations/{id}");
    assert_eq!(vera_b.get(&path).await.0, 404);

    // Shared through A: B shows it to the viewer, and streams it live.
    let (status, member) = alice_a
        .post(&members(&id), json!({"user": "vera", "role": "viewer"}))
        .await;
    assert_eq!(status, 201, "{member}");
    assert_eq!(vera_b.conversation(&id).await["role"], "viewer");
    let mut vera_ws = vera_b.conversation_ws(&id, 0).await;
    alice_a.prompt(&id, "hello").await;
    let started = vera_ws.until_type("turn_started").await.pop().unwrap();
    assert_eq!(started["data"]["by"], "user:alice");
    vera_ws.until_type("turn_ended").await;
    assert_problem(vera_b.try_prompt(&id, "hello").await, 403, "collaborator");

    // Changed through B (the node that does not run it): a collaborator
    // prompts through B, recorded as theirs.
    let (status, changed) = alice_b
        .call(
            "PATCH",
            &format!("{}/vera", members(&id)),
            Some(json!({"role": "collaborator"})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    let (status, body) = vera_b.try_prompt(&id, "hello").await;
    assert_eq!(status, 202, "{body}");
    let started = vera_ws.until_type("turn_started").await.pop().unwrap();
    assert_eq!(started["data"]["by"], "user:vera");
    vera_ws.until_type("turn_ended").await;

    // Removed through A: B closes the member's socket at once and shows
    // them nothing more.
    assert_eq!(
        alice_a.delete(&format!("{}/vera", members(&id))).await.0,
        204
    );
    let (frames, code) = vera_ws.until_closed().await;
    assert_eq!(code, 1008, "{frames:?}");
    assert_eq!(vera_b.get(&path).await.0, 404);
    assert_eq!(vera_b.try_prompt(&id, "hello").await.0, 404);
}

/// Two nodes: B notified of a conversation's request when it ran it, then
/// A ran it and an approver was added there (B follows none of that), then
/// B runs it again. The approver is notified of its next request by B: B
/// reads who answers there again, not what it remembered from before.
#[tokio::test]
async fn an_approver_added_while_another_node_ran_the_conversation_is_notified_by_the_next() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let operator = cli_token(&db, "root-op", "operator");
    let node = |tx: mpsc::UnboundedSender<Outgoing>| {
        let mut agent = demo_profile("demo", &[]);
        // Let go once idle, for the other node to take.
        agent.idle_timeout = Duration::from_millis(300);
        let mut config = Config::for_tests(&db, vec![agent]);
        config.notifications.grace = Duration::from_millis(200);
        config.notifications.base_url = Some("https://gateway.example".into());
        TestGateway::start_notifying(config, Some(Arc::new(Recorder(tx))))
    };
    let (tx_a, _rx_a) = mpsc::unbounded_channel();
    let (tx_b, mut rx_b) = mpsc::unbounded_channel();
    let (a, b) = (node(tx_a).await, node(tx_b).await);
    let alice = a.make_token(&operator, "alice", "user").await.0;
    a.make_token(&operator, "abe", "user").await;
    let (alice_a, alice_b) = (a.with_token(&alice), b.with_token(&alice));
    let (status, created) = alice_b
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = alice_a.conversation_ws(&id, 0).await;
    let ask = async |client: &Client, ws: &mut Ws| {
        client.prompt(&id, "tool").await;
        ws.until_type("permission_requested").await.pop().unwrap()["data"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let answer_and_let_go = async |request: &str, ws: &mut Ws| {
        assert_eq!(respond(&alice_a, request).await.0, 200);
        ws.until_type("turn_ended").await;
        crate::cluster::until_released(&db, &id).await;
    };

    // Run by B, which notifies its owner (no one else answers there yet).
    let request = ask(&alice_b, &mut ws).await;
    notified(&mut rx_b, &request, &["alice"]).await;
    answer_and_let_go(&request, &mut ws).await;

    // Run by A; abe becomes an approver there.
    let request = ask(&alice_a, &mut ws).await;
    let (status, member) = alice_a
        .post(&members(&id), json!({"user": "abe", "role": "approver"}))
        .await;
    assert_eq!(status, 201, "{member}");
    answer_and_let_go(&request, &mut ws).await;

    // Run by B again: abe is notified too.
    let request = ask(&alice_b, &mut ws).await;
    notified(&mut rx_b, &request, &["alice", "abe"]).await;
    assert_eq!(respond(&alice_b, &request).await.0, 200);
    ws.until_type("turn_ended").await;
    drop(ws);
    a.stop().await;
    b.stop().await;
}

backend_tests!(
    each_role_may_do_what_it_may_and_is_refused_the_rest,
    sockets_follow_membership_and_a_removal_closes_them_at_once,
    an_approvers_action_url_answers_until_their_membership_is_gone,
);
