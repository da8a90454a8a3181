//! The gateway as an ACP agent over Streamable HTTP (`POST`/`GET`/`DELETE`
//! `/api/v1/acp`): real HTTP against a gateway running the demo agent.
//! `initialize` opens a connection (its id in `Acp-Connection-Id`); every
//! later message is answered 202 and what answers it comes on the
//! connection's one event stream, in order; a permission request shown
//! there is answered by POSTing the response; every refusal has its
//! status; a deleted connection is gone; a stream that drops is opened
//! again with `Last-Event-ID` and misses nothing, twice nothing.

use crate::common::*;
use acp_gateway::config::Config;
use serde_json::{json, Value};

const CONNECTION: &str = "Acp-Connection-Id";

/// A POST of `body` (JSON) to `path`, on connection `conn` if given.
async fn post(gw: &Client, path: &str, conn: Option<&str>, body: Value) -> reqwest::Response {
    let mut request = gw.http.post(gw.url(path)).json(&body);
    if let Some(conn) = conn {
        request = request.header(CONNECTION, conn);
    }
    request.send().await.unwrap()
}

fn request(id: i64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// Opens a connection: `initialize`'s answer and the connection's id.
async fn initialize(gw: &TestGateway, path: &str) -> (Value, String) {
    let response = post(
        gw,
        path,
        None,
        request(0, "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(response.status(), 200);
    let conn = response.headers()[CONNECTION].to_str().unwrap().to_owned();
    (response.json().await.unwrap(), conn)
}

/// A connection's event stream, read as it comes.
struct Events {
    response: reqwest::Response,
    buffer: String,
    /// The `id` of the last event read.
    last_id: Option<u64>,
}

impl Events {
    async fn open(gw: &Client, conn: &str) -> Events {
        let response = stream_request(gw, conn, "text/event-stream").await;
        assert_eq!(response.status(), 200);
        Events::of(response)
    }

    fn of(response: reqwest::Response) -> Events {
        Events {
            response,
            buffer: String::new(),
            last_id: None,
        }
    }

    /// The next `data:` event's message; `None` once the stream ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() {
                    let id = block.lines().find_map(|l| l.strip_prefix("id:"));
                    self.last_id = id.map(|id| id.trim().parse().unwrap());
                    return Some(serde_json::from_str(&data.join("\n")).unwrap());
                }
                continue;
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("an event within WAIT")
                .unwrap()?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    async fn message(&mut self) -> Value {
        self.next().await.expect("the stream is open")
    }

    /// Messages until the response to `id` (that one last).
    async fn until_response(&mut self, id: i64) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let message = self.message().await;
            let done = message.get("method").is_none() && message["id"] == id;
            seen.push(message);
            if done {
                return seen;
            }
        }
    }
}

async fn stream_request(gw: &Client, conn: &str, accept: &str) -> reqwest::Response {
    gw.http
        .get(gw.url("/api/v1/acp"))
        .header(CONNECTION, conn)
        .header("Accept", accept)
        .send()
        .await
        .unwrap()
}

/// A stream request naming the last event a dropped stream delivered.
async fn resume_request(gw: &Client, conn: &str, last_event_id: &str) -> reqwest::Response {
    gw.http
        .get(gw.url("/api/v1/acp"))
        .header(CONNECTION, conn)
        .header("Accept", "text/event-stream")
        .header("Last-Event-ID", last_event_id)
        .send()
        .await
        .unwrap()
}

async fn gateway(db: &TestDb) -> TestGateway {
    TestGateway::start(db, vec![demo_profile("demo", &[])]).await
}

/// The session/update kinds and seqs among messages.
fn updates(messages: &[Value]) -> Vec<(String, i64)> {
    messages
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| {
            let kind = m["params"]["update"]["sessionUpdate"].as_str().unwrap();
            let seq = m["params"]["_meta"]["acpGateway"]["seq"].as_i64().unwrap();
            (kind.to_owned(), seq)
        })
        .collect()
}

async fn a_prompt_streams_on_the_get_stream_and_a_permission_is_answered_by_post(db: TestDb) {
    let gw = gateway(&db).await;
    let (init, conn) = initialize(&gw, "/api/v1/acp").await;
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    assert_eq!(init["id"], 0);
    let mut events = Events::open(&gw, &conn).await;

    let cwd = std::env::temp_dir();
    let created = post(
        &gw,
        "/api/v1/acp",
        Some(&conn),
        request(1, "session/new", json!({"cwd": cwd})),
    )
    .await;
    assert_eq!(created.status(), 202);
    let created = events.until_response(1).await;
    let session = created.last().unwrap()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(gw.conversation(&session).await["agent"], "demo");

    let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": "long 50"}]});
    let sent = gw
        .http
        .post(gw.url("/api/v1/acp"))
        .header(CONNECTION, &conn)
        // Accepted, not read: the params' sessionId counts.
        .header("Acp-Session-Id", &session)
        .json(&request(2, "session/prompt", prompt))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202);
    let turn = events.until_response(2).await;
    assert_eq!(turn.last().unwrap()["result"]["stopReason"], "end_turn");
    let seen = updates(&turn);
    assert!(!seen.is_empty());
    assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "{seen:?}");

    let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": "tool"}]});
    post(
        &gw,
        "/api/v1/acp",
        Some(&conn),
        request(3, "session/prompt", prompt),
    )
    .await;
    let asked = loop {
        let message = events.message().await;
        if message["method"] == "session/request_permission" {
            break message;
        }
    };
    assert_eq!(asked["params"]["sessionId"], session.as_str());
    let answer = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}});
    let answered = post(&gw, "/api/v1/acp", Some(&conn), answer).await;
    assert_eq!(answered.status(), 202);
    let turn = events.until_response(3).await;
    assert_eq!(turn.last().unwrap()["result"]["stopReason"], "end_turn");
    let id = asked["params"]["_meta"]["acpGateway"]["permissionId"]
        .as_str()
        .unwrap();
    let (_, permission) = gw.get(&format!("/api/v1/permissions/{id}")).await;
    assert_eq!(permission["status"], "approved", "{permission}");
    assert_eq!(permission["decision"]["via"], "acp");

    // Deleted: its stream ends, its id is gone, the conversation stays.
    let deleted = gw
        .http
        .delete(gw.url("/api/v1/acp"))
        .header(CONNECTION, &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(events.next().await.is_none());
    let after = post(
        &gw,
        "/api/v1/acp",
        Some(&conn),
        request(4, "session/list", json!({})),
    )
    .await;
    assert_eq!(after.status(), 404);
    let again = gw
        .http
        .delete(gw.url("/api/v1/acp"))
        .header(CONNECTION, &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
    let (status, _) = gw.get(&format!("/api/v1/conversations/{session}")).await;
    assert_eq!(status, 200);
}

async fn every_refusal_has_its_status_and_messages_wait_for_the_stream(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.acp_connections_per_user = 1;
    let gw = TestGateway::start_with(config).await;
    let status = |r: reqwest::Response| r.status().as_u16();
    let path = "/api/v1/acp";
    // Not JSON as its type says: 415; a batch: 501; not a message: 400.
    let plain = gw
        .http
        .post(gw.url(path))
        .header("Content-Type", "text/plain");
    let plain = plain.body(request(0, "initialize", json!({})).to_string());
    assert_eq!(status(plain.send().await.unwrap()), 415);
    let batch = json!([request(0, "initialize", json!({}))]);
    assert_eq!(status(post(&gw, path, None, batch).await), 501);
    assert_eq!(status(post(&gw, path, None, json!({"id": 1})).await), 400);
    let broken = gw
        .http
        .post(gw.url(path))
        .header("Content-Type", "application/json");
    assert_eq!(status(broken.body("{").send().await.unwrap()), 400);
    // Anything but initialize without a connection: 400; an unknown one: 404.
    let list = request(1, "session/list", json!({}));
    assert_eq!(status(post(&gw, path, None, list.clone()).await), 400);
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        status(post(&gw, path, Some(&unknown), list.clone()).await),
        404
    );
    assert_eq!(
        status(post(&gw, path, Some("not-an-id"), list.clone()).await),
        404
    );
    let (status_code, _) = gw
        .post("/api/v1/acp/nosuch", request(0, "initialize", json!({})))
        .await;
    assert_eq!(status_code, 404);

    let (_, conn) = initialize(&gw, path).await;
    // Over the per-user limit (1): 429, over HTTP as over WebSocket.
    let second = post(&gw, path, None, request(0, "initialize", json!({}))).await;
    assert_eq!(status(second), 429);
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = gw.url(path).replacen("http://", "ws://", 1);
    match tokio_tungstenite::connect_async(url.into_client_request().unwrap()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 429)
        }
        other => panic!("a WebSocket over the limit: {:?}", other.map(|_| ())),
    }

    // Answered while no stream is open: held until one opens.
    assert_eq!(
        status(post(&gw, path, Some(&conn), list.clone()).await),
        202
    );
    let bogus = request(2, "no/such", json!({}));
    assert_eq!(status(post(&gw, path, Some(&conn), bogus).await), 202);
    // A stream needs text/event-stream (406) and its connection (400, 404).
    assert_eq!(
        status(stream_request(&gw, &conn, "application/json").await),
        406
    );
    assert_eq!(
        status(stream_request(&gw, &unknown, "text/event-stream").await),
        404
    );
    let nameless = gw
        .http
        .get(gw.url(path))
        .header("Accept", "text/event-stream");
    assert_eq!(status(nameless.send().await.unwrap()), 400);
    let mut events = Events::open(&gw, &conn).await;
    // One stream per connection: a second is refused while it is open.
    assert_eq!(
        status(stream_request(&gw, &conn, "text/event-stream").await),
        409
    );
    let listed = events.message().await;
    assert_eq!(listed["id"], 1);
    assert_eq!(listed["result"]["sessions"], json!([]), "{listed}");
    let missing = events.message().await;
    assert_eq!(missing["id"], 2);
    assert_eq!(missing["error"]["code"], -32601, "{missing}");
    // The stream closed, another may open and goes on where it stopped.
    drop(events);
    let reopened = eventually(WAIT, async || {
        let response = stream_request(&gw, &conn, "text/event-stream").await;
        (response.status() == 200).then_some(response)
    })
    .await
    .expect("a closed stream frees its connection's");
    drop(reopened);
    // Without a connection id, DELETE is 400.
    let nameless = gw.http.delete(gw.url(path)).send().await.unwrap();
    assert_eq!(status(nameless), 400);
}

async fn a_connection_is_its_tokens_users_the_token_may_be_a_query_and_revoking_it_ends_it(
    db: TestDb,
) {
    let operator = cli_token(&db, "root-op", "operator");
    let gw = gateway(&db).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, bob_id) = gw.make_token(&operator, "bob", "user").await;
    let init = request(0, "initialize", json!({"protocolVersion": 1}));
    // No token: 401.
    let response = post(&gw, "/api/v1/acp", None, init.clone()).await;
    assert_eq!(response.status(), 401);
    // The token as a query parameter, as on the WebSocket.
    let url = gw.url(&format!("/api/v1/acp?access_token={bob}"));
    let response = gw.http.post(url).json(&init).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let conn = response.headers()[CONNECTION].to_str().unwrap().to_owned();
    // Another user's connection is no connection of theirs: 404.
    let list = request(1, "session/list", json!({}));
    let as_alice = gw.with_token(&alice);
    let response = post(&as_alice, "/api/v1/acp", Some(&conn), list.clone()).await;
    assert_eq!(response.status(), 404);
    let as_bob = gw.with_token(&bob);
    let response = post(&as_bob, "/api/v1/acp", Some(&conn), list.clone()).await;
    assert_eq!(response.status(), 202);
    let response = as_bob
        .http
        .delete(gw.url("/api/v1/acp"))
        .header(CONNECTION, &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);

    // A revoked token ends its connections: the stream ends.
    let response = post(&as_bob, "/api/v1/acp", None, init.clone()).await;
    let conn = response.headers()[CONNECTION].to_str().unwrap().to_owned();
    let mut events = Events::open(&as_bob, &conn).await;
    let (status, _) = gw
        .delete_as(&format!("/api/v1/tokens/{bob_id}"), Some(&operator))
        .await;
    assert_eq!(status, 204);
    assert!(events.next().await.is_none());
}

/// `Last-Event-ID` belongs to the event stream: a WebSocket handshake
/// carrying one that is not a number is refused (400), a number is ignored
/// (a WebSocket starts afresh).
async fn a_websocket_handshake_ignores_a_last_event_id_and_refuses_a_malformed_one(db: TestDb) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let gw = gateway(&db).await;
    let handshake = |last_event_id: &str| {
        let url = gw.url("/api/v1/acp").replacen("http://", "ws://", 1);
        let mut request = url.into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert("last-event-id", last_event_id.parse().unwrap());
        if let Some(token) = &gw.token {
            headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    match tokio_tungstenite::connect_async(handshake("abc")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 400)
        }
        other => panic!(
            "a malformed Last-Event-ID is refused: {:?}",
            other.map(|_| ())
        ),
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(handshake("7"))
        .await
        .expect("a number is ignored");
    ws.close(None).await.unwrap();
}

async fn an_idle_connection_is_ended_and_frees_its_place(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.acp_connections_per_user = 1;
    config.acp_http_idle_secs = 1;
    // The polls below count as connections: no rate limit is to end them.
    config.rate_limits.connections_per_minute = 100_000;
    let gw = TestGateway::start_with(config).await;
    let (_, idle) = initialize(&gw, "/api/v1/acp").await;
    // No stream and no POST: ended after acp_http_idle_secs, which frees
    // the user's one place (asked with initialize until it is free).
    let init = request(0, "initialize", json!({"protocolVersion": 1}));
    let next = eventually(WAIT, async || {
        let response = post(&gw, "/api/v1/acp", None, init.clone()).await;
        (response.status() == 200).then_some(response)
    })
    .await
    .expect("an idle connection is ended");
    assert!(next.headers().contains_key(CONNECTION));
    let list = request(1, "session/list", json!({}));
    let ended = post(&gw, "/api/v1/acp", Some(&idle), list).await;
    assert_eq!(ended.status(), 404);
}

async fn a_dropped_stream_opened_again_with_last_event_id_misses_nothing_and_repeats_nothing(
    db: TestDb,
) {
    let gw = gateway(&db).await;
    let (_, conn) = initialize(&gw, "/api/v1/acp").await;
    let mut events = Events::open(&gw, &conn).await;
    let cwd = std::env::temp_dir();
    post(
        &gw,
        "/api/v1/acp",
        Some(&conn),
        request(1, "session/new", json!({"cwd": cwd})),
    )
    .await;
    let created = events.until_response(1).await;
    let session = created.last().unwrap()["result"]["sessionId"].clone();
    assert_eq!(events.last_id, Some(1), "ids count from 1");

    // A turn of 30 chunks 50 ms apart; the stream drops after a few.
    let prompt = json!({"sessionId": session, "prompt": [{"type": "text", "text": "slow 30"}]});
    post(
        &gw,
        "/api/v1/acp",
        Some(&conn),
        request(2, "session/prompt", prompt),
    )
    .await;
    let mut seen: Vec<(u64, Value)> = Vec::new();
    while seen.len() < 5 {
        let message = events.message().await;
        seen.push((events.last_id.unwrap(), message));
    }
    let last = events.last_id.unwrap();
    drop(events);

    // Opened again while the turn goes on (409 until the gateway has seen
    // the first one go): what came after `last` first.
    let response = eventually(WAIT, async || {
        let response = resume_request(&gw, &conn, &last.to_string()).await;
        (response.status() != 409).then_some(response)
    })
    .await
    .expect("a dropped stream frees its connection's");
    assert_eq!(response.status(), 200);
    let mut events = Events::of(response);
    loop {
        let message = events.message().await;
        let done = message.get("method").is_none() && message["id"] == 2;
        seen.push((events.last_id.unwrap(), message));
        if done {
            break;
        }
    }
    let ids: Vec<u64> = seen.iter().map(|(id, _)| *id).collect();
    let expected: Vec<u64> = (2..2 + ids.len() as u64).collect();
    assert_eq!(ids, expected, "no gap, no duplicate");
    let messages: Vec<Value> = seen.into_iter().map(|(_, m)| m).collect();
    assert_eq!(messages.last().unwrap()["result"]["stopReason"], "end_turn");
    let seqs = updates(&messages);
    assert!(seqs.windows(2).all(|w| w[0].1 < w[1].1), "{seqs:?}");
    let text: String = messages
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect();
    let all: String = (0..30).map(|i| format!("s{i} ")).collect();
    assert_eq!(text, all);

    // Refused, the stream open or not: a Last-Event-ID that is no number.
    let bad = resume_request(&gw, &conn, "seven").await;
    assert_eq!(bad.status(), 400);
    let last = events.last_id.unwrap();
    drop(events);
    // An id never sent: 400.
    let never = eventually(WAIT, async || {
        let response = resume_request(&gw, &conn, &(last + 100).to_string()).await;
        (response.status() != 409).then_some(response)
    })
    .await
    .unwrap();
    assert_eq!(never.status(), 400);

    // Over a thousand events after it: those after an old id are gone,
    // and the answer says which.
    for id in 100..1101 {
        let listed = post(
            &gw,
            "/api/v1/acp",
            Some(&conn),
            request(id, "session/list", json!({})),
        );
        assert_eq!(listed.await.status(), 202);
    }
    let mut events = Events::of(resume_request(&gw, &conn, &last.to_string()).await);
    let lists = events.until_response(1100).await;
    assert_eq!(lists.len(), 1001);
    let newest = events.last_id.unwrap();
    drop(events);
    assert!(newest - last > 1000, "{last} then {newest}");
    let gone = eventually(WAIT, async || {
        let response = resume_request(&gw, &conn, &last.to_string()).await;
        let problem: Value = response.json().await.ok()?;
        (problem["code"] != "acp_stream_open").then_some(problem)
    })
    .await
    .unwrap();
    assert_eq!(gone["status"], 409, "{gone}");
    assert_eq!(gone["code"], "acp_events_gone", "{gone}");
    let detail = gone["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("events {} to", last + 1)),
        "{detail}"
    );
    // The newest are still there: an exact reconnect still works.
    let resumed = eventually(WAIT, async || {
        let response = resume_request(&gw, &conn, &(newest - 1).to_string()).await;
        (response.status() == 200).then_some(response)
    })
    .await
    .unwrap();
    let mut events = Events::of(resumed);
    let again = events.message().await;
    assert_eq!((events.last_id, &again["id"]), (Some(newest), &json!(1100)));
}

backend_tests!(
    a_dropped_stream_opened_again_with_last_event_id_misses_nothing_and_repeats_nothing,
    an_idle_connection_is_ended_and_frees_its_place,
    a_prompt_streams_on_the_get_stream_and_a_permission_is_answered_by_post,
    every_refusal_has_its_status_and_messages_wait_for_the_stream,
    a_connection_is_its_tokens_users_the_token_may_be_a_query_and_revoking_it_ends_it,
    a_websocket_handshake_ignores_a_last_event_id_and_refuses_a_malformed_one,
);
