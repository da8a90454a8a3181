//! The gateway against agents built on the official ACP SDKs (npm
//! `@agentclientprotocol/sdk`, PyPI `agent-client-protocol`), so that a
//! misreading of the spec shows up here rather than in production.

use crate::common::*;
use acp_gateway::config::AgentProfile;
use serde_json::json;

async fn full_turns_work_with(db: TestDb, profile: AgentProfile) {
    let gw = TestGateway::start(&db, vec![profile]).await;
    let conv = gw.create_conversation("sdk").await;
    assert_eq!(conv["status"], "idle");
    let id = conv["id"].as_str().unwrap().to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;

    // Plain streaming.
    gw.prompt(&id, "hello there").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: hello there"
    );

    // A permission request answered with approval.
    gw.prompt(&id, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    assert_eq!(request["tool_call"]["toolCallId"], "call_1");
    let (status, body) = gw
        .post(
            &format!(
                "/api/v1/permissions/{}/respond",
                request["id"].as_str().unwrap()
            ),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let (_, tools) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    assert_eq!(tools["items"][0]["status"], "completed");
    assert_eq!(tools["items"][0]["kind"], "edit");

    // Cancel with a request pending: the cancel rule, as the SDK expects it.
    gw.prompt(&id, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
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
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");

    // A turn that waits for cancel.
    gw.prompt(&id, "hang").await;
    ws.until(|e| e["type"] == "session_update").await;
    gw.post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");

    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    let frames = ws.until_agent_gone().await;
    assert_eq!(frames.last().unwrap()["data"]["status"], "exited");
}

async fn full_turns_work_with_the_npm_sdk_agent(db: TestDb) {
    full_turns_work_with(db, node_sdk_profile("sdk")).await;
}

async fn full_turns_work_with_the_python_sdk_agent(db: TestDb) {
    full_turns_work_with(db, python_sdk_profile("sdk")).await;
}

backend_tests!(
    full_turns_work_with_the_npm_sdk_agent,
    full_turns_work_with_the_python_sdk_agent,
);
