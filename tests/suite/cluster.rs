//! Several gateway nodes on one Postgres: two `acp-gateway serve` processes
//! on two ports, one database, a short `node_lease`. A conversation's agent
//! runs on one node; its events, approvals and commands work from the other,
//! and the other takes it over when its node dies. SQLite refuses a second
//! node.

use crate::common::*;
use serde_json::{json, Value};

/// Two nodes on `db`, each with `agents`.
pub(crate) fn two_nodes(
    db: &TestDb,
    agents: &[acp_gateway::config::AgentProfile],
) -> (GatewayProcess, GatewayProcess) {
    let start = || GatewayProcess::start_configured(db, agents, "info", "node_lease = \"1s\"");
    (start(), start())
}

async fn events(node: &GatewayProcess, id: &str) -> Vec<Value> {
    let (status, body) = node
        .call(
            "GET",
            &format!("/api/v1/conversations/{id}/events?limit=1000"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().unwrap().clone()
}

async fn node_id(node: &GatewayProcess) -> String {
    let (status, body) = node.call("GET", "/readyz", None).await;
    assert_eq!(status, 200, "{body}");
    body["node_id"].as_str().unwrap().to_owned()
}

/// The node that owns the conversation, as the database says.
async fn owner(db: &TestDb, id: &str) -> Option<String> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let owner: Option<uuid::Uuid> =
        sqlx::query_scalar("select node_id from conversations where id = $1::uuid")
            .bind(id)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    owner.map(|o| o.to_string())
}

/// What a node's `/metrics` says.
async fn metrics(node: &GatewayProcess) -> String {
    reqwest::get(format!("{}/metrics", node.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// `acp_gateway_agents_running` on a node.
async fn agents_running(node: &GatewayProcess) -> i64 {
    let text = metrics(node).await;
    let line = text
        .lines()
        .find(|l| l.starts_with("acp_gateway_agents_running "))
        .expect("agents_running in /metrics");
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Answers a permission request on `node` with an option.
async fn respond(node: &GatewayProcess, request: &Value, option: &str) -> (u16, Value) {
    let id = request["id"].as_str().unwrap();
    node.call(
        "POST",
        &format!("/api/v1/permissions/{id}/respond"),
        Some(json!({"option_id": option})),
    )
    .await
}

/// Waits on a WebSocket for the next `permission_requested` event.
async fn requested(ws: &mut Ws) -> Value {
    ws.until_type("permission_requested").await.last().unwrap()["data"].clone()
}

fn option_of(request: &Value, kind: &str) -> String {
    request["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} option in {request}"))["optionId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Prompts `text` on `node` for a conversation another node ran, watching
/// from the last event on: the events up to the prompt's `end_turn`.
async fn take_over_with_a_prompt(node: &GatewayProcess, id: &str, text: &str) -> Vec<Value> {
    let last = events(node, id).await.last().unwrap()["seq"]
        .as_i64()
        .unwrap();
    let mut ws = node.conversation_ws(id, last).await;
    let (status, body) = node.try_prompt(id, text).await;
    assert_eq!(status, 202, "{body}");
    ws.until(|e| e["type"] == "turn_ended" && e["data"]["stop_reason"] == "end_turn")
        .await
}

/// The pid of the conversation's agent, from its process record.
async fn agent_pid(db: &TestDb, id: &str) -> i32 {
    agent_process_records(db)
        .await
        .into_iter()
        .find(|r| r.conversation_id.to_string() == id)
        .unwrap()
        .pid
}

#[tokio::test]
async fn a_websocket_on_another_node_gets_every_event_in_order() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    let (id_a, id_b) = (node_id(&a).await, node_id(&b).await);
    assert_ne!(id_a, id_b, "each process is a node of its own");
    let metrics = metrics(&b).await;
    assert!(
        metrics.contains(&format!("acp_gateway_node_info{{node_id=\"{id_b}\"}} 1")),
        "{metrics}"
    );
    assert!(a.log_text().contains(&id_a), "the node id is in the log");

    let id = a.create("demo").await;
    assert_eq!(owner(&db, &id).await.as_deref(), Some(id_a.as_str()));
    let mut on_b = b.conversation_ws(&id, 0).await;
    let mut inbox_b = b.ws("/api/v1/ws").await;
    assert_eq!(inbox_b.next().await["type"], "snapshot");
    for round in 0..3 {
        let (status, body) = a.try_prompt(&id, "long 3000").await;
        assert_eq!(status, 202, "round {round}: {body}");
        on_b.until_type("turn_ended").await;
    }
    let stored = events(&a, &id).await;
    // What B's socket showed is exactly what is stored, and what either
    // node's `GET /events` says.
    let mut shown = b.conversation_ws(&id, 0).await;
    let replayed = shown
        .until(|e| e["seq"] == stored.last().unwrap()["seq"])
        .await;
    assert_eq!(replayed, stored);
    assert_eq!(events(&b, &id).await, stored);
    assert_consecutive(&stored, 0);
    // The live socket (opened before anything happened) got the same, in order.
    let mut live = Vec::new();
    let mut again = b.conversation_ws(&id, 0).await;
    while live.len() < stored.len() {
        live.push(again.next().await);
    }
    assert_eq!(live, stored);
    // And the inbox on B saw the three turns end.
    let mut ended = 0;
    while ended < 3 {
        let e = inbox_b.next().await;
        assert_eq!(e["conversation_id"], id.as_str());
        if e["type"] == "turn_ended" {
            ended += 1;
        }
    }
    assert_eq!(agents_running(&a).await, 1);
    assert_eq!(agents_running(&b).await, 0);
}

/// Waits (bounded) until no node holds the conversation, as its node does
/// once its agent is gone (checked in the database every 20 ms).
pub(crate) async fn until_released(db: &TestDb, id: &str) {
    eventually(WAIT, async || owner(db, id).await.is_none().then_some(()))
        .await
        .expect("the conversation is let go");
}

/// A conversation that moves between nodes (its agent stopped when idle,
/// its next prompt sent to the other node) shows each of its events once
/// on a node's inbox: what the node published itself while it owned the
/// conversation is not relayed to it again once the other node owns it.
#[tokio::test]
async fn a_conversation_moving_between_nodes_shows_each_event_once_on_an_inbox() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let mut agent = demo_profile("demo", &[]);
    agent.idle_timeout = std::time::Duration::from_millis(300);
    let (a, b) = two_nodes(&db, &[agent]);
    let mut inbox_a = a.ws("/api/v1/ws").await;
    assert_eq!(inbox_a.next().await["type"], "snapshot");
    let id = a.create("demo").await;
    let mut seen = Vec::new();
    for (round, node) in [&a, &b, &a, &b].into_iter().enumerate() {
        let (status, body) = node.try_prompt(&id, &format!("round {round}")).await;
        assert_eq!(status, 202, "round {round}: {body}");
        // Taken by the node prompted.
        assert_eq!(
            owner(&db, &id).await,
            Some(node_id(node).await),
            "round {round}"
        );
        // The turn ends, then the agent is stopped when idle (the
        // conversation is let go, for the next node to take).
        let frames = inbox_a
            .until(|e| {
                e["conversation_id"] == id.as_str()
                    && e["type"] == "agent_status"
                    && e["data"]["status"] == "exited"
            })
            .await;
        seen.extend(
            frames
                .into_iter()
                .filter(|e| e["conversation_id"] == id.as_str()),
        );
        until_released(&db, &id).await;
    }
    let seqs: Vec<i64> = seen.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    let stored = events(&a, &id).await;
    let stored_seqs: Vec<i64> = stored.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, stored_seqs, "each event once, in order");
}

#[tokio::test]
async fn live_events_relayed_to_another_node_arrive_gapless_and_ordered() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    let id = a.create("demo").await;
    let mut on_b = b.conversation_ws(&id, 0).await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "long 20000").await;
    let from_b = on_b.until_type("turn_ended").await;
    let from_a = on_a.until_type("turn_ended").await;
    assert_eq!(
        from_b, from_a,
        "the same events, in the same order, on both nodes"
    );
    assert_consecutive(&from_b, 0);
    let text = streamed_text(&from_b, "agent_message_chunk");
    assert!(text.len() > 20000, "{}", text.len());
}

#[tokio::test]
async fn a_permission_answered_on_another_node_reaches_the_agent() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    let id = a.create("demo").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    let mut inbox_b = b.ws("/api/v1/ws").await;
    assert_eq!(inbox_b.next().await["type"], "snapshot");
    a.prompt(&id, "tool").await;
    // B's inbox shows the request of a conversation A runs.
    let request = requested(&mut inbox_b).await;
    let allow = option_of(&request, "allow_once");
    let (status, answered) = respond(&b, &request, &allow).await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "approved", "{answered}");
    assert_eq!(answered["decision"]["option_id"], allow.as_str());
    let frames = on_a.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let resolved: Vec<&Value> = frames
        .iter()
        .filter(|e| e["type"] == "permission_resolved")
        .collect();
    assert_eq!(resolved.len(), 1, "{frames:#?}");
    assert_eq!(resolved[0]["data"]["decision"]["option_id"], allow.as_str());
    // Answering again on B with the same answer is idempotent, as on A.
    let (status, again) = respond(&b, &request, &allow).await;
    assert_eq!(status, 200, "{again}");
}

#[tokio::test]
async fn prompts_queued_edited_and_steered_on_another_node_reach_the_queue_of_the_node_that_runs_it(
) {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    let id = a.create("demo").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "tool").await;
    let request = requested(&mut on_a).await;
    let prompts = format!("/api/v1/conversations/{id}/prompts");
    let (status, queued) = b
        .call("POST", &prompts, Some(json!({"text": "hello via b"})))
        .await;
    assert_eq!(status, 202, "{queued}");
    assert_eq!(
        (queued["queued"].clone(), queued["position"].clone()),
        (json!(true), json!(0))
    );
    let one = format!(
        "/api/v1/conversations/{id}/queue/{}",
        queued["id"].as_str().unwrap()
    );
    let (status, list) = b
        .call("PATCH", &one, Some(json!({"text": "hello edited on b"})))
        .await;
    assert_eq!(status, 200, "{list}");
    let (status, list) = b
        .call("GET", &format!("/api/v1/conversations/{id}/queue"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(list["items"][0]["content"][0]["text"], "hello edited on b");
    // A reason given on B, steering: the turn on A is cancelled and the
    // reason goes first, then the queue.
    let reject = option_of(&request, "reject_once");
    let (status, answered) = b
        .call(
            "POST",
            &format!(
                "/api/v1/permissions/{}/respond",
                request["id"].as_str().unwrap()
            ),
            Some(json!({"option_id": reject, "reason": "not that file", "steer": true})),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["decision"]["reason"], "not that file");
    let started = |text: &'static str| {
        move |e: &Value| {
            e["type"] == "turn_started"
                && e["data"]["content"][0]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(text))
        }
    };
    on_a.until(started("Their reason: not that file")).await;
    let frames = on_a.until(started("hello edited on b")).await;
    let first = frames.iter().find(|e| e["type"] == "turn_started").unwrap();
    assert_eq!(first["data"]["turn_id"], queued["id"]);
    on_a.until_type("turn_ended").await;
    assert_eq!(agents_running(&b).await, 0);
}

#[tokio::test]
async fn a_worktrees_changes_are_read_committed_and_landed_through_another_node() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let repo = super::worktrees::Repo::new();
    let (a, b) = two_nodes(&db, &[super::worktrees::demo_on(&repo.root)]);
    let (id, mut on_a, _) = super::worktrees::on_repo(&a, &repo, json!({})).await;
    super::worktrees::turn_changes(&a, &mut on_a, &id, "save notes.txt from a").await;
    let changes = format!("/api/v1/conversations/{id}/changes");
    let (status, listed) = b.call("GET", &changes, None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["files"][0]["path"], "notes.txt");
    // While a turn runs on A, B's commit is refused there.
    a.prompt(&id, "hang").await;
    on_a.until_type("turn_started").await;
    let commit = format!("{changes}/commit");
    let (status, problem) = b
        .call("POST", &commit, Some(json!({"message": "via b"})))
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("turn_in_progress")),
        "{problem}"
    );
    a.cancel_turn(&mut on_a, &id).await;
    let (status, committed) = b
        .call("POST", &commit, Some(json!({"message": "via b"})))
        .await;
    assert_eq!(status, 200, "{committed}");
    let (status, landed) = b
        .call(
            "POST",
            &format!("{changes}/land"),
            Some(json!({"strategy": "merge"})),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert!(repo.path.join("notes.txt").exists());
    // The node that runs the agent did them: its agent is the only one.
    on_a.until_type("changes_landed").await;
    assert_eq!(agents_running(&b).await, 0);
}

#[tokio::test]
async fn a_question_asked_on_one_node_is_in_the_others_inbox_and_answered_there() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[node_sdk_profile("node")]);
    let id = a.create("node").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    let mut inbox_b = b.ws("/api/v1/ws").await;
    assert_eq!(inbox_b.next().await["type"], "snapshot");
    let form = json!({"mode": "form", "message": "How many?",
        "requestedSchema": {"properties": {"n": {"type": "integer", "maximum": 3}}, "required": ["n"]}});
    a.prompt(&id, &format!("question {form}")).await;
    let frames = inbox_b.until_type("question_asked").await;
    let question = frames.last().unwrap()["data"].clone();
    let respond = format!(
        "/api/v1/questions/{}/respond",
        question["id"].as_str().unwrap()
    );
    // Checked on B as on A.
    let (status, problem) = b
        .call(
            "POST",
            &respond,
            Some(json!({"action": "accept", "content": {"n": 7}})),
        )
        .await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("content.n"));
    let (status, answered) = b
        .call(
            "POST",
            &respond,
            Some(json!({"action": "accept", "content": {"n": 2}})),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "accepted");
    let frames = on_a.until_type("turn_ended").await;
    let said = streamed_text(&frames, "agent_message_chunk");
    assert_eq!(
        serde_json::from_str::<Value>(&said).unwrap(),
        json!({"action": "accept", "content": {"n": 2}})
    );
    assert_eq!(agents_running(&b).await, 0);
}

#[tokio::test]
async fn answers_racing_on_two_nodes_have_exactly_one_winner() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    for round in 0..3 {
        let id = a.create("demo").await;
        let mut on_a = a.conversation_ws(&id, 0).await;
        a.prompt(&id, "tool").await;
        let request = requested(&mut on_a).await;
        let (allow, reject) = (
            option_of(&request, "allow_once"),
            option_of(&request, "reject_once"),
        );
        let (on_a_answer, on_b_answer) = tokio::join!(
            respond(&a, &request, &allow),
            respond(&b, &request, &reject),
        );
        let mut statuses = [on_a_answer.0, on_b_answer.0];
        statuses.sort();
        assert_eq!(
            statuses,
            [200, 409],
            "round {round}: {on_a_answer:?} {on_b_answer:?}"
        );
        let (winner, loser) = if on_a_answer.0 == 200 {
            (on_a_answer.1, on_b_answer.1)
        } else {
            (on_b_answer.1, on_a_answer.1)
        };
        assert_eq!(loser["code"], "already_resolved", "{loser}");
        // The loser is told what won.
        assert_eq!(loser["request"]["decision"], winner["decision"], "{loser}");
        let frames = on_a.until_type("turn_ended").await;
        let resolved = frames
            .iter()
            .filter(|e| e["type"] == "permission_resolved")
            .count();
        assert_eq!(resolved, 1, "{frames:#?}");
    }
}

#[tokio::test]
async fn a_prompt_a_cancel_and_a_delete_sent_to_another_node_reach_the_agent() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[node_sdk_profile("node")]);
    let id = a.create("node").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    // Same answer as on the owner: 202 and the turn's id.
    let (status, body) = b.try_prompt(&id, "hang").await;
    assert_eq!(status, 202, "{body}");
    let turn = body["turn_id"].as_str().unwrap().to_owned();
    let started = on_a
        .until(|e| e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .await;
    let turn_started = started
        .iter()
        .find(|e| e["type"] == "turn_started")
        .unwrap();
    assert_eq!(turn_started["data"]["turn_id"], turn.as_str());
    // The agent runs on A, not on B.
    assert_eq!(agents_running(&a).await, 1);
    assert_eq!(agents_running(&b).await, 0);
    // A second prompt through B meets the running turn, as on A.
    let (status, busy) = b
        .call(
            "POST",
            &format!("/api/v1/conversations/{id}/prompts"),
            Some(json!({"text": "hello", "queue": false})),
        )
        .await;
    assert_eq!(status, 409, "{busy}");
    assert_eq!(busy["code"], "turn_in_progress");

    let (status, body) = b
        .call(
            "POST",
            &format!("/api/v1/conversations/{id}/cancel"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let frames = on_a.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    assert_eq!(frames.last().unwrap()["data"]["turn_id"], turn.as_str());

    let (status, body) = b
        .call("DELETE", &format!("/api/v1/conversations/{id}"), None)
        .await;
    assert_eq!(status, 204, "{body}");
    let (_, shown) = a
        .call("GET", &format!("/api/v1/conversations/{id}"), None)
        .await;
    assert_eq!(shown["status"], "closed", "{shown}");
    assert_eq!(agents_running(&a).await, 0);
    let (status, closed) = b.try_prompt(&id, "hello").await;
    assert_eq!(status, 409, "{closed}");
    assert_eq!(closed["code"], "conversation_closed");
}

#[tokio::test]
async fn a_dead_nodes_conversation_is_taken_over_and_resumed() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let state = tempfile::tempdir().unwrap();
    let mut agent = node_sdk_profile("node");
    agent.env.insert(
        "ACP_TEST_AGENT_STATE".into(),
        state.path().to_str().unwrap().into(),
    );
    let (a, b) = two_nodes(&db, &[agent]);
    let a_id = node_id(&a).await;
    let id = a.create("node").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "first").await;
    on_a.until_type("turn_ended").await;
    a.prompt(&id, "tool").await;
    let request = requested(&mut on_a).await;
    let request_id = request["id"].as_str().unwrap().to_owned();
    let agent = ProcessWatch::new(agent_pid(&db, &id).await);

    a.kill();
    // As if A had run on another machine: only its lease can tell B that
    // it is dead.
    db.execute(
        &format!("update nodes set boot_id = 'another machine' where id = '{a_id}'"),
        "",
    )
    .await;
    // First the turn A was running ends (error), then B's (end_turn).
    let frames = take_over_with_a_prompt(&b, &id, "second").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: second"
    );
    let b_id = node_id(&b).await;
    assert_eq!(owner(&db, &id).await.as_deref(), Some(b_id.as_str()));
    assert_eq!(agents_running(&b).await, 1);
    // The agent resumed its session (session/load), with its context.
    let ready: Vec<&Value> = frames
        .iter()
        .filter(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .collect();
    assert_eq!(ready.len(), 1, "{frames:#?}");
    assert_eq!(ready[0]["data"]["context"], "loaded");
    // What was pending on A expired, saying why; A's turn ended.
    let (_, expired) = b
        .call("GET", &format!("/api/v1/permissions/{request_id}"), None)
        .await;
    assert_eq!(expired["status"], "expired", "{expired}");
    assert!(
        expired["decision"]["reason"]
            .as_str()
            .unwrap()
            .contains("node"),
        "{expired}"
    );
    let all = events(&b, &id).await;
    assert_consecutive(&all, 0);
    let turn_ends: Vec<&str> = all
        .iter()
        .filter(|e| e["type"] == "turn_ended")
        .map(|e| e["data"]["stop_reason"].as_str().unwrap())
        .collect();
    assert_eq!(turn_ends, ["end_turn", "error", "end_turn"], "{all:#?}");
    // The dead node's agent is gone (its stdin closed with A, or killed).
    assert!(agent.ended().await);
    let (_, messages) = b
        .call("GET", &format!("/api/v1/conversations/{id}/messages"), None)
        .await;
    let users: Vec<&str> = messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["first", "tool", "second"]);
}

#[tokio::test]
async fn a_dead_nodes_pending_requests_expire_without_any_command() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    let id = a.create("demo").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "tool").await;
    let request = requested(&mut on_a).await;
    let mut inbox_b = b.ws("/api/v1/ws").await;
    let snapshot = inbox_b.next().await;
    assert_eq!(snapshot["pending_permissions"][0]["id"], request["id"]);
    a.kill();
    // B's sweep settles it: the phone on B sees the request expire.
    let frames = inbox_b.until(|e| e["type"] == "permission_resolved").await;
    let resolved = frames.last().unwrap();
    assert_eq!(resolved["data"]["id"], request["id"]);
    assert_eq!(resolved["data"]["status"], "expired");
    // Left for the next command, on any node.
    let (status, body) = b.try_prompt(&id, "hello").await;
    assert_eq!(status, 202, "{body}");
    let b_id = node_id(&b).await;
    assert_eq!(owner(&db, &id).await.as_deref(), Some(b_id.as_str()));
}

/// A node's sweep takes a dead node's conversation only from the dead node:
/// one that a command's start (here or on another node) took first is left
/// to it, so its new agent is not taken for the dead node's and killed.
#[tokio::test]
async fn the_sweep_takes_a_dead_nodes_conversation_only_if_no_command_took_it_first() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let profiles = [demo_profile("demo", &[])];
    let a = GatewayProcess::start_configured(&db, &profiles, "info", "node_lease = \"1s\"");
    let a_id = node_id(&a).await;
    let taken = a.create("demo").await;
    let left = a.create("demo").await;
    // B is built but does not run, so no sweep of its own races this test.
    let b = acp_gateway::Gateway::build(Config::for_tests(&db, profiles.to_vec()))
        .await
        .unwrap();
    let node = b.node();
    a.kill();
    db.execute(
        &format!("update nodes set boot_id = 'another machine' where id = '{a_id}'"),
        "",
    )
    .await;
    let a_id: uuid::Uuid = a_id.parse().unwrap();
    let (taken, left): (uuid::Uuid, uuid::Uuid) = (taken.parse().unwrap(), left.parse().unwrap());
    let orphans = tokio::time::timeout(WAIT, async {
        loop {
            let orphans = node.orphans().await.unwrap();
            if !orphans.is_empty() {
                return orphans;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("A's lease runs out in time");
    let mut expected = vec![(taken, a_id), (left, a_id)];
    let mut found = orphans.clone();
    expected.sort();
    found.sort();
    assert_eq!(found, expected);
    // A command's start claims one of them after the sweep listed it.
    let claim = node.claim(taken).await.unwrap();
    assert!(
        matches!(claim, acp_gateway::cluster::Claim::Mine { took_from: Some(dead), .. } if dead == a_id),
        "{claim:?}"
    );
    assert!(!node.take_orphan(taken, a_id).await.unwrap());
    assert!(node.take_orphan(left, a_id).await.unwrap());
    let b_id = node.id().to_string();
    assert_eq!(
        owner(&db, &taken.to_string()).await.as_deref(),
        Some(b_id.as_str())
    );
    assert_eq!(
        owner(&db, &left.to_string()).await.as_deref(),
        Some(b_id.as_str())
    );
    assert!(node.orphans().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_second_gateway_on_one_sqlite_file_is_refused() {
    let db = TestDb::sqlite().await;
    let first = GatewayProcess::start(&db, &[demo_profile("demo", &[])]);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!("listen = \"127.0.0.1:0\"\ndatabase_url = {:?}\n", db.url),
    )
    .unwrap();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["serve", "--config"])
        .arg(config.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr).into_owned()
        + &String::from_utf8_lossy(&second.stdout);
    assert!(said.contains("SQLite serves one gateway node"), "{said}");
    assert!(said.contains("use Postgres"), "{said}");
    // Once the first stops, another may take the file.
    first.stop();
    let third = GatewayProcess::start(&db, &[demo_profile("demo", &[])]);
    third.stop();
}

/// What a node does for the others (its lease, the commands sent to it, the
/// events it relays) is owned by it and stops with its gateway: once the
/// gateway's `run` has returned, none of the node's tasks still runs.
#[tokio::test]
async fn a_stopped_gateway_leaves_none_of_its_nodes_tasks_running() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let db = &db;
    let start = move || async move {
        let gateway =
            acp_gateway::Gateway::build(Config::for_tests(db, vec![demo_profile("demo", &[])]))
                .await
                .unwrap();
        let (node, base) = (gateway.node(), format!("http://{}", gateway.local_addr()));
        let stop = tokio_util::sync::CancellationToken::new();
        let run = tokio::spawn(gateway.run(stop.clone().cancelled_owned()));
        (node, base, stop, run)
    };
    let (node_a, base_a, stop_a, run_a) = start().await;
    let (node_b, base_b, stop_b, run_b) = start().await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{base_a}/api/v1/conversations"))
        .json(&json!({"agent": "demo"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap();
    // A command B forwards to A: A carries it out in a task of its node.
    let prompted = http
        .post(format!("{base_b}/api/v1/conversations/{id}/prompts"))
        .json(&json!({"text": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(prompted.status(), 202);
    assert!(!node_a.is_stopped() && !node_b.is_stopped());
    for (node, stop, run) in [(node_a, stop_a, run_a), (node_b, stop_b, run_b)] {
        stop.cancel();
        tokio::time::timeout(WAIT, run)
            .await
            .expect("the gateway stops in time")
            .unwrap()
            .unwrap();
        assert!(node.is_stopped(), "a task of the node still runs");
    }
}

/// The value of `acp_gateway_agent_exits_total{cause}` on a node.
async fn agent_exits(node: &GatewayProcess, cause: &str) -> i64 {
    let text = metrics(node).await;
    let prefix = format!("acp_gateway_agent_exits_total{{cause=\"{cause}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_node_frozen_past_its_lease_is_fenced_off_and_stops_its_agent() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (a, b) = two_nodes(&db, &[demo_profile("demo", &[])]);
    let a_id = node_id(&a).await;
    let id = a.create("demo").await;
    let mut on_a = a.conversation_ws(&id, 0).await;
    a.prompt(&id, "slow 100000").await;
    on_a.until_type("session_update").await;
    let agent = ProcessWatch::killing(agent_pid(&db, &id).await);

    // A stops dead (as a node cut off from the database would), its agent
    // streaming; its lease runs out, and it cannot be told apart from a
    // node on another machine.
    let a_pid = a.child.id() as i32;
    assert_eq!(unsafe { libc::kill(a_pid, libc::SIGSTOP) }, 0);
    db.execute(
        &format!(
            "update nodes set boot_id = 'another machine', lease_until = now() - interval '1 second'
             where id = '{a_id}';
             update agent_processes set boot_id = 'another machine'
             where conversation_id = '{id}'"
        ),
        "",
    )
    .await;
    // B takes the conversation over with a prompt of its own.
    take_over_with_a_prompt(&b, &id, "hello from b").await;
    let b_id = node_id(&b).await;
    assert_eq!(owner(&db, &id).await.as_deref(), Some(b_id.as_str()));

    // A wakes up: whatever it writes for the conversation is refused as a
    // whole, and it stops its copy of the agent.
    assert_eq!(unsafe { libc::kill(a_pid, libc::SIGCONT) }, 0);
    assert!(agent.ended().await, "A's agent stops");
    assert_eq!(agent_exits(&a, "fenced").await, 1);
    assert_eq!(owner(&db, &id).await.as_deref(), Some(b_id.as_str()));

    // One history: every seq once, the same read on either node, and
    // nothing of A's after B took over.
    let all = events(&b, &id).await;
    assert_consecutive(&all, 0);
    assert_eq!(events(&a, &id).await, all);
    let turn_ends: Vec<&str> = all
        .iter()
        .filter(|e| e["type"] == "turn_ended")
        .map(|e| e["data"]["stop_reason"].as_str().unwrap())
        .collect();
    assert_eq!(turn_ends, ["error", "end_turn"], "{all:#?}");
    let after_takeover = all
        .iter()
        .skip_while(|e| e["type"] != "turn_ended")
        .filter_map(|e| e["data"]["update"]["content"]["text"].as_str())
        .any(|text| text.starts_with('s'));
    assert!(
        !after_takeover,
        "no chunk of A's agent after the takeover: {all:#?}"
    );
}

#[tokio::test]
async fn postgres_ends_a_transaction_a_frozen_node_left_open() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    // What the gateway's connections are set to: a node frozen inside a
    // transaction holds a conversation's row lock only this long.
    let store = acp_gateway::store::postgres::PgStore::open(&db.url)
        .await
        .unwrap();
    let timeout: String = sqlx::query_scalar("show idle_in_transaction_session_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(timeout, acp_gateway::store::postgres::IDLE_IN_TRANSACTION);
}

#[tokio::test]
async fn the_connection_that_listens_is_none_of_the_pools() {
    use acp_gateway::store::postgres::{PgStore, POOL_SIZE};
    use acp_gateway::store::Clustered;
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = PgStore::open(&db.url).await.unwrap();
    let shared = store.cluster().expect("Postgres is clustered");
    // One listener dropped at once (its connection goes back where it came
    // from, unlistening in the background), one listening.
    drop(shared.listen().await.unwrap());
    let _listening = shared.listen().await.unwrap();
    // Every connection of the pool can still be had, and none of them
    // listens: a notification never reaches a query's connection.
    let mut held = Vec::new();
    for i in 0..POOL_SIZE {
        let mut conn = store
            .pool()
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("connection {i} of the pool: {e}"));
        let channels: i64 = sqlx::query_scalar("select count(*) from pg_listening_channels()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(channels, 0, "connection {i} of the pool listens");
        held.push(conn);
    }
    let listening: i64 = sqlx::query_scalar(
        "select count(*) from pg_stat_activity
         where datname = current_database() and query like 'LISTEN%'",
    )
    .fetch_one(&mut *held[0])
    .await
    .unwrap();
    assert!(
        listening >= 1,
        "the listener listens, on a connection of its own"
    );
}
