//! What one long agent line costs the gateway in memory: the gateway runs as
//! its own process (`acp-gateway serve`, release build) with the demo agent;
//! the agent writes one message chunk of N bytes; a WebSocket reads it. The
//! figures are the growth of the gateway's peak resident memory (VmHWM, reset
//! before the turn) over its resident memory before the turn, as a multiple of
//! the line, and what stays resident afterwards. Prints; asserts nothing.
//!
//! `cargo bench --bench memory` (SQLite); BENCH_LINE_MB sets N (default 20).

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;

/// One turn of `big bytes` through the gateway, read over a WebSocket.
async fn big_turn(base: &str, http: &reqwest::Client, bytes: usize) {
    let conv: serde_json::Value = http
        .post(format!("{base}/api/v1/conversations"))
        .json(&serde_json::json!({"agent": "demo"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = conv["id"].as_str().unwrap();
    let url = format!("{base}/api/v1/conversations/{id}/ws").replacen("http", "ws", 1);
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(256 << 20))
        .max_frame_size(Some(256 << 20));
    let (stream, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), false)
        .await
        .unwrap();
    let mut ws = Ws { stream };
    ws.until_type("agent_status").await;
    let status = http
        .post(format!("{base}/api/v1/conversations/{id}/prompts"))
        .json(&serde_json::json!({"text": format!("big {bytes}")}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 202);
    let frames = ws.until_type("turn_ended").await;
    let text = streamed_text(&frames, "agent_message_chunk");
    assert_eq!(text.len(), bytes, "the whole line arrived");
    ws.close().await;
}

#[tokio::main]
async fn main() {
    let mb: usize = env_or("BENCH_LINE_MB", 20);
    let bytes = mb << 20;
    let db = TestDb::sqlite().await;
    let agent = profile("demo", env!("CARGO_BIN_EXE_acp-gateway"), &["demo-agent"]);
    let gw = GatewayProcess::start_configured(
        &db,
        &[agent],
        "info,tower_http=warn",
        &format!("max_line_bytes = {}", bytes + (1 << 20)),
    );
    let pid = gw.child.id();
    let http = reqwest::Client::new();
    // Warm up: the first turn allocates what every turn needs.
    big_turn(&gw.base, &http, 64 << 10).await;
    let before = proc_status_kib(pid, "VmRSS:");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    big_turn(&gw.base, &http, bytes).await;
    let peak = proc_status_kib(pid, "VmHWM:");
    let after = proc_status_kib(pid, "VmRSS:");
    let line_kib = (bytes >> 10) as f64;
    println!(
        "one {mb} MiB agent line: gateway peak RSS +{:.1} MiB ({:.1}x the line), \
         resident after the turn +{:.1} MiB ({:.2}x the line)",
        (peak.saturating_sub(before)) as f64 / 1024.0,
        peak.saturating_sub(before) as f64 / line_kib,
        after as f64 / 1024.0 - before as f64 / 1024.0,
        (after as f64 - before as f64) / line_kib,
    );
    gw.stop();
}
