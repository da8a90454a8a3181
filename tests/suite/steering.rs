//! The person steers: prompts sent during a turn queue (persisted, edited,
//! moved, removed, shown live as `queue_changed`), start one after another
//! as turns end with `end_turn`, hold after a cancel (`queue_held`) until a
//! person resumes them, and a steering prompt cancels the turn to go
//! first; a reason given with an answer is stored with the decision and
//! reaches the agent as the first queued prompt (or at once, steering).

use serde_json::{json, Value};

use crate::common::*;

fn prompts(id: &str) -> String {
    format!("/api/v1/conversations/{id}/prompts")
}

fn queue(id: &str) -> String {
    format!("/api/v1/conversations/{id}/queue")
}

/// Sends `body` as a prompt; the answer, asserting 202.
async fn send(gw: &Client, id: &str, body: Value) -> Value {
    let (status, answer) = gw.post(&prompts(id), body).await;
    assert_eq!(status, 202, "{answer}");
    answer
}

/// Asserts a problem's status and code; the problem.
fn assert_code((status, problem): (u16, Value), expected: u16, code: &str) -> Value {
    assert_eq!(
        (status, problem["code"].as_str()),
        (expected, Some(code)),
        "{problem}"
    );
    problem
}

/// The text of a queued prompt or a turn's content.
fn text_of(content: &Value) -> &str {
    content[0]["text"].as_str().unwrap_or_default()
}

/// The texts of the queue as the API lists it.
async fn queued_texts(gw: &Client, id: &str) -> Vec<String> {
    let (status, list) = gw.get(&queue(id)).await;
    assert_eq!(status, 200, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| text_of(&p["content"]).to_owned())
        .collect()
}

/// Waits on `ws` for the turn whose prompt is `text` to start, then end:
/// the turn's `turn_started` and `turn_ended`.
async fn turn_of(ws: &mut Ws, text: &str) -> (Value, Value) {
    let frames = ws
        .until(|e| e["type"] == "turn_started" && text_of(&e["data"]["content"]) == text)
        .await;
    let started = frames.last().unwrap().clone();
    let turn = started["data"]["turn_id"].clone();
    let frames = ws
        .until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn)
        .await;
    (started, frames.last().unwrap().clone())
}

async fn prompts_sent_during_a_turn_queue_and_start_in_order_after_end_turn(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "tool").await;
    let asked = ws.until_type("permission_requested").await;
    let request = asked.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = send(&gw, &id, json!({"text": "hello one"})).await;
    assert_eq!(first["queued"], true, "{first}");
    assert_eq!(first["position"], 0);
    let second = send(
        &gw,
        &id,
        json!({"content": [{"type": "text", "text": "hello two"}]}),
    )
    .await;
    assert_eq!(second["position"], 1);
    assert_eq!(queued_texts(&gw, &id).await, ["hello one", "hello two"]);
    // Shown live, with who queued it.
    let shown = ws
        .until(|e| e["type"] == "queue_changed" && e["data"]["prompt_id"] == second["id"])
        .await;
    let changed = &shown.last().unwrap()["data"];
    assert_eq!(changed["change"], "queued");
    assert_eq!(changed["queue"].as_array().unwrap().len(), 2);
    assert!(
        changed["by"].as_str().unwrap().starts_with("user:"),
        "{changed}"
    );

    let (status, _) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200);
    // The first queued prompt starts as the turn ends with end_turn, its
    // id the turn's; then the second.
    let (started, ended) = turn_of(&mut ws, "hello one").await;
    assert_eq!(started["data"]["turn_id"], first["id"]);
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    let (started, _) = turn_of(&mut ws, "hello two").await;
    assert_eq!(started["data"]["turn_id"], second["id"]);
    assert!(queued_texts(&gw, &id).await.is_empty());
    let events = gw.events(&id).await;
    let starts: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "queue_changed" && e["data"]["change"] == "started")
        .map(|e| e["data"]["prompt_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        starts,
        [
            first["id"].as_str().unwrap(),
            second["id"].as_str().unwrap()
        ]
    );
    // Each start is committed with its turn_started, right before it.
    for (i, e) in events.iter().enumerate() {
        if e["type"] == "queue_changed" && e["data"]["change"] == "started" {
            assert_eq!(events[i + 1]["type"], "turn_started", "{events:#?}");
        }
    }
}

async fn a_queue_holds_after_a_cancel_and_starts_again_when_resumed(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    let queued = send(&gw, &id, json!({"text": "hello after"})).await;
    let frames = gw.cancel_turn(&mut ws, &id).await;
    let ended = frames.last().unwrap()["data"]["turn_id"].clone();
    let held = ws.until_type("queue_held").await;
    let held = &held.last().unwrap()["data"];
    assert_eq!(held["turn_id"], ended);
    assert_eq!(held["stop_reason"], "cancelled");
    assert_eq!(held["queued"], 1);
    assert_eq!(queued_texts(&gw, &id).await, ["hello after"]);
    let (status, _) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(gw.conversation(&id).await["status"], "idle");

    let (status, resumed) = gw.post(&format!("{}/resume", queue(&id)), json!({})).await;
    assert_eq!(status, 202, "{resumed}");
    assert_eq!(resumed["turn_id"], queued["id"]);
    let (_, ended) = turn_of(&mut ws, "hello after").await;
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    let (status, empty) = gw.post(&format!("{}/resume", queue(&id)), json!({})).await;
    assert_code((status, empty), 409, "queue_empty");
}

async fn a_steering_prompt_cancels_the_turn_and_starts_ahead_of_the_queue(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    send(&gw, &id, json!({"text": "hello later"})).await;
    let steered = send(&gw, &id, json!({"text": "hello now", "steer": true})).await;
    assert_eq!(
        (steered["queued"].clone(), steered["position"].clone()),
        (json!(true), json!(0))
    );
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    let (started, ended) = turn_of(&mut ws, "hello now").await;
    assert_eq!(started["data"]["turn_id"], steered["id"]);
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    // Then the queue goes on as it was.
    turn_of(&mut ws, "hello later").await;
    // A prompt sent once the turn's cancel was asked for starts as it ends.
    gw.prompt(&id, "hang").await;
    let (status, _) = gw
        .post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 202);
    let next = send(&gw, &id, json!({"text": "hello after the cancel"})).await;
    // Queued while the cancel was on its way (or started, were it done).
    let (started, _) = turn_of(&mut ws, "hello after the cancel").await;
    let turn = if next["queued"] == true {
        &next["id"]
    } else {
        &next["turn_id"]
    };
    assert_eq!(&started["data"]["turn_id"], turn);
    // Steering with no turn running just starts one.
    let started = send(&gw, &id, json!({"text": "hello idle", "steer": true})).await;
    assert_eq!(started["queued"], false);
    assert!(started["turn_id"].is_string(), "{started}");
    turn_of(&mut ws, "hello idle").await;
}

async fn queued_prompts_are_edited_moved_and_removed_and_a_started_one_is_409(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    let mut ids = Vec::new();
    for text in ["hello a", "hello b", "hello c"] {
        ids.push(
            send(&gw, &id, json!({"text": text})).await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let one = |n: usize| format!("{}/{}", queue(&id), ids[n]);
    let (status, list) = gw
        .call("PATCH", &one(2), Some(json!({"position": 0})))
        .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        queued_texts(&gw, &id).await,
        ["hello c", "hello a", "hello b"]
    );
    let (status, _) = gw
        .call("PATCH", &one(0), Some(json!({"text": "hello A"})))
        .await;
    assert_eq!(status, 200);
    let (status, _) = gw.delete(&one(1)).await;
    assert_eq!(status, 204);
    assert_eq!(queued_texts(&gw, &id).await, ["hello c", "hello A"]);
    let changes: Vec<String> = gw
        .events(&id)
        .await
        .iter()
        .filter(|e| e["type"] == "queue_changed")
        .map(|e| e["data"]["change"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        changes,
        ["queued", "queued", "queued", "moved", "edited", "removed"]
    );

    // Bad edits.
    assert_code(gw.delete(&one(1)).await, 404, "not_found");
    let unknown = format!("{}/{}", queue(&id), acp_gateway::model::new_id());
    assert_code(
        gw.call("PATCH", &unknown, Some(json!({"position": 1})))
            .await,
        404,
        "not_found",
    );
    let both = json!({"text": "x", "content": [{"type": "text", "text": "y"}]});
    assert_eq!(gw.call("PATCH", &one(0), Some(both)).await.0, 422);
    let empty = json!({"content": []});
    assert_eq!(gw.call("PATCH", &one(0), Some(empty)).await.0, 422);
    let negative = json!({"position": -1});
    assert_eq!(gw.call("PATCH", &one(0), Some(negative)).await.0, 422);
    let stranger = json!({"text": "x", "colour": "red"});
    assert_eq!(gw.call("PATCH", &one(0), Some(stranger)).await.0, 422);

    // Once a queued prompt started, editing or removing it is 409.
    gw.cancel_turn(&mut ws, &id).await;
    let (status, _) = gw.post(&format!("{}/resume", queue(&id)), json!({})).await;
    assert_eq!(status, 202);
    turn_of(&mut ws, "hello c").await;
    let started = gw
        .call("PATCH", &one(2), Some(json!({"text": "too late"})))
        .await;
    assert_code(started, 409, "already_started");
    assert_code(gw.delete(&one(2)).await, 409, "already_started");
}

async fn the_queue_survives_a_restart_and_is_edited_without_an_agent(db: TestDb) {
    let (gw, id, ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    let a = send(&gw, &id, json!({"text": "hello a"})).await;
    let b = send(&gw, &id, json!({"text": "hello b"})).await;
    drop(ws);
    // The test gateway cancels turns as it stops: the queue holds.
    let gw = gw.restart().await;
    assert_eq!(queued_texts(&gw, &id).await, ["hello a", "hello b"]);
    let events = gw.events(&id).await;
    assert!(
        events.iter().any(|e| e["type"] == "queue_held"),
        "{events:#?}"
    );
    // No agent runs now: the stored queue is edited.
    let mut ws = gw
        .conversation_ws(&id, events.last().unwrap()["seq"].as_i64().unwrap())
        .await;
    let path = format!("{}/{}", queue(&id), b["id"].as_str().unwrap());
    let (status, _) = gw
        .call(
            "PATCH",
            &path,
            Some(json!({"position": 0, "text": "hello B"})),
        )
        .await;
    assert_eq!(status, 200);
    let changed = ws.until_type("queue_changed").await;
    assert_eq!(changed.last().unwrap()["data"]["change"], "moved");
    assert_eq!(queued_texts(&gw, &id).await, ["hello B", "hello a"]);
    // Resuming starts the agent again and the first prompt, then the next.
    let (status, resumed) = gw.post(&format!("{}/resume", queue(&id)), json!({})).await;
    assert_eq!(status, 202, "{resumed}");
    assert_eq!(resumed["turn_id"], b["id"]);
    turn_of(&mut ws, "hello B").await;
    let (started, _) = turn_of(&mut ws, "hello a").await;
    assert_eq!(started["data"]["turn_id"], a["id"]);
}

async fn a_queue_holds_when_the_agent_dies_and_resuming_starts_it_again(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    let turn = gw.prompt(&id, "hang").await;
    let queued = send(&gw, &id, json!({"text": "hello again"})).await;
    crate::resume::kill_agent(&db, &id, &mut ws).await;
    let events = gw.events(&id).await;
    let held = events.iter().find(|e| e["type"] == "queue_held").unwrap();
    assert_eq!(held["data"]["turn_id"], turn.as_str());
    assert_eq!(held["data"]["stop_reason"], "error");
    assert_eq!(queued_texts(&gw, &id).await, ["hello again"]);
    let (status, resumed) = gw.post(&format!("{}/resume", queue(&id)), json!({})).await;
    assert_eq!(status, 202, "{resumed}");
    assert_eq!(resumed["turn_id"], queued["id"]);
    let (_, ended) = turn_of(&mut ws, "hello again").await;
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
}

/// The request the demo agent asks in its `tool` scenario, once asked.
async fn asked(ws: &mut Ws) -> String {
    let frames = ws.until_type("permission_requested").await;
    frames.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn a_reason_given_with_a_rejection_is_stored_and_reaches_the_agent_after_the_turn(
    db: TestDb,
) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "tool").await;
    let request = asked(&mut ws).await;
    let respond = format!("/api/v1/permissions/{request}/respond");
    let (status, answered) = gw
        .post(
            &respond,
            json!({"option_id": "reject-once", "reason": "wrong file:\nuse notes.txt"}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["decision"]["reason"], "wrong file:\nuse notes.txt");
    assert!(answered["decision"]["decided_by"]
        .as_str()
        .unwrap()
        .starts_with("user:"));
    // Wherever the decision is shown.
    let (_, shown) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(shown["decision"]["reason"], "wrong file:\nuse notes.txt");
    let frames = ws.until_type("permission_resolved").await;
    assert_eq!(
        frames.last().unwrap()["data"]["decision"]["reason"],
        "wrong file:\nuse notes.txt"
    );
    // The turn ends as the agent ends it; then the agent hears why.
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let told = "The user refused your request to run \"Write hello.txt\" (\"Reject\"). Their reason: wrong file:\nuse notes.txt";
    let (started, _) = turn_of(&mut ws, told).await;
    let frames = gw.events(&id).await;
    let reply: Vec<&Value> = frames
        .iter()
        .filter(|e| {
            e["data"]["turn_id"] == started["data"]["turn_id"]
                || e["seq"].as_i64() > started["seq"].as_i64()
        })
        .collect();
    let said = streamed_text(
        &reply.into_iter().cloned().collect::<Vec<_>>(),
        "agent_message_chunk",
    );
    assert!(said.contains("Their reason: wrong file"), "{said}");
    // The same answer again is a success; one with another reason too
    // (the first stands), and nothing more is queued.
    let (status, again) = gw
        .post(
            &respond,
            json!({"option_id": "reject-once", "reason": "other"}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["decision"]["reason"], "wrong file:\nuse notes.txt");
    assert!(queued_texts(&gw, &id).await.is_empty());
}

async fn a_steering_reason_cancels_the_turn_and_is_sent_at_once(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "ask 3").await;
    let request = asked(&mut ws).await;
    send(&gw, &id, json!({"text": "hello queued"})).await;
    let (status, answered) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once", "reason": "but only this one", "steer": true}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    let told = "The user allowed your request to run \"Write ask-0.txt\" (\"Allow once\"), and said: but only this one";
    turn_of(&mut ws, told).await;
    // The rest of the queue goes on after it.
    turn_of(&mut ws, "hello queued").await;
}

async fn bad_reasons_are_refused_and_answer_nothing(db: TestDb) {
    let (gw, _id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&_id, "tool").await;
    let request = asked(&mut ws).await;
    let respond = format!("/api/v1/permissions/{request}/respond");
    let long = "x".repeat(2001);
    for body in [
        json!({"option_id": "reject-once", "reason": long}),
        json!({"option_id": "reject-once", "reason": "bell\u{7}"}),
        json!({"option_id": "reject-once", "reason": 42}),
    ] {
        let (status, problem) = gw.post(&respond, body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
    }
    let (_, still) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(still["status"], "pending");
    // At the limit is fine.
    let (status, _) = gw
        .post(
            &respond,
            json!({"option_id": "reject-once", "reason": "y".repeat(2000)}),
        )
        .await;
    assert_eq!(status, 200);
}

backend_tests!(
    prompts_sent_during_a_turn_queue_and_start_in_order_after_end_turn,
    a_queue_holds_after_a_cancel_and_starts_again_when_resumed,
    a_steering_prompt_cancels_the_turn_and_starts_ahead_of_the_queue,
    queued_prompts_are_edited_moved_and_removed_and_a_started_one_is_409,
    the_queue_survives_a_restart_and_is_edited_without_an_agent,
    a_queue_holds_when_the_agent_dies_and_resuming_starts_it_again,
    a_reason_given_with_a_rejection_is_stored_and_reaches_the_agent_after_the_turn,
    a_steering_reason_cancels_the_turn_and_is_sent_at_once,
    bad_reasons_are_refused_and_answer_nothing,
);
