//! Bad requests get the contract's status codes with problem+json bodies,
//! and nothing is lost by them.

use crate::common::*;
use serde_json::json;

async fn health_and_readiness_answer(db: TestDb) {
    let gw = TestGateway::start(&db, vec![]).await;
    assert_eq!(gw.get("/healthz").await, (200, json!({"status": "ok"})));
    assert_eq!(gw.get("/readyz").await.0, 200);
}

async fn malformed_json_wrong_shapes_wrong_media_types_and_huge_bodies_get_problems(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let prompts = format!("/api/v1/conversations/{id}/prompts");

    let resp = gw
        .http
        .post(gw.url(&prompts))
        .header("content-type", "application/json")
        .body("{\"text\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(problem["status"], 400);
    assert_eq!(problem["code"], "malformed_json");
    assert!(
        problem["type"].is_string()
            && problem["title"].is_string()
            && problem["detail"].is_string()
    );

    for body in [
        json!({"text": 5}),
        json!({"content": "x"}),
        json!({}),
        json!({"content": []}),
        json!({"content": [{"text": "no type"}]}),
        json!({"text": "a", "content": [{"type":"text","text":"b"}]}),
        json!([1]),
    ] {
        let (status, problem) = gw.post(&prompts, body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert_eq!(problem["code"], "invalid_request");
    }
    let (status, problem) = gw.post_raw(&prompts, "text/plain", "hello").await;
    assert_eq!(status, 415, "{problem}");
    assert_eq!(problem["code"], "unsupported_media_type");
    let huge = json!({"text": "x".repeat(100 * 1024)}).to_string();
    let (status, problem) = gw.post_raw(&prompts, "application/json", huge).await;
    assert_eq!(status, 413, "{problem}");
    assert_eq!(problem["code"], "payload_too_large");

    // None of that started a turn or lost anything.
    let events = gw.events(&id).await;
    assert!(events.iter().all(|e| e["type"] != "turn_started"));
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "hello").await;
    ws.until_type("turn_ended").await;
}

async fn unknown_conversations_and_agents_get_404(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let unknown = uuid::Uuid::now_v7();
    for path in ["", "/messages", "/tool-calls", "/events"] {
        let (status, problem) = gw
            .get(&format!("/api/v1/conversations/{unknown}{path}"))
            .await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(problem["code"], "not_found");
    }
    let (status, _) = gw
        .post(
            &format!("/api/v1/conversations/{unknown}/prompts"),
            json!({"text": "x"}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = gw
        .post(
            &format!("/api/v1/conversations/{unknown}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{unknown}")).await;
    assert_eq!(status, 404);
    let (status, _) = gw.get("/api/v1/conversations/not-a-uuid").await;
    assert_eq!(status, 404);
    let url = gw
        .url(&format!("/api/v1/conversations/{unknown}/ws"))
        .replacen("http", "ws", 1);
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 404),
        other => panic!("expected a 404 for an unknown conversation's websocket: {other:?}"),
    }
    let (status, problem) = gw
        .post("/api/v1/conversations", json!({"agent": "nope"}))
        .await;
    assert_eq!(status, 404, "{problem}");
}

async fn conversation_input_is_validated(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    for body in [
        json!({"agent": "demo", "cwd": "relative/path"}),
        json!({"agent": "demo", "cwd": ""}),
        json!({"agent": 3}),
        json!({"title": "no agent"}),
    ] {
        let (status, problem) = gw.post("/api/v1/conversations", body.clone()).await;
        assert_eq!(status, 422, "{body}: {problem}");
    }
    // A directory that is not there is a resource not found (the document
    // cannot know what is on the disk).
    let (status, problem) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "cwd": "/definitely/not/a/dir"}),
        )
        .await;
    assert_eq!(status, 404, "{problem}");
    let (status, _) = gw.get("/api/v1/conversations?limit=0").await;
    assert_eq!(status, 422);
    let (status, _) = gw.get("/api/v1/conversations?limit=abc").await;
    assert_eq!(status, 422);
    let (status, _) = gw.get("/api/v1/permissions?status=maybe").await;
    assert_eq!(status, 422);
    let (status, conv) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": "My chat", "cwd": "/tmp"}),
        )
        .await;
    assert_eq!(status, 201);
    assert_eq!(conv["title"], "My chat");
    assert_eq!(conv["cwd"], "/tmp");
}

async fn a_prompt_while_a_turn_runs_gets_409_turn_in_progress(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    // Refused where the client asks not to queue it.
    let (status, problem) = gw
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "again", "queue": false}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(problem["code"], "turn_in_progress");
    gw.post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        frames
            .iter()
            .filter(|e| e["type"] == "turn_started")
            .count(),
        1
    );
}

backend_tests!(
    health_and_readiness_answer,
    malformed_json_wrong_shapes_wrong_media_types_and_huge_bodies_get_problems,
    unknown_conversations_and_agents_get_404,
    conversation_input_is_validated,
    a_prompt_while_a_turn_runs_gets_409_turn_in_progress,
);
