//! Conversations outlive their agent processes: after a crash or a gateway
//! restart, the next prompt starts the agent again and resumes the session
//! (`session/load` where the agent offers it, else a fresh session that
//! says so), on real agent subprocesses.

use crate::common::*;
use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};

/// The pid of the agent process the gateway runs for `conversation`.
pub(crate) async fn agent_pid(db: &TestDb, conversation: &str) -> i32 {
    let records = agent_process_records(db).await;
    let record = records
        .iter()
        .find(|r| r.conversation_id.to_string() == conversation)
        .expect("the conversation's agent is recorded");
    record.pid
}

/// Kills a conversation's agent as an OOM killer would, and waits until the
/// gateway has recorded that it is gone.
pub(crate) async fn kill_agent(db: &TestDb, conversation: &str, ws: &mut Ws) {
    let pid = agent_pid(db, conversation).await;
    let watch = ProcessWatch::new(pid);
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(watch.ended().await);
    ws.until_agent_gone().await;
}

/// The `agent_status` events of a list of events.
fn agent_statuses(events: &[Value]) -> Vec<(String, Option<String>)> {
    events
        .iter()
        .filter(|e| e["type"] == "agent_status")
        .map(|e| {
            (
                e["data"]["status"].as_str().unwrap().to_owned(),
                e["data"]["context"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

async fn a_killed_agent_is_started_again_by_the_next_prompt_with_a_fresh_session(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "hello").await;
    ws.until_type("turn_ended").await;
    let before = gw.conversation(&id).await;
    kill_agent(&db, &id, &mut ws).await;
    // Gone, but not failed: the conversation can go on.
    let gone = gw.conversation(&id).await;
    assert_eq!(gone["status"], "idle", "{gone}");

    gw.prompt(&id, "hello again").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        agent_statuses(&frames),
        [
            ("starting".to_owned(), None),
            ("ready".to_owned(), Some("reset".to_owned()))
        ],
        "the demo agent cannot load sessions: the client learns it forgot"
    );
    let ended = frames.last().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    assert!(streamed_text(&frames, "agent_message_chunk").contains("You said: hello again"));
    let after = gw.conversation(&id).await;
    assert_eq!(after["status"], "idle");
    // A fresh session (the demo agent numbers them per process, so its id
    // may even repeat: the context is what tells the client).
    assert!(after["acp_session_id"].is_string());
    assert!(before["acp_session_id"].is_string());
    assert_consecutive(&gw.events(&id).await, 0);
}

async fn a_restarted_gateway_resumes_with_session_load_and_stores_no_history_twice(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let mut agent = node_sdk_profile("node");
    agent.env.insert(
        "ACP_TEST_AGENT_STATE".into(),
        state.path().to_str().unwrap().into(),
    );
    let gw = TestGateway::start(&db, vec![agent]).await;
    let (id, mut ws) = gw.open_conversation("node").await;
    gw.prompt(&id, "first").await;
    ws.until_type("turn_ended").await;
    let before = gw.conversation(&id).await;

    let gw = gw.restart().await;
    let stopped = gw.conversation(&id).await;
    assert_eq!(stopped["status"], "idle", "{stopped}");
    let mut ws = gw
        .conversation_ws(&id, stopped["last_seq"].as_i64().unwrap())
        .await;
    gw.prompt(&id, "second").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        agent_statuses(&frames),
        [
            ("starting".to_owned(), None),
            ("ready".to_owned(), Some("loaded".to_owned()))
        ]
    );
    // The history the agent replayed while loading is not news: nothing
    // between its restart and the new turn, and the transcript holds each
    // message once.
    let started = frames
        .iter()
        .position(|e| e["type"] == "turn_started")
        .unwrap();
    assert!(
        frames[..started]
            .iter()
            .all(|e| e["type"] == "agent_status"),
        "{frames:#?}"
    );
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: second"
    );
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    let texts: Vec<(String, String)> = messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"][0]["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pair = |r: &str, t: &str| (r.to_owned(), t.to_owned());
    assert_eq!(
        texts,
        [
            pair("user", "first"),
            pair("agent", "You said: first"),
            pair("user", "second"),
            pair("agent", "You said: second"),
        ]
    );
    let after = gw.conversation(&id).await;
    assert_eq!(after["acp_session_id"], before["acp_session_id"]);
    assert_consecutive(&gw.events(&id).await, 0);
}

async fn concurrent_prompts_start_one_agent(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    kill_agent(&db, &id, &mut ws).await;
    let path = format!("/api/v1/conversations/{id}/prompts");
    let (a, b) = tokio::join!(
        gw.post(&path, json!({"text": "slow 5", "queue": false})),
        gw.post(&path, json!({"text": "slow 5", "queue": false}))
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [202, 409], "{a:?} {b:?}");
    let conflict = if a.0 == 409 { a.1 } else { b.1 };
    assert_eq!(conflict["code"], "turn_in_progress");
    let frames = ws.until_type("turn_ended").await;
    let ready = agent_statuses(&frames)
        .iter()
        .filter(|(s, _)| s == "ready")
        .count();
    assert_eq!(ready, 1, "one start: {frames:#?}");
    let running: Vec<_> = agent_process_records(&db)
        .await
        .into_iter()
        .filter(|r| r.conversation_id.to_string() == id)
        .collect();
    assert_eq!(running.len(), 1);
}

async fn a_failed_restart_says_why_and_a_later_prompt_tries_again(db: TestDb) {
    let (gw, id, _) = demo_conversation(&db).await;
    let mut config = gw.stop().await;
    // The agent's command is gone when the conversation resumes.
    let good: AgentProfile = config.agents[0].clone();
    config.agents[0].command = "/nonexistent/acp-agent".into();
    let gw = TestGateway::start_with(config.clone()).await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let (status, problem) = gw
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "hello"}),
        )
        .await;
    assert_eq!(status, 502, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/acp-agent"),
        "{problem}"
    );
    let frames = ws
        .until(|e| e["type"] == "agent_status" && e["data"]["status"] == "failed")
        .await;
    let failed = frames.last().unwrap();
    assert!(failed["data"]["detail"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/acp-agent"));
    // Still there to try again, with no turn started.
    assert_eq!(gw.conversation(&id).await["status"], "idle");
    assert!(!frames.iter().any(|e| e["type"] == "turn_started"));

    let mut config = gw.stop().await;
    config.agents[0] = good;
    let gw = TestGateway::start_with(config).await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_consecutive(&gw.events(&id).await, 0);
}

async fn a_closed_conversation_is_never_started_again(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    ws.until_agent_gone().await;
    let gw = gw.restart().await;
    let (status, body) = gw
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"text": "hello"}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["code"], "conversation_closed");
    assert!(agent_process_records(&db).await.is_empty());
}

async fn an_idle_agent_is_stopped_and_the_next_prompt_starts_it_again(db: TestDb) {
    let mut agent = demo_profile("demo", &[]);
    agent.idle_timeout = std::time::Duration::from_millis(300);
    let gw = TestGateway::start(&db, vec![agent]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "hello").await;
    ws.until_type("turn_ended").await;
    // No turn, nothing pending: after idle_timeout the agent is stopped.
    let frames = ws.until_agent_gone().await;
    let gone = frames.last().unwrap();
    assert_eq!(gone["data"]["status"], "exited");
    assert_eq!(gone["data"]["detail"], "stopped after 300ms idle");
    assert_eq!(gw.conversation(&id).await["status"], "idle");
    assert!(agent_process_records(&db).await.is_empty());
    gw.prompt(&id, "hello again").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        agent_statuses(&frames),
        [
            ("starting".to_owned(), None),
            ("ready".to_owned(), Some("reset".to_owned()))
        ]
    );
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn a_waiting_permission_keeps_an_agent_from_its_idle_stop(db: TestDb) {
    let mut agent = demo_profile("demo", &[]);
    agent.idle_timeout = std::time::Duration::from_millis(200);
    // The request is answered (by its timeout) long after idle_timeout.
    agent.permission_timeout = Some(std::time::Duration::from_millis(800));
    let gw = TestGateway::start(&db, vec![agent]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "tool").await;
    let frames = ws.until_type("turn_ended").await;
    let resolved = frames
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["status"], "timed_out");
    let statuses = agent_statuses(&frames);
    assert!(
        statuses.iter().all(|(s, _)| s != "exited"),
        "stopped while a turn ran: {statuses:?}"
    );
    // Idle only from now on.
    let frames = ws.until_agent_gone().await;
    assert_eq!(
        frames.last().unwrap()["data"]["detail"],
        "stopped after 200ms idle"
    );
}

async fn max_agents_stops_the_longest_idle_agent_or_answers_503(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.max_agents = Some(1);
    let gw = TestGateway::start_with(config).await;
    let (first, mut first_ws) = gw.open_conversation("demo").await;
    // A second conversation takes the idle first one's place.
    let second = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let frames = first_ws.until_agent_gone().await;
    assert_eq!(
        frames.last().unwrap()["data"]["detail"],
        "stopped to make room for another conversation's agent"
    );
    // While the only agent is busy, nobody gets another: 503, Retry-After.
    let mut second_ws = gw.conversation_ws(&second, 0).await;
    gw.prompt(&second, "hang").await;
    second_ws.until_type("turn_started").await;
    let response = reqwest::Client::new()
        .post(gw.url("/api/v1/conversations"))
        .json(&json!({"agent": "demo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "at_capacity");
    let (status, body) = gw
        .post(
            &format!("/api/v1/conversations/{first}/prompts"),
            json!({"text": "hello"}),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    // Once it is idle again, the first conversation gets its agent back.
    gw.post(&format!("/api/v1/conversations/{second}/cancel"), json!({}))
        .await;
    second_ws.until_type("turn_ended").await;
    gw.prompt(&first, "hello").await;
    let frames = first_ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    second_ws.until_agent_gone().await;
    assert_eq!(agent_process_records(&db).await.len(), 1);
}

backend_tests!(
    an_idle_agent_is_stopped_and_the_next_prompt_starts_it_again,
    a_waiting_permission_keeps_an_agent_from_its_idle_stop,
    max_agents_stops_the_longest_idle_agent_or_answers_503,
    a_killed_agent_is_started_again_by_the_next_prompt_with_a_fresh_session,
    a_restarted_gateway_resumes_with_session_load_and_stores_no_history_twice,
    concurrent_prompts_start_one_agent,
    a_failed_restart_says_why_and_a_later_prompt_tries_again,
    a_closed_conversation_is_never_started_again,
);
