//! The permission lifecycle made trustworthy: concurrent requests, the cancel
//! rule, expiry, timeouts, remembered "always" answers and the inbox.

use std::time::Duration;

use crate::common::*;
use acp_gateway::permissions::OnTimeout;
use serde_json::{json, Value};

fn respond_path(request: &Value) -> String {
    format!(
        "/api/v1/permissions/{}/respond",
        request["id"].as_str().unwrap()
    )
}

/// Reads until `n` permission requests have been announced; returns them in order.
async fn requests(ws: &mut Ws, n: usize) -> Vec<Value> {
    let mut found = Vec::new();
    while found.len() < n {
        let frame = ws.until_type("permission_requested").await.pop().unwrap();
        found.push(frame["data"].clone());
    }
    found
}

/// Prompts, checks that the permission request waits for a person, then
/// answers it with `option` and waits for the turn to end.
async fn expect_a_person_decides(
    gw: &TestGateway,
    ws: &mut Ws,
    id: &str,
    prompt: &str,
    option: &str,
) {
    gw.prompt(id, prompt).await;
    let request = requests(ws, 1).await.pop().unwrap();
    let (_, current) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(current["status"], "pending", "{prompt}");
    gw.post(&respond_path(&request), json!({"option_id": option}))
        .await;
    ws.until_type("turn_ended").await;
}

async fn start(
    db: TestDb,
    profile: acp_gateway::config::AgentProfile,
) -> (TestDb, TestGateway, String, Ws) {
    let config = Config::for_tests(&db, vec![profile]);
    start_configured(db, config).await
}

/// A gateway of `config` with a conversation with its `demo` profile, and
/// that conversation's WebSocket.
async fn start_configured(
    db: TestDb,
    config: acp_gateway::config::Config,
) -> (TestDb, TestGateway, String, Ws) {
    let gw = TestGateway::start_with(config).await;
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ws = gw.conversation_ws(&id, 0).await;
    (db, gw, id, ws)
}

async fn two_concurrent_requests_answered_in_reverse_order_each_reach_their_tool_call(db: TestDb) {
    let (_db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "parallel 2").await;
    let reqs = requests(&mut ws, 2).await;
    let (_, listed) = gw
        .get(&format!("/api/v1/permissions?conversation_id={id}"))
        .await;
    let listed_ids: Vec<_> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(
        listed_ids,
        [reqs[0]["id"].clone(), reqs[1]["id"].clone()],
        "oldest first"
    );
    let call = |r: &Value| r["tool_call"]["toolCallId"].as_str().unwrap().to_owned();
    assert_ne!(call(&reqs[0]), call(&reqs[1]));

    let (status, second) = gw
        .post(&respond_path(&reqs[1]), json!({"option_id": "allow-once"}))
        .await;
    assert_eq!((status, second["status"].as_str()), (200, Some("approved")));
    let (status, first) = gw
        .post(&respond_path(&reqs[0]), json!({"option_id": "reject-once"}))
        .await;
    assert_eq!((status, first["status"].as_str()), (200, Some("rejected")));
    ws.until_type("turn_ended").await;

    let (_, tools) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    let status_of = |call_id: &str| {
        tools["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tool_call_id"] == call_id)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status_of(&call(&reqs[1])), "completed");
    assert_eq!(status_of(&call(&reqs[0])), "failed");
}

async fn cancel_with_two_requests_pending_answers_both_cancelled_and_the_turn_ends_cancelled(
    db: TestDb,
) {
    let (_db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "parallel 2").await;
    let reqs = requests(&mut ws, 2).await;
    let frames = gw.cancel_turn(&mut ws, &id).await;
    for request in &reqs {
        let (_, current) = gw
            .get(&format!(
                "/api/v1/permissions/{}",
                request["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(current["status"], "cancelled");
        assert_eq!(current["decision"]["outcome"], "cancelled");
        assert_eq!(current["decision"]["decided_by"], "system");
    }
    let resolved = frames
        .iter()
        .filter(|e| e["type"] == "permission_resolved")
        .count();
    assert_eq!(resolved, 2);
}

/// A request that crosses the turn's cancel on the wire is answered
/// cancelled at once, like those waiting when the cancel was sent: no
/// person can approve it, and no policy does (`echo` is allowed by one).
async fn a_request_asked_after_the_cancel_is_answered_cancelled(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.policies = vec![serde_json::from_value(json!({
        "name": "echo", "kinds": ["execute"], "commands": ["^echo\\b"], "decision": "allow",
    }))
    .unwrap()];
    let (_db, gw, id, mut ws) = start_configured(db, config).await;
    gw.prompt(&id, "late").await;
    ws.until_type("turn_started").await;
    let frames = gw.cancel_turn(&mut ws, &id).await;
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .expect("the late request is resolved");
    assert_eq!(resolved["data"]["status"], "cancelled", "{resolved}");
    assert_eq!(resolved["data"]["decision"]["decided_by"], "system");
    assert_eq!(
        resolved["data"]["decision"]["reason"],
        "asked after the turn was cancelled"
    );
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        r#"late answer: {"outcome":"cancelled"}"#
    );
    let (status, body) = gw
        .post(
            &respond_path(&resolved["data"]),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
}

/// "Always allow" remembers the call as the request showed it: a command
/// the agent added to the call while the request waited was not seen, and
/// is not remembered (the request showed only a title: nothing is).
async fn always_remembers_the_call_as_shown_not_as_updated_since(db: TestDb) {
    let (_db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "sneak").await;
    let request = requests(&mut ws, 1).await.pop().unwrap();
    assert!(request["tool_call"].get("rawInput").is_none(), "{request}");
    // The update has been applied once the tool call's record shows it.
    let until_updated = async {
        loop {
            let (_, calls) = gw
                .get(&format!("/api/v1/conversations/{id}/tool-calls"))
                .await;
            if calls.to_string().contains("rm -rf build") {
                break;
            }
            // Published once committed: the store has it then.
            ws.until(|e| e["data"]["update"]["sessionUpdate"] == "tool_call_update")
                .await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), until_updated)
        .await
        .expect("the agent's update is applied");
    let (status, answered) = gw
        .post(
            &respond_path(&request),
            json!({"option_id": "allow-always"}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "approved");
    let reason = answered["decision"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("not remembered"), "{answered}");
    ws.until_type("turn_ended").await;
    let (_, rules) = gw.get(&format!("/api/v1/conversations/{id}/rules")).await;
    assert_eq!(rules["items"], json!([]), "{rules}");
}

async fn a_request_pending_when_the_gateway_restarts_is_expired_on_start(db: TestDb) {
    // The gateway runs as its own process so that it can really crash;
    // its agents are its own children (no shim keeps them for the next
    // start: see `restart.rs` for that).
    let process =
        GatewayProcess::start_configured(&db, &[demo_profile("demo", &[])], "info", NO_SHIMS);
    let created = process
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await
        .1;
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = process.conversation_ws(&id, 0).await;
    let turn = process
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "tool"}),
        )
        .await
        .1;
    assert!(turn["turn_id"].is_string(), "{turn}");
    let request = requests(&mut ws, 1).await.pop().unwrap();
    process.kill();

    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let (_, current) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(current["status"], "expired", "{current}");
    assert_eq!(current["decision"]["decided_by"], "system");
    assert!(
        current["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("restarted"),
        "{current}"
    );
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"], json!([]));
    let events = gw.events(&id).await;
    assert_consecutive(&events, 0);
    let resolved = events
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"], current);
    let ended = events.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "idle");
}

async fn a_graceful_stop_cancels_pending_requests_saying_why(db: TestDb) {
    let (db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "tool").await;
    let request = requests(&mut ws, 1).await.pop().unwrap();
    let gw = gw.restart().await;
    let (_, current) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    // Stopping cancels the running turn, and with it its requests.
    assert_eq!(current["status"], "cancelled", "{current}");
    assert!(
        current["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{current}"
    );
    drop(db);
}

async fn a_timeout_with_on_timeout_reject_sends_the_reject_option_and_reports_timed_out(
    db: TestDb,
) {
    let mut profile = demo_profile("demo", &[]);
    profile.permission_timeout = Some(Duration::from_millis(300));
    profile.on_timeout = OnTimeout::Reject;
    let (_db, gw, id, mut ws) = start(db, profile).await;
    gw.prompt(&id, "tool").await;
    let request = requests(&mut ws, 1).await.pop().unwrap();
    let frames = ws.until_type("turn_ended").await;
    let resolved = &frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap()["data"];
    assert_eq!(resolved["id"], request["id"]);
    assert_eq!(resolved["status"], "timed_out");
    assert_eq!(resolved["decision"]["option_id"], "reject-once");
    assert_eq!(resolved["decision"]["outcome"], "selected");
    assert_eq!(resolved["decision"]["decided_by"], "system");
    assert!(resolved["decision"]["reason"]
        .as_str()
        .unwrap()
        .contains("no answer within"));
    // The agent received the reject option.
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "Permission denied."
    );
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    // A late answer from the user is a conflict, not a silent success.
    let (status, _) = gw
        .post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    assert_eq!(status, 409);
}

async fn a_timeout_with_on_timeout_cancel_sends_the_cancelled_outcome(db: TestDb) {
    let mut profile = demo_profile("demo", &[]);
    profile.permission_timeout = Some(Duration::from_millis(300));
    profile.on_timeout = OnTimeout::Cancel;
    let (_db, gw, id, mut ws) = start(db, profile).await;
    gw.prompt(&id, "tool").await;
    let frames = ws.until_type("turn_ended").await;
    let resolved = &frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap()["data"];
    assert_eq!(resolved["status"], "timed_out");
    assert_eq!(resolved["decision"]["outcome"], "cancelled");
    assert_eq!(resolved["decision"]["option_id"], json!(null));
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
}

async fn allow_always_answers_matching_requests_itself_until_the_rule_is_forgotten(db: TestDb) {
    let (_db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "execute git status").await;
    let first = requests(&mut ws, 1).await.pop().unwrap();
    let (status, _) = gw
        .post(&respond_path(&first), json!({"option_id": "allow-always"}))
        .await;
    assert_eq!(status, 200);
    ws.until_type("turn_ended").await;
    let (_, rules) = gw.get(&format!("/api/v1/conversations/{id}/rules")).await;
    let rules = rules["items"].as_array().unwrap().clone();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["tool_kind"], "execute");
    assert_eq!(rules[0]["subject"], "git");
    assert_eq!(rules[0]["option_kind"], "allow_always");
    assert_eq!(rules[0]["permission_id"], first["id"]);

    // Same program: answered by the gateway, and the user still sees it.
    gw.prompt(&id, "execute git log --oneline").await;
    let frames = ws.until_type("turn_ended").await;
    let requested = frames
        .iter()
        .find(|e| e["type"] == "permission_requested")
        .unwrap();
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(requested["data"]["id"], resolved["data"]["id"]);
    assert_eq!(resolved["data"]["status"], "approved");
    assert_eq!(resolved["data"]["decision"]["option_id"], "allow-always");
    assert_eq!(
        resolved["data"]["decision"]["decided_by"],
        "policy:remembered"
    );
    assert_eq!(streamed_text(&frames, "agent_message_chunk"), "Done.");

    // Another program still waits for a person.
    expect_a_person_decides(&gw, &mut ws, &id, "execute rm -rf build", "reject-once").await;

    // Forgotten: git waits again.
    let rule_id = rules[0]["id"].as_str().unwrap();
    let (status, _) = gw
        .delete(&format!("/api/v1/conversations/{id}/rules/{rule_id}"))
        .await;
    assert_eq!(status, 204);
    let (status, _) = gw
        .delete(&format!("/api/v1/conversations/{id}/rules/{rule_id}"))
        .await;
    assert_eq!(status, 404);
    expect_a_person_decides(&gw, &mut ws, &id, "execute git push", "allow-once").await;
}

async fn reject_always_on_a_path_rejects_the_same_path_again(db: TestDb) {
    let (_db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "tool").await;
    let first = requests(&mut ws, 1).await.pop().unwrap();
    gw.post(&respond_path(&first), json!({"option_id": "reject-always"}))
        .await;
    ws.until_type("turn_ended").await;
    gw.prompt(&id, "tool").await;
    let frames = ws.until_type("turn_ended").await;
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["status"], "rejected");
    assert_eq!(
        resolved["data"]["decision"]["decided_by"],
        "policy:remembered"
    );
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "Permission denied."
    );
    let (status, _) = gw
        .delete(&format!("/api/v1/conversations/{id}/rules"))
        .await;
    assert_eq!(status, 204);
    let (_, rules) = gw.get(&format!("/api/v1/conversations/{id}/rules")).await;
    assert_eq!(rules["items"], json!([]));
}

async fn the_inbox_snapshot_after_a_reconnect_equals_the_pending_list(db: TestDb) {
    let (_db, gw, id, mut ws) = start(db, demo_profile("demo", &[])).await;
    gw.prompt(&id, "parallel 3").await;
    let reqs = requests(&mut ws, 3).await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    let snapshot = inbox.next().await;
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(snapshot["pending_permissions"], pending["items"]);
    assert_eq!(pending["items"].as_array().unwrap().len(), 3);
    inbox.close().await;
    // While the phone is away, one request is answered.
    gw.post(&respond_path(&reqs[1]), json!({"option_id": "allow-once"}))
        .await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    let snapshot = inbox.next().await;
    assert_eq!(snapshot["type"], "snapshot");
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(snapshot["pending_permissions"], pending["items"]);
    let ids: Vec<_> = pending["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, [reqs[0]["id"].clone(), reqs[2]["id"].clone()]);
}

/// A store on `db` holding one idle conversation.
async fn stored_conversation(
    db: &TestDb,
) -> (
    std::sync::Arc<dyn acp_gateway::store::Store>,
    acp_gateway::model::Conversation,
) {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let conversation = crate::common::idle_conversation(None);
    store.insert_conversation(&conversation).await.unwrap();
    (store, conversation)
}

/// A pending request of the conversation, with one option, `allow-once`.
fn pending_request(conversation_id: uuid::Uuid) -> acp_gateway::model::PermissionRequest {
    use acp_gateway::model::{self, PermissionRequest, PermissionStatus};
    PermissionRequest {
        id: model::new_id(),
        conversation_id,
        turn_id: None,
        tool_call: json!({"toolCallId": "t1"}),
        options: vec![json!({"optionId": "allow-once", "name": "Allow", "kind": "allow_once"})],
        status: PermissionStatus::Pending,
        decision: None,
        created_at: model::now(),
        kind: Default::default(),
    }
}

/// The conversation's state at `seq`, running.
fn running_patch(seq: i64) -> acp_gateway::store::ConversationPatch {
    acp_gateway::store::ConversationPatch {
        status: acp_gateway::model::ConversationStatus::Running,
        acp_session_id: None,
        last_seq: seq,
        current_turn_id: None,
        updated_at: acp_gateway::model::now(),
        state: None,
        queue: None,
    }
}

/// The store resolves a request once, and announces it as the table holds
/// it, whatever copy the caller passes: a copy that differs from what was
/// stored (as when the database kept only a cut-down stand-in) still
/// resolves the stored request, and the event carries the stored one; a
/// second resolution writes nothing.
async fn a_resolution_announces_the_request_as_stored_and_happens_once(db: TestDb) {
    use acp_gateway::model::{
        self, ConversationStatus, Decision, Event, PermissionRequest, PermissionStatus,
    };
    use acp_gateway::store::{Batch, Resolution};

    let (store, conversation) = stored_conversation(&db).await;
    let stored = PermissionRequest {
        tool_call: json!({"toolCallId": "t1", "title": "as stored"}),
        ..pending_request(conversation.id)
    };
    let event = |seq| Event {
        seq,
        conversation_id: conversation.id,
        at: model::now(),
        body: model::EventBody::Verbatim {
            kind: "permission_resolved".into(),
            data: Value::Null,
        },
    };
    store
        .commit(
            conversation.id,
            &Batch {
                new_permissions: vec![stored.clone()],
                conversation: Some(running_patch(0)),
                ..Batch::default()
            },
        )
        .await
        .unwrap();

    let held = PermissionRequest {
        tool_call: json!({"toolCallId": "t1", "title": "as the session held it"}),
        ..stored.clone()
    };
    let resolution = Resolution {
        request: held,
        status: PermissionStatus::Approved,
        decision: Decision::new(Some("allow-once".into()), "user:ann".into(), None),
    };
    let (resolved, announced) = store
        .resolve_permission(&resolution, event(1), &running_patch(1), None)
        .await
        .unwrap()
        .expect("pending, so resolved");
    assert_eq!(resolved.tool_call, stored.tool_call);
    assert_eq!(resolved.status, PermissionStatus::Approved);
    assert_eq!(
        announced.data_value(),
        serde_json::to_value(&resolved).unwrap()
    );
    let events = store.list_events(conversation.id, 0, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].data_value()["tool_call"]["title"], "as stored");
    let row = store
        .get_conversation(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.last_seq, row.status), (1, ConversationStatus::Running));

    // Once resolved, a second answer, with the exact copy this time, changes
    // nothing.
    let again = Resolution {
        request: stored.clone(),
        status: PermissionStatus::Rejected,
        decision: Decision::new(Some("reject-once".into()), "user:bob".into(), None),
    };
    let second = store
        .resolve_permission(&again, event(2), &running_patch(2), None)
        .await
        .unwrap();
    assert!(second.is_none());
    assert_eq!(
        store
            .list_events(conversation.id, 0, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let row = store.get_permission(stored.id).await.unwrap().unwrap();
    assert_eq!(row.status, PermissionStatus::Approved);
    assert_eq!(row.decision.unwrap().decided_by, "user:ann");

    // The common case: the copy is exact (on Postgres, one statement).
    let next = PermissionRequest {
        id: model::new_id(),
        turn_id: Some(model::new_id()),
        tool_call: json!({"toolCallId": "t2", "rawInput": {"command": "ls \u{0}"}}),
        created_at: model::now(),
        ..stored.clone()
    };
    store
        .commit(
            conversation.id,
            &Batch {
                new_permissions: vec![next.clone()],
                conversation: Some(running_patch(1)),
                ..Batch::default()
            },
        )
        .await
        .unwrap();
    let exact = Resolution {
        request: next.clone(),
        status: PermissionStatus::Rejected,
        decision: Decision::new(Some("reject-once".into()), "user:ann".into(), None),
    };
    let (resolved, announced) = store
        .resolve_permission(&exact, event(2), &running_patch(2), None)
        .await
        .unwrap()
        .expect("pending, so resolved");
    assert_eq!(
        resolved,
        store.get_permission(next.id).await.unwrap().unwrap()
    );
    assert_eq!(resolved.status, PermissionStatus::Rejected);
    let events = store.list_events(conversation.id, 0, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1], announced);
    assert_eq!(
        events[1].data_value(),
        serde_json::to_value(&resolved).unwrap()
    );
    let row = store
        .get_conversation(conversation.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.last_seq, 2);
}

/// Fencing: a writer holding an older owner epoch than the conversation's
/// writes nothing at all (no request, no event, no state), commits and
/// resolutions alike; the current owner's writes go through.
async fn a_stale_owners_writes_are_refused_as_a_whole(db: TestDb) {
    use acp_gateway::model::{self, ConversationStatus, Decision, Event, PermissionStatus};
    use acp_gateway::store::{Batch, Resolution};

    let (store, conversation) = stored_conversation(&db).await;
    // Claimed twice since: epoch 2 (the database's only conversation).
    let id = conversation.id;
    let claimed = "update conversations set owner_epoch = 2";
    db.execute(claimed, claimed).await;
    let request = pending_request(id);
    let event = |seq| Event {
        seq,
        conversation_id: id,
        at: model::now(),
        body: model::EventBody::Verbatim {
            kind: "permission_requested".into(),
            data: json!({}),
        },
    };
    let batch = |fence| Batch {
        new_permissions: vec![request.clone()],
        events: vec![event(1)],
        conversation: Some(running_patch(1)),
        fence,
        ..Batch::default()
    };
    let refused = store.commit(id, &batch(Some(1))).await.unwrap_err();
    assert!(refused.is_fenced(), "{refused}");
    assert!(store.list_events(id, 0, 10).await.unwrap().is_empty());
    assert!(store.get_permission(request.id).await.unwrap().is_none());
    let row = store.get_conversation(id).await.unwrap().unwrap();
    assert_eq!((row.last_seq, row.status), (0, ConversationStatus::Idle));

    store.commit(id, &batch(Some(2))).await.unwrap();
    let resolution = Resolution {
        request: request.clone(),
        status: PermissionStatus::Approved,
        decision: Decision::new(Some("allow-once".into()), "user:ann".into(), None),
    };
    let refused = store
        .resolve_permission(&resolution, event(2), &running_patch(2), Some(1))
        .await
        .unwrap_err();
    assert!(refused.is_fenced(), "{refused}");
    let still = store.get_permission(request.id).await.unwrap().unwrap();
    assert_eq!(still.status, PermissionStatus::Pending);
    assert_eq!(store.list_events(id, 0, 10).await.unwrap().len(), 1);
    let (resolved, _) = store
        .resolve_permission(&resolution, event(2), &running_patch(2), Some(2))
        .await
        .unwrap()
        .expect("the owner's answer is written");
    assert_eq!(resolved.status, PermissionStatus::Approved);
}

backend_tests!(
    a_stale_owners_writes_are_refused_as_a_whole,
    a_resolution_announces_the_request_as_stored_and_happens_once,
    two_concurrent_requests_answered_in_reverse_order_each_reach_their_tool_call,
    cancel_with_two_requests_pending_answers_both_cancelled_and_the_turn_ends_cancelled,
    a_request_asked_after_the_cancel_is_answered_cancelled,
    always_remembers_the_call_as_shown_not_as_updated_since,
    a_request_pending_when_the_gateway_restarts_is_expired_on_start,
    a_graceful_stop_cancels_pending_requests_saying_why,
    a_timeout_with_on_timeout_reject_sends_the_reject_option_and_reports_timed_out,
    a_timeout_with_on_timeout_cancel_sends_the_cancelled_outcome,
    allow_always_answers_matching_requests_itself_until_the_rule_is_forgotten,
    reject_always_on_a_path_rejects_the_same_path_again,
    the_inbox_snapshot_after_a_reconnect_equals_the_pending_list,
);
