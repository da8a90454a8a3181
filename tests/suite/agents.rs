//! Agents that misbehave: crash, print garbage, send unknown updates, fail or
//! hang at start-up. The gateway keeps serving and reports what happened.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

async fn an_agent_crashing_mid_turn_ends_the_turn_with_error_and_reports_the_crash(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "crash").await;
    let frames = ws.until_agent_gone().await;
    let ended = frames
        .iter()
        .find(|e| e["type"] == "turn_ended")
        .expect("turn ended");
    assert_eq!(ended["data"]["stop_reason"], "error");
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "failed");
    let detail = status["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("code 3"), "{detail}");
    assert!(detail.contains("crashing on purpose"), "{detail}");
    assert!(!streamed_text(&frames, "agent_message_chunk").is_empty());
    // Gone, not failed: the conversation goes on.
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "idle");
    // Reaped before it was reported: nothing of it is on record.
    assert_eq!(agent_process_records(&db).await, vec![]);
    // The next prompt starts the agent again (it cannot load the session).
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    let ready = frames
        .iter()
        .find(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .unwrap();
    assert_eq!(ready["data"]["context"], "reset");
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");

    // The gateway goes on serving other conversations.
    let other = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws2 = gw.conversation_ws(&other, 0).await;
    gw.prompt(&other, "hello").await;
    let frames = ws2.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn an_agent_killed_with_a_request_pending_expires_it(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    // A working directory of its own identifies this test's agent process.
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let (status, conv) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "cwd": cwd.to_str().unwrap()}),
        )
        .await;
    assert_eq!(status, 201, "{conv}");
    let id = conv["id"].as_str().unwrap().to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "tool").await;
    ws.until_type("permission_requested").await;
    // Kill the agent from outside, as an OOM killer would.
    let pid = process_with_cwd(&cwd);
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let frames = ws.until_agent_gone().await;
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["status"], "expired");
    assert!(resolved["data"]["decision"]["reason"]
        .as_str()
        .unwrap()
        .contains("agent went away"));
    assert_eq!(frames.last().unwrap()["data"]["status"], "failed");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"], json!([]));
}

/// The one process whose working directory is `cwd`.
fn process_with_cwd(cwd: &std::path::Path) -> u32 {
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|p| p == cwd))
        .collect();
    assert_eq!(pids.len(), 1, "one agent process in {cwd:?}: {pids:?}");
    pids[0]
}

async fn garbage_on_stdout_is_skipped_and_the_turn_completes(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &["--stdout-banner"])]).await;
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "garbage").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert!(!streamed_text(&frames, "agent_message_chunk").is_empty());
}

async fn an_unknown_session_update_is_forwarded_verbatim(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "unknown").await;
    let frames = ws.until_type("turn_ended").await;
    let unknown = frames
        .iter()
        .find(|e| e["data"]["update"]["sessionUpdate"] == "future_variant_xyz")
        .expect("unknown update forwarded");
    assert_eq!(
        unknown["data"]["update"],
        json!({"sessionUpdate": "future_variant_xyz", "payload": {"a": 1}, "_meta": {"x": true}})
    );
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn refusals_and_prompt_errors_end_the_turn_with_their_reason(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "refuse").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "refusal");
    gw.prompt(&id, "error").await;
    let frames = ws.until_type("turn_ended").await;
    let data = &frames.last().unwrap()["data"];
    assert_eq!(data["stop_reason"], "error");
    assert!(
        data["error"]
            .as_str()
            .unwrap()
            .contains("failed on purpose"),
        "{data}"
    );
    // The conversation is usable afterwards.
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn a_hanging_turn_is_cancelled_by_the_cancel_rule(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hang").await;
    ws.until_type("turn_started").await;
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "running");
    gw.cancel_turn(&mut ws, &id).await;
    // Cancelling while idle is a no-op.
    let (status, _) = gw
        .post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 202);
}

async fn agents_that_fail_at_start_get_502_with_their_stderr_and_504_when_silent(db: TestDb) {
    let mut silent = demo_profile("silent", &["--hang-on", "initialize"]);
    silent.startup_timeout = Duration::from_millis(300);
    let gw = TestGateway::start(
        &db,
        vec![
            demo_profile("exits", &["--exit-on", "initialize"]),
            demo_profile("refuses", &["--fail-on", "session/new"]),
            profile("missing", "/nonexistent/agent-binary", &[]),
            silent,
        ],
    )
    .await;
    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "exits"}))
        .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["code"], "agent_failed");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("exiting on initialize"), "{detail}");
    assert!(detail.contains("code 2"), "{detail}");

    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "refuses"}))
        .await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("session/new"),
        "{body}"
    );

    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "missing"}))
        .await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("does not exist"),
        "{body}"
    );

    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "silent"}))
        .await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["code"], "agent_timeout");

    // Failed starts are recorded, with what went wrong.
    let (_, list) = gw.get("/api/v1/conversations").await;
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 4);
    assert!(items.iter().all(|c| c["status"] == "failed"));
    assert_eq!(
        agent_process_records(&db).await,
        vec![],
        "none is on record"
    );
    let events = gw.events(items[0]["id"].as_str().unwrap()).await;
    assert_eq!(events.last().unwrap()["data"]["status"], "failed");

    let (_, agents) = gw.get("/api/v1/agents").await;
    let missing = agents["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "missing")
        .unwrap();
    assert_eq!(missing["available"], false);
    assert!(missing["unavailable_reason"]
        .as_str()
        .unwrap()
        .contains("does not exist"));
    let exits = agents["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "exits")
        .unwrap();
    assert_eq!(exits["available"], true);
    assert_eq!(exits["unavailable_reason"], json!(null));
}

async fn closing_a_conversation_stops_the_agent_together_with_its_children(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "child").await;
    let child = ProcessWatch::new(child_pid(&mut ws).await);
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    assert!(child.ended().await, "the agent's child is stopped with it");
    assert_eq!(agent_process_records(&db).await, vec![], "and forgotten");
}

async fn an_agents_children_left_by_a_crashed_gateway_are_killed_when_it_starts_again(db: TestDb) {
    // The gateway runs as its own process so that it can really crash;
    // its agents are its own children (no shim keeps them for the next
    // start: see `restart.rs` for that).
    let gateway =
        GatewayProcess::start_configured(&db, &[demo_profile("demo", &[])], "info", NO_SHIMS);
    let created = gateway
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await
        .1;
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = gateway.conversation_ws(&id, 0).await;
    let turn = gateway
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "child"}),
        )
        .await
        .1;
    assert!(turn["turn_id"].is_string(), "{turn}");
    let child = ProcessWatch::new(child_pid(&mut ws).await);
    // The agent is on record, and the child is in its process group.
    let records = agent_process_records(&db).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].conversation_id.to_string(), id);
    let stat = acp_gateway::process::procs::stat(child.pid).expect("the child runs");
    assert_eq!(
        stat.pgrp, records[0].pid,
        "the child is in the agent's group"
    );

    gateway.kill();
    // Nothing of a crash stops the child (its agent exits when stdin closes).
    assert!(!child.has_ended(), "the child outlives the crashed gateway");

    let gateway =
        GatewayProcess::start_configured(&db, &[demo_profile("demo", &[])], "info", NO_SHIMS);
    assert!(
        child.ended().await,
        "the gateway kills on start what the crashed one's agent left"
    );
    assert_eq!(agent_process_records(&db).await, vec![], "and forgets it");
    let log = gateway.stop();
    assert!(log.contains(&format!("{} (sleep)", child.pid)), "{log}");
}

async fn a_cancel_gets_through_while_an_agent_streams_as_fast_as_it_can(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "long 1000000").await;
    ws.until(|e| e["type"] == "session_update").await;
    let frames = gw.cancel_turn(&mut ws, &id).await;
    let streamed = streamed_text(&frames, "agent_message_chunk");
    assert!(
        streamed.split_whitespace().count() < 1_000_000,
        "cancelled before the end"
    );
}

backend_tests!(
    closing_a_conversation_stops_the_agent_together_with_its_children,
    an_agents_children_left_by_a_crashed_gateway_are_killed_when_it_starts_again,
    a_cancel_gets_through_while_an_agent_streams_as_fast_as_it_can,
    an_agent_crashing_mid_turn_ends_the_turn_with_error_and_reports_the_crash,
    an_agent_killed_with_a_request_pending_expires_it,
    garbage_on_stdout_is_skipped_and_the_turn_completes,
    an_unknown_session_update_is_forwarded_verbatim,
    refusals_and_prompt_errors_end_the_turn_with_their_reason,
    a_hanging_turn_is_cancelled_by_the_cancel_rule,
    agents_that_fail_at_start_get_502_with_their_stderr_and_504_when_silent,
);
