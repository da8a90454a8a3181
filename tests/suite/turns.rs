//! A whole turn end to end: REST + WebSocket + Postgres + a real agent
//! subprocess, and the history surviving a restart.

use crate::common::*;
use serde_json::json;

async fn a_prompt_streams_chunks_a_tool_call_and_turn_ended_and_survives_a_restart(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let conv = gw.create_conversation("demo").await;
    let id = conv["id"].as_str().unwrap().to_owned();
    assert_eq!(conv["status"], "idle");
    assert_eq!(conv["agent"], "demo");
    assert!(conv["acp_session_id"]
        .as_str()
        .unwrap()
        .starts_with("demo-"));

    let mut ws = gw.conversation_ws(&id, 0).await;
    let turn = gw.prompt(&id, "hello world").await;
    let live = ws.until_type("turn_ended").await;
    let ended = live.last().unwrap();
    assert_eq!(ended["data"]["turn_id"], turn.as_str());
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    assert_consecutive(&live, 0);
    assert_eq!(
        streamed_text(&live, "agent_message_chunk"),
        "You said: hello world"
    );
    assert_eq!(
        streamed_text(&live, "agent_thought_chunk"),
        "Thinking about: hello world"
    );
    let started = live.iter().find(|e| e["type"] == "turn_started").unwrap();
    assert_eq!(
        started["data"]["content"],
        json!([{"type": "text", "text": "hello world"}])
    );

    // A tool call with a permission request, approved.
    let turn2 = gw.prompt(&id, "tool").await;
    let frames = ws.until_type("permission_requested").await;
    let request = frames.last().unwrap()["data"].clone();
    assert_eq!(request["status"], "pending");
    assert_eq!(request["turn_id"], turn2.as_str());
    let (status, _) = gw
        .post(
            &format!(
                "/api/v1/permissions/{}/respond",
                request["id"].as_str().unwrap()
            ),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200);
    let rest = ws.until_type("turn_ended").await;
    assert_eq!(rest.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert!(rest.iter().any(|e| e["type"] == "permission_resolved"));

    let events_before = gw.events(&id).await;
    let (_, messages_before) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    let (_, tools_before) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    let tools = tools_before["items"].as_array().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["status"], "completed");
    assert_eq!(tools[0]["kind"], "edit");
    assert_eq!(tools[0]["title"], "Write hello.txt");
    assert_eq!(tools[0]["turn_id"], turn2.as_str());
    assert!(tools[0]["content"][0]["content"]["text"].as_str().is_some());
    let messages = messages_before["items"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "thought", "agent", "user", "agent"]);
    assert_eq!(
        messages[2]["content"],
        json!([{"type": "text", "text": "You said: hello world"}])
    );

    // Everything that was live is in the log, and the same after a restart.
    let all_live: Vec<_> = live.iter().chain(&frames).chain(&rest).cloned().collect();
    assert_eq!(&events_before[..all_live.len()], &all_live[..]);
    ws.close().await;
    let gw = gw.restart().await;
    let events_after = gw.events(&id).await;
    assert_eq!(&events_after[..events_before.len()], &events_before[..]);
    // The restart is recorded after the history: the agent is gone.
    let tail = &events_after[events_before.len()..];
    assert_eq!(tail.last().unwrap()["type"], "agent_status");
    assert_eq!(tail.last().unwrap()["data"]["status"], "exited");
    assert_consecutive(&events_after, 0);
    let (_, messages_after) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    assert_eq!(messages_after, messages_before);
    let (_, tools_after) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    assert_eq!(tools_after, tools_before);
    // Not closed: the next prompt starts the agent again.
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "idle");
    assert_eq!(conv["last_seq"], events_after.last().unwrap()["seq"]);
}

async fn a_long_stream_of_small_chunks_is_merged_without_losing_text(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "long 3000").await;
    let live = ws.until_type("turn_ended").await;
    let expected: String = (0..3000).map(|i| format!("w{i} ")).collect();
    assert_eq!(streamed_text(&live, "agent_message_chunk"), expected);
    assert_consecutive(&live, 0);
    let stored = gw.events(&id).await;
    assert_eq!(streamed_text(&stored, "agent_message_chunk"), expected);
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    let agent: Vec<_> = messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "agent")
        .collect();
    assert_eq!(agent.len(), 1);
    assert_eq!(agent[0]["content"][0]["text"], expected.as_str());
}

async fn a_message_committed_in_parts_reads_back_whole_and_survives_a_restart(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "slow 4").await;
    // The chunks come 50 ms apart, each committed (and so published) before
    // the next as a rule: the message is stored as several parts.
    let live = ws.until_type("turn_ended").await;
    let chunk_events = live
        .iter()
        .filter(|e| e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert!(chunk_events >= 2, "several commits: {live:?}");
    let expected = json!([{"type": "text", "text": "s0 s1 s2 s3 "}]);
    let agent_message = |messages: &serde_json::Value| {
        messages["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "agent")
            .map(|m| m["content"].clone())
            .collect::<Vec<_>>()
    };
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    assert_eq!(agent_message(&messages), [expected]);
    ws.close().await;
    let gw = gw.restart().await;
    let (_, after) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    assert_eq!(after, messages);
}

async fn a_plan_and_content_blocks_pass_through_verbatim(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    let content = json!([{"type": "text", "text": "plan"}, {"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs"}]);
    let (status, body) = gw
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"content": content}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let live = ws.until_type("turn_ended").await;
    let started = live.iter().find(|e| e["type"] == "turn_started").unwrap();
    assert_eq!(started["data"]["content"], content);
    let plan = live
        .iter()
        .find(|e| e["data"]["update"]["sessionUpdate"] == "plan")
        .expect("plan update");
    assert_eq!(
        plan["data"]["update"]["entries"].as_array().unwrap().len(),
        3
    );
}

async fn conversations_are_listed_newest_first_with_a_cursor(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            gw.create_conversation("demo").await["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let (_, page1) = gw.get("/api/v1/conversations?limit=2").await;
    let items: Vec<_> = page1["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(items, [ids[2].clone(), ids[1].clone()]);
    let cursor = page1["next_cursor"].as_str().unwrap();
    let (_, page2) = gw
        .get(&format!("/api/v1/conversations?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(page2["items"][0]["id"], ids[0].as_str());
    assert_eq!(page2["next_cursor"], json!(null));
}

async fn closing_a_conversation_stops_its_agent_and_keeps_its_history(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    ws.until_type("turn_started").await;
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    let frames = ws.until_agent_gone().await;
    let ended = frames
        .iter()
        .find(|e| e["type"] == "turn_ended")
        .expect("turn ended");
    assert_eq!(ended["data"]["stop_reason"], "cancelled");
    assert_eq!(frames.last().unwrap()["data"]["status"], "exited");
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "closed");
    let (status, body) = gw
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "hello"}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["code"], "conversation_closed");
    // Deleting again is harmless.
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    assert!(!gw.events(&id).await.is_empty());
}

backend_tests!(
    a_prompt_streams_chunks_a_tool_call_and_turn_ended_and_survives_a_restart,
    a_long_stream_of_small_chunks_is_merged_without_losing_text,
    a_message_committed_in_parts_reads_back_whole_and_survives_a_restart,
    a_plan_and_content_blocks_pass_through_verbatim,
    conversations_are_listed_newest_first_with_a_cursor,
    closing_a_conversation_stops_its_agent_and_keeps_its_history,
);
