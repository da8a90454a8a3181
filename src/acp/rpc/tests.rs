//! The tests of the JSON-RPC connection: a real `RpcPeer` driven over an in-memory pipe by
//! a hand-written agent, plus property tests of the line reader and the router.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::json;
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};
use tokio::task::JoinHandle;

use super::framing::{Line, LineReader};
use super::routing::{classify, Message};
use super::*;

/// What these tests' own fast path reads: the lines of method `fast`, as
/// `serde_json` writes them (their `params`), so that the hook is tried too.
#[derive(Debug)]
struct Fast(Value);

/// How a `fast` notification's line starts.
const FAST: &[u8] = br#"{"jsonrpc":"2.0","method":"fast","params":"#;

impl Inbound for Fast {
    fn read_fast(line: &[u8]) -> Option<Self> {
        let params = line.strip_prefix(FAST)?.strip_suffix(b"}")?;
        serde_json::from_slice(params).ok().map(Fast)
    }

    fn method(&self) -> &str {
        "fast"
    }
}

/// Messages as these tests read them: JSON-RPC with no protocol on top but
/// their own fast path.
type Incoming = super::Incoming<Fast>;

/// Bounds every wait, so a broken test fails instead of hanging; never a measured delay.
async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), future)
        .await
        .expect("timed out waiting for an event")
}

/// The agent's end of the connection, driven by hand.
struct Agent {
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    writer: WriteHalf<DuplexStream>,
}

impl Agent {
    async fn send(&mut self, message: Value) {
        self.send_raw(format!("{message}\n").as_bytes()).await;
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        within(self.writer.write_all(bytes)).await.unwrap();
    }

    /// The next message we wrote.
    async fn recv(&mut self) -> Value {
        let line = within(self.lines.next_line())
            .await
            .unwrap()
            .expect("the gateway closed its output");
        serde_json::from_str(&line).unwrap()
    }

    /// Asks the gateway `method`, with `id` and no parameters.
    async fn ask(&mut self, id: Value, method: &str) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}))
            .await;
    }

    /// Answers a request with `result`.
    async fn answer(&mut self, request: &Value, result: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
            .await;
    }
}

fn connect(config: RpcConfig) -> (RpcPeer, Inbox<Incoming>, Agent) {
    connect_with_pipe_capacity(config, 64 * 1024)
}

fn connect_with_pipe_capacity(
    config: RpcConfig,
    capacity: usize,
) -> (RpcPeer, Inbox<Incoming>, Agent) {
    let (ours, theirs) = tokio::io::duplex(capacity);
    let (reader, writer) = tokio::io::split(ours);
    let (peer, incoming) = RpcPeer::spawn(reader, writer, config);
    let (their_reader, their_writer) = tokio::io::split(theirs);
    let agent = Agent {
        lines: BufReader::new(their_reader).lines(),
        writer: their_writer,
    };
    (peer, incoming, agent)
}

fn spawn_request(peer: &RpcPeer, method: &str) -> JoinHandle<Result<Value, RpcError>> {
    let peer = peer.clone();
    let method = method.to_owned();
    tokio::spawn(async move { peer.request(&method, json!({"asked": method})).await })
}

/// The next message, one the fast path read as the notification it is.
async fn next_incoming(incoming: &mut Inbox<Incoming>) -> Incoming {
    match within(incoming.recv())
        .await
        .expect("incoming channel ended")
    {
        Incoming::Fast(Fast(params)) => Incoming::Notification {
            method: "fast".into(),
            params,
        },
        other => other,
    }
}

async fn next_notification(incoming: &mut Inbox<Incoming>) -> (String, Value) {
    match next_incoming(incoming).await {
        Incoming::Notification { method, params } => (method, params),
        other => panic!("expected a notification, got {other:?}"),
    }
}

async fn next_request(incoming: &mut Inbox<Incoming>) -> IncomingRequest {
    match next_incoming(incoming).await {
        Incoming::Request(request) => request,
        other => panic!("expected a request, got {other:?}"),
    }
}

fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

#[tokio::test]
async fn responses_answered_out_of_order_reach_their_own_callers() {
    let (peer, _incoming, mut agent) = connect(RpcConfig::default());
    let calls: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|method| (*method, spawn_request(&peer, method)))
        .collect();
    let mut requests = Vec::new();
    for _ in 0..3 {
        requests.push(agent.recv().await);
    }
    for request in requests.iter().rev() {
        let result = json!({"answer_to": request["method"]});
        agent.answer(request, result).await;
    }
    for (method, call) in calls {
        let result = within(call).await.unwrap().unwrap();
        assert_eq!(result, json!({"answer_to": method}));
    }
    assert_eq!(peer.pending_len(), 0);
}

#[tokio::test]
async fn the_first_request_uses_id_zero_and_its_answer_is_accepted() {
    let (peer, _incoming, mut agent) = connect(RpcConfig::default());
    let call = spawn_request(&peer, "initialize");
    let request = agent.recv().await;
    assert_eq!(
        request,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"asked": "initialize"}})
    );
    agent.answer(&request, json!({"protocolVersion": 1})).await;
    assert_eq!(
        within(call).await.unwrap().unwrap(),
        json!({"protocolVersion": 1})
    );
}

#[tokio::test]
async fn a_connection_taking_over_numbers_above_the_earlier_one_and_gets_its_answers() {
    // An earlier connection sent request 7; its answer is the first line
    // the new one reads, before anyone asks for it.
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (their_reader, mut their_writer) = tokio::io::split(theirs);
    their_writer
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"stopReason\":\"end_turn\"}}\n")
        .await
        .unwrap();
    let after = notification("session/update", json!({"n": 1}));
    their_writer
        .write_all(format!("{after}\n").as_bytes())
        .await
        .unwrap();
    let (reader, writer) = tokio::io::split(ours);
    let (peer, mut incoming) = RpcPeer::spawn(
        reader,
        writer,
        RpcConfig {
            first_request_id: 9,
            answers_awaited: vec![7],
            ..RpcConfig::default()
        },
    );
    let mut agent = Agent {
        lines: BufReader::new(their_reader).lines(),
        writer: their_writer,
    };
    // The line after the answer has come: the answer was read before
    // anyone asked for it.
    assert_eq!(next_notification(&mut incoming).await.1, json!({"n": 1}));
    let answer = within(peer.answer_to(7)).await.unwrap();
    assert_eq!(answer, json!({"stopReason": "end_turn"}));
    // Its own requests start above the earlier connection's.
    let call = spawn_request(&peer, "session/prompt");
    let request = agent.recv().await;
    assert_eq!(request["id"], 9);
    agent.answer(&request, json!({})).await;
    within(call).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_response_id_sent_back_as_a_numeric_string_is_accepted() {
    let (peer, _incoming, mut agent) = connect(RpcConfig::default());
    let first = spawn_request(&peer, "first");
    agent.recv().await;
    let second = spawn_request(&peer, "second");
    agent.recv().await;
    agent
        .send(json!({"jsonrpc": "2.0", "id": "1", "result": "second"}))
        .await;
    agent
        .send(json!({"jsonrpc": "2.0", "id": "0", "result": "first"}))
        .await;
    assert_eq!(within(first).await.unwrap().unwrap(), json!("first"));
    assert_eq!(within(second).await.unwrap().unwrap(), json!("second"));
}

#[tokio::test]
async fn incoming_request_ids_are_echoed_verbatim_as_strings_or_numbers() {
    let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
    agent.ask(json!("5f0c-uuid"), "fs/read_text_file").await;
    agent.ask(json!(0), "fs/read_text_file").await;
    let by_string = next_request(&mut incoming).await;
    assert_eq!(by_string.id, json!("5f0c-uuid"));
    assert_eq!(by_string.responder.id(), &json!("5f0c-uuid"));
    by_string.responder.respond(json!({"content": "a"}));
    let by_number = next_request(&mut incoming).await;
    by_number.responder.respond(json!({"content": "b"}));

    assert_eq!(
        agent.recv().await,
        json!({"jsonrpc": "2.0", "id": "5f0c-uuid", "result": {"content": "a"}})
    );
    assert_eq!(
        agent.recv().await,
        json!({"jsonrpc": "2.0", "id": 0, "result": {"content": "b"}})
    );
}

#[tokio::test]
async fn notifications_and_requests_are_delivered_in_arrival_order_under_backpressure() {
    // A tiny channel makes the reader wait for the receiver most of the time.
    let config = RpcConfig {
        incoming_capacity: 2,
        ..RpcConfig::default()
    };
    let (_peer, mut incoming, mut agent) = connect(config);
    for n in 0..50 {
        if n == 25 {
            agent
                .send(json!({"jsonrpc": "2.0", "id": 25, "method": "session/request_permission", "params": {"n": n}}))
                .await;
        } else {
            agent
                .send(notification("session/update", json!({"n": n})))
                .await;
        }
    }
    for n in 0..50 {
        match next_incoming(&mut incoming).await {
            Incoming::Request(request) => {
                assert_eq!(n, 25);
                assert_eq!(request.params, json!({"n": n}));
                request.responder.respond(json!({}));
            }
            Incoming::Notification { method, params } => {
                assert_eq!(method, "session/update");
                assert_eq!(params, json!({"n": n}));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn what_the_fast_path_reads_comes_in_order_with_everything_else() {
    let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
    let fast = |text: &str| notification("fast", json!({"text": text}));
    agent.send(fast("a")).await;
    agent
        .send(notification("session/update", json!({"n": 1})))
        .await;
    // Split across writes, so that it is assembled rather than read in place.
    let line = serde_json::to_vec(&fast("b")).unwrap();
    agent.send_raw(&line[..10]).await;
    agent.send_raw(&line[10..]).await;
    agent.send_raw(b"\n").await;
    for text in ["a", "", "b"] {
        match within(incoming.recv()).await.unwrap() {
            Incoming::Fast(Fast(params)) if !text.is_empty() => {
                assert_eq!(params, json!({"text": text}));
            }
            Incoming::Notification { params, .. } if text.is_empty() => {
                assert_eq!(params, json!({"n": 1}));
            }
            other => panic!("expected {text:?}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_incoming_request_can_be_answered_later_while_other_traffic_flows() {
    let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
    agent
        .send(json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission", "params": {"sessionId": "s"}}))
        .await;
    let permission = next_request(&mut incoming).await;
    assert_eq!(permission.method, "session/request_permission");

    // While the permission request waits, a whole exchange happens in both directions.
    let prompt = spawn_request(&peer, "session/prompt");
    let sent = agent.recv().await;
    assert_eq!(sent["method"], "session/prompt");
    agent
        .send(notification("session/update", json!({"chunk": 1})))
        .await;
    assert_eq!(
        next_notification(&mut incoming).await,
        ("session/update".to_owned(), json!({"chunk": 1}))
    );
    within(peer.notify("session/cancel", json!({"sessionId": "s"})))
        .await
        .unwrap();
    assert_eq!(
        agent.recv().await,
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}})
    );
    agent
        .answer(&sent, json!({"stopReason": "cancelled"}))
        .await;
    assert_eq!(
        within(prompt).await.unwrap().unwrap(),
        json!({"stopReason": "cancelled"})
    );

    // Now, much later, the held request gets its answer, with the agent's id.
    let outcome = json!({"outcome": {"outcome": "cancelled"}});
    permission.responder.respond(outcome.clone());
    assert_eq!(
        agent.recv().await,
        json!({"jsonrpc": "2.0", "id": 0, "result": outcome})
    );
}

#[tokio::test]
async fn reject_unknown_method_answers_method_not_found() {
    let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
    agent.ask(json!(3), "terminal/create").await;
    next_request(&mut incoming).await.reject_unknown_method();
    assert_eq!(
        agent.recv().await,
        json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "Method not found: terminal/create"}})
    );
}

#[tokio::test]
async fn garbage_and_invalid_shapes_are_skipped_and_later_messages_still_processed() {
    let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
    let junk: &[&[u8]] = &[
        b"Starting agent v1.2 ...\n",
        b"\xff\xfe\x00 not utf-8\n",
        b"{\"jsonrpc\": \"2.0\", \"method\": \n",
        b"[1, 2, 3]\n",
        b"42\n",
        b"\"just a string\"\n",
        b"{\"jsonrpc\": \"2.0\"}\n",
        b"{\"jsonrpc\": \"2.0\", \"method\": 5}\n",
        b"{\"jsonrpc\": \"2.0\", \"id\": {\"x\": 1}, \"method\": \"m\"}\n",
        b"{\"jsonrpc\": \"2.0\", \"id\": 0}\n",
        b"{\"jsonrpc\": \"2.0\", \"id\": 999, \"result\": {}}\n",
        b"{\"jsonrpc\": \"2.0\", \"id\": \"not ours\", \"result\": {}}\n",
        b"\n",
        b"\r\n",
        b"   \n",
    ];
    for line in junk {
        agent.send_raw(line).await;
    }
    agent
        .send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"after\",\"params\":{\"ok\":true}}\r\n")
        .await;
    assert_eq!(
        next_notification(&mut incoming).await,
        ("after".to_owned(), json!({"ok": true}))
    );

    let call = spawn_request(&peer, "still/works");
    let request = agent.recv().await;
    agent.answer(&request, json!("yes")).await;
    assert_eq!(within(call).await.unwrap().unwrap(), json!("yes"));
    assert!(!peer.is_closed());
}

/// A notification line of exactly `len` bytes.
fn notification_line_of_len(method: &str, len: usize) -> Vec<u8> {
    let empty = format!("{{\"method\":\"{method}\",\"params\":\"\"}}");
    let padding = "x".repeat(len - empty.len());
    format!("{{\"method\":\"{method}\",\"params\":\"{padding}\"}}").into_bytes()
}

#[tokio::test]
async fn a_line_longer_than_the_limit_is_discarded_and_the_next_line_processed() {
    const MAX: usize = 1024;
    let config = RpcConfig {
        max_line_bytes: MAX,
        ..RpcConfig::default()
    };
    // A small pipe means the agent's writes only go through if the reader keeps consuming.
    let (_peer, mut incoming, mut agent) = connect_with_pipe_capacity(config, 256);

    let mut fits = notification_line_of_len("fits", MAX);
    fits.push(b'\n');
    agent.send_raw(&fits).await;
    let mut one_too_many = notification_line_of_len("too/long", MAX + 1);
    one_too_many.push(b'\n');
    agent.send_raw(&one_too_many).await;
    // Ten times the limit without a newline, in chunks smaller than the pipe.
    for _ in 0..(10 * MAX / 128) {
        agent.send_raw(&[b'y'; 128]).await;
    }
    agent.send_raw(b"\n").await;
    agent.send(notification("after", json!({}))).await;

    let (method, params) = next_notification(&mut incoming).await;
    // The line of exactly the limit arrived whole.
    let line = serde_json::to_vec(&json!({"method": method, "params": params})).unwrap();
    assert_eq!(line, notification_line_of_len("fits", MAX));
    assert_eq!(
        next_notification(&mut incoming).await,
        ("after".to_owned(), json!({}))
    );
}

#[tokio::test]
async fn the_line_reader_never_holds_more_than_the_limit_while_discarding() {
    const MAX: usize = 100;
    let (reader, mut writer) = tokio::io::duplex(64);
    let feeder = tokio::spawn(async move {
        for _ in 0..(10 * MAX / 25) {
            writer.write_all(&[b'z'; 25]).await.unwrap();
        }
        writer.write_all(b"\nnext\r\nlast").await.unwrap();
        // Dropping `writer` ends the stream.
    });
    let mut lines = LineReader::new(BufReader::with_capacity(32, reader), MAX);
    // Each refill while it discards says so, with where it has got to.
    let mut skipped_to = Vec::new();
    let first = loop {
        match within(lines.next_line(<[u8]>::to_vec)).await.unwrap() {
            Some(Line::Skipping) => skipped_to.push(lines.span()),
            other => break other,
        }
    };
    assert_eq!(first, Some(Line::TooLong { len: 10 * MAX }));
    assert!(!skipped_to.is_empty());
    assert!(skipped_to.iter().all(|(start, _)| *start == 0));
    assert!(skipped_to.windows(2).all(|w| w[0].1 < w[1].1));
    assert!(skipped_to.last().unwrap().1 <= 10 * MAX as u64);
    assert_eq!(
        within(lines.next_line(<[u8]>::to_vec)).await.unwrap(),
        Some(Line::Complete(b"next\r".to_vec()))
    );
    assert_eq!(
        within(lines.next_line(<[u8]>::to_vec)).await.unwrap(),
        Some(Line::Complete(b"last".to_vec()))
    );
    assert_eq!(within(lines.next_line(<[u8]>::to_vec)).await.unwrap(), None);
    within(feeder).await.unwrap();
    assert!(lines.peak <= MAX, "buffered {} bytes", lines.peak);
}

#[tokio::test]
async fn eof_fails_every_pending_caller_at_once_and_later_calls_fail_fast() {
    let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
    let calls: Vec<_> = (0..3)
        .map(|n| spawn_request(&peer, &format!("call/{n}")))
        .collect();
    for _ in 0..3 {
        agent.recv().await;
    }
    agent.send(notification("last/words", json!({}))).await;
    within(agent.writer.shutdown()).await.unwrap();

    for call in calls {
        match within(call).await.unwrap() {
            Err(RpcError::Closed(reason)) => assert!(reason.contains("EOF"), "{reason}"),
            other => panic!("expected Closed, got {other:?}"),
        }
    }
    assert!(within(peer.closed()).await.contains("EOF"));
    assert!(peer.is_closed());
    assert_eq!(peer.pending_len(), 0);
    assert!(matches!(
        within(peer.request("after", json!({}))).await,
        Err(RpcError::Closed(_))
    ));
    assert!(matches!(
        within(peer.notify("after", json!({}))).await,
        Err(RpcError::Closed(_))
    ));
    // What was queued before the end is still delivered, then the channel ends.
    assert_eq!(next_notification(&mut incoming).await.0, "last/words");
    assert!(within(incoming.recv()).await.is_none());
    // Our writer shut down too, so the agent sees the end of its input.
    assert!(within(agent.lines.next_line()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_dropped_request_future_removes_its_pending_entry() {
    let (peer, _incoming, mut agent) = connect(RpcConfig::default());
    let mut call = Box::pin(peer.request("slow", json!({})));
    let sent = tokio::select! {
        _ = &mut call => panic!("nobody answered yet"),
        sent = agent.recv() => sent,
    };
    assert_eq!(peer.pending_len(), 1);
    drop(call);
    assert_eq!(peer.pending_len(), 0);

    // A timeout that fires behaves the same: a zero timeout polls the request once.
    let timed_out = tokio::time::timeout(Duration::ZERO, peer.request("slower", json!({}))).await;
    assert!(timed_out.is_err());
    assert_eq!(peer.pending_len(), 0);
    let sent_too = agent.recv().await;
    assert_eq!(sent_too["method"], "slower");

    // Late answers to the abandoned ids are skipped; the connection keeps working.
    agent.answer(&sent, json!("late")).await;
    agent.answer(&sent_too, json!("later")).await;
    let call = spawn_request(&peer, "next");
    let request = agent.recv().await;
    assert_eq!(request["id"], 2);
    agent.answer(&request, json!("on time")).await;
    assert_eq!(within(call).await.unwrap().unwrap(), json!("on time"));
}

#[tokio::test]
async fn a_dropped_responder_answers_internal_error() {
    let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
    agent.ask(json!(9), "fs/write_text_file").await;
    drop(next_request(&mut incoming).await);
    assert_eq!(
        agent.recv().await,
        json!({"jsonrpc": "2.0", "id": 9, "error": {"code": -32603, "message": "request dropped without an answer"}})
    );
}

#[tokio::test]
async fn a_remote_error_object_becomes_rpc_error_remote() {
    let (peer, _incoming, mut agent) = connect(RpcConfig::default());
    let call = spawn_request(&peer, "session/new");
    let request = agent.recv().await;
    agent
        .send(json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": "cwd must be absolute", "data": {"field": "cwd"}}}))
        .await;
    match within(call).await.unwrap() {
        Err(RpcError::Remote {
            code,
            message,
            data,
        }) => {
            assert_eq!(code, INVALID_PARAMS);
            assert_eq!(message, "cwd must be absolute");
            assert_eq!(data, Some(json!({"field": "cwd"})));
        }
        other => panic!("expected a remote error, got {other:?}"),
    }
}

#[tokio::test]
async fn requests_are_refused_once_the_incoming_receiver_is_dropped() {
    let (peer, incoming, mut agent) = connect(RpcConfig::default());
    drop(incoming);
    agent.send(notification("session/update", json!({}))).await;
    agent.ask(json!("r1"), "session/request_permission").await;
    let answer = agent.recv().await;
    assert_eq!(answer["id"], "r1");
    assert_eq!(answer["error"]["code"], INTERNAL_ERROR);

    // Our own requests are unaffected.
    let call = spawn_request(&peer, "session/prompt");
    let request = agent.recv().await;
    agent.answer(&request, json!("fine")).await;
    assert_eq!(within(call).await.unwrap().unwrap(), json!("fine"));
}

/// A transport whose every write fails, like the stdin of an agent that exited.
struct BrokenPipe;

impl AsyncWrite for BrokenPipe {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "agent stdin closed",
        )))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_failed_write_closes_the_connection() {
    let (ours, _theirs) = tokio::io::duplex(1024);
    let (peer, mut incoming) = RpcPeer::spawn::<Fast>(ours, BrokenPipe, RpcConfig::default());
    match within(peer.request("initialize", json!({}))).await {
        Err(RpcError::Closed(reason)) => assert!(reason.contains("write failed"), "{reason}"),
        other => panic!("expected Closed, got {other:?}"),
    }
    assert!(within(peer.closed()).await.contains("agent stdin closed"));
    // The reader stops too, although its side of the pipe is still open.
    assert!(within(incoming.recv()).await.is_none());
}

#[tokio::test]
async fn close_fails_pending_callers_and_ends_the_agents_input() {
    let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
    let call = spawn_request(&peer, "session/prompt");
    agent.recv().await;
    peer.close("conversation deleted");
    match within(call).await.unwrap() {
        Err(RpcError::Closed(reason)) => assert_eq!(reason, "conversation deleted"),
        other => panic!("expected Closed, got {other:?}"),
    }
    assert_eq!(within(peer.closed()).await, "conversation deleted");
    assert!(within(agent.lines.next_line()).await.unwrap().is_none());
    assert!(within(incoming.recv()).await.is_none());
}

#[test]
fn classify_tells_the_three_kinds_of_message_apart() {
    let parse = |value: Value| match value {
        Value::Object(object) => classify(object),
        _ => unreachable!(),
    };
    assert!(matches!(
        parse(json!({"id": null, "method": "m"})),
        Ok(Message::Notification {
            params: Value::Null,
            ..
        })
    ));
    assert!(matches!(
        parse(json!({"id": "x", "method": "m", "params": [1]})),
        Ok(Message::Request { .. })
    ));
    assert!(matches!(
        parse(json!({"id": 1, "result": 2, "error": null})),
        Ok(Message::Response { outcome: Ok(_), .. })
    ));
    assert!(matches!(
        parse(json!({"id": 1, "error": "boom"})),
        Ok(Message::Response {
            outcome: Err(RpcError::Remote {
                code: INTERNAL_ERROR,
                ..
            }),
            ..
        })
    ));
    assert!(parse(json!({"id": 1, "error": null})).is_err());
    assert!(parse(json!({"id": true, "result": 1})).is_err());
}
/// Property tests (a bounded fuzzer): `PROPTEST_CASES` raises the number
/// of cases; `scripts/fuzz` runs them for longer.
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Lines as an agent might write them: JSON-RPC-ish fragments glued
    /// together, or any bytes at all (never a newline: that ends a line).
    fn agent_line() -> impl Strategy<Value = Vec<u8>> {
        let fragment = prop_oneof![
            Just(r#"{"jsonrpc":"2.0","#.to_owned()),
            Just(r#""id":"#.to_owned()),
            Just(r#""method":"session/update","#.to_owned()),
            Just(r#""method":"session/request_permission","#.to_owned()),
            Just(r#""params":{"update":{"sessionUpdate":"agent_message_chunk"}}"#.to_owned()),
            Just(r#"{"jsonrpc":"2.0","method":"fast","params":"#.to_owned()),
            Just(r#""result":{"stopReason":"end_turn"}"#.to_owned()),
            Just(r#""error":{"code":-32603,"message":"x"}"#.to_owned()),
            Just(r#""\u0000\ud800""#.to_owned()),
            Just("0".to_owned()),
            Just("-1e999".to_owned()),
            Just("null".to_owned()),
            Just("[".to_owned()),
            Just("]".to_owned()),
            Just("}".to_owned()),
            Just(",".to_owned()),
            "[ -~]{0,12}",
        ];
        prop_oneof![
            proptest::collection::vec(fragment, 0..12).prop_map(|f| f.concat().into_bytes()),
            proptest::collection::vec(
                any::<u8>().prop_filter("no newline", |b| *b != b'\n'),
                0..200
            ),
        ]
    }

    proptest! {
        /// Whatever the stream and however it is cut into reads, the
        /// reader yields exactly its lines, longer ones as `TooLong`, and
        /// never holds more than the limit.
        #[test]
        fn the_line_reader_yields_every_line_and_never_holds_more_than_the_limit(
            input in proptest::collection::vec(prop_oneof![any::<u8>(), Just(b'\n')], 0..2000),
            read_size in 1usize..64,
            max in 1usize..300,
        ) {
            let mut parts: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
            let last = parts.pop().unwrap_or_default();
            if !last.is_empty() {
                parts.push(last);
            }
            let expected: Vec<Line<Vec<u8>>> = parts
                .into_iter()
                .map(|part| {
                    if part.len() > max {
                        Line::TooLong { len: part.len() }
                    } else {
                        Line::Complete(part.to_vec())
                    }
                })
                .collect();
            let (got, peak) = runtime().block_on(async {
                let mut lines =
                    LineReader::new(BufReader::with_capacity(read_size, &input[..]), max);
                let mut got = Vec::new();
                while let Some(line) = lines.next_line(<[u8]>::to_vec).await.unwrap() {
                    if line != Line::Skipping {
                        got.push(line);
                    }
                }
                (got, lines.peak)
            });
            prop_assert_eq!(got, expected);
            prop_assert!(peak <= max);
        }

        /// No line an agent writes stops the connection or panics: what
        /// follows it is still delivered.
        #[test]
        fn any_agent_output_is_routed_or_skipped_and_the_connection_goes_on(
            lines in proptest::collection::vec(agent_line(), 0..20),
        ) {
            runtime().block_on(async {
                let config = RpcConfig { max_line_bytes: 150, ..RpcConfig::default() };
                let (_peer, mut incoming, mut agent) = connect(config);
                for line in &lines {
                    agent.send_raw(line).await;
                    agent.send_raw(b"\n").await;
                }
                agent.send(notification("done", json!({}))).await;
                loop {
                    match next_incoming(&mut incoming).await {
                        Incoming::Notification { method, .. } if method == "done" => break,
                        // Requests among the noise are dropped: answered -32603.
                        _ => continue,
                    }
                }
            });
        }
    }
}

/// The bytes of `message` as the agent sends it (a line).
fn line_len(message: &Value) -> u64 {
    format!("{message}\n").len() as u64
}

#[tokio::test]
async fn the_stream_is_processed_only_as_far_as_what_was_handed_on_is_done_with() {
    let start = 1_000;
    let config = RpcConfig {
        start_position: start,
        ..RpcConfig::default()
    };
    let (peer, mut incoming, mut agent) = connect(config);
    assert_eq!(
        peer.processed_to(),
        start,
        "a stream joined part way through"
    );
    let first = notification("session/update", json!({"n": 1}));
    let second = notification("session/update", json!({"n": 2}));
    agent.send(first.clone()).await;
    agent.send(second.clone()).await;
    let _ = next_notification(&mut incoming).await;
    assert_eq!(peer.processed_to(), start, "taken, not yet done with");
    incoming.done();
    assert_eq!(peer.processed_to(), start + line_len(&first));
    // Asking for the next says the one before is done with.
    let _ = next_notification(&mut incoming).await;
    let _ = next_notification_or_none(&mut incoming).await;
    let after_two = start + line_len(&first) + line_len(&second);
    assert_eq!(peer.processed_to(), after_two);

    // Garbage needs nothing: it counts as processed once read past.
    agent.send_raw(b"not json\n").await;
    // An answer counts once its caller has it, even when a later line is
    // done with first.
    let mut call = Box::pin(peer.request("session/prompt", json!({})));
    assert!(futures::poll!(&mut call).is_pending(), "sent, not answered");
    let request = agent.recv().await;
    let answer =
        json!({"jsonrpc": "2.0", "id": request["id"], "result": {"stopReason": "end_turn"}});
    let third = notification("session/update", json!({"n": 3}));
    agent.send(answer.clone()).await;
    agent.send(third.clone()).await;
    let _ = next_notification(&mut incoming).await;
    incoming.done();
    let answer_at = after_two + b"not json\n".len() as u64;
    assert_eq!(
        peer.processed_to(),
        answer_at,
        "the answer is not yet taken"
    );
    assert_eq!(within(call).await.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        peer.processed_to(),
        answer_at + line_len(&answer) + line_len(&third)
    );
}

/// Asks for the next message without expecting one: the one in hand is
/// done with.
async fn next_notification_or_none(incoming: &mut Inbox<Incoming>) -> Option<Incoming> {
    incoming.try_recv().ok()
}

#[tokio::test]
async fn a_held_answer_is_done_with_only_once_taken_and_released() {
    let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
    let id = peer.reserve_id();
    let hold = peer.hold_answer(id);
    let mut call = Box::pin(peer.request_as(id, "session/prompt", json!({})));
    assert!(futures::poll!(&mut call).is_pending(), "sent, not answered");
    let request = agent.recv().await;
    let answer =
        json!({"jsonrpc": "2.0", "id": request["id"], "result": {"stopReason": "end_turn"}});
    agent.send(answer.clone()).await;
    assert_eq!(within(call).await.unwrap()["stopReason"], "end_turn");
    assert_eq!(peer.processed_to(), 0, "taken, but held");
    drop(hold);
    assert_eq!(peer.processed_to(), line_len(&answer), "released");

    // Released before its answer came (its caller gave up): nothing stays
    // held, and the late answer is read past.
    let id = peer.reserve_id();
    let hold = peer.hold_answer(id);
    let mut call = Box::pin(peer.request_as(id, "session/prompt", json!({})));
    assert!(futures::poll!(&mut call).is_pending());
    let request = agent.recv().await;
    drop(call);
    drop(hold);
    let late = json!({"jsonrpc": "2.0", "id": request["id"], "result": {}});
    let after = notification("session/update", json!({"n": 1}));
    agent.send(late.clone()).await;
    agent.send(after.clone()).await;
    let _ = next_notification(&mut incoming).await;
    incoming.done();
    assert_eq!(
        peer.processed_to(),
        line_len(&answer) + line_len(&late) + line_len(&after)
    );
}

#[tokio::test]
async fn what_the_reader_drops_moves_the_stream_on_and_says_so_even_inside_a_long_line() {
    const MAX: usize = 1024;
    let config = RpcConfig {
        max_line_bytes: MAX,
        ..RpcConfig::default()
    };
    let (peer, mut incoming, mut agent) = connect(config);
    // A garbage line: processed once read past, and said.
    agent.send_raw(b"not json\n").await;
    within(peer.moved_on()).await;
    assert_eq!(peer.processed().to, 9);
    // An answer nobody waits for: the same.
    let stray = json!({"jsonrpc": "2.0", "id": 77, "result": {}});
    agent.send(stray.clone()).await;
    within(peer.moved_on()).await;
    let after_stray = 9 + line_len(&stray);
    assert_eq!(peer.processed().to, after_stray);
    // A line far over the limit, not ended yet: what went by is dealt with,
    // inside the line, long before its end comes.
    agent.send_raw(&vec![b'x'; 100 * MAX]).await;
    let inside = loop {
        within(peer.moved_on()).await;
        let at = peer.processed();
        if at.to >= after_stray + 50 * MAX as u64 {
            break at;
        }
    };
    assert!(inside.inside_long_line, "{inside:?}");
    agent.send_raw(b"xx\n").await;
    let next = notification("session/update", json!({"n": 1}));
    agent.send(next.clone()).await;
    let _ = next_notification(&mut incoming).await;
    incoming.done();
    let end = after_stray + 100 * MAX as u64 + 3 + line_len(&next);
    assert_eq!(
        peer.processed(),
        Processed {
            to: end,
            inside_long_line: false
        }
    );
}

#[tokio::test]
async fn a_reader_joining_inside_a_long_line_drops_the_rest_of_it() {
    let config = RpcConfig {
        start_position: 5_000,
        start_inside_long_line: true,
        ..RpcConfig::default()
    };
    let (peer, mut incoming, mut agent) = connect(config);
    assert!(peer.processed().inside_long_line);
    // The tail of the line it joined looks like a message: it is not one.
    let tail = notification("session/update", json!({"tail": true}));
    agent.send(tail.clone()).await;
    let next = notification("session/update", json!({"n": 1}));
    agent.send(next.clone()).await;
    let (_, params) = next_notification(&mut incoming).await;
    assert_eq!(params["n"], 1);
    incoming.done();
    assert_eq!(
        peer.processed(),
        Processed {
            to: 5_000 + line_len(&tail) + line_len(&next),
            inside_long_line: false
        }
    );
}
