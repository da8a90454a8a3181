//! Reference rates for the gateway's streaming figure: the same demo agent and the
//! same `long N` turn, read without the gateway.
//!
//! - [`sdk_parse_only`]: a client on the official Rust ACP SDK (`agent-client-protocol`)
//!   that parses every message and only counts the chunks: what parsing alone costs.
//! - [`agent_alone`]: a bare reader that counts lines and parses nothing: how fast the
//!   agent writes, the ceiling for any client.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest, SessionNotification,
    SessionUpdate, StopReason,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, ByteStreams, Client};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use crate::common::{demo_agent_path, WAIT};

/// The text of a `long {chunks}` turn is `w0 w1 … w{chunks-1} `: its byte length.
fn expected_text_len(chunks: usize) -> usize {
    (0..chunks).map(|i| format!("w{i} ").len()).sum()
}

/// What the SDK client saw of the turn's `agent_message_chunk` updates. Only the
/// first and last texts are kept: with the total length they check the order cheaply.
#[derive(Default)]
struct Seen {
    count: usize,
    bytes: usize,
    first: Option<String>,
    last: String,
}

impl Seen {
    fn record(&mut self, text: String) {
        self.count += 1;
        self.bytes += text.len();
        if self.first.is_none() {
            self.first = Some(text.clone());
        }
        self.last = text;
    }

    fn check(&self, chunks: usize) {
        assert_eq!(self.count, chunks, "SDK client: every chunk arrived");
        assert_eq!(
            self.bytes,
            expected_text_len(chunks),
            "SDK client: chunk text length"
        );
        if chunks > 0 {
            assert_eq!(
                self.first.as_deref(),
                Some("w0 "),
                "SDK client: first chunk"
            );
            assert_eq!(
                self.last,
                format!("w{} ", chunks - 1),
                "SDK client: last chunk"
            );
        }
    }
}

/// Seconds for one `long {chunks}` turn of the demo agent read through the ACP SDK,
/// from sending the prompt until both its response and every chunk have arrived.
///
/// Blocking: runs on its own thread with its own runtime, so it may be called from
/// inside the bench's runtime.
pub fn sdk_parse_only(chunks: usize) -> f64 {
    let run = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the SDK client")
            .block_on(sdk_turn(chunks))
    });
    run.join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

async fn sdk_turn(chunks: usize) -> f64 {
    let mut agent = tokio::process::Command::new(demo_agent_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the demo agent");
    let transport = ByteStreams::new(
        agent.stdin.take().unwrap().compat_write(),
        agent.stdout.take().unwrap().compat(),
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    // Signalled by the handler at the last chunk; a stored permit covers the case
    // where that happens before the prompt's response is awaited.
    let all_seen = Arc::new(Notify::new());
    let handler_seen = Arc::clone(&seen);
    let handler_all_seen = Arc::clone(&all_seen);

    let secs = Client
        .v1()
        .name("acp-gateway-bench")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                if let SessionUpdate::AgentMessageChunk(chunk) = notification.update {
                    let text = match chunk.content {
                        ContentBlock::Text(text) => text.text,
                        _ => String::new(),
                    };
                    let mut seen = handler_seen.lock().unwrap();
                    seen.record(text);
                    if seen.count == chunks {
                        handler_all_seen.notify_one();
                    }
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(std::env::temp_dir()))
                .block_task()
                .await?;

            let started = Instant::now();
            let response = cx
                .send_request(PromptRequest::new(
                    session.session_id,
                    vec![ContentBlock::from(format!("long {chunks}"))],
                ))
                .block_task()
                .await?;
            if chunks > 0 {
                tokio::time::timeout(WAIT, all_seen.notified())
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "SDK client: {} of {chunks} chunks after the prompt's response",
                            seen.lock().unwrap().count
                        )
                    });
            }
            let secs = started.elapsed().as_secs_f64();
            assert_eq!(response.stop_reason, StopReason::EndTurn);
            Ok(secs)
        })
        .await
        .expect("SDK client: the turn ran");

    seen.lock().unwrap().check(chunks);
    // Killing an agent that already left on end of input is harmless.
    let _ = agent.start_kill();
    agent.wait().await.expect("reap the demo agent");
    secs
}

/// Seconds for one `long {chunks}` turn of the demo agent read by a bare line counter,
/// from sending the prompt until its response line: what the agent alone can write.
/// Blocking.
pub fn agent_alone(chunks: usize) -> f64 {
    let mut agent = Command::new(demo_agent_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the demo agent");
    let mut stdin = agent.stdin.take().unwrap();
    let mut stdout = BufReader::with_capacity(1 << 20, agent.stdout.take().unwrap());
    let mut line = Vec::with_capacity(256);

    // The setup is parsed properly; only the turn is read bare.
    let mut call = |id: u64, method: &str, params: Value| -> Value {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{request}").expect("write to the demo agent");
        loop {
            line.clear();
            let read = stdout.read_until(b'\n', &mut line).expect("read the agent");
            assert!(
                read > 0,
                "the demo agent closed stdout before answering {method}"
            );
            let message: Value = serde_json::from_slice(&line).expect("a JSON-RPC line");
            if message["id"] == id {
                assert!(message["error"].is_null(), "{method} failed: {message}");
                return message["result"].clone();
            }
        }
    };
    call(
        1,
        "initialize",
        json!({
            "protocolVersion": 1,
            "clientCapabilities": {},
            "clientInfo": {"name": "acp-gateway-bench", "version": "0.1.0"},
        }),
    );
    let session = call(
        2,
        "session/new",
        json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    let session_id = session["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned();

    let started = Instant::now();
    let prompt = json!({
        "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": format!("long {chunks}")}]},
    });
    writeln!(stdin, "{prompt}").expect("write to the demo agent");
    // No chunk's text can contain this key, so its first line is the prompt's response.
    let response = memchr::memmem::Finder::new(b"\"stopReason\"");
    let mut lines = 0;
    loop {
        line.clear();
        let read = stdout.read_until(b'\n', &mut line).expect("read the agent");
        assert!(read > 0, "the demo agent closed stdout during the turn");
        if response.find(&line).is_some() {
            break;
        }
        lines += 1;
    }
    let secs = started.elapsed().as_secs_f64();

    let message: Value = serde_json::from_slice(&line).expect("the prompt's response");
    assert_eq!(message["id"], 3, "the prompt's response");
    assert_eq!(message["result"]["stopReason"], "end_turn");
    assert_eq!(lines, chunks, "bare reader: one line per chunk");
    drop(stdin);
    // Killing an agent that already left on end of input is harmless.
    let _ = agent.kill();
    agent.wait().expect("reap the demo agent");
    secs
}
