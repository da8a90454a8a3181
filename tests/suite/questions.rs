//! The agents' questions (ACP elicitation) through a real gateway, asked by
//! the scripted agent on the official npm SDK: advertised, parked and
//! stored, shown live and in the inbox, answered over REST with content
//! checked against the schema (422 naming the field), declined, cancelled
//! by the turn's cancel, answered `accept` when a URL question completes,
//! first answer wins, never by a policy, and surviving a restart of the
//! gateway as "agent gone" like a permission request.

use serde_json::{json, Value};

use crate::common::*;

/// The form the agent asks with in most tests.
fn form() -> Value {
    json!({
        "mode": "form",
        "message": "Which environment, and how many replicas?",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "env": {"type": "string", "enum": ["staging", "production"]},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
                "contact": {"type": "string", "format": "email"},
                "confirm": {"type": "boolean"}
            },
            "required": ["env", "replicas"]
        }
    })
}

/// A conversation with the SDK agent and a socket on it; the agent asks
/// `params` and the question as `question_asked` showed it.
async fn asked(db: &TestDb, params: Value) -> (TestGateway, String, Ws, Value) {
    let gw = TestGateway::start(db, vec![node_sdk_profile("node")]).await;
    let (id, mut ws) = gw.open_conversation("node").await;
    gw.prompt(&id, &format!("question {params}")).await;
    let frames = ws.until_type("question_asked").await;
    let question = frames.last().unwrap()["data"].clone();
    (gw, id, ws, question)
}

/// What the agent says it got, once the turn ended.
async fn agent_got(ws: &mut Ws) -> (Value, String) {
    let frames = ws.until_type("turn_ended").await;
    let said = streamed_text(&frames, "agent_message_chunk");
    let ended = frames.last().unwrap()["data"]["stop_reason"]
        .as_str()
        .unwrap()
        .to_owned();
    (
        serde_json::from_str(&said).unwrap_or(Value::String(said)),
        ended,
    )
}

fn respond(question: &Value) -> String {
    format!(
        "/api/v1/questions/{}/respond",
        question["id"].as_str().unwrap()
    )
}

async fn a_form_question_is_shown_listed_and_answered_with_checked_content(db: TestDb) {
    let (gw, id, mut ws, question) = asked(&db, form()).await;
    assert_eq!(question["mode"], "form");
    assert_eq!(question["status"], "pending");
    assert_eq!(
        question["message"],
        "Which environment, and how many replicas?"
    );
    assert_eq!(
        question["requested_schema"]["required"],
        json!(["env", "replicas"])
    );
    assert!(question["turn_id"].is_string());
    let (status, list) = gw.get("/api/v1/questions").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(list["items"][0]["id"], question["id"]);
    // Not a permission request.
    let (_, permissions) = gw.get("/api/v1/permissions").await;
    assert_eq!(permissions["items"], json!([]));
    let qid = question["id"].as_str().unwrap();
    assert_eq!(gw.get(&format!("/api/v1/permissions/{qid}")).await.0, 404);
    let (status, shown) = gw.get(&format!("/api/v1/questions/{qid}")).await;
    assert_eq!((status, &shown["id"]), (200, &question["id"]));
    let (status, _) = gw
        .get(&format!(
            "/api/v1/questions?conversation_id={id}&status=all"
        ))
        .await;
    assert_eq!(status, 200);

    // Content that does not match: 422 naming each field; nothing answered.
    let bad = json!({"action": "accept", "content": {"env": "moon", "replicas": 9, "contact": "nobody", "extra": 1}});
    let (status, problem) = gw.post(&respond(&question), bad).await;
    assert_eq!(status, 422, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    for field in [
        "content.env",
        "content.replicas",
        "content.contact",
        "content.extra",
    ] {
        assert!(detail.contains(field), "{field} not in {detail}");
    }
    let (status, problem) = gw
        .post(
            &respond(&question),
            json!({"action": "accept", "content": {"env": "staging"}}),
        )
        .await;
    assert_eq!(status, 422);
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("content.replicas is required"));
    for body in [
        json!({"action": "maybe"}),
        json!({"action": "decline", "content": {"env": "staging"}}),
        json!({"option_id": "allow-once"}),
        json!({}),
    ] {
        assert_eq!(
            gw.post(&respond(&question), body.clone()).await.0,
            422,
            "{body}"
        );
    }
    // Answering it as a permission request finds nothing.
    let (status, _) = gw
        .post(
            &format!("/api/v1/permissions/{qid}/respond"),
            json!({"outcome": "cancelled"}),
        )
        .await;
    assert_eq!(status, 404);

    let content =
        json!({"env": "production", "replicas": 3, "contact": "ops@example.org", "confirm": true});
    let (status, answered) = gw
        .post(
            &respond(&question),
            json!({"action": "accept", "content": content}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "accepted");
    assert_eq!(answered["answer"]["action"], "accept");
    assert_eq!(answered["answer"]["content"], content);
    assert!(answered["answer"]["decided_by"]
        .as_str()
        .unwrap()
        .starts_with("user:"));
    let (got, ended) = agent_got(&mut ws).await;
    assert_eq!(got, json!({"action": "accept", "content": content}));
    assert_eq!(ended, "end_turn");
    let events = gw.events(&id).await;
    let resolved = events
        .iter()
        .find(|e| e["type"] == "question_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["answer"]["content"], content);
    // First answer wins: the same again is 200, another is 409.
    let again = gw
        .post(
            &respond(&question),
            json!({"action": "accept", "content": content}),
        )
        .await;
    assert_eq!(again.0, 200, "{}", again.1);
    let (status, conflict) = gw
        .post(&respond(&question), json!({"action": "decline"}))
        .await;
    assert_eq!(status, 409);
    assert_eq!(conflict["code"], "already_resolved");
    assert_eq!(conflict["question"]["status"], "accepted");
    let (_, pending) = gw.get("/api/v1/questions").await;
    assert_eq!(pending["items"], json!([]));
}

async fn a_declined_question_and_one_crossing_the_cancel_are_told_to_the_agent(db: TestDb) {
    let (gw, id, mut ws, question) = asked(&db, form()).await;
    let (status, answered) = gw
        .post(&respond(&question), json!({"action": "decline"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(answered["status"], "declined");
    assert_eq!(agent_got(&mut ws).await.0, json!({"action": "decline"}));
    // The turn's cancel answers a waiting question `cancel`.
    gw.prompt(&id, &format!("question {}", form())).await;
    let frames = ws.until_type("question_asked").await;
    let second = frames.last().unwrap()["data"].clone();
    gw.post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    let frames = ws.until_type("question_resolved").await;
    let resolved = &frames.last().unwrap()["data"];
    assert_eq!(resolved["id"], second["id"]);
    assert_eq!(resolved["status"], "cancelled");
    assert_eq!(resolved["answer"]["action"], "cancel");
    assert_eq!(resolved["answer"]["decided_by"], "system");
    let (got, _) = agent_got(&mut ws).await;
    assert_eq!(got, json!({"action": "cancel"}));
}

async fn a_url_question_is_accepted_by_a_person_or_completed_by_the_agent(db: TestDb) {
    let url = json!({"mode": "url", "message": "Sign in to the registry",
        "url": "https://registry.example.org/login?x=1", "elicitationId": "e-1"});
    let (gw, id, mut ws, question) = asked(&db, url.clone()).await;
    assert_eq!(question["mode"], "url");
    assert_eq!(question["url"], "https://registry.example.org/login?x=1");
    assert_eq!(question["elicitation_id"], "e-1");
    assert!(question.get("requested_schema").is_none());
    let with_content = json!({"action": "accept", "content": {"a": 1}});
    assert_eq!(gw.post(&respond(&question), with_content).await.0, 422);
    let (status, _) = gw
        .post(&respond(&question), json!({"action": "accept"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(agent_got(&mut ws).await.0, json!({"action": "accept"}));
    // The agent says the interaction is done before anyone answers.
    let mut done = url.clone();
    done["elicitationId"] = json!("e-2");
    done["complete"] = json!(true);
    gw.prompt(&id, &format!("question {done}")).await;
    let frames = ws.until_type("question_resolved").await;
    let resolved = &frames.last().unwrap()["data"];
    assert_eq!(resolved["status"], "accepted");
    assert_eq!(resolved["answer"]["decided_by"], "system");
    assert_eq!(agent_got(&mut ws).await.0, json!({"action": "accept"}));
}

async fn questions_the_gateway_cannot_ask_are_refused_to_the_agent(db: TestDb) {
    let gw = TestGateway::start(&db, vec![node_sdk_profile("node")]).await;
    let (id, mut ws) = gw.open_conversation("node").await;
    for bad in [
        json!({"mode": "form", "message": "x", "requestedSchema": {"type": "object",
            "properties": {"nested": {"type": "object"}}}}),
        json!({"mode": "url", "message": "x", "url": "javascript:alert(1)", "elicitationId": "e"}),
        json!({"mode": "telepathy", "message": "x"}),
    ] {
        gw.prompt(&id, &format!("question {bad}")).await;
        let (got, _) = agent_got(&mut ws).await;
        assert_eq!(got["error"]["code"], -32602, "{bad}: {got}");
    }
    let (_, all) = gw.get("/api/v1/questions?status=all").await;
    assert_eq!(all["items"], json!([]));
}

async fn a_waiting_question_is_in_the_inbox_snapshot_and_its_events(db: TestDb) {
    let (gw, _id, _ws, question) = asked(&db, form()).await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    let snapshot = inbox.next().await;
    assert_eq!(snapshot["type"], "snapshot");
    assert_eq!(snapshot["pending_permissions"], json!([]));
    assert_eq!(snapshot["pending_questions"][0]["id"], question["id"]);
    gw.post(&respond(&question), json!({"action": "decline"}))
        .await;
    let frames = inbox.until_type("question_resolved").await;
    assert_eq!(frames.last().unwrap()["data"]["id"], question["id"]);
}

async fn a_question_left_by_a_gateway_that_stopped_is_answered_as_gone(db: TestDb) {
    let (gw, _id, ws, question) = asked(&db, form()).await;
    drop(ws);
    let gw = gw.restart().await;
    let (_, stored) = gw
        .get(&format!(
            "/api/v1/questions/{}",
            question["id"].as_str().unwrap()
        ))
        .await;
    // Settled as a permission request would be: the agent that asked is gone.
    assert_ne!(stored["status"], "pending", "{stored}");
    let (status, _) = gw
        .post(&respond(&question), json!({"action": "decline"}))
        .await;
    assert_eq!(status, 409);
}

async fn no_policy_answers_a_question_and_it_times_out_as_cancel(db: TestDb) {
    let mut profile = node_sdk_profile("node");
    profile.permission_timeout = Some(std::time::Duration::from_millis(400));
    let mut config = acp_gateway::config::Config::for_tests(&db, vec![profile]);
    config.policies = serde_json::from_value(json!([
        {"name": "everything", "decision": "allow"}
    ]))
    .unwrap();
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("node").await;
    gw.prompt(&id, &format!("question {}", form())).await;
    let frames = ws.until_type("question_resolved").await;
    let asked = frames
        .iter()
        .find(|e| e["type"] == "question_asked")
        .unwrap();
    assert_eq!(
        asked["data"]["status"], "pending",
        "asked of a person, not a policy"
    );
    let resolved = &frames.last().unwrap()["data"];
    assert_eq!(resolved["status"], "timed_out");
    assert_eq!(resolved["answer"]["action"], "cancel");
    assert_eq!(resolved["answer"]["decided_by"], "system");
    assert_eq!(agent_got(&mut ws).await.0, json!({"action": "cancel"}));
}

backend_tests!(
    no_policy_answers_a_question_and_it_times_out_as_cancel,
    a_form_question_is_shown_listed_and_answered_with_checked_content,
    a_declined_question_and_one_crossing_the_cancel_are_told_to_the_agent,
    a_url_question_is_accepted_by_a_person_or_completed_by_the_agent,
    questions_the_gateway_cannot_ask_are_refused_to_the_agent,
    a_waiting_question_is_in_the_inbox_snapshot_and_its_events,
    a_question_left_by_a_gateway_that_stopped_is_answered_as_gone,
);
