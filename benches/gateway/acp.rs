//! The gateway's ACP front door (`/api/v1/acp`) under the streaming load: an
//! ACP client over WebSocket (`initialize`, `session/new`, `session/prompt`)
//! counts the `session/update`s of a `long N` turn of the demo agent until it
//! has the prompt's answer and every chunk's text, checked in order. Its rate
//! is printed beside the REST + WebSocket client's (`streaming`) and the Rust
//! SDK client's reading the agent's stdio (`reference`) of the same run.

use std::time::Instant;

use serde_json::{json, Value};

use crate::common::*;
use acp_gateway::config::Config;
use futures::SinkExt;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// One ACP turn measured: seconds from sending `session/prompt` until both
/// its answer and every chunk arrived, and how many `session/update`s
/// carried the chunks (the gateway sends an event's chunks as one).
struct AcpTurn {
    secs: f64,
    updates: usize,
}

/// Sends one JSON-RPC request on `ws`.
async fn send(ws: &mut Ws, id: i64, method: &str, params: Value) {
    let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.stream
        .send(WsMessage::Text(message.to_string().into()))
        .await
        .expect("send to /api/v1/acp");
}

/// The result of request `id` (frames before it are skipped: the setup
/// sends none that matter here).
async fn result(ws: &mut Ws, id: i64) -> Value {
    loop {
        let frame = ws.next().await;
        if frame.get("method").is_none() && frame["id"] == id {
            assert!(frame["error"].is_null(), "ACP request {id} failed: {frame}");
            return frame["result"].clone();
        }
    }
}

/// A new ACP connection with its session (a new conversation of `agent`):
/// the socket and the session's id.
pub async fn open_session(gw: &TestGateway, agent: &str) -> (Ws, String) {
    let mut ws = gw.ws("/api/v1/acp").await;
    send(
        &mut ws,
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await;
    let init = result(&mut ws, 1).await;
    assert_eq!(init["protocolVersion"], 1, "{init}");
    let params = json!({
        "cwd": std::env::temp_dir(),
        "mcpServers": [],
        "_meta": {"acpGateway": {"agent": agent}},
    });
    send(&mut ws, 2, "session/new", params).await;
    let session = result(&mut ws, 2).await;
    let id = session["sessionId"]
        .as_str()
        .expect("a sessionId")
        .to_owned();
    (ws, id)
}

/// One `long {n}` turn through `/api/v1/acp`, timed and checked: every
/// byte of text, in order, and the answer `end_turn`.
async fn acp_stream_once(gw: &TestGateway, n: usize) -> AcpTurn {
    let (mut ws, session) = open_session(gw, "demo").await;
    let expected = crate::expected_text(n);
    let mut text = String::with_capacity(expected.len());
    let mut updates = 0;
    let mut answer = None;
    let started = Instant::now();
    let prompt =
        json!({"sessionId": session, "prompt": [{"type": "text", "text": format!("long {n}")}]});
    send(&mut ws, 3, "session/prompt", prompt).await;
    while answer.is_none() || text.len() < expected.len() {
        let frame = ws.next().await;
        if frame["method"] == "session/update" {
            let update = &frame["params"]["update"];
            if update["sessionUpdate"] == "agent_message_chunk" {
                updates += 1;
                text.push_str(update["content"]["text"].as_str().unwrap_or_default());
            }
        } else if frame.get("method").is_none() && frame["id"] == 3 {
            answer = Some(frame["result"]["stopReason"].clone());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(answer, Some(json!("end_turn")), "the prompt's answer");
    assert!(text == expected, "the ACP client got every chunk, in order");
    ws.close().await;
    let (status, body) = gw.delete(&format!("/api/v1/conversations/{session}")).await;
    assert_eq!(status, 204, "{body}");
    AcpTurn { secs, updates }
}

/// The `acp` scenario on `backend`: each size in `sizes` (median of
/// `runs`), with the REST + WebSocket client's rate at that size where
/// `streaming` measured it in this run (`rest`) and the SDK client's
/// (`sdk_rate` at `ref_size`).
pub async fn run(
    backend: &str,
    db: &TestDb,
    sizes: &[usize],
    rest: &[(usize, f64)],
    (ref_size, sdk_rate): (usize, f64),
) {
    let mut config = Config::for_tests(db, vec![demo_profile("demo", &[])]);
    config.rate_limits.conversations_per_minute = 1_000_000;
    config.rate_limits.connections_per_minute = 1_000_000;
    let gw = TestGateway::start_with(config).await;
    // Warm up, as `streaming` does.
    acp_stream_once(&gw, 10_000).await;
    let runs = env_or("BENCH_RUNS", 3).max(1);
    for &n in sizes {
        let mut all = Vec::new();
        for _ in 0..runs {
            all.push(acp_stream_once(&gw, n).await);
        }
        all.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        let spread: Vec<String> = all.iter().map(|r| format!("{:.3}", r.secs)).collect();
        let turn = all.swap_remove(all.len() / 2);
        let rate = n as f64 / turn.secs;
        println!(
            "[{backend}] acp    {n:>7} chunks: {:7.3} s = {rate:>7.0} chunks/s end to end to an ACP client on /api/v1/acp \
             (median of {runs}: {} s; {} session/updates)",
            turn.secs,
            spread.join(", "),
            turn.updates,
        );
        let mut beside = Vec::new();
        if let Some((_, rest_rate)) = rest.iter().find(|(size, _)| *size == n) {
            beside.push(format!(
                "REST + WebSocket client {rest_rate:.0} chunks/s (ACP {:.2}× it)",
                rate / rest_rate
            ));
        }
        if n == ref_size && sdk_rate.is_finite() {
            beside.push(format!(
                "Rust SDK client on the agent's stdio, parse only {sdk_rate:.0} chunks/s (ACP {:.2}× it)",
                rate / sdk_rate
            ));
        }
        if !beside.is_empty() {
            println!(
                "[{backend}] acp at {n} chunks, beside: {}",
                beside.join("; ")
            );
        }
    }
    gw.stop().await;
}
