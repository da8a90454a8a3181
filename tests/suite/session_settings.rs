//! What an agent reports about its session (modes, configuration options,
//! commands, usage, title) and what a client may change (mode, options),
//! against the agent built on the official npm SDK; and the session
//! lifecycle around it: `session/resume` over `session/load`,
//! `session/close` on delete, `authenticate` with the profile's method.

use std::path::Path;

use crate::common::*;
use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};

/// The npm SDK agent keeping its sessions (and a log of the calls it
/// received) in `state`, with more behaviour switched on by `env`.
fn agent(name: &str, state: &Path, env: &[(&str, &str)]) -> AgentProfile {
    let mut agent = node_sdk_profile(name);
    agent.env.insert(
        "ACP_TEST_AGENT_STATE".into(),
        state.to_str().unwrap().into(),
    );
    for (k, v) in env {
        agent.env.insert((*k).into(), (*v).into());
    }
    agent
}

/// The methods the agent received, in order, with their params.
fn calls(state: &Path) -> Vec<(String, Value)> {
    let log = std::fs::read_to_string(state.join("calls.jsonl")).unwrap_or_default();
    log.lines()
        .map(|line| {
            let call: Value = serde_json::from_str(line).unwrap();
            (
                call["method"].as_str().unwrap().to_owned(),
                call["params"].clone(),
            )
        })
        .collect()
}

fn methods(state: &Path) -> Vec<String> {
    calls(state).into_iter().map(|(m, _)| m).collect()
}

fn current_value(conversation: &Value, option: &str) -> Value {
    conversation["config_options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == option)
        .unwrap()["currentValue"]
        .clone()
}

/// What the agent says it holds (its `settings` prompt).
async fn agent_settings(gw: &TestGateway, id: &str, ws: &mut Ws) -> String {
    gw.prompt(id, "settings").await;
    let frames = ws.until_type("turn_ended").await;
    streamed_text(&frames, "agent_message_chunk")
}

async fn modes_and_options_show_and_change_through_rest(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let gw = TestGateway::start(&db, vec![agent("sdk", state.path(), &[])]).await;
    let created = gw.create_conversation("sdk").await;
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;

    // As session/new reported them, verbatim.
    assert_eq!(created["modes"]["currentModeId"], "ask", "{created}");
    let modes: Vec<&str> = created["modes"]["availableModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["ask", "plan", "broken"]);
    assert_eq!(
        created["modes"]["availableModes"][1]["description"],
        "Plans only"
    );
    assert_eq!(current_value(&created, "model"), "fast");
    assert_eq!(created["config_options"][0]["category"], "model");
    assert_eq!(created["usage"], Value::Null);
    // The commands follow the answer to session/new.
    let frames = ws
        .until(|e| e["data"]["update"]["sessionUpdate"] == "available_commands_update")
        .await;
    assert_eq!(frames.last().unwrap()["data"]["turn_id"], Value::Null);
    let shown = gw.conversation(&id).await;
    assert_eq!(shown["available_commands"][0]["name"], "init");
    assert_eq!(
        shown["available_commands"][1]["input"]["hint"],
        "what to review"
    );
    // The list carries them too.
    let (_, list) = gw.get("/api/v1/conversations").await;
    assert_eq!(list["items"][0]["modes"], shown["modes"]);
    assert_eq!(
        list["items"][0]["available_commands"],
        shown["available_commands"]
    );

    // A mode change reaches the agent, is recorded for every client, and
    // the conversation says so.
    let (status, changed) = gw.set_mode(&id, "plan").await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["modes"]["currentModeId"], "plan");
    assert_eq!(changed["id"], id.as_str());
    let frames = ws.until_type("mode_changed").await;
    let event = frames.last().unwrap();
    assert_eq!(event["data"]["mode_id"], "plan");
    assert_eq!(event["data"]["changed_by"], "user:anonymous");
    assert_eq!(event["data"]["modes"]["currentModeId"], "plan");
    let set_mode = calls(state.path())
        .into_iter()
        .find(|(m, _)| m == "session/set_mode")
        .unwrap();
    assert_eq!(set_mode.1["modeId"], "plan");
    assert_eq!(set_mode.1["sessionId"], created["acp_session_id"]);

    // Options: a select and a boolean; the answer's options are kept.
    let (status, changed) = gw.set_option(&id, "model", json!("deep")).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(current_value(&changed, "model"), "deep");
    let (status, changed) = gw.set_option(&id, "brave", json!(true)).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(current_value(&changed, "brave"), true);
    let frames = ws.until_type("config_option_changed").await;
    let event = frames.last().unwrap();
    assert_eq!(event["data"]["config_id"], "model");
    assert_eq!(event["data"]["value"], "deep");
    let frames = ws.until_type("config_option_changed").await;
    let event = frames.last().unwrap();
    assert_eq!(event["data"]["config_id"], "brave");
    assert_eq!(event["data"]["value"], true);
    assert_eq!(
        event["data"]["config_options"],
        gw.conversation(&id).await["config_options"]
    );
    let sent: Vec<Value> = calls(state.path())
        .into_iter()
        .filter(|(m, _)| m == "session/set_config_option")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(sent[0]["configId"], "model");
    assert_eq!(sent[0]["value"], "deep");
    assert_eq!(sent[1]["type"], "boolean");
    assert_eq!(sent[1]["value"], true);
    assert_eq!(
        agent_settings(&gw, &id, &mut ws).await,
        "mode=plan model=deep brave=true"
    );

    // What the agent does not offer is refused without asking it.
    let asked = calls(state.path()).len();
    for (path, body, names) in [
        ("mode", json!({"mode_id": "yolo"}), "ask, plan, broken"),
        (
            "config-options",
            json!({"config_id": "model", "value": "huge"}),
            "fast, deep",
        ),
        (
            "config-options",
            json!({"config_id": "colour", "value": "red"}),
            "model, brave",
        ),
        (
            "config-options",
            json!({"config_id": "brave", "value": "yes"}),
            "true or false",
        ),
        (
            "config-options",
            json!({"config_id": "model", "value": true}),
            "a string",
        ),
    ] {
        let (status, problem) = gw
            .post(&format!("/api/v1/conversations/{id}/{path}"), body.clone())
            .await;
        assert_eq!(status, 409, "{body}: {problem}");
        assert_eq!(problem["code"], "not_offered", "{body}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(names),
            "{body}: {problem}"
        );
    }
    // Well-formed JSON of the wrong shape.
    for (path, body) in [
        ("mode", json!({})),
        ("mode", json!({"mode_id": 3})),
        ("mode", json!({"mode_id": "plan", "extra": 1})),
        ("mode", json!({"mode_id": ""})),
        ("config-options", json!({"config_id": "", "value": true})),
        ("config-options", json!({"config_id": "model"})),
        ("config-options", json!({"config_id": "model", "value": 3})),
        (
            "config-options",
            json!({"config_id": "model", "value": null}),
        ),
    ] {
        let (status, problem) = gw
            .post(&format!("/api/v1/conversations/{id}/{path}"), body.clone())
            .await;
        assert_eq!(status, 422, "{body}: {problem}");
    }
    assert_eq!(calls(state.path()).len(), asked, "the agent was not asked");

    // The agent's own refusal is a 502 that carries its message, and
    // changes nothing.
    let before = gw.conversation(&id).await;
    assert_problem(
        gw.set_mode(&id, "broken").await,
        502,
        "this mode cannot be entered",
    );
    assert_problem(
        gw.set_option(&id, "model", json!("refused")).await,
        502,
        "this value cannot be set",
    );
    let after = gw.conversation(&id).await;
    assert_eq!(after["modes"], before["modes"]);
    assert_eq!(after["config_options"], before["config_options"]);

    // During a turn too.
    gw.prompt(&id, "hang").await;
    ws.until(|e| e["type"] == "session_update" && e["data"]["turn_id"].is_string())
        .await;
    let (status, changed) = gw.set_mode(&id, "ask").await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["status"], "running");
    assert_eq!(changed["modes"]["currentModeId"], "ask");
    gw.post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
        .await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");

    // Unknown and closed conversations.
    let unknown = uuid::Uuid::now_v7().to_string();
    let (status, _) = gw.set_mode(&unknown, "plan").await;
    assert_eq!(status, 404);
    gw.delete(&format!("/api/v1/conversations/{id}")).await;
    let (status, problem) = gw.set_mode(&id, "plan").await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "conversation_closed");
}

async fn usage_and_the_agents_title_are_kept(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let gw = TestGateway::start(&db, vec![agent("sdk", state.path(), &[])]).await;
    let (id, mut ws) = gw.open_conversation("sdk").await;
    let (status, titled) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "sdk", "title": "Mine"}),
        )
        .await;
    assert_eq!(status, 201, "{titled}");
    let titled_id = titled["id"].as_str().unwrap().to_owned();
    let mut titled_ws = gw.conversation_ws(&titled_id, 0).await;
    assert_eq!(gw.conversation(&id).await["title"], Value::Null);

    for (id, ws) in [(&id, &mut ws), (&titled_id, &mut titled_ws)] {
        gw.prompt(id, "usage").await;
        let frames = ws.until_type("turn_ended").await;
        assert!(frames
            .iter()
            .any(|e| e["data"]["update"]["sessionUpdate"] == "usage_update"));
    }
    let shown = gw.conversation(&id).await;
    assert_eq!(
        shown["usage"],
        json!({"used": 1234, "size": 200000, "cost": {"amount": 0.12, "currency": "USD"}})
    );
    assert_eq!(shown["title"], "Usage report", "the agent's title");
    assert_eq!(
        gw.conversation(&titled_id).await["title"],
        "Mine",
        "the user's title stays"
    );
}

async fn the_state_survives_a_gateway_restart(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let gw = TestGateway::start(&db, vec![agent("sdk", state.path(), &[])]).await;
    let (id, mut ws) = gw.open_conversation("sdk").await;
    ws.until(|e| e["data"]["update"]["sessionUpdate"] == "available_commands_update")
        .await;
    gw.set_mode(&id, "plan").await;
    let (status, _) = gw.set_option(&id, "model", json!("deep")).await;
    assert_eq!(status, 200);
    gw.prompt(&id, "usage").await;
    ws.until_type("turn_ended").await;
    let before = gw.conversation(&id).await;

    // Shown at once, before any agent runs again.
    let gw = gw.restart().await;
    let after = gw.conversation(&id).await;
    for key in [
        "modes",
        "config_options",
        "available_commands",
        "usage",
        "title",
    ] {
        assert_eq!(after[key], before[key], "{key}");
    }
    assert_eq!(after["modes"]["currentModeId"], "plan");

    // The agent, started again, loads its session with its settings, and
    // a change goes on from there.
    let mut ws = gw
        .conversation_ws(&id, after["last_seq"].as_i64().unwrap())
        .await;
    assert_eq!(
        agent_settings(&gw, &id, &mut ws).await,
        "mode=plan model=deep brave=false"
    );
    let (status, changed) = gw.set_option(&id, "brave", json!(true)).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(current_value(&changed, "model"), "deep");
    assert_eq!(current_value(&changed, "brave"), true);
}

async fn a_change_starts_an_agent_that_is_gone_and_refuses_without_starting_one(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let gw = TestGateway::start(&db, vec![agent("sdk", state.path(), &[])]).await;
    let (id, _ws) = gw.open_conversation("sdk").await;
    let gw = gw.restart().await;
    let starts = || {
        methods(state.path())
            .iter()
            .filter(|m| *m == "initialize")
            .count()
    };
    assert_eq!(starts(), 1);

    let (status, _) = gw.set_mode(&id, "yolo").await;
    assert_eq!(status, 409);
    assert_eq!(starts(), 1, "a refused change starts no agent");

    let (status, changed) = gw.set_mode(&id, "plan").await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["modes"]["currentModeId"], "plan");
    assert_eq!(starts(), 2);
    assert_eq!(
        methods(state.path()).last().map(String::as_str),
        Some("session/set_mode")
    );
}

async fn the_profile_pins_a_new_sessions_mode_and_options(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let mut pinned = agent("pinned", state.path(), &[]);
    pinned.session_mode = Some("plan".into());
    pinned.session_config.insert("model".into(), json!("deep"));
    pinned.session_config.insert("brave".into(), json!(true));
    let mut wrong = agent("wrong", state.path(), &[]);
    wrong.session_mode = Some("yolo".into());
    let gw = TestGateway::start(&db, vec![pinned, wrong]).await;

    let (id, mut ws) = gw.open_conversation("pinned").await;
    let shown = gw.conversation(&id).await;
    assert_eq!(shown["modes"]["currentModeId"], "plan");
    assert_eq!(current_value(&shown, "model"), "deep");
    assert_eq!(current_value(&shown, "brave"), true);
    assert_eq!(
        agent_settings(&gw, &id, &mut ws).await,
        "mode=plan model=deep brave=true"
    );
    let sent = methods(state.path());
    let new = sent.iter().position(|m| m == "session/new").unwrap();
    assert_eq!(
        sent[new + 1..new + 4],
        [
            "session/set_mode",
            "session/set_config_option",
            "session/set_config_option"
        ]
    );

    // A pinned mode the agent does not offer: the conversation fails, and
    // says why.
    let (status, problem) = gw
        .post("/api/v1/conversations", json!({"agent": "wrong"}))
        .await;
    assert_eq!(status, 502, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("session_mode") && detail.contains("ask, plan, broken"),
        "{detail}"
    );
}

async fn session_resume_is_preferred_where_the_agent_offers_it(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let resuming = agent("resuming", state.path(), &[("ACP_TEST_AGENT_RESUME", "1")]);
    let gw = TestGateway::start(&db, vec![resuming]).await;
    let (id, mut ws) = gw.open_conversation("resuming").await;
    gw.prompt(&id, "first").await;
    ws.until_type("turn_ended").await;
    let before = gw.conversation(&id).await;

    let gw = gw.restart().await;
    let stopped = gw.conversation(&id).await;
    let mut ws = gw
        .conversation_ws(&id, stopped["last_seq"].as_i64().unwrap())
        .await;
    gw.prompt(&id, "second").await;
    let frames = ws.until_type("turn_ended").await;
    let ready = frames
        .iter()
        .find(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .unwrap();
    assert_eq!(ready["data"]["context"], "loaded");
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: second"
    );
    let sent = calls(state.path());
    let names: Vec<&str> = sent.iter().map(|(m, _)| m.as_str()).collect();
    assert!(names.contains(&"session/resume"), "{names:?}");
    assert!(!names.contains(&"session/load"), "{names:?}");
    let resume = &sent.iter().find(|(m, _)| m == "session/resume").unwrap().1;
    assert_eq!(resume["sessionId"], before["acp_session_id"]);
    assert_eq!(resume["cwd"], before["cwd"]);
    assert_eq!(
        gw.conversation(&id).await["acp_session_id"],
        before["acp_session_id"]
    );
}

async fn delete_sends_session_close_where_the_agent_offers_it(db: TestDb) {
    let closing_state = tempfile::tempdir().unwrap();
    let plain_state = tempfile::tempdir().unwrap();
    let closing = agent(
        "closing",
        closing_state.path(),
        &[("ACP_TEST_AGENT_CLOSE", "1")],
    );
    let plain = agent("plain", plain_state.path(), &[]);
    let gw = TestGateway::start(&db, vec![closing, plain]).await;

    for (name, state) in [
        ("closing", closing_state.path()),
        ("plain", plain_state.path()),
    ] {
        let (id, mut ws) = gw.open_conversation(name).await;
        let session_id = gw.conversation(&id).await["acp_session_id"].clone();
        let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
        assert_eq!(status, 204);
        let frames = ws.until_agent_gone().await;
        assert_eq!(frames.last().unwrap()["data"]["status"], "exited");
        assert_eq!(gw.conversation(&id).await["status"], "closed");
        let closes: Vec<Value> = calls(state)
            .into_iter()
            .filter(|(m, _)| m == "session/close")
            .map(|(_, p)| p)
            .collect();
        if name == "closing" {
            assert_eq!(closes, [json!({"sessionId": session_id})]);
        } else {
            assert!(closes.is_empty(), "{closes:?}");
        }
    }
}

async fn an_agent_that_needs_authentication_gets_the_profiles_method(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let env = [("ACP_TEST_AGENT_AUTH", "api-key")];
    let unset = agent("unset", state.path(), &env);
    let mut wrong = agent("wrong", state.path(), &env);
    wrong.auth_method = Some("password".into());
    let mut right = agent("right", state.path(), &env);
    right.auth_method = Some("api-key".into());
    let gw = TestGateway::start(&db, vec![unset, wrong, right]).await;

    // Without a method: the 502 names those the agent offers.
    let (status, problem) = gw
        .post("/api/v1/conversations", json!({"agent": "unset"}))
        .await;
    assert_eq!(status, 502, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"api-key\" (API key)")
            && detail.contains("\"browser\" (Browser login)")
            && detail.contains("auth_method"),
        "{detail}"
    );
    assert_problem(
        gw.post("/api/v1/conversations", json!({"agent": "wrong"}))
            .await,
        502,
        "\"password\" is not one it offers",
    );
    assert!(!methods(state.path()).contains(&"authenticate".to_owned()));

    let (id, mut ws) = gw.open_conversation("right").await;
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let sent = calls(state.path());
    let auth = sent.iter().position(|(m, _)| m == "authenticate").unwrap();
    assert_eq!(sent[auth].1["methodId"], "api-key");
    assert_eq!(sent[auth + 1].0, "session/new");
}

async fn an_agent_that_never_answers_a_change_or_dies_on_one(db: TestDb) {
    let mut hanging = demo_profile("hanging", &["--hang-on", "session/set_mode"]);
    hanging.startup_timeout = std::time::Duration::from_secs(3);
    let dying = demo_profile("dying", &["--exit-on", "session/set_config_option"]);
    let gw = TestGateway::start(&db, vec![hanging, dying]).await;

    // No answer: 504 within the profile's startup_timeout; nothing changes
    // and the conversation goes on.
    let (id, mut ws) = gw.open_conversation("hanging").await;
    assert_eq!(
        gw.conversation(&id).await["modes"]["currentModeId"],
        "default"
    );
    let problem = assert_problem(gw.set_mode(&id, "plan").await, 504, "session/set_mode");
    assert_eq!(problem["code"], "agent_timeout");
    assert_eq!(
        gw.conversation(&id).await["modes"]["currentModeId"],
        "default"
    );
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert!(!frames.iter().any(|e| e["type"] == "mode_changed"));

    // The agent dies on it: 502, the conversation is idle with what it had,
    // and the next prompt starts the agent again.
    let (id, mut ws) = gw.open_conversation("dying").await;
    assert_problem(
        gw.set_option(&id, "model", json!("large")).await,
        502,
        "went away",
    );
    ws.until_agent_gone().await;
    let shown = gw.conversation(&id).await;
    assert_eq!(shown["status"], "idle");
    assert_eq!(current_value(&shown, "model"), "small");
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn the_demo_agent_offers_a_mode_and_a_model(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    let shown = gw.conversation(&id).await;
    assert_eq!(shown["modes"]["currentModeId"], "default");
    assert_eq!(current_value(&shown, "model"), "small");
    let (status, changed) = gw.set_mode(&id, "plan").await;
    assert_eq!(status, 200, "{changed}");
    let (status, changed) = gw.set_option(&id, "model", json!("large")).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["modes"]["currentModeId"], "plan");
    assert_eq!(current_value(&changed, "model"), "large");
    let frames = ws.until_type("config_option_changed").await;
    let kinds: Vec<&str> = frames
        .iter()
        .filter_map(|e| match e["type"].as_str() {
            Some("session_update") => e["data"]["update"]["sessionUpdate"].as_str(),
            other => other,
        })
        .collect();
    assert_eq!(
        kinds[kinds.len() - 3..],
        [
            "current_mode_update",
            "mode_changed",
            "config_option_changed"
        ]
    );
    assert_consecutive(&gw.events(&id).await, 0);
}

backend_tests!(
    modes_and_options_show_and_change_through_rest,
    usage_and_the_agents_title_are_kept,
    the_state_survives_a_gateway_restart,
    a_change_starts_an_agent_that_is_gone_and_refuses_without_starting_one,
    the_profile_pins_a_new_sessions_mode_and_options,
    session_resume_is_preferred_where_the_agent_offers_it,
    delete_sends_session_close_where_the_agent_offers_it,
    an_agent_that_needs_authentication_gets_the_profiles_method,
    an_agent_that_never_answers_a_change_or_dies_on_one,
    the_demo_agent_offers_a_mode_and_a_model,
);
