//! The person's story of issue 51, end to end with real components: *I
//! start a task from my IDE at the desk through the gateway, walk away, my
//! phone buzzes with the agent's permission request, I answer on the lock
//! screen, and back at the desk the IDE shows the turn went on; tomorrow I
//! reopen the conversation from the IDE, including one I started from my
//! phone.*
//!
//! The IDE is the ACP client of the official npm SDK
//! (`tests/sdk-agents/acp-client.mjs`) over a real WebSocket at
//! `/api/v1/acp/demo`; the phone is a Web Push subscription whose push
//! service is a real HTTP receiver on loopback that decrypts each push with
//! libraries of its own (`tests/notify-services/push_service.py`: Python
//! `http_ece`, never the gateway's code), and the lock screen's button is
//! the push's action, followed as the web client's service worker does (a
//! `POST` to its URL, no credentials).

use serde_json::{json, Value};

use super::acp_server::{text_prompt, SdkClient};
use super::notify_channels::{
    attempts_of, decrypted_bodies, notifying_config, vapid_public_key, web_push_target, Service,
    BASE,
};
use crate::common::*;

/// What a `session/load` replays, as (seq, update), built from the
/// conversation's history over REST: each prompt's content as
/// `user_message_chunk`s at its `turn_started`, each stored update as it
/// was.
fn expected_replay(history: &[Value]) -> Vec<(i64, Value)> {
    let mut expected = Vec::new();
    for event in history {
        let seq = event["seq"].as_i64().unwrap();
        match event["type"].as_str().unwrap() {
            "session_update" => expected.push((seq, event["data"]["update"].clone())),
            "turn_started" => {
                for block in event["data"]["content"].as_array().unwrap() {
                    expected.push((
                        seq,
                        json!({"sessionUpdate": "user_message_chunk", "content": block}),
                    ));
                }
            }
            _ => {}
        }
    }
    expected
}

/// The updates an SDK client printed, as (seq, update), taken out of its
/// events.
fn take_updates(ide: &mut SdkClient) -> Vec<(i64, Value)> {
    let (updates, rest): (Vec<Value>, Vec<Value>) =
        ide.events.drain(..).partition(|e| e["event"] == "update");
    ide.events.extend(rest);
    updates
        .into_iter()
        .map(|e| {
            (
                e["params"]["_meta"]["acpGateway"]["seq"].as_i64().unwrap(),
                e["params"]["update"].clone(),
            )
        })
        .collect()
}

fn agent_text(updates: &[(i64, Value)]) -> String {
    updates
        .iter()
        .filter(|(_, u)| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|(_, u)| u["content"]["text"].as_str())
        .collect()
}

async fn initialize(ide: &mut SdkClient) {
    let init = ide
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await;
    assert_eq!(init["protocolVersion"], 1, "{init}");
}

async fn an_ide_task_answered_from_the_phone_goes_on_and_is_reopened_the_next_day(db: TestDb) {
    let gw = TestGateway::start_with(notifying_config(&db)).await;
    // The phone: a browser's Web Push subscription at a push service.
    let push_service = Service::start("push_service.py", &[&vapid_public_key(&gw).await]);
    let phone = web_push_target(&gw, &push_service).await;
    let mut pushes = gw.outbox.watch();

    // At the desk: the IDE starts a task that needs a permission.
    let mut ide = SdkClient::start_at(&gw, "/api/v1/acp/demo");
    initialize(&mut ide).await;
    let created = ide
        .call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await;
    let desk = created["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(gw.conversation(&desk).await["agent"], "demo");
    let prompt = ide.send("session/prompt", text_prompt(&desk, "tool")).await;
    let asked = ide.event("permission").await;
    let permission_id = asked["params"]["_meta"]["acpGateway"]["permissionId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The person walks away: the IDE holds the request, unanswered.

    // The phone buzzes: one push, delivered and decrypted by the service.
    let attempts = attempts_of(&mut pushes, "permission_waiting", &[&phone]).await;
    assert_eq!(attempts[&phone].outcome, "delivered", "{attempts:?}");
    let seen = decrypted_bodies(&push_service.seen().await);
    let waiting: Vec<&Value> = seen
        .iter()
        .map(|(body, _)| body)
        .filter(|body| body["event"] == "permission_waiting")
        .collect();
    assert_eq!(waiting.len(), 1, "one push: {seen:#?}");
    let body = waiting[0];
    assert_eq!(body["conversation"]["id"], desk.as_str());
    assert_eq!(body["request"]["id"], permission_id.as_str());
    // The lock screen's button: its action, followed as the service worker
    // does (a POST without credentials).
    let allow = body["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["option_id"] == "allow-once")
        .unwrap_or_else(|| panic!("an allow-once action: {body}"));
    let url = allow["url"].as_str().unwrap();
    let path = url.strip_prefix(BASE).unwrap();
    let tapped = reqwest::Client::new()
        .post(gw.url(path))
        .send()
        .await
        .unwrap();
    assert_eq!(tapped.status(), 200);
    let answered: Value = tapped.json().await.unwrap();
    assert_eq!(answered["status"], "approved", "{answered}");
    assert_eq!(answered["decision"]["via"], "notification");

    // Back at the desk: the IDE's request is withdrawn, the turn goes on
    // and its prompt ends, once.
    let withdrawn = ide.event("cancelled").await;
    assert_eq!(withdrawn["requestId"], asked["requestId"]);
    let ended = ide.answer(prompt).await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let live = take_updates(&mut ide);
    assert!(live.windows(2).all(|w| w[0].0 < w[1].0), "{live:?}");
    assert!(
        live.iter()
            .any(|(_, u)| u["sessionUpdate"] == "tool_call_update" && u["status"] == "completed"),
        "{live:?}"
    );
    assert_eq!(agent_text(&live), "Done.");
    // Nothing else came for the prompt: one more call's answer is next.
    ide.call("session/list", json!({})).await;
    assert!(
        ide.events.iter().all(|e| e["id"] != prompt),
        "{:?}",
        ide.events
    );
    let ends = gw
        .events(&desk)
        .await
        .into_iter()
        .filter(|e| e["type"] == "turn_ended")
        .count();
    assert_eq!(ends, 1);
    ide.close().await;

    // Later, from the phone: a conversation of its own, over REST.
    let (status, created) = gw
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let mobile = created["id"].as_str().unwrap().to_owned();
    let mut events = gw.conversation_ws(&mobile, 0).await;
    gw.prompt(&mobile, "hello from my phone").await;
    let frames = events.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");

    // The next day, at the desk: both are listed, and each loads as its
    // history says, every update once, nothing missing.
    let mut ide = SdkClient::start_at(&gw, "/api/v1/acp/demo");
    initialize(&mut ide).await;
    let listed = ide.call("session/list", json!({})).await;
    let ids: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&desk.as_str()), "{listed}");
    assert!(ids.contains(&mobile.as_str()), "{listed}");
    let mut cursors = Vec::new();
    for session in [&desk, &mobile] {
        let loaded = ide
            .call(
                "session/load",
                json!({"sessionId": session, "cwd": std::env::temp_dir(), "mcpServers": []}),
            )
            .await;
        let cursor = loaded["_meta"]["acpGateway"]["cursor"]
            .as_i64()
            .unwrap_or_else(|| panic!("{loaded}"));
        let replayed = take_updates(&mut ide);
        let history = gw.events(session).await;
        assert_eq!(
            cursor,
            history.last().unwrap()["seq"].as_i64().unwrap(),
            "loaded up to the last event"
        );
        assert_eq!(replayed, expected_replay(&history), "{session}");
        cursors.push(cursor);
    }
    let desk_replay = expected_replay(&gw.events(&desk).await);
    assert_eq!(agent_text(&desk_replay), "Done.");

    // A prompt from the IDE on the one started from the phone streams back.
    let ended = ide
        .call(
            "session/prompt",
            text_prompt(&mobile, "hello from the desk"),
        )
        .await;
    assert_eq!(ended["stopReason"], "end_turn", "{ended}");
    let streamed = take_updates(&mut ide);
    assert!(!streamed.is_empty());
    assert!(
        streamed.iter().all(|(seq, _)| *seq > cursors[1]),
        "only what is new: {streamed:?}"
    );
    assert!(
        streamed
            .iter()
            .all(|(_, u)| u["sessionUpdate"] != "user_message_chunk"),
        "its own prompt is not echoed: {streamed:?}"
    );
    let history = gw.events(&mobile).await;
    let stored: Vec<(i64, Value)> = expected_replay(&history)
        .into_iter()
        .filter(|(seq, u)| *seq > cursors[1] && u["sessionUpdate"] != "user_message_chunk")
        .collect();
    assert_eq!(streamed, stored);
    // The phone sees the desk's prompt too.
    let frames = events.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    ide.close().await;
    gw.stop().await;
}

backend_tests!(an_ide_task_answered_from_the_phone_goes_on_and_is_reopened_the_next_day);
