//! The gateway as an ACP agent (`/api/v1/acp`): a JSON-RPC client over a
//! real WebSocket against a gateway running the demo agent. Sessions are
//! the user's conversations; prompts stream `session/update`s in order and
//! are answered with their stop reason; permission requests reach every
//! attached client and are answered from any, the others told
//! `$/cancel_request`; load replays, resume and cursors continue exactly;
//! bad input gets an error and the connection goes on.

use std::collections::VecDeque;

use crate::common::*;
use acp_gateway::config::Config;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// An ACP client: requests with ids of its own, and what the gateway sent
/// besides the responses (notifications and requests), in order.
pub(crate) struct Acp {
    pub(crate) ws: Ws,
    next_id: i64,
    /// Frames that were not the response waited for.
    pub(crate) other: VecDeque<Value>,
}

impl Acp {
    pub(crate) async fn connect(gw: &TestGateway, path: &str) -> Acp {
        let ws = gw.ws(path).await;
        Acp {
            ws,
            next_id: 1,
            other: VecDeque::new(),
        }
    }

    /// Connected and initialized.
    pub(crate) async fn open(gw: &TestGateway) -> Acp {
        let mut acp = Acp::connect(gw, "/api/v1/acp").await;
        let init = acp
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}}),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
        acp
    }

    pub(crate) async fn send_text(&mut self, text: String) {
        self.ws
            .stream
            .send(WsMessage::Text(text.into()))
            .await
            .unwrap();
    }

    pub(crate) async fn request(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_text(message.to_string()).await;
        id
    }

    pub(crate) async fn notify(&mut self, method: &str, params: Value) {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.send_text(message.to_string()).await;
    }

    /// Sends a request and waits for its response (whole: `result` or
    /// `error`); what came before it is kept in `other`.
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        self.response(id).await
    }

    pub(crate) async fn response(&mut self, id: i64) -> Value {
        loop {
            let frame = self.ws.next().await;
            if frame.get("method").is_none() && frame["id"] == id {
                return frame;
            }
            self.other.push_back(frame);
        }
    }

    /// The next frame that is not a response to one of this client's
    /// requests.
    pub(crate) async fn next_other(&mut self) -> Value {
        if let Some(frame) = self.other.pop_front() {
            return frame;
        }
        self.ws.next().await
    }

    /// Frames until one with this method (that one last).
    pub(crate) async fn until_method(&mut self, method: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let frame = self.next_other().await;
            let done = frame["method"] == method;
            seen.push(frame);
            if done {
                return seen;
            }
        }
    }

    pub(crate) async fn new_session(&mut self) -> String {
        let cwd = std::env::temp_dir();
        let created = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        created["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{created}"))
            .to_owned()
    }
}

pub(crate) fn text_prompt(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// The updates among frames: (their `sessionUpdate`, their seq).
fn updates(frames: &[Value]) -> Vec<(String, i64)> {
    frames
        .iter()
        .filter(|f| f["method"] == "session/update")
        .map(|f| {
            (
                f["params"]["update"]["sessionUpdate"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                f["params"]["_meta"]["acpGateway"]["seq"].as_i64().unwrap(),
            )
        })
        .collect()
}

pub(crate) fn agent_text(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|f| f["params"]["update"]["content"]["text"].as_str())
        .collect()
}

/// The status a WebSocket handshake to `path` is refused with (`None`: it
/// was accepted).
async fn handshake_status(gw: &TestGateway, path: &str) -> Option<u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = gw.url(path).replacen("http://", "ws://", 1);
    match tokio_tungstenite::connect_async(url.into_client_request().unwrap()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Some(response.status().as_u16())
        }
        Err(e) => panic!("the handshake failed: {e}"),
        Ok(_) => None,
    }
}

async fn gateway(db: &TestDb) -> TestGateway {
    TestGateway::start(db, vec![demo_profile("demo", &[])]).await
}

async fn a_session_streams_its_updates_in_order_and_the_prompt_ends_with_its_stop_reason(
    db: TestDb,
) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    // A conversation of the user's, at once.
    let conversation = gw.conversation(&session).await;
    assert_eq!(conversation["agent"], "demo");
    let (_, listed) = gw.get("/api/v1/conversations").await;
    assert_eq!(listed["items"][0]["id"], session.as_str());

    let ended = acp
        .call("session/prompt", text_prompt(&session, "long 50"))
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let frames: Vec<Value> = acp.other.drain(..).collect();
    let seen = updates(&frames);
    assert!(!seen.is_empty());
    // In order, each once, and never the client's own prompt echoed.
    assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "{seen:?}");
    assert!(seen.iter().all(|(kind, _)| kind != "user_message_chunk"));
    let stored: Vec<Value> = gw.events(&session).await;
    let stored_text: String = stored
        .iter()
        .filter(|e| e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|e| e["data"]["update"]["content"]["text"].as_str())
        .collect();
    assert!(!stored_text.is_empty());
    assert_eq!(agent_text(&frames), stored_text);
}

async fn a_permission_request_is_answered_from_the_acp_client(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let prompt = acp
        .request("session/prompt", text_prompt(&session, "tool"))
        .await;
    let asked = acp.until_method("session/request_permission").await;
    let asked = asked.last().unwrap().clone();
    assert_eq!(asked["params"]["sessionId"], session.as_str());
    assert_eq!(asked["params"]["options"][0]["optionId"], "allow-once");
    let answer = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}});
    acp.send_text(answer.to_string()).await;
    let ended = acp.response(prompt).await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let id = asked["params"]["_meta"]["acpGateway"]["permissionId"]
        .as_str()
        .unwrap();
    let (_, request) = gw.get(&format!("/api/v1/permissions/{id}")).await;
    assert_eq!(request["status"], "approved", "{request}");
    assert_eq!(request["decision"]["via"], "acp");
    assert_eq!(request["decision"]["decided_by"], "user:anonymous");
}

async fn a_request_answered_over_rest_is_withdrawn_from_every_acp_client(db: TestDb) {
    let gw = gateway(&db).await;
    let mut first = Acp::open(&gw).await;
    let session = first.new_session().await;
    let mut second = Acp::open(&gw).await;
    let resumed = second
        .call(
            "session/resume",
            json!({"sessionId": session, "cwd": std::env::temp_dir()}),
        )
        .await;
    assert!(
        resumed["result"]["_meta"]["acpGateway"]["cursor"].is_i64(),
        "{resumed}"
    );
    let prompt = first
        .request("session/prompt", text_prompt(&session, "tool"))
        .await;
    let asked_first = first
        .until_method("session/request_permission")
        .await
        .pop()
        .unwrap();
    let asked_second = second
        .until_method("session/request_permission")
        .await
        .pop()
        .unwrap();
    let id = asked_first["params"]["_meta"]["acpGateway"]["permissionId"].clone();
    assert_eq!(
        asked_second["params"]["_meta"]["acpGateway"]["permissionId"],
        id
    );

    let (status, answered) = gw
        .post(
            &format!("/api/v1/permissions/{}/respond", id.as_str().unwrap()),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    for (acp, asked) in [(&mut first, &asked_first), (&mut second, &asked_second)] {
        let cancelled = acp.until_method("$/cancel_request").await.pop().unwrap();
        assert_eq!(cancelled["params"]["requestId"], asked["id"]);
    }
    // An answer the client sends after all is ignored: the first won.
    let late = json!({"jsonrpc": "2.0", "id": asked_second["id"], "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}});
    second.send_text(late.to_string()).await;
    let ended = first.response(prompt).await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let (_, request) = gw
        .get(&format!("/api/v1/permissions/{}", id.as_str().unwrap()))
        .await;
    assert_eq!(request["status"], "approved");
    let turn_ends = gw
        .events(&session)
        .await
        .into_iter()
        .filter(|e| e["type"] == "turn_ended")
        .count();
    assert_eq!(turn_ends, 1);
    // The second client saw the turn's updates too, and the turn end
    // answered only the client that prompted.
    let frames = second.until_method("session/update").await;
    assert!(!frames.is_empty());
}

async fn a_prompt_sent_over_rest_reaches_the_acp_client_as_user_message_chunks(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    gw.prompt(&session, "hello there").await;
    let frames = acp.until_method("session/update").await;
    let first = frames.last().unwrap();
    assert_eq!(
        first["params"]["update"]["sessionUpdate"],
        "user_message_chunk"
    );
    assert_eq!(first["params"]["update"]["content"]["text"], "hello there");
    // Then the agent's answer, once.
    let more = acp.until_method("session/update").await;
    let kind = &more.last().unwrap()["params"]["update"]["sessionUpdate"];
    assert!(
        kind == "agent_thought_chunk" || kind == "agent_message_chunk",
        "{kind}"
    );
}

async fn cancel_ends_the_running_turn_cancelled(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let mut events = gw.conversation_ws(&session, 0).await;
    let prompt = acp
        .request("session/prompt", text_prompt(&session, "hang"))
        .await;
    events.until_type("turn_started").await;
    acp.notify("session/cancel", json!({"sessionId": session}))
        .await;
    let ended = acp.response(prompt).await;
    assert_eq!(ended["result"]["stopReason"], "cancelled", "{ended}");
}

async fn load_after_a_disconnect_replays_the_history_then_goes_on_live(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let ended = acp
        .call("session/prompt", text_prompt(&session, "long 20"))
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn");
    let live: Vec<Value> = acp.other.drain(..).collect();
    // Mid-turn, gone: the turn goes on without it.
    let mut events = gw.conversation_ws(&session, 0).await;
    events.until_type("turn_ended").await;
    acp.request("session/prompt", text_prompt(&session, "slow 10"))
        .await;
    acp.until_method("session/update").await;
    drop(acp);
    let rest = events.until_type("turn_ended").await;
    assert_eq!(rest.last().unwrap()["data"]["stop_reason"], "end_turn");

    let mut again = Acp::open(&gw).await;
    let listed = again.call("session/list", json!({})).await;
    assert_eq!(
        listed["result"]["sessions"][0]["sessionId"],
        session.as_str(),
        "{listed}"
    );
    let loaded = again
        .call(
            "session/load",
            json!({"sessionId": session, "cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await;
    let cursor = loaded["result"]["_meta"]["acpGateway"]["cursor"]
        .as_i64()
        .unwrap();
    let replayed: Vec<Value> = again.other.drain(..).collect();
    let seqs: Vec<i64> = updates(&replayed).iter().map(|u| u.1).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // The first turn as it was seen live, the user's prompts replayed.
    assert!(agent_text(&replayed).starts_with(&agent_text(&live)));
    let users: Vec<&Value> = replayed
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        .collect();
    assert_eq!(users.len(), 2);
    let stored = gw.events(&session).await;
    assert_eq!(cursor, stored.last().unwrap()["seq"].as_i64().unwrap());
    // Each stored update once, no more.
    let stored_updates = stored
        .iter()
        .filter(|e| e["type"] == "session_update")
        .count();
    assert_eq!(seqs.len(), stored_updates + users.len());

    // A resume at the cursor: only what comes after.
    let mut third = Acp::open(&gw).await;
    let resumed = third
        .call("session/resume", json!({"sessionId": session, "cwd": std::env::temp_dir(), "_meta": {"acpGateway": {"cursor": cursor}}}))
        .await;
    assert_eq!(resumed["result"]["_meta"]["acpGateway"]["cursor"], cursor);
    assert!(third.other.is_empty());
    let ended = again
        .call("session/prompt", text_prompt(&session, "hello"))
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn");
    let next = third.until_method("session/update").await.pop().unwrap();
    assert_eq!(next["params"]["_meta"]["acpGateway"]["seq"], cursor + 1);
}

async fn close_detaches_the_client_and_delete_closes_the_conversation(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let closed = acp
        .call("session/close", json!({"sessionId": session}))
        .await;
    assert_eq!(closed["result"], json!({}), "{closed}");
    let refused = acp
        .call("session/prompt", text_prompt(&session, "hello"))
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_ne!(gw.conversation(&session).await["status"], "closed");
    let deleted = acp
        .call("session/delete", json!({"sessionId": session}))
        .await;
    assert_eq!(deleted["result"], json!({}), "{deleted}");
    assert_eq!(gw.conversation(&session).await["status"], "closed");
    let unknown = acp
        .call("session/delete", json!({"sessionId": uuid::Uuid::now_v7()}))
        .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}

async fn bad_input_gets_an_error_and_the_connection_goes_on(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.max_body_bytes = 4096;
    let gw = TestGateway::start_with(config).await;
    let mut acp = Acp::connect(&gw, "/api/v1/acp").await;
    let early = acp.call("session/list", json!({})).await;
    assert_eq!(early["error"]["code"], -32600, "{early}");
    acp.call("initialize", json!({"protocolVersion": 1})).await;

    acp.send_text("{not json".into()).await;
    let parse = acp.ws.next().await;
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    assert_eq!(parse["id"], Value::Null);

    let unknown = acp.call("session/fly", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");

    let nobody = "0190a2b4-0000-7000-8000-000000000000";
    let missing = acp.call("session/prompt", text_prompt(nobody, "hi")).await;
    assert_eq!(missing["error"]["code"], -32602, "{missing}");
    let not_mine = acp
        .call("session/load", json!({"sessionId": nobody, "cwd": "/"}))
        .await;
    assert_eq!(not_mine["error"]["code"], -32602, "{not_mine}");
    let wrong = acp.call("session/prompt", json!({"sessionId": 7})).await;
    assert_eq!(wrong["error"]["code"], -32602, "{wrong}");

    let big = "x".repeat(8000);
    acp.send_text(
        json!({"jsonrpc": "2.0", "id": 99, "method": "session/list", "params": {"pad": big}})
            .to_string(),
    )
    .await;
    let oversized = acp.ws.next().await;
    assert_eq!(oversized["error"]["code"], -32600, "{oversized}");
    assert!(oversized["error"]["message"]
        .as_str()
        .unwrap()
        .contains("4096"));

    // A response to nothing asked: ignored.
    acp.send_text(json!({"jsonrpc": "2.0", "id": 12345, "result": {}}).to_string())
        .await;
    let outside = acp
        .call(
            "session/new",
            json!({"cwd": "/nonexistent/acp-gateway-test"}),
        )
        .await;
    assert!(outside["error"]["code"].is_i64(), "{outside}");

    // Still serving.
    let session = acp.new_session().await;
    let ended = acp
        .call("session/prompt", text_prompt(&session, "hello"))
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
}

async fn the_path_names_the_agent_and_connections_per_user_are_limited(db: TestDb) {
    let mut config = Config::for_tests(
        &db,
        vec![demo_profile("demo", &[]), demo_profile("other", &[])],
    );
    config.acp_connections_per_user = 2;
    let gw = TestGateway::start_with(config).await;
    // A handshake to an agent there is none of: 404; no handshake: 400.
    let (status, _) = gw.get("/api/v1/acp/demo").await;
    assert_eq!(status, 400);
    assert_eq!(handshake_status(&gw, "/api/v1/acp/nosuch").await, Some(404));
    // Not a JSON-RPC message for the Streamable HTTP transport: 400.
    let (status, _) = gw.post("/api/v1/acp", json!({"jsonrpc": "2.0"})).await;
    assert_eq!(status, 400);
    let mut acp = Acp::connect(&gw, "/api/v1/acp/other").await;
    acp.call("initialize", json!({"protocolVersion": 1})).await;
    let session = acp.new_session().await;
    assert_eq!(gw.conversation(&session).await["agent"], "other");
    let mismatch = acp
        .call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "_meta": {"acpGateway": {"agent": "demo"}}}),
        )
        .await;
    assert!(mismatch["error"]["code"].is_i64(), "{mismatch}");

    let mut named = Acp::open(&gw).await;
    let created = named
        .call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "_meta": {"acpGateway": {"agent": "other"}}}),
        )
        .await;
    let id = created["result"]["sessionId"].as_str().unwrap();
    assert_eq!(gw.conversation(id).await["agent"], "other");

    // Two open: a third is refused before the upgrade.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = gw.url("/api/v1/acp").replacen("http://", "ws://", 1);
    assert_eq!(handshake_status(&gw, "/api/v1/acp").await, Some(429));
    drop(acp);
    // Nothing announces the slot's release: asked again until it is free.
    let mut freed = eventually(WAIT, async || {
        let request = url.clone().into_client_request().unwrap();
        tokio_tungstenite::connect_async(request).await.ok()
    })
    .await
    .expect("a closed connection frees its slot");
    let _ = freed.0.close(None).await;
    let _ = named.ws.stream.close(None).await;
    let _ = named.ws.stream.next().await;
}

/// The ACP client of the official TypeScript SDK
/// (`tests/sdk-agents/acp-client.mjs`) over its WebSocket transport, driven
/// by JSON lines; killed when dropped.
pub(crate) struct SdkClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next_id: i64,
    /// What it printed that was not the answer waited for.
    pub(crate) events: VecDeque<Value>,
}

impl SdkClient {
    fn start(gw: &TestGateway) -> SdkClient {
        SdkClient::start_at(gw, "/api/v1/acp")
    }

    /// Connected to the gateway's `path` (`/api/v1/acp` or
    /// `/api/v1/acp/{agent}`).
    pub(crate) fn start_at(gw: &TestGateway, path: &str) -> SdkClient {
        use tokio::io::AsyncBufReadExt;
        let script = sdk_agents_dir().join("acp-client.mjs");
        let url = gw.url(path).replacen("http://", "ws://", 1);
        let mut child = tokio::process::Command::new("node")
            .arg("--experimental-websocket")
            .arg(script)
            .arg(url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let stdin = child.stdin.take().unwrap();
        let stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        SdkClient {
            child,
            stdin,
            stdout,
            next_id: 1,
            events: VecDeque::new(),
        }
    }

    async fn command(&mut self, command: Value) {
        use tokio::io::AsyncWriteExt;
        let line = format!("{command}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("the SDK client prints in time")
            .unwrap()
            .expect("the SDK client runs");
        serde_json::from_str(&line).unwrap()
    }

    pub(crate) async fn send(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.command(json!({"id": id, "call": method, "params": params}))
            .await;
        id
    }

    pub(crate) async fn answer(&mut self, id: i64) -> Value {
        loop {
            let line = self.line().await;
            if line["id"] == id {
                return line;
            }
            self.events.push_back(line);
        }
    }

    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        let answer = self.answer(id).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// The first event of `kind` not taken yet; the others stay in
    /// `events`, in order.
    pub(crate) async fn event(&mut self, kind: &str) -> Value {
        if let Some(at) = self.events.iter().position(|e| e["event"] == kind) {
            return self.events.remove(at).unwrap();
        }
        loop {
            let line = self.line().await;
            if line["event"] == kind {
                return line;
            }
            self.events.push_back(line);
        }
    }

    pub(crate) async fn close(mut self) {
        self.command(json!({"close": true})).await;
        let status = tokio::time::timeout(WAIT, self.child.wait()).await;
        assert!(status.expect("the SDK client exits").unwrap().success());
    }
}

async fn an_sdk_client_works_through_the_gateway_as_through_an_agent(db: TestDb) {
    let gw = gateway(&db).await;
    let mut sdk = SdkClient::start(&gw);
    let init = sdk
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await;
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    let created = sdk
        .call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await;
    let session = created["sessionId"].as_str().unwrap().to_owned();

    // Two permission requests: the first answered from the SDK client, the
    // second over REST while the client holds it too.
    let prompt = sdk
        .send("session/prompt", text_prompt(&session, "ask 2"))
        .await;
    let first = sdk.event("permission").await;
    let option = first["params"]["options"][0]["optionId"].clone();
    sdk.command(json!({"answer": first["requestId"], "optionId": option}))
        .await;
    let second = sdk.event("permission").await;
    assert_ne!(second["requestId"], first["requestId"]);
    let id = second["params"]["_meta"]["acpGateway"]["permissionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = gw
        .post(
            &format!("/api/v1/permissions/{id}/respond"),
            json!({"option_id": option}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let withdrawn = sdk.event("cancelled").await;
    assert_eq!(withdrawn["requestId"], second["requestId"]);
    let ended = sdk.answer(prompt).await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let first_id = first["params"]["_meta"]["acpGateway"]["permissionId"]
        .as_str()
        .unwrap();
    let (_, answered) = gw.get(&format!("/api/v1/permissions/{first_id}")).await;
    assert_eq!(answered["decision"]["via"], "acp", "{answered}");
    let seen: Vec<Value> = sdk
        .events
        .drain(..)
        .filter(|e| e["event"] == "update")
        .collect();
    let seqs: Vec<i64> = seen
        .iter()
        .map(|e| e["params"]["_meta"]["acpGateway"]["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    sdk.close().await;

    // Another SDK client lists the session and loads it: the same updates.
    let mut again = SdkClient::start(&gw);
    again
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await;
    let listed = again.call("session/list", json!({})).await;
    assert_eq!(
        listed["sessions"][0]["sessionId"],
        session.as_str(),
        "{listed}"
    );
    let loaded = again
        .call(
            "session/load",
            json!({"sessionId": session, "cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await;
    assert!(loaded["_meta"]["acpGateway"]["cursor"].is_i64(), "{loaded}");
    let replayed: Vec<i64> = again
        .events
        .drain(..)
        .filter(|e| e["event"] == "update")
        .filter(|e| e["params"]["update"]["sessionUpdate"] != "user_message_chunk")
        .map(|e| e["params"]["_meta"]["acpGateway"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(replayed, seqs);
    again.close().await;
}

async fn a_request_a_policy_decides_is_never_shown_and_a_waiting_one_is_shown_on_load(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.policies = serde_json::from_value(json!([
        {"name": "no rm", "kinds": ["execute"], "commands": ["^rm\\b"], "decision": "deny"}
    ]))
    .unwrap();
    let gw = TestGateway::start_with(config).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let denied = acp
        .call(
            "session/prompt",
            text_prompt(&session, "execute rm -rf build"),
        )
        .await;
    assert!(denied["result"]["stopReason"].is_string(), "{denied}");
    let stored = gw.events(&session).await;
    assert!(stored.iter().any(|e| e["type"] == "permission_resolved"));
    assert!(
        acp.other
            .iter()
            .all(|f| f["method"] != "session/request_permission"),
        "{:?}",
        acp.other
    );

    // A request left waiting by a client that went away is shown to the
    // client that loads the session, once its history is replayed.
    let last = stored.last().unwrap()["seq"].as_i64().unwrap();
    let mut events = gw.conversation_ws(&session, last).await;
    acp.request("session/prompt", text_prompt(&session, "tool"))
        .await;
    let asked = acp
        .until_method("session/request_permission")
        .await
        .pop()
        .unwrap();
    drop(acp);
    let mut again = Acp::open(&gw).await;
    let loaded = again
        .call(
            "session/load",
            json!({"sessionId": session, "cwd": std::env::temp_dir()}),
        )
        .await;
    assert!(loaded["result"].is_object(), "{loaded}");
    let shown = again
        .until_method("session/request_permission")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        shown["params"]["_meta"]["acpGateway"]["permissionId"],
        asked["params"]["_meta"]["acpGateway"]["permissionId"]
    );
    let answer = json!({"jsonrpc": "2.0", "id": shown["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}});
    again.send_text(answer.to_string()).await;
    let turn = events.until_type("turn_ended").await;
    assert_eq!(turn.last().unwrap()["data"]["stop_reason"], "end_turn");
    let resolved = turn
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["decision"]["via"], "acp", "{resolved}");
}

async fn a_connection_acts_as_its_tokens_user_and_ends_when_the_token_is_revoked(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let gw = gateway(&db).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, bob_id) = gw.make_token(&operator, "bob", "user").await;
    let alices = gw.with_token(&alice).create("demo").await;
    assert_eq!(handshake_status(&gw, "/api/v1/acp").await, Some(401));

    let mut acp = Acp::connect(&gw, &format!("/api/v1/acp?access_token={bob}")).await;
    acp.call("initialize", json!({"protocolVersion": 1})).await;
    let listed = acp.call("session/list", json!({})).await;
    assert_eq!(listed["result"]["sessions"], json!([]), "{listed}");
    let hidden = acp
        .call("session/load", json!({"sessionId": alices, "cwd": "/"}))
        .await;
    assert_eq!(hidden["error"]["code"], -32602, "{hidden}");
    let session = acp.new_session().await;
    let (status, _) = gw
        .with_token(&bob)
        .get(&format!("/api/v1/conversations/{session}"))
        .await;
    assert_eq!(status, 200);
    let (status, _) = gw
        .with_token(&alice)
        .get(&format!("/api/v1/conversations/{session}"))
        .await;
    assert_eq!(status, 404);

    let (status, _) = gw
        .delete_as(&format!("/api/v1/tokens/{bob_id}"), Some(&operator))
        .await;
    assert_eq!(status, 204);
    let (_, code) = acp.ws.until_closed().await;
    assert_eq!(code, 1008);
}

async fn a_long_replay_and_requests_sent_meanwhile_are_all_answered(db: TestDb) {
    let gw = gateway(&db).await;
    let session = gw.create("demo").await;
    let mut events = gw.conversation_ws(&session, 0).await;
    // Updates that do not merge: 300 tool calls, each failing once its
    // request is cancelled.
    gw.prompt(&session, "parallel 300").await;
    for _ in 0..300 {
        events.until_type("permission_requested").await;
    }
    let (status, _) = gw
        .post(
            &format!("/api/v1/conversations/{session}/cancel"),
            json!({}),
        )
        .await;
    assert_eq!(status, 202);
    events.until_type("turn_ended").await;
    let stored = gw.events(&session).await;
    let updates_stored = stored
        .iter()
        .filter(|e| e["type"] == "session_update")
        .count();
    // More than the connection queues for its client at once.
    assert!(updates_stored > 300, "{updates_stored}");

    let mut acp = Acp::open(&gw).await;
    let load = acp
        .request("session/load", json!({"sessionId": session, "cwd": "/"}))
        .await;
    // Requests sent before reading anything: each answered all the same.
    let mut lists = Vec::new();
    for _ in 0..5 {
        lists.push(acp.request("session/list", json!({})).await);
    }
    for id in lists {
        let listed = acp.response(id).await;
        assert!(listed["result"]["sessions"].is_array(), "{listed}");
    }
    let loaded = acp.response(load).await;
    assert!(
        loaded["result"]["_meta"]["acpGateway"]["cursor"].is_i64(),
        "{loaded}"
    );
    let replayed = updates(&acp.other.drain(..).collect::<Vec<_>>());
    // Each stored update once, and the prompt.
    assert_eq!(replayed.len(), updates_stored + 1);
}

async fn modes_and_options_change_through_the_acp_client(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let created = acp
        .call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await;
    let result = &created["result"];
    assert_eq!(result["modes"]["currentModeId"], "default", "{created}");
    assert!(result["configOptions"].is_array(), "{created}");
    let session = result["sessionId"].as_str().unwrap().to_owned();

    let changed = acp
        .call(
            "session/set_mode",
            json!({"sessionId": session, "modeId": "plan"}),
        )
        .await;
    assert!(changed["result"].is_object(), "{changed}");
    let conversation = gw.conversation(&session).await;
    assert_eq!(conversation["modes"]["currentModeId"], "plan");

    let set = acp
        .call(
            "session/set_config_option",
            json!({"sessionId": session, "configId": "model", "value": "large"}),
        )
        .await;
    let model = set["result"]["configOptions"]
        .as_array()
        .unwrap_or_else(|| panic!("{set}"))
        .iter()
        .find(|o| o["id"] == "model")
        .unwrap()
        .clone();
    assert_eq!(model["currentValue"], "large", "{set}");

    // What the agent does not offer: the REST route's 409, as a gateway error.
    let refused = acp
        .call(
            "session/set_mode",
            json!({"sessionId": session, "modeId": "nope"}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    assert_eq!(refused["error"]["data"]["status"], 409, "{refused}");
    assert_eq!(refused["error"]["data"]["code"], "not_offered", "{refused}");
}

async fn a_client_resuming_is_shown_the_request_that_waits(db: TestDb) {
    let gw = gateway(&db).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let mut events = gw.conversation_ws(&session, 0).await;
    acp.request("session/prompt", text_prompt(&session, "tool"))
        .await;
    let asked = acp
        .until_method("session/request_permission")
        .await
        .pop()
        .unwrap();
    drop(acp);
    let mut again = Acp::open(&gw).await;
    let resumed = again
        .call("session/resume", json!({"sessionId": session, "cwd": "/"}))
        .await;
    assert!(resumed["result"].is_object(), "{resumed}");
    let shown = again
        .until_method("session/request_permission")
        .await
        .pop()
        .unwrap();
    let id = &asked["params"]["_meta"]["acpGateway"]["permissionId"];
    assert_eq!(&shown["params"]["_meta"]["acpGateway"]["permissionId"], id);
    let answer = json!({"jsonrpc": "2.0", "id": shown["id"], "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}});
    again.send_text(answer.to_string()).await;
    let turn = events.until_type("turn_ended").await;
    let resolved = turn
        .iter()
        .find(|e| e["type"] == "permission_resolved")
        .unwrap();
    assert_eq!(resolved["data"]["status"], "rejected", "{resolved}");
    // Shown once: no second request for it.
    let more = again.until_method("session/update").await;
    assert!(more
        .iter()
        .all(|f| f["method"] != "session/request_permission"));
}

async fn an_agents_question_is_never_shown_to_the_editor_as_a_permission_request(db: TestDb) {
    let gw = TestGateway::start(&db, vec![node_sdk_profile("demo")]).await;
    let mut acp = Acp::open(&gw).await;
    let session = acp.new_session().await;
    let mut events = gw.conversation_ws(&session, 0).await;
    let form = json!({"mode": "form", "message": "Go?",
        "requestedSchema": {"properties": {"go": {"type": "boolean"}}}});
    acp.request(
        "session/prompt",
        text_prompt(&session, &format!("question {form}")),
    )
    .await;
    let asked = events.until_type("question_asked").await;
    let question = asked.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    drop(acp);
    // An editor coming back is shown what waits: not the question.
    let mut again = Acp::open(&gw).await;
    let resumed = again
        .call("session/resume", json!({"sessionId": session, "cwd": "/"}))
        .await;
    assert!(resumed["result"].is_object(), "{resumed}");
    let (status, _) = gw
        .post(
            &format!("/api/v1/questions/{question}/respond"),
            json!({"action": "accept", "content": {"go": true}}),
        )
        .await;
    assert_eq!(status, 200);
    let more = again.until_method("session/update").await;
    assert!(
        more.iter()
            .all(|f| f["method"] != "session/request_permission"),
        "{more:#?}"
    );
    events.until_type("turn_ended").await;
}

backend_tests!(
    an_agents_question_is_never_shown_to_the_editor_as_a_permission_request,
    a_session_streams_its_updates_in_order_and_the_prompt_ends_with_its_stop_reason,
    a_permission_request_is_answered_from_the_acp_client,
    a_request_answered_over_rest_is_withdrawn_from_every_acp_client,
    a_prompt_sent_over_rest_reaches_the_acp_client_as_user_message_chunks,
    cancel_ends_the_running_turn_cancelled,
    load_after_a_disconnect_replays_the_history_then_goes_on_live,
    close_detaches_the_client_and_delete_closes_the_conversation,
    bad_input_gets_an_error_and_the_connection_goes_on,
    the_path_names_the_agent_and_connections_per_user_are_limited,
    an_sdk_client_works_through_the_gateway_as_through_an_agent,
    a_request_a_policy_decides_is_never_shown_and_a_waiting_one_is_shown_on_load,
    a_connection_acts_as_its_tokens_user_and_ends_when_the_token_is_revoked,
    a_long_replay_and_requests_sent_meanwhile_are_all_answered,
    modes_and_options_change_through_the_acp_client,
    a_client_resuming_is_shown_the_request_that_waits,
);
