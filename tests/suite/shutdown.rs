//! Graceful shutdown of a real gateway process (SIGTERM) with
//! `on_shutdown = "cancel"`: running turns are cancelled as a user would
//! cancel them and end `cancelled`, clients see that and get close code
//! 1001, the process exits 0, and the conversations resume after the next
//! start. (What the default, `detach`, leaves: `restart.rs`.)

use crate::common::*;
use serde_json::{json, Value};

/// Starts a gateway process and a conversation on it; returns both and a
/// WebSocket on the conversation.
async fn conversation_on(
    db: &TestDb,
    agent: acp_gateway::config::AgentProfile,
    extra: &str,
) -> (GatewayProcess, String, Ws) {
    let extra = format!("on_shutdown = \"cancel\"\n{extra}");
    let gw = GatewayProcess::start_configured(db, &[agent], "info", &extra);
    let conversation = gw
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await
        .1;
    let id = conversation["id"].as_str().unwrap().to_owned();
    let ws = gw.conversation_ws(&id, 0).await;
    (gw, id, ws)
}

async fn prompt(gw: &GatewayProcess, id: &str, text: &str) -> Value {
    gw.post(
        &format!("/api/v1/conversations/{id}/prompts"),
        json!({"text": text}),
    )
    .await
    .1
}

async fn sigterm_ends_a_running_turn_cancelled_and_the_conversation_resumes(db: TestDb) {
    let (gw, id, mut ws) = conversation_on(&db, demo_profile("demo", &[]), "").await;
    prompt(&gw, &id, "tool").await;
    let requested = ws.until_type("permission_requested").await;
    let request = requested.last().unwrap()["data"]["id"].clone();

    let (status, log) = gw.terminate();
    assert!(status.success(), "exit status {status:?}\n{log}");
    let (frames, code) = ws.until_closed().await;
    assert_eq!(code, 1001);
    // The cancel rule: the request is answered cancelled, then the agent
    // ends its turn itself.
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .expect("the request is resolved before the socket closes");
    assert_eq!(resolved["data"]["id"], request);
    assert_eq!(resolved["data"]["status"], "cancelled");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "cancelled");
    assert_eq!(ended["data"]["error"], Value::Null);
    let gone = frames.last().unwrap();
    assert_eq!(gone["type"], "agent_status");
    assert_eq!(gone["data"]["status"], "exited");
    assert!(agent_process_records(&db).await.is_empty());

    // After the next start the conversation goes on.
    let gw = GatewayProcess::start_configured(
        &db,
        &[demo_profile("demo", &[])],
        "info",
        "on_shutdown = \"cancel\"",
    );
    let (_, conversation) = {
        let url = format!("{}/api/v1/conversations/{id}", gw.base);
        let response = reqwest::get(url).await.unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    };
    assert_eq!(conversation["status"], "idle", "{conversation}");
    let mut ws = gw
        .conversation_ws(&id, conversation["last_seq"].as_i64().unwrap())
        .await;
    let started = prompt(&gw, &id, "hello").await;
    assert!(started["turn_id"].is_string(), "{started}");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let (status, _) = gw.terminate();
    assert!(status.success());
}

async fn an_agent_that_ignores_the_cancel_is_stopped_after_shutdown_timeout(db: TestDb) {
    let agent = demo_profile("demo", &["--hang-on", "session/cancel"]);
    let (gw, id, mut ws) = conversation_on(&db, agent, "shutdown_timeout = \"300ms\"").await;
    prompt(&gw, &id, "hang").await;
    ws.until_type("turn_started").await;
    let (status, log) = gw.terminate();
    assert!(status.success(), "exit status {status:?}\n{log}");
    assert!(
        log.contains("did not answer session/cancel before shutdown_timeout"),
        "{log}"
    );
    let (frames, code) = ws.until_closed().await;
    assert_eq!(code, 1001);
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "cancelled");
    assert!(agent_process_records(&db).await.is_empty());
}

backend_tests!(
    sigterm_ends_a_running_turn_cancelled_and_the_conversation_resumes,
    an_agent_that_ignores_the_cancel_is_stopped_after_shutdown_timeout,
);
