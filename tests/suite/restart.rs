//! Work that outlives the gateway: each test runs a real `acp-gateway
//! serve`, kills or stops it while an agent works under its shim, starts
//! another on the same database and state directory, and checks that the
//! conversation simply continued: every event once, in order, the turn
//! ended as the agent ended it, the request answered on its own id, the
//! agent the same process.

use serde_json::{json, Value};

use crate::common::{
    agent_and_shim, agent_process_records, assert_consecutive, demo_profile, eventually,
    kill_shims_under, shims_under, streamed_text, GatewayProcess, ProcessWatch, TestDb, Ws, WAIT,
};

backend_tests!(
    a_crash_mid_turn_loses_no_chunk_and_the_turn_ends_as_the_agent_ends_it,
    a_request_pending_through_a_crash_is_answered_on_its_own_id_after_it,
    an_answer_committed_just_before_a_crash_still_reaches_the_agent,
    an_answer_that_could_not_be_recorded_leaves_the_request_answerable_after_a_restart,
    a_prompts_answer_is_acknowledged_to_the_shim_only_with_the_turns_end,
    sigterm_with_detach_leaves_the_turn_running_for_the_next_start,
    sigterm_with_cancel_ends_the_turn_as_before,
    ctrl_c_stops_the_agents_whatever_on_shutdown_says,
    an_agent_that_ends_while_no_gateway_runs_is_accounted_for_after_the_restart,
    a_full_shim_buffer_pauses_the_agent_and_loses_nothing,
    a_shim_that_cannot_be_reached_falls_back_to_resuming_the_session,
    a_closed_conversations_shim_is_stopped_when_the_gateway_starts,
    a_deleted_conversations_shim_is_stopped_when_the_gateway_starts,
    a_shim_no_record_names_is_stopped_when_the_gateway_starts,
    a_question_pending_through_a_crash_is_answered_on_its_own_id_after_it,
);

fn agents() -> Vec<acp_gateway::config::AgentProfile> {
    vec![demo_profile("demo", &["--chunk-delay-ms", "0"])]
}

/// The agent's own pid (not its shim's), as the conversation's process
/// record says.
async fn agent_pid(db: &TestDb, id: &str) -> i32 {
    agent_and_shim(db, id).await.0
}

/// Reads until `n` message chunks have come (their events).
async fn chunks(ws: &mut Ws, n: usize) -> Vec<Value> {
    let mut seen = Vec::new();
    while streamed_text(&seen, "agent_message_chunk")
        .split_whitespace()
        .count()
        < n
    {
        seen.push(ws.next().await);
    }
    seen
}

/// What `slow n` streams, whole.
fn slow_text(n: usize) -> String {
    (0..n).map(|i| format!("s{i} ")).collect()
}

/// Reattaches a WebSocket after `seen`, reads to the end of the turn and
/// checks that the two parts make one gap-free log: every event once, in
/// order. All the events, and the turn's end.
async fn read_on(gw: &GatewayProcess, id: &str, seen: Vec<Value>) -> (Vec<Value>, Value) {
    let last = seen.last().map_or(0, |e| e["seq"].as_i64().unwrap());
    let mut ws = gw.conversation_ws(id, last).await;
    let rest = ws.until_type("turn_ended").await;
    let all: Vec<Value> = seen.into_iter().chain(rest).collect();
    let first = all[0]["seq"].as_i64().unwrap();
    assert_consecutive(&all, first - 1);
    // The log as stored says the same.
    let stored = gw.events(id).await;
    let from = stored
        .iter()
        .position(|e| e["seq"] == all[0]["seq"])
        .unwrap();
    assert_eq!(&stored[from..from + all.len()], &all[..]);
    let ended = all.last().unwrap().clone();
    (all, ended)
}

async fn a_crash_mid_turn_loses_no_chunk_and_the_turn_ends_as_the_agent_ends_it(db: TestDb) {
    let gw = GatewayProcess::start(&db, &agents());
    let id = gw.create("demo").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let turn = gw.prompt(&id, "slow 60").await;
    let pid = agent_pid(&db, &id).await;
    let agent = ProcessWatch::new(pid);
    let seen = chunks(&mut ws, 5).await;
    gw.kill();
    assert!(!agent.has_ended(), "the agent outlives the gateway");

    let gw = GatewayProcess::start(&db, &agents());
    let (all, ended) = read_on(&gw, &id, seen).await;
    assert_eq!(streamed_text(&all, "agent_message_chunk"), slow_text(60));
    assert_eq!(ended["data"]["turn_id"], turn.as_str());
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    // The reply is one message, as if nothing had happened.
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    let replies: Vec<&Value> = messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "agent" && m["turn_id"] == turn.as_str())
        .collect();
    assert_eq!(replies.len(), 1, "{messages}");
    let text: String = replies[0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect();
    assert_eq!(text, slow_text(60));
    // The same agent, still there for the next turn.
    assert_eq!(agent_pid(&db, &id).await, pid);
    assert!(!agent.has_ended());
    let next = gw.prompt(&id, "hello again").await;
    let mut ws = gw
        .conversation_ws(&id, ended["seq"].as_i64().unwrap())
        .await;
    let rest = ws.until_type("turn_ended").await;
    assert_eq!(rest.last().unwrap()["data"]["turn_id"], next.as_str());
    assert!(
        rest.iter().all(|e| e["type"] != "agent_status"),
        "the agent was not started again: {rest:?}"
    );
}

/// The request is still pending; answered, the agent hears it (its tool
/// call runs) and the turn ends.
async fn answered_and_ran(gw: &GatewayProcess, id: &str, request: &str, seen: Vec<Value>) {
    let (_, current) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(current["status"], "pending", "{current}");
    let respond = format!("/api/v1/permissions/{request}/respond");
    let (status, body) = gw.post(&respond, json!({"option_id": "allow-once"})).await;
    assert_eq!(status, 200, "{body}");
    let (all, ended) = read_on(gw, id, seen).await;
    assert_eq!(
        streamed_text(&all, "agent_message_chunk"),
        "1 of 1 tool calls ran."
    );
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
}

/// A conversation whose agent asks permission, and its gateway killed
/// (SIGKILL) while the request waits: the conversation's id, the events
/// seen up to the request, and the request's id.
async fn a_crash_with_a_request_pending(db: &TestDb) -> (String, Vec<Value>, String) {
    let gw = GatewayProcess::start(db, &agents());
    let asked = a_request_pending(&gw).await;
    gw.kill();
    asked
}

/// A conversation on `gw` whose agent asks once: its id, the events seen
/// up to the request, and the request's id.
async fn a_request_pending(gw: &GatewayProcess) -> (String, Vec<Value>, String) {
    let id = gw.create("demo").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "ask 1").await;
    let seen = ws.until_type("permission_requested").await;
    let request = seen.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (id, seen, request)
}

async fn a_request_pending_through_a_crash_is_answered_on_its_own_id_after_it(db: TestDb) {
    let (id, seen, request_id) = a_crash_with_a_request_pending(&db).await;
    let pid = agent_pid(&db, &id).await;

    let gw = GatewayProcess::start(&db, &agents());
    answered_and_ran(&gw, &id, &request_id, seen).await;
    assert_eq!(agent_pid(&db, &id).await, pid);
    // The tool call's record built on what was stored before the crash.
    let (_, calls) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    let call = &calls["items"][0];
    assert_eq!(call["title"], "Write ask-0.txt", "{calls}");
    assert_eq!(call["status"], "completed", "{calls}");
}

async fn a_question_pending_through_a_crash_is_answered_on_its_own_id_after_it(db: TestDb) {
    let agents = vec![crate::common::node_sdk_profile("node")];
    let gw = GatewayProcess::start(&db, &agents);
    let id = gw.create("node").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let form = json!({"mode": "form", "message": "Go on?",
        "requestedSchema": {"properties": {"go": {"type": "boolean"}}, "required": ["go"]}});
    gw.prompt(&id, &format!("question {form}")).await;
    let seen = ws.until_type("question_asked").await;
    let question = seen.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pid = agent_pid(&db, &id).await;
    gw.kill();

    let gw = GatewayProcess::start(&db, &agents);
    let (_, current) = gw.get(&format!("/api/v1/questions/{question}")).await;
    assert_eq!(current["status"], "pending", "{current}");
    let respond = format!("/api/v1/questions/{question}/respond");
    let answer = json!({"action": "accept", "content": {"go": true}});
    let (status, body) = gw.post(&respond, answer).await;
    assert_eq!(status, 200, "{body}");
    let (all, ended) = read_on(&gw, &id, seen).await;
    let said: Value = serde_json::from_str(&streamed_text(&all, "agent_message_chunk")).unwrap();
    assert_eq!(said, json!({"action": "accept", "content": {"go": true}}));
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    assert_eq!(agent_pid(&db, &id).await, pid);
}

async fn an_answer_committed_just_before_a_crash_still_reaches_the_agent(db: TestDb) {
    let (id, seen, request) = a_crash_with_a_request_pending(&db).await;
    // As if the gateway had committed the answer and died before the agent
    // had it.
    let decision = r#"{"option_id":"allow-once","outcome":"selected","decided_by":"user:anonymous","reason":null,"decided_at":"2026-11-27T00:00:00Z"}"#;
    db.execute(
        &format!(
            "update permission_requests set status = 'approved', decision = '{decision}' \
             where id = '{request}'"
        ),
        &format!(
            "update permission_requests set status = 'approved', decision = '{decision}' \
             where lower(hex(id)) = '{}'",
            request.replace('-', "")
        ),
    )
    .await;

    let gw = GatewayProcess::start(&db, &agents());
    let mut ws = gw
        .conversation_ws(&id, seen.last().unwrap()["seq"].as_i64().unwrap())
        .await;
    let rest = ws.until_type("turn_ended").await;
    assert_eq!(
        streamed_text(&rest, "agent_message_chunk"),
        "1 of 1 tool calls ran."
    );
    assert_eq!(rest.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn an_answer_that_could_not_be_recorded_leaves_the_request_answerable_after_a_restart(
    db: TestDb,
) {
    let gw = GatewayProcess::start(&db, &agents());
    let (id, seen, request) = a_request_pending(&gw).await;
    let respond = format!("/api/v1/permissions/{request}/respond");
    // The database fails the answer's write, as a connection lost just then
    // would (an outage that began after the caller's token was checked).
    db.execute(
        "create function lost() returns trigger language plpgsql as $$
           begin raise exception 'connection lost' using errcode = '08006'; end $$;
         create trigger lost before update on permission_requests
           for each row execute function lost();",
        "create trigger lost before update on permission_requests
           begin select raise(abort, 'connection lost'); end;",
    )
    .await;
    let (status, body) = gw.post(&respond, json!({"option_id": "allow-once"})).await;
    assert!(status >= 500, "{status} {body}");
    db.execute(
        "drop trigger lost on permission_requests; drop function lost();",
        "drop trigger lost;",
    )
    .await;
    // Stopped (detach), it commits what it holds first: the conversation,
    // and where the agent stands with the request.
    let (status, log) = gw.terminate();
    assert!(status.success(), "{log}");

    let gw = GatewayProcess::start(&db, &agents());
    answered_and_ran(&gw, &id, &request, seen).await;
}

/// Every commit that tells the agent's shim it may forget the prompt's
/// answer also holds the turn's end: no link on record waits for a prompt
/// whose answer it has let go (a gateway dying just after such a commit
/// would reattach and wait forever for an answer the shim no longer holds).
/// The `hasty` agent asks permission right after its answer to the prompt,
/// and a policy answers at once (a commit of its own): the gateway may take
/// the answer first, and apply and commit the request that came after it
/// before the turn has ended.
async fn a_prompts_answer_is_acknowledged_to_the_shim_only_with_the_turns_end(db: TestDb) {
    let reads = "[[policies]]\nname = \"reads\"\nkinds = [\"read\"]\ndecision = \"allow\"\n";
    let gw = GatewayProcess::start_configured(&db, &agents(), "info", reads);
    // Every link a commit writes, in order.
    db.execute(
        "create table link_log (n bigserial primary key, link text);
         create function log_link() returns trigger language plpgsql as $$
           begin insert into link_log (link) values (new.link); return new; end $$;
         create trigger log_link after insert or update on agent_processes
           for each row execute function log_link();",
        "create table link_log (n integer primary key autoincrement, link text);
         create trigger log_inserted_link after insert on agent_processes
           begin insert into link_log (link) values (new.link); end;
         create trigger log_updated_link after update on agent_processes
           begin insert into link_log (link) values (new.link); end;",
    )
    .await;
    let id = gw.create("demo").await;
    let mut after = 0;
    for _ in 0..20 {
        let turn = gw.prompt(&id, "hasty").await;
        let mut ws = gw.conversation_ws(&id, after).await;
        let events = ws.until_type("turn_ended").await;
        let ended = events.last().unwrap();
        assert_eq!(ended["data"]["turn_id"], turn.as_str());
        assert_eq!(ended["data"]["stop_reason"], "end_turn");
        after = ended["seq"].as_i64().unwrap();
    }
    // Each turn's request too, answered by the policy.
    let mut ws = gw.conversation_ws(&id, 0).await;
    let mut allowed = 0;
    while allowed < 20 {
        let event = ws.next().await;
        if event["type"] == "permission_resolved" {
            assert_eq!(event["data"]["decision"]["decided_by"], "policy:reads");
            allowed += 1;
        }
    }

    let links: Vec<Value> = db
        .column::<String>("select link from link_log where link is not null order by n")
        .await
        .iter()
        .map(|link| serde_json::from_str(link).unwrap())
        .collect();
    // The agent's first output in a turn is its answer to the prompt: a
    // link still waiting for the prompt has dealt with nothing past where
    // the turn began.
    let mut began = std::collections::HashMap::new();
    for (i, link) in links.iter().enumerate() {
        let Some(prompt) = link["prompt_request"].as_u64() else {
            continue;
        };
        let at = link["output_to"].as_u64().unwrap();
        let start = *began.entry(prompt).or_insert(at);
        assert_eq!(
            at, start,
            "link {i} waits for prompt {prompt} and lets its answer go: {link}"
        );
    }
    assert_eq!(began.len(), 20, "the turns' links are on record: {links:?}");
}

async fn sigterm_with_detach_leaves_the_turn_running_for_the_next_start(db: TestDb) {
    let gw = GatewayProcess::start(&db, &agents());
    let id = gw.create("demo").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "slow 60").await;
    let pid = agent_pid(&db, &id).await;
    let agent = ProcessWatch::new(pid);
    let mut seen = chunks(&mut ws, 3).await;
    let (status, log) = gw.terminate();
    assert!(status.success(), "exit 0 on SIGTERM: {status:?}\n{log}");
    // Everything it had is committed and sent; the socket closes with 1001.
    let (frames, code) = ws.until_closed().await;
    assert_eq!(code, 1001);
    seen.extend(frames);
    assert!(!agent.has_ended(), "the agent is left running");

    let gw = GatewayProcess::start(&db, &agents());
    let (all, ended) = read_on(&gw, &id, seen).await;
    assert_eq!(streamed_text(&all, "agent_message_chunk"), slow_text(60));
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    assert_eq!(agent_pid(&db, &id).await, pid);
}

async fn sigterm_with_cancel_ends_the_turn_as_before(db: TestDb) {
    let gw = GatewayProcess::start_configured(&db, &agents(), "info", "on_shutdown = \"cancel\"");
    a_stop_ends_everything(&db, gw, GatewayProcess::terminate).await;
}

async fn ctrl_c_stops_the_agents_whatever_on_shutdown_says(db: TestDb) {
    let gw = GatewayProcess::start(&db, &agents());
    a_stop_ends_everything(&db, gw, GatewayProcess::interrupt).await;
}

/// Stopping `gw` with `stop` during a turn cancels the turn and stops the
/// agent and its shim.
async fn a_stop_ends_everything(
    db: &TestDb,
    gw: GatewayProcess,
    stop: fn(GatewayProcess) -> (std::process::ExitStatus, String),
) {
    let id = gw.create("demo").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "slow 200").await;
    let agent = ProcessWatch::new(agent_pid(db, &id).await);
    chunks(&mut ws, 3).await;
    let (status, log) = stop(gw);
    assert!(status.success(), "{log}");
    let ended = ws.until_type("turn_ended").await.pop().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "cancelled");
    assert!(agent.ended().await, "the agent is stopped");
    assert_eq!(kill_shims_under(db.state_dir()), 0, "and its shim with it");
}

async fn an_agent_that_ends_while_no_gateway_runs_is_accounted_for_after_the_restart(db: TestDb) {
    let gw = GatewayProcess::start(&db, &agents());
    let id = gw.create("demo").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "slow 20").await;
    let pid = agent_pid(&db, &id).await;
    let agent = ProcessWatch::new(pid);
    let seen = chunks(&mut ws, 2).await;
    gw.kill();
    // With nobody reading, the agent finishes its turn into its shim, and
    // is then killed (by its user, the OOM killer, …).
    let socket = shim_socket(&db, &id).await;
    // Asked again and again: while no gateway reads the shim, nothing
    // announces a change.
    eventually(WAIT, async || {
        tail_has_prompt_answer(&socket).await.then_some(())
    })
    .await
    .expect("the agent finished its turn into its shim");
    // SAFETY: kill(2) on the test's own agent.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    assert!(agent.ended().await);

    let gw = GatewayProcess::start(&db, &agents());
    let (all, ended) = read_on(&gw, &id, seen).await;
    // Its last words are stored, its turn ended as it ended it…
    assert_eq!(streamed_text(&all, "agent_message_chunk"), slow_text(20));
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
    // …and its end is recorded.
    let mut ws = gw
        .conversation_ws(&id, ended["seq"].as_i64().unwrap())
        .await;
    let status = ws.until_type("agent_status").await.pop().unwrap();
    assert!(
        status["data"]["detail"]
            .as_str()
            .unwrap()
            .contains("signal 15"),
        "{status}"
    );
    assert_eq!(gw.conversation(&id).await["status"], "idle");
    // The shim has gone with its agent.
    assert_eq!(kill_shims_under(db.state_dir()), 0);
}

async fn a_full_shim_buffer_pauses_the_agent_and_loses_nothing(db: TestDb) {
    const BUFFER: usize = 4096;
    const CHUNKS: usize = 2000;
    // Paced (a chunk a millisecond): the gateway is frozen long before the
    // agent is done.
    let agents = vec![demo_profile("demo", &["--chunk-delay-ms", "1"])];
    // Lines up to 1 KiB (the least allowed), so that the shim holds one.
    let extra = format!("shim_buffer = {BUFFER}\nmax_line_bytes = 1024");
    let gw = GatewayProcess::start_configured(&db, &agents, "info", &extra);
    let id = gw.create("demo").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, &format!("long {CHUNKS}")).await;
    // The agent streams.
    let seen = chunks(&mut ws, 1).await;
    // Frozen: nothing more is committed, so the shim holds what comes.
    // SAFETY: kill(2) on the test's own gateway.
    unsafe {
        libc::kill(gw.child.id() as i32, libc::SIGSTOP);
    }
    let socket = shim_socket(&db, &id).await;
    // The shim fills up to its bound and reads no more: the agent waits.
    let hello = eventually(WAIT, async || {
        hello(&socket)
            .await
            .filter(|h| h.read_to - h.held_from >= BUFFER as u64)
    })
    .await
    .expect("the shim's buffer filled");
    assert!(hello.exit.is_none(), "the agent is paused, not done");
    assert!(
        hello.read_to - hello.held_from <= BUFFER as u64,
        "{hello:?}"
    );
    gw.kill();

    let gw = GatewayProcess::start_configured(&db, &agents, "info", &extra);
    let (all, ended) = read_on(&gw, &id, seen).await;
    let expected: String = (0..CHUNKS).map(|i| format!("w{i} ")).collect();
    assert_eq!(streamed_text(&all, "agent_message_chunk"), expected);
    assert_eq!(ended["data"]["stop_reason"], "end_turn");
}

async fn a_shim_that_cannot_be_reached_falls_back_to_resuming_the_session(db: TestDb) {
    let (id, seen, request) = a_crash_with_a_request_pending(&db).await;
    // As after a reboot: neither the shim nor its agent is there any more.
    assert_eq!(kill_shims_under(db.state_dir()), 1);

    let gw = GatewayProcess::start(&db, &agents());
    let (_, current) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(current["status"], "expired", "{current}");
    let mut ws = gw
        .conversation_ws(&id, seen.last().unwrap()["seq"].as_i64().unwrap())
        .await;
    let ended = ws.until_type("turn_ended").await.pop().unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    assert!(
        ended["data"]["error"]
            .as_str()
            .unwrap()
            .contains("shim could not be reached"),
        "{ended}"
    );
    // The next prompt starts the agent again and resumes its session as
    // far as the agent can (this demo agent cannot load one: `reset`).
    gw.prompt(&id, "hello again").await;
    let rest = ws.until_type("turn_ended").await;
    let restarted = rest
        .iter()
        .find(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .expect("the agent started again");
    assert_eq!(restarted["data"]["context"], "reset", "{restarted}");
    assert_eq!(rest.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn a_closed_conversations_shim_is_stopped_when_the_gateway_starts(db: TestDb) {
    // Closed while no gateway ran (as a restore of the database would).
    shims_of_gone_conversations_are_stopped(db, "update conversations set status = 'closed'", "id")
        .await;
}

async fn a_deleted_conversations_shim_is_stopped_when_the_gateway_starts(db: TestDb) {
    // Its process record goes with it: the shim is found by its socket.
    shims_of_gone_conversations_are_stopped(db, "delete from conversations", "id").await;
}

async fn a_shim_no_record_names_is_stopped_when_the_gateway_starts(db: TestDb) {
    // As when another node took the conversation over while this one was
    // down: the record is that node's now, the shim here nobody's.
    shims_of_gone_conversations_are_stopped(db, "delete from agent_processes", "conversation_id")
        .await;
}

/// A gateway starting after `change` (SQL, completed with `where
/// <column> = ` the conversation's id) stops the conversation's shim and
/// its agent.
async fn shims_of_gone_conversations_are_stopped(db: TestDb, change: &str, column: &str) {
    let gw = GatewayProcess::start(&db, &agents());
    let id = gw.create("demo").await;
    let records = agent_process_records(&db).await;
    let shim = ProcessWatch::new(records[0].pid);
    let agent = ProcessWatch::new(agent_pid(&db, &id).await);
    gw.kill();
    db.execute(
        &format!("{change} where {column} = '{id}'"),
        &format!(
            "{change} where lower(hex({column})) = '{}'",
            id.replace('-', "")
        ),
    )
    .await;
    // Started (and kept running while it is checked): it stops the shim.
    let _gw = GatewayProcess::start(&db, &agents());
    assert!(shim.ended().await, "the shim is stopped");
    assert!(agent.ended().await, "and its agent");
    assert!(agent_process_records(&db).await.is_empty());
    assert!(shims_under(db.state_dir()).is_empty());
}

/// The socket of the conversation's shim.
async fn shim_socket(db: &TestDb, id: &str) -> std::path::PathBuf {
    let records = agent_process_records(db).await;
    let record = records
        .iter()
        .find(|r| r.conversation_id.to_string() == id)
        .unwrap();
    record.shim_socket.clone().unwrap().into()
}

/// The shim's hello, as a gateway connecting now would get it (the
/// connection is closed at once: the shim goes on as if a gateway left);
/// `None` when it refused the connection just now (connections come fast
/// here: its backlog may be full), to be tried again.
async fn hello(socket: &std::path::Path) -> Option<acp_gateway::shim::protocol::Hello> {
    use acp_gateway::shim::protocol::{self, ToGateway};
    let stream = match tokio::net::UnixStream::connect(socket).await {
        Ok(stream) => stream,
        Err(e) => {
            eprintln!("connecting to the shim: {e}; again");
            return None;
        }
    };
    let (mut read, _write) = stream.into_split();
    match protocol::read_from_shim(&mut read).await.unwrap() {
        Some(ToGateway::Hello(hello)) => Some(hello),
        other => panic!("no hello: {other:?}"),
    }
}

/// Whether the last output the shim holds is the answer to a prompt.
async fn tail_has_prompt_answer(socket: &std::path::Path) -> bool {
    use acp_gateway::shim::protocol::{self, ToGateway, ToShim};
    let Ok(stream) = tokio::net::UnixStream::connect(socket).await else {
        return false; // refused just now: asked again
    };
    let (mut read, mut write) = stream.into_split();
    let Ok(Some(ToGateway::Hello(_))) = protocol::read_from_shim(&mut read).await else {
        return false;
    };
    // As the gateway: with the key beside the socket, then by the hello
    // that follows.
    let key = std::fs::read(acp_gateway::shim::key_of(socket)).unwrap();
    protocol::send_to_shim(&mut write, &ToShim::Auth { key })
        .await
        .unwrap();
    let Ok(Some(ToGateway::Hello(now))) = protocol::read_from_shim(&mut read).await else {
        return false;
    };
    let from = now.held_from;
    protocol::send_to_shim(&mut write, &ToShim::Attach { from })
        .await
        .unwrap();
    let mut bytes = Vec::new();
    while from + (bytes.len() as u64) < now.read_to {
        match protocol::read_from_shim(&mut read).await {
            Ok(Some(ToGateway::Output { bytes: b, .. })) => bytes.extend(b),
            Ok(Some(_)) => continue,
            _ => return false,
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    text.lines()
        .last()
        .is_some_and(|line| line.contains("\"stopReason\""))
}
