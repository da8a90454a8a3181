//! Permission requests: parked, listed, answered over REST, and the agent
//! gets the right outcome.

use crate::common::*;
use serde_json::{json, Value};

async fn ask(gw: &TestGateway, ws: &mut Ws, id: &str, text: &str) -> Value {
    gw.prompt(id, text).await;
    ws.until_type("permission_requested").await.pop().unwrap()["data"].clone()
}

fn respond_path(request: &Value) -> String {
    format!(
        "/api/v1/permissions/{}/respond",
        request["id"].as_str().unwrap()
    )
}

async fn setup(db: TestDb) -> (TestDb, TestGateway, String, Ws) {
    let (gw, id, ws) = demo_conversation(&db).await;
    (db, gw, id, ws)
}

fn tool_status(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|e| e["data"]["update"]["sessionUpdate"] == "tool_call_update")
        .filter_map(|e| e["data"]["update"]["status"].as_str().map(str::to_owned))
        .collect()
}

async fn an_approval_reaches_the_agent_and_a_second_different_answer_gets_409(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "awaiting_permission");
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"].as_array().unwrap().len(), 1);
    assert_eq!(pending["items"][0]["id"], request["id"]);
    assert_eq!(pending["items"][0]["options"][0]["optionId"], "allow-once");
    assert_eq!(pending["items"][0]["tool_call"]["toolCallId"], "call_1");

    let (status, body) = gw
        .post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "approved");
    assert_eq!(body["decision"]["option_id"], "allow-once");
    assert_eq!(body["decision"]["outcome"], "selected");
    assert_eq!(body["decision"]["decided_by"], "user:anonymous");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(tool_status(&frames), ["in_progress", "completed"]);
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"], body);

    // The identical answer again is fine; a different one conflicts.
    let (status, again) = gw
        .post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(again, body);
    let (status, conflict) = gw
        .post(&respond_path(&request), json!({"option_id": "reject-once"}))
        .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["code"], "already_resolved");
    assert_eq!(conflict["request"], body);
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"], json!([]));
    let (_, all) = gw
        .get(&format!(
            "/api/v1/permissions?status=all&conversation_id={id}"
        ))
        .await;
    assert_eq!(all["items"][0], body);
}

async fn a_rejection_reaches_the_agent(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let (status, body) = gw
        .post(&respond_path(&request), json!({"option_id": "reject-once"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "rejected");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(tool_status(&frames), ["failed"]);
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "Permission denied."
    );
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn cancelling_the_turn_answers_the_pending_request_cancelled(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let (status, _) = gw
        .post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 202);
    let frames = ws.until_type("turn_ended").await;
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["id"], request["id"]);
    assert_eq!(resolved["data"]["status"], "cancelled");
    assert_eq!(resolved["data"]["decision"]["outcome"], "cancelled");
    assert_eq!(resolved["data"]["decision"]["decided_by"], "system");
    assert_eq!(tool_status(&frames), ["failed"]);
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    // A user answering afterwards loses to the cancellation.
    let (status, body) = gw
        .post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    assert_eq!(status, 409, "{body}");
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "idle");
}

async fn a_user_can_answer_with_the_cancelled_outcome(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let (status, body) = gw
        .post(&respond_path(&request), json!({"outcome": "cancelled"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["decision"]["decided_by"], "user:anonymous");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
}

async fn bad_answers_get_422_options_not_offered_409_and_unknown_ids_404(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let path = respond_path(&request);
    // Well-formed, but not an option of this request: the document cannot
    // know the options, so the request conflicts with the request's state.
    let (status, problem) = gw.post(&path, json!({"option_id": "no-such-option"})).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "not_offered", "{problem}");
    for body in [
        json!({"outcome": "selected"}),
        json!({"option_id": null, "outcome": null}),
        json!({"option_id": "allow-once", "outcome": null}),
        json!({}),
        json!({"option_id": "allow-once", "outcome": "cancelled"}),
        json!({"option_id": 5}),
    ] {
        let (status, problem) = gw.post(&path, body.clone()).await;
        assert_eq!(status, 422, "{body} → {problem}");
    }
    // Still pending after all that.
    let (_, current) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(current["status"], "pending");
    let unknown = uuid::Uuid::now_v7();
    let (status, problem) = gw
        .post(
            &format!("/api/v1/permissions/{unknown}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(problem["code"], "not_found");
    let (status, _) = gw.get(&format!("/api/v1/permissions/{unknown}")).await;
    assert_eq!(status, 404);
    let (status, _) = gw.get("/api/v1/permissions/not-a-uuid").await;
    assert_eq!(status, 404);
}

async fn two_people_answering_at_once_exactly_one_wins(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let path = respond_path(&request);
    let (a, b) = tokio::join!(
        gw.post(&path, json!({"option_id": "allow-once"})),
        gw.post(&path, json!({"option_id": "reject-once"})),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    let frames = ws.until_type("turn_ended").await;
    let resolved: Vec<_> = frames
        .iter()
        .filter(|e| e["type"] == "permission_resolved")
        .collect();
    assert_eq!(resolved.len(), 1);
    let winner = if a.0 == 200 { &a.1 } else { &b.1 };
    assert_eq!(&resolved[0]["data"], winner);
}

async fn an_agent_withdrawing_its_request_resolves_it_cancelled(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    gw.prompt(&id, "withdraw").await;
    let frames = ws.until_type("turn_ended").await;
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["status"], "cancelled");
    assert_eq!(resolved["data"]["decision"]["decided_by"], "system");
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn the_inbox_starts_with_the_pending_snapshot_and_streams_decisions(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "tool").await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    let snapshot = inbox.next().await;
    assert_eq!(snapshot["type"], "snapshot");
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(snapshot["pending_permissions"], pending["items"]);
    assert_eq!(snapshot["pending_permissions"][0]["id"], request["id"]);
    gw.post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    let frames = inbox.until_type("permission_resolved").await;
    assert_eq!(frames.last().unwrap()["data"]["id"], request["id"]);
    assert_eq!(frames.last().unwrap()["conversation_id"], id.as_str());
}

async fn ask_n_asks_one_request_at_a_time_each_after_the_previous_answer(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    gw.prompt(&id, "ask 3").await;
    let mut all = Vec::new();
    for (i, option) in ["allow-once", "reject-once", "allow-once"]
        .into_iter()
        .enumerate()
    {
        let frames = ws.until_type("permission_requested").await;
        let request = frames.last().unwrap()["data"].clone();
        all.extend(frames);
        assert_eq!(request["tool_call"]["title"], format!("Write ask-{i}.txt"));
        // Only this one is outstanding: the next waits for its answer.
        let (_, pending) = gw
            .get(&format!("/api/v1/permissions?conversation_id={id}"))
            .await;
        assert_eq!(pending["items"].as_array().unwrap().len(), 1, "{pending}");
        let (status, body) = gw
            .post(&respond_path(&request), json!({"option_id": option}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    all.extend(ws.until_type("turn_ended").await);
    assert_eq!(all.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_eq!(
        tool_status(&all),
        [
            "in_progress",
            "completed",
            "failed",
            "in_progress",
            "completed"
        ]
    );
    assert_eq!(
        streamed_text(&all, "agent_message_chunk"),
        "2 of 3 tool calls ran."
    );
}

/// Mistral Vibe asks with only `{toolCallId}`; the command is in the
/// `tool_call` before. A person sees the whole call, as the policies judged
/// it: in the REST answer, the inbox's snapshot and its live event.
async fn a_request_carrying_only_its_tool_call_id_shows_the_announced_command(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    assert_eq!(inbox.next().await["type"], "snapshot");
    let request = ask(&gw, &mut ws, &id, "vibe rm -rf build").await;
    let shown = |call: &Value| {
        assert_eq!(call["title"], "Run rm -rf build", "{call}");
        assert_eq!(call["kind"], "execute", "{call}");
        assert_eq!(call["rawInput"]["command"], "rm -rf build", "{call}");
    };
    shown(&request["tool_call"]);
    let (status, got) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200, "{got}");
    shown(&got["tool_call"]);
    let live = inbox.until_type("permission_requested").await;
    shown(&live.last().unwrap()["data"]["tool_call"]);
    let mut again = gw.ws("/api/v1/ws").await;
    let snapshot = again.next().await;
    shown(&snapshot["pending_permissions"][0]["tool_call"]);
    gw.post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    ws.until_type("turn_ended").await;
}

/// Qwen Code announces a bare `Shell` with empty raw input and puts the
/// title and command in its request: the tool call's record keeps them.
async fn the_details_a_request_carries_reach_the_tool_calls_record(db: TestDb) {
    let (_db, gw, id, mut ws) = setup(db).await;
    let request = ask(&gw, &mut ws, &id, "qwen ls -la").await;
    assert_eq!(request["tool_call"]["title"], "Run ls -la");
    gw.post(&respond_path(&request), json!({"option_id": "allow-once"}))
        .await;
    ws.until_type("turn_ended").await;
    let (_, calls) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    let call = &calls["items"][0];
    assert_eq!(call["title"], "Run ls -la", "{calls}");
    assert_eq!(call["raw_input"], json!({"command": "ls -la"}), "{calls}");
    assert_eq!(call["status"], "completed", "{calls}");
}

backend_tests!(
    an_approval_reaches_the_agent_and_a_second_different_answer_gets_409,
    a_rejection_reaches_the_agent,
    cancelling_the_turn_answers_the_pending_request_cancelled,
    a_user_can_answer_with_the_cancelled_outcome,
    bad_answers_get_422_options_not_offered_409_and_unknown_ids_404,
    two_people_answering_at_once_exactly_one_wins,
    an_agent_withdrawing_its_request_resolves_it_cancelled,
    the_inbox_starts_with_the_pending_snapshot_and_streams_decisions,
    ask_n_asks_one_request_at_a_time_each_after_the_previous_answer,
    a_request_carrying_only_its_tool_call_id_shows_the_announced_command,
    the_details_a_request_carries_reach_the_tool_calls_record,
);
