//! Forking a conversation (ACP `session/fork`) and taking over an agent
//! session begun elsewhere (`session/list`, then `session/load` or
//! `session/resume`), against the agent built on the official npm SDK
//! (its `ACP_TEST_AGENT_FORK` and `ACP_TEST_AGENT_LIST` switches) and the
//! demo agent (which offers neither): over REST and WebSocket, across a
//! restart, per user, and with their bad inputs.

use std::path::{Path, PathBuf};

use crate::common::*;
use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};

/// The npm SDK agent keeping its sessions in `state` (`"home"`: each
/// user's home for the profile), with more switched on by `env`, its
/// conversations in `work` (its only allowed root).
fn agent(name: &str, state: &str, work: &Path, env: &[(&str, &str)]) -> AgentProfile {
    let mut agent = node_sdk_profile(name);
    agent
        .env
        .insert("ACP_TEST_AGENT_STATE".into(), state.into());
    agent.env.insert("ACP_TEST_AGENT_PIDS".into(), "1".into());
    for (k, v) in env {
        agent.env.insert((*k).into(), (*v).into());
    }
    agent.cwd = Some(work.to_path_buf());
    agent.allowed_roots = vec![work.to_path_buf()];
    if state != "home" {
        // Its box holds its conversation's directory and its home only.
        agent.read_write_paths.push(PathBuf::from(state));
    }
    agent
}

/// A directory for the agents' conversations, as the gateway resolves it.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

/// The methods the agent received, with their params.
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

/// Every agent that wrote its pid in `state` has ended (the gateway waits
/// for the agents it ends, so none is left even as a zombie).
fn all_ended(state: &Path) {
    let pids = std::fs::read_to_string(state.join("pids")).unwrap_or_default();
    for pid in pids.lines() {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "agent {pid} still runs"
        );
    }
}

async fn messages(client: &Client, id: &str) -> Vec<Value> {
    let (status, body) = client
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().unwrap().clone()
}

/// Each message as (role, its text).
fn said(messages: &[Value]) -> Vec<(String, String)> {
    messages
        .iter()
        .map(|m| {
            let text = m["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<String>();
            (m["role"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

async fn turn(client: &Client, ws: &mut Ws, id: &str, text: &str) -> Vec<Value> {
    client.prompt(id, text).await;
    ws.until_type("turn_ended").await
}

async fn conversation_count(client: &Client) -> usize {
    let (status, body) = client.get("/api/v1/conversations?limit=200").await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().unwrap().len()
}

async fn a_fork_holds_the_history_and_both_go_on_apart(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let (_work, work) = workspace();
    let forking = agent(
        "forking",
        state.path().to_str().unwrap(),
        &work,
        &[("ACP_TEST_AGENT_FORK", "1")],
    );
    let gw = TestGateway::start(&db, vec![forking]).await;
    let (id, mut ws) = gw.open_conversation("forking").await;
    turn(&gw, &mut ws, &id, "first").await;
    turn(&gw, &mut ws, &id, "second").await;
    let source = gw.conversation(&id).await;
    assert_eq!(source["session_capabilities"]["fork"], true, "{source}");
    assert_eq!(source["forked_from"], Value::Null);
    let (_, agents) = gw.get("/api/v1/agents").await;
    assert_eq!(
        agents["items"][0]["session_capabilities"]["fork"], true,
        "{agents}"
    );
    let before = messages(&gw, &id).await;
    let last = before.last().unwrap()["id"].clone();

    let (status, fork) = gw
        .post(
            &format!("/api/v1/conversations/{id}/fork"),
            json!({"at": last}),
        )
        .await;
    assert_eq!(status, 201, "{fork}");
    let fork_id = fork["id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, id);
    assert_eq!(
        fork["forked_from"],
        json!({"conversation_id": id, "message_id": last})
    );
    assert_eq!(fork["status"], "idle");
    assert_eq!(fork["cwd"], source["cwd"]);
    assert_eq!(fork["agent"], "forking");
    assert!(
        fork["title"].as_str().unwrap().ends_with(" (fork)"),
        "{fork}"
    );
    let fork_session = fork["acp_session_id"].as_str().unwrap();
    assert!(fork_session.starts_with("fork_"), "{fork}");
    // The agent was asked to fork the source's session, in its directory.
    let forked = calls(state.path())
        .into_iter()
        .find(|(m, _)| m == "session/fork")
        .unwrap()
        .1;
    assert_eq!(forked["sessionId"], source["acp_session_id"]);
    assert_eq!(forked["cwd"], source["cwd"]);
    // The history so far, under new ids.
    let copied = messages(&gw, &fork_id).await;
    assert_eq!(said(&copied), said(&before));
    assert!(copied.iter().zip(&before).all(|(c, b)| c["id"] != b["id"]));
    // And as events, replayed as an agent replays a session (outside any
    // turn), for clients that build a conversation from them.
    let replayed = gw.events(&fork_id).await;
    assert_eq!(
        streamed_text(&replayed, "user_message_chunk"),
        "firstsecond",
        "{replayed:?}"
    );
    assert_eq!(
        streamed_text(&replayed, "agent_message_chunk"),
        "You said: firstYou said: second"
    );
    assert!(replayed
        .iter()
        .filter(|e| e["type"] == "session_update")
        .all(|e| e["data"]["turn_id"].is_null()));

    // Both go on, each in its own session.
    let mut fork_ws = gw
        .conversation_ws(&fork_id, fork["last_seq"].as_i64().unwrap())
        .await;
    let frames = turn(&gw, &mut fork_ws, &fork_id, "third").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: third"
    );
    let frames = turn(&gw, &mut ws, &id, "elsewhere").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: elsewhere"
    );
    let prompted: Vec<Value> = calls(state.path())
        .into_iter()
        .filter(|(m, _)| m == "session/prompt")
        .map(|(_, p)| p["sessionId"].clone())
        .collect();
    assert_eq!(
        prompted[prompted.len() - 2..],
        [json!(fork_session), source["acp_session_id"].clone()]
    );
    let texts = |m: &[Value]| said(m).into_iter().map(|(_, t)| t).collect::<Vec<_>>();
    let source_now = texts(&messages(&gw, &id).await);
    let fork_now = texts(&messages(&gw, &fork_id).await);
    assert!(
        source_now.contains(&"elsewhere".to_owned()) && !source_now.contains(&"third".to_owned())
    );
    assert!(fork_now.contains(&"third".to_owned()) && !fork_now.contains(&"elsewhere".to_owned()));
    // Without a body: after the newest message.
    let (status, again) = gw
        .call(
            "POST",
            &format!("/api/v1/conversations/{fork_id}/fork"),
            None,
        )
        .await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["forked_from"]["conversation_id"], fork_id.as_str());

    // A restart: the fork resumes like any other conversation.
    let gw = gw.restart().await;
    let stopped = gw.conversation(&fork_id).await;
    let mut fork_ws = gw
        .conversation_ws(&fork_id, stopped["last_seq"].as_i64().unwrap())
        .await;
    let frames = turn(&gw, &mut fork_ws, &fork_id, "after").await;
    let ready = frames
        .iter()
        .find(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .unwrap();
    assert_eq!(ready["data"]["context"], "loaded");
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: after"
    );
    let after = gw.conversation(&fork_id).await;
    assert_eq!(after["acp_session_id"], fork_session);
    assert_eq!(after["forked_from"], fork["forked_from"]);
    // The loaded history was not taken for news.
    assert_eq!(
        texts(&messages(&gw, &fork_id).await).len(),
        fork_now.len() + 2
    );
    gw.stop().await;
    all_ended(state.path());
}

async fn a_fork_is_refused_where_it_cannot_be_made(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let (_work, work) = workspace();
    let forking = agent(
        "forking",
        state.path().to_str().unwrap(),
        &work,
        &[("ACP_TEST_AGENT_FORK", "1")],
    );
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![forking, demo_profile("demo", &[])]).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let (alice, bob) = (gw.with_token(&alice), gw.with_token(&bob));
    let (id, mut ws) = alice.open_conversation("forking").await;
    turn(&alice, &mut ws, &id, "first").await;
    turn(&alice, &mut ws, &id, "second").await;
    let (demo, mut demo_ws) = alice.open_conversation("demo").await;
    turn(&alice, &mut demo_ws, &demo, "hello").await;
    let count = conversation_count(&alice).await;
    let fork = |id: &str| format!("/api/v1/conversations/{id}/fork");

    // An agent that does not offer session/fork.
    let problem = assert_problem(
        alice.post(&fork(&demo), json!({})).await,
        409,
        "session/fork",
    );
    assert_eq!(problem["code"], "not_supported");
    let (_, agents) = alice.get("/api/v1/agents").await;
    let demo_agent = agents["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "demo")
        .unwrap()
        .clone();
    assert_eq!(
        demo_agent["session_capabilities"]["fork"], false,
        "{demo_agent}"
    );
    // `at`: no message of this conversation (unknown, or another's).
    let unknown = uuid::Uuid::now_v7();
    assert_problem(
        alice.post(&fork(&id), json!({"at": unknown})).await,
        422,
        "at",
    );
    let other = messages(&alice, &demo).await[0]["id"].clone();
    assert_problem(
        alice.post(&fork(&id), json!({"at": other})).await,
        422,
        "at",
    );
    // Not the newest: the agent forks its whole session only.
    let first = messages(&alice, &id).await[0]["id"].clone();
    let problem = assert_problem(
        alice.post(&fork(&id), json!({"at": first})).await,
        409,
        "newest",
    );
    assert_eq!(problem["code"], "not_supported");
    // A bad body.
    assert_problem(alice.post(&fork(&id), json!({"at": "x"})).await, 422, "");
    assert_problem(
        alice.post(&fork(&id), json!({"since": first})).await,
        422,
        "",
    );
    let big = json!({"at": "x".repeat(70 * 1024)});
    let problem = assert_problem(alice.post(&fork(&id), big).await, 413, "");
    assert_eq!(problem["code"], "payload_too_large");
    // Someone else's conversation, or none: 404.
    assert_problem(bob.post(&fork(&id), json!({})).await, 404, "");
    assert_problem(
        alice.post(&fork(&unknown.to_string()), json!({})).await,
        404,
        "",
    );
    // Nothing was left behind.
    assert_eq!(conversation_count(&alice).await, count);
    // Bob's own fork of his own conversation works and is his.
    let (bobs, mut bobs_ws) = bob.open_conversation("forking").await;
    turn(&bob, &mut bobs_ws, &bobs, "mine").await;
    let (status, forked) = bob.post(&fork(&bobs), json!({})).await;
    assert_eq!(status, 201, "{forked}");
    let forked_id = forked["id"].as_str().unwrap();
    assert_problem(
        alice
            .get(&format!("/api/v1/conversations/{forked_id}"))
            .await,
        404,
        "",
    );
    gw.stop().await;
    all_ended(state.path());
}

/// A session left in `user`'s home for the profile by a run of the agent
/// outside the gateway (in a terminal), as the agent keeps it.
fn session_begun_elsewhere(
    db: &TestDb,
    user: &str,
    profile: &str,
    id: &str,
    cwd: &Path,
    said: &str,
) {
    let dir = db
        .state_dir()
        .join("homes")
        .join(user)
        .join(profile)
        .join(".node-agent-state");
    std::fs::create_dir_all(&dir).unwrap();
    let history = json!([
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": said}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("You said: {said}")}},
    ]);
    std::fs::write(dir.join(format!("{id}.json")), history.to_string()).unwrap();
    let meta = json!({"sessionId": id, "cwd": cwd, "title": said, "updatedAt": "2026-12-01T10:00:00.000Z"});
    std::fs::write(dir.join(format!("{id}.meta.json")), meta.to_string()).unwrap();
}

async fn a_session_of_an_agent_that_only_resumes_is_taken_over_with_session_resume(db: TestDb) {
    let (_work, work) = workspace();
    let resuming = agent(
        "resuming",
        "home",
        &work,
        &[
            ("ACP_TEST_AGENT_LIST", "1"),
            ("ACP_TEST_AGENT_RESUME", "1"),
            ("ACP_TEST_AGENT_NO_LOAD", "1"),
        ],
    );
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![resuming]).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let alice = gw.with_token(&alice);
    session_begun_elsewhere(
        &db,
        "alice",
        "resuming",
        "desk-r",
        &work,
        "begun at the desk",
    );
    let adopt = json!({"agent": "resuming", "cwd": work, "adopt": "desk-r"});
    let (status, adopted) = alice.post("/api/v1/conversations", adopt).await;
    assert_eq!(status, 201, "{adopted}");
    let id = adopted["id"].as_str().unwrap().to_owned();
    assert_eq!(adopted["adopted_session"], "desk-r");
    let home = db
        .state_dir()
        .join("homes/alice/resuming/.node-agent-state");
    let methods: Vec<String> = calls(&home).into_iter().map(|(m, _)| m).collect();
    assert!(methods.iter().any(|m| m == "session/resume"), "{methods:?}");
    assert!(!methods.iter().any(|m| m == "session/load"), "{methods:?}");
    // No history is replayed by a resume; the session goes on.
    let mut ws = alice.conversation_ws(&id, 0).await;
    let frames = turn(&alice, &mut ws, &id, "from the phone").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: from the phone"
    );
}

async fn an_agents_own_sessions_are_listed_per_user_and_one_is_taken_over(db: TestDb) {
    let (_work, work) = workspace();
    let listing = agent(
        "listing",
        "home",
        &work,
        &[
            ("ACP_TEST_AGENT_LIST", "1"),
            ("ACP_TEST_AGENT_LIST_PAGE", "1"),
        ],
    );
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![listing, demo_profile("demo", &[])]).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let (alice, bob) = (gw.with_token(&alice), gw.with_token(&bob));
    let sessions = "/api/v1/agents/listing/sessions";

    // Nothing yet (the agent starts in the user's home, made now).
    let (status, page) = alice.get(sessions).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page, json!({"items": [], "next_cursor": null}));
    let home = db.state_dir().join("homes/alice/listing/.node-agent-state");
    assert!(home.is_dir(), "the agent ran in alice's home");
    all_ended(&home);

    // Two sessions begun at the desk, in alice's home.
    session_begun_elsewhere(
        &db,
        "alice",
        "listing",
        "desk-1",
        &work,
        "hello from the desk",
    );
    session_begun_elsewhere(&db, "alice", "listing", "desk-2", &work, "another one");
    let (status, first) = alice
        .get(&format!("{sessions}?cwd={}", work.display()))
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["items"].as_array().unwrap().len(), 1, "{first}");
    let cursor = first["next_cursor"].as_str().unwrap();
    let (status, second) = alice
        .get(&format!(
            "{sessions}?cwd={}&cursor={cursor}",
            work.display()
        ))
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["next_cursor"], Value::Null);
    let mut listed: Vec<Value> = [&first, &second]
        .iter()
        .flat_map(|p| p["items"].as_array().unwrap().clone())
        .collect();
    listed.sort_by_key(|s| s["session_id"].as_str().unwrap().to_owned());
    assert_eq!(
        listed[0],
        json!({"session_id": "desk-1", "cwd": work, "title": "hello from the desk",
               "updated_at": "2026-12-01T10:00:00.000Z", "held_by": null})
    );
    assert_eq!(listed[1]["session_id"], "desk-2");
    // The agent was asked for this directory's sessions, from the cursor.
    let list_calls: Vec<Value> = calls(&home)
        .into_iter()
        .filter(|(m, _)| m == "session/list")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        list_calls[list_calls.len() - 1],
        json!({"cwd": work, "cursor": cursor})
    );

    // Bob's home holds none of them: he sees none, and cannot take one.
    let (status, bobs) = bob.get(sessions).await;
    assert_eq!(status, 200, "{bobs}");
    assert_eq!(bobs["items"], json!([]));
    let adopt = |id: &str| json!({"agent": "listing", "cwd": work, "adopt": id});
    let problem = assert_problem(
        bob.post("/api/v1/conversations", adopt("desk-1")).await,
        404,
        "desk-1",
    );
    assert_eq!(problem["code"], "not_found");
    assert_eq!(
        conversation_count(&bob).await,
        0,
        "no failed conversation is left"
    );

    // Alice takes desk-1 over: its history is the conversation's.
    let (status, adopted) = alice.post("/api/v1/conversations", adopt("desk-1")).await;
    assert_eq!(status, 201, "{adopted}");
    let id = adopted["id"].as_str().unwrap().to_owned();
    assert_eq!(adopted["adopted_session"], "desk-1");
    assert_eq!(adopted["acp_session_id"], "desk-1");
    assert_eq!(adopted["title"], "hello from the desk");
    let mut ws = alice.conversation_ws(&id, 0).await;
    let frames = ws
        .until(|e| e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: hello from the desk"
    );
    assert_eq!(
        said(&messages(&alice, &id).await),
        [
            ("user".to_owned(), "hello from the desk".to_owned()),
            (
                "agent".to_owned(),
                "You said: hello from the desk".to_owned()
            )
        ]
    );
    let loaded = calls(&home)
        .into_iter()
        .find(|(m, _)| m == "session/load")
        .unwrap()
        .1;
    assert_eq!(loaded["sessionId"], "desk-1");
    // It goes on from there.
    let frames = turn(&alice, &mut ws, &id, "from the phone").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: from the phone"
    );

    // Listed as held; a second adoption is refused.
    let (_, page) = alice
        .get(&format!("{sessions}?cwd={}", work.display()))
        .await;
    let (_, rest) = alice
        .get(&format!(
            "{sessions}?cwd={}&cursor={}",
            work.display(),
            page["next_cursor"].as_str().unwrap()
        ))
        .await;
    let desk1 = [&page, &rest]
        .iter()
        .flat_map(|p| p["items"].as_array().unwrap().clone())
        .find(|s| s["session_id"] == "desk-1")
        .unwrap();
    assert_eq!(desk1["held_by"], id.as_str());
    let problem = assert_problem(
        alice.post("/api/v1/conversations", adopt("desk-1")).await,
        409,
        "desk-1",
    );
    assert_eq!(problem["code"], "already_held");

    // An unknown session, a directory outside what alice may use, an agent
    // that lists nothing: nothing is left behind.
    let count = conversation_count(&alice).await;
    assert_problem(
        alice.post("/api/v1/conversations", adopt("no-such")).await,
        404,
        "no-such",
    );
    assert_problem(
        alice
            .post(
                "/api/v1/conversations",
                json!({"agent": "listing", "cwd": "/", "adopt": "desk-2"}),
            )
            .await,
        403,
        "",
    );
    assert_problem(alice.get(&format!("{sessions}?cwd=/")).await, 403, "");
    assert_problem(
        alice.get(&format!("{sessions}?cwd=relative")).await,
        422,
        "cwd",
    );
    assert_problem(
        alice.get("/api/v1/agents/nobody/sessions").await,
        404,
        "nobody",
    );
    let problem = assert_problem(
        alice.get("/api/v1/agents/demo/sessions").await,
        409,
        "session/list",
    );
    assert_eq!(problem["code"], "not_supported");
    assert_problem(
        alice
            .post(
                "/api/v1/conversations",
                json!({"agent": "listing", "adopt": ""}),
            )
            .await,
        422,
        "adopt",
    );
    assert_eq!(conversation_count(&alice).await, count);
    let (_, agents) = alice.get("/api/v1/agents").await;
    let listing = agents["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "listing")
        .unwrap()
        .clone();
    assert_eq!(listing["session_capabilities"]["list"], true, "{listing}");
    assert_eq!(listing["session_capabilities"]["load"], true, "{listing}");

    // After a restart it resumes like any other; its history is not doubled.
    let gw = gw.restart().await;
    let alice = gw.with_token(&alice.token.clone().unwrap());
    let stopped = alice.conversation(&id).await;
    let mut ws = alice
        .conversation_ws(&id, stopped["last_seq"].as_i64().unwrap())
        .await;
    let frames = turn(&alice, &mut ws, &id, "later").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: later"
    );
    assert_eq!(messages(&alice, &id).await.len(), 6);
    // Closed, it holds the session no more: it may be taken over again.
    let (status, _) = alice.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    ws.until_agent_gone().await;
    let (status, again) = alice.post("/api/v1/conversations", adopt("desk-1")).await;
    assert_eq!(status, 201, "{again}");
    gw.stop().await;
    all_ended(&home);
    all_ended(&db.state_dir().join("homes/bob/listing/.node-agent-state"));
}

/// Two adoptions of one session racing (as two nodes would): the database
/// lets exactly one in; a closed conversation holds it no more; another
/// user's session of the same id is another session.
async fn the_database_lets_one_conversation_hold_an_adopted_session(db: TestDb) {
    use acp_gateway::model::ConversationStatus;
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let adopting = |owner: &str| {
        let mut c = idle_conversation(Some(owner));
        c.agent = "listing".into();
        c.adopted_session = Some("desk-1".into());
        c
    };
    let (first, second) = (adopting("alice"), adopting("alice"));
    let (a, b) = tokio::join!(
        store.insert_conversation(&first),
        store.insert_conversation(&second)
    );
    let refused = match (a, b) {
        (Ok(()), Err(e)) | (Err(e), Ok(())) => e,
        other => panic!("exactly one insert wins: {other:?}"),
    };
    let problem = refused.problem();
    assert_eq!(
        (problem.status, problem.code.as_str()),
        (409, "already_held")
    );
    // Bob's session of that id is his own.
    store.insert_conversation(&adopting("bob")).await.unwrap();
    // Held: listed so.
    let winner = store
        .session_holders(
            "listing",
            Some("alice"),
            &["desk-1".into(), "desk-2".into()],
        )
        .await
        .unwrap();
    assert_eq!(winner.len(), 1);
    assert!([first.id, second.id].contains(&winner[0].1));
    // A closed conversation holds it no more.
    let mut closed = adopting("carol");
    closed.status = ConversationStatus::Closed;
    store.insert_conversation(&closed).await.unwrap();
    store.insert_conversation(&adopting("carol")).await.unwrap();
    assert!(store
        .session_holders("listing", Some("dave"), &["desk-1".into()])
        .await
        .unwrap()
        .is_empty());
}

/// Where users share the agent's home (`sandbox = "off"`: no home per
/// user), a session another user's conversation began is still theirs:
/// neither listed nor taken over, even once closed.
async fn another_users_session_is_neither_listed_nor_taken_where_homes_are_shared(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let (_work, work) = workspace();
    let mut shared = agent(
        "shared",
        state.path().to_str().unwrap(),
        &work,
        &[("ACP_TEST_AGENT_LIST", "1")],
    );
    shared.sandbox = acp_gateway::sandbox::SandboxMode::Off;
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![shared]).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let (alice, bob) = (gw.with_token(&alice), gw.with_token(&bob));
    let (bobs, mut ws) = bob.open_conversation("shared").await;
    turn(&bob, &mut ws, &bobs, "bob's own").await;
    let session = bob.conversation(&bobs).await["acp_session_id"].clone();
    let sessions = "/api/v1/agents/shared/sessions";
    let (status, his) = bob.get(sessions).await;
    assert_eq!(status, 200, "{his}");
    assert_eq!(his["items"][0]["session_id"], session);
    assert_eq!(his["items"][0]["held_by"], bobs.as_str());
    let (status, hers) = alice.get(sessions).await;
    assert_eq!(status, 200, "{hers}");
    assert_eq!(hers["items"], json!([]));
    let adopt = json!({"agent": "shared", "cwd": work, "adopt": session});
    assert_problem(
        alice.post("/api/v1/conversations", adopt.clone()).await,
        404,
        "",
    );
    let (status, _) = bob.delete(&format!("/api/v1/conversations/{bobs}")).await;
    assert_eq!(status, 204);
    ws.until_agent_gone().await;
    assert_problem(
        alice.post("/api/v1/conversations", adopt.clone()).await,
        404,
        "",
    );
    assert_eq!(conversation_count(&alice).await, 0);
    // Bob himself may take it over again.
    let (status, again) = bob.post("/api/v1/conversations", adopt).await;
    assert_eq!(status, 201, "{again}");
    gw.stop().await;
    all_ended(state.path());
}

/// A source whose agent never said what it offers (a conversation of an
/// earlier version): the fork's agent is started and asked; one that
/// cannot fork is 409, one that does not know the session 502, and either
/// way no conversation is left behind.
async fn a_fork_the_agent_turns_down_once_started_leaves_nothing(db: TestDb) {
    let state = tempfile::tempdir().unwrap();
    let (_work, work) = workspace();
    let path = state.path().to_str().unwrap();
    let plain = agent("plain", path, &work, &[]);
    let forking = agent("forking", path, &work, &[("ACP_TEST_AGENT_FORK", "1")]);
    let gw = TestGateway::start(&db, vec![plain, forking]).await;
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    for (agent, code, status) in [
        ("plain", "not_supported", 409),
        ("forking", "agent_failed", 502),
    ] {
        let mut source = idle_conversation(Some("anonymous"));
        source.agent = agent.into();
        source.cwd = work.to_string_lossy().into_owned();
        source.acp_session_id = Some("sess_gone".into());
        store.insert_conversation(&source).await.unwrap();
        let count = conversation_count(&gw).await;
        let (got, problem) = gw
            .post(
                &format!("/api/v1/conversations/{}/fork", source.id),
                json!({}),
            )
            .await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{problem}"
        );
        assert_eq!(
            conversation_count(&gw).await,
            count,
            "{agent}: nothing left behind"
        );
    }
    let asked: Vec<String> = calls(state.path())
        .into_iter()
        .filter(|(m, _)| m == "session/fork")
        .map(|(_, p)| p["sessionId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        asked,
        ["sess_gone"],
        "only the agent that forks is asked to"
    );
    gw.stop().await;
    all_ended(state.path());
}

backend_tests!(
    a_fork_the_agent_turns_down_once_started_leaves_nothing,
    the_database_lets_one_conversation_hold_an_adopted_session,
    another_users_session_is_neither_listed_nor_taken_where_homes_are_shared,
    a_fork_holds_the_history_and_both_go_on_apart,
    a_fork_is_refused_where_it_cannot_be_made,
    an_agents_own_sessions_are_listed_per_user_and_one_is_taken_over,
    a_session_of_an_agent_that_only_resumes_is_taken_over_with_session_resume,
);

/// Two nodes on one Postgres: a conversation whose agent runs on one is
/// forked through the other, which runs the fork's agent.
#[tokio::test]
async fn a_conversation_on_one_node_is_forked_through_another() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let (_work, work) = workspace();
    let forking = agent(
        "forking",
        state.path().to_str().unwrap(),
        &work,
        &[("ACP_TEST_AGENT_FORK", "1")],
    );
    let start = || {
        GatewayProcess::start_configured(
            &db,
            std::slice::from_ref(&forking),
            "info",
            "node_lease = \"1s\"\non_shutdown = \"cancel\"",
        )
    };
    let (a, b) = (start(), start());
    let (id, mut ws) = a.open_conversation("forking").await;
    turn(&a, &mut ws, &id, "on a").await;
    let (status, fork) = b
        .post(&format!("/api/v1/conversations/{id}/fork"), json!({}))
        .await;
    assert_eq!(status, 201, "{fork}");
    let fork_id = fork["id"].as_str().unwrap().to_owned();
    assert_eq!(
        said(&messages(&b, &fork_id).await),
        said(&messages(&a, &id).await)
    );
    // B runs it: a prompt through A reaches B's agent.
    let (_, b_ready) = b.get("/readyz").await;
    let owner: Option<uuid::Uuid> = {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar("select node_id from conversations where id = $1::uuid")
            .bind(&fork_id)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(
        owner.map(|o| o.to_string()),
        b_ready["node_id"].as_str().map(str::to_owned)
    );
    let mut fork_ws = a
        .conversation_ws(&fork_id, fork["last_seq"].as_i64().unwrap())
        .await;
    let frames = turn(&a, &mut fork_ws, &fork_id, "on b").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: on b"
    );
    a.stop();
    b.stop();
    all_ended(state.path());
}

/// Two nodes on one Postgres take one session over at once: one gets it,
/// the other 409 `already_held`, and only one conversation is left.
#[tokio::test]
async fn two_nodes_adopting_one_session_at_once_make_one_conversation() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (_work, work) = workspace();
    let listing = agent("listing", "home", &work, &[("ACP_TEST_AGENT_LIST", "1")]);
    let start = || {
        GatewayProcess::start_configured(
            &db,
            std::slice::from_ref(&listing),
            "info",
            "node_lease = \"1s\"\non_shutdown = \"cancel\"",
        )
    };
    let (a, b) = (start(), start());
    // The agent's home is made by a first listing.
    let (status, page) = a.get("/api/v1/agents/listing/sessions").await;
    assert_eq!(status, 200, "{page}");
    session_begun_elsewhere(&db, "anonymous", "listing", "desk-1", &work, "at the desk");
    let adopt = json!({"agent": "listing", "cwd": work, "adopt": "desk-1"});
    let ((sa, ba), (sb, bb)) = tokio::join!(
        a.post("/api/v1/conversations", adopt.clone()),
        b.post("/api/v1/conversations", adopt.clone())
    );
    let mut statuses = [sa, sb];
    statuses.sort();
    assert_eq!(statuses, [201, 409], "{ba} {bb}");
    let refused = if sa == 409 { &ba } else { &bb };
    assert_eq!(refused["code"], "already_held", "{refused}");
    let (_, list) = b.get("/api/v1/conversations").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    a.stop();
    b.stop();
    all_ended(
        &db.state_dir()
            .join("homes/anonymous/listing/.node-agent-state"),
    );
}
