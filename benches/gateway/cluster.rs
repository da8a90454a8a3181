//! Two gateway nodes on one Postgres (`acp-gateway serve` twice): what a
//! subscriber on the node that does not run the agent gets, against one on
//! the node that does.
//!
//! - Rate: the demo agent's `long N` (BENCH_CLUSTER_CHUNKS, 200,000), timed
//!   from the prompt until each node's WebSocket has the turn's end; every
//!   chunk checked, in order, on both.
//! - Added latency: a paced turn (BENCH_CLUSTER_PACED chunks, 1,000, 2 ms
//!   apart: a few chunks a commit, so hundreds of events, each announced on
//!   its own); for each event, when the other node's socket got it minus when
//!   the owner's did.
//!
//! BENCH_CLUSTER_CHUNKS=0 skips it.

use std::collections::HashMap;
use std::time::Instant;

use futures::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::*;

pub async fn run(db: &TestDb) {
    let chunks = env_or("BENCH_CLUSTER_CHUNKS", 200_000);
    if chunks == 0 {
        return;
    }
    let paced = env_or("BENCH_CLUSTER_PACED", 1000);
    let agents = [
        demo_profile("demo", &[]),
        demo_profile("paced", &["--chunk-delay-ms", "2"]),
    ];
    let owner = GatewayProcess::start_configured(db, &agents, "info,sqlx=warn", "");
    let other = GatewayProcess::start_configured(db, &agents, "info,sqlx=warn", "");

    // The rate.
    let id = owner.create("demo").await;
    let (on_owner, on_other) = (watch(&owner, &id), watch(&other, &id));
    let (owner_rx, other_rx) = (on_owner.await, on_other.await);
    let started = Instant::now();
    let (status, body) = owner.try_prompt(&id, &format!("long {chunks}")).await;
    assert_eq!(status, 202, "{body}");
    let (a, b) = tokio::join!(owner_rx, other_rx);
    let (a, b) = (a.unwrap(), b.unwrap());
    let expected: String = (0..chunks).map(|i| format!("w{i} ")).collect();
    for (node, frames) in [("owner", &a), ("other", &b)] {
        let text = streamed_text(
            &frames.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(),
            "agent_message_chunk",
        );
        assert!(
            text == expected,
            "the {node} node's socket got every chunk, in order"
        );
    }
    let seqs =
        |f: &Vec<(Value, Instant)>| f.iter().map(|(v, _)| v["seq"].clone()).collect::<Vec<_>>();
    assert_eq!(
        seqs(&a),
        seqs(&b),
        "both sockets got the same events, in the same order"
    );
    let secs = |f: &Vec<(Value, Instant)>| (f.last().unwrap().1 - started).as_secs_f64();
    let rate = |f: &Vec<(Value, Instant)>| {
        format!(
            "{:.3} s = {:.0} chunks/s, {:.0} events/s",
            secs(f),
            chunks as f64 / secs(f),
            f.len() as f64 / secs(f)
        )
    };
    println!(
        "[postgres] two nodes: {chunks} chunks in {} events delivered to a WebSocket on the owner node in {}; on the other node in {}",
        a.len(),
        rate(&a),
        rate(&b),
    );

    // The added latency.
    let id = owner.create("paced").await;
    let (on_owner, on_other) = (watch(&owner, &id), watch(&other, &id));
    let (owner_rx, other_rx) = (on_owner.await, on_other.await);
    let (status, body) = owner.try_prompt(&id, &format!("long {paced}")).await;
    assert_eq!(status, 202, "{body}");
    let (a, b) = tokio::join!(owner_rx, other_rx);
    let (a, b) = (a.unwrap(), b.unwrap());
    let at_owner: HashMap<i64, Instant> = a
        .iter()
        .map(|(v, t)| (v["seq"].as_i64().unwrap(), *t))
        .collect();
    let mut added: Vec<f64> = b
        .iter()
        .map(|(v, t)| {
            let seen = at_owner[&v["seq"].as_i64().unwrap()];
            t.saturating_duration_since(seen).as_secs_f64() * 1000.0
                - seen.saturating_duration_since(*t).as_secs_f64() * 1000.0
        })
        .collect();
    added.sort_by(f64::total_cmp);
    let q = |q: f64| added[((q * added.len() as f64).ceil() as usize).clamp(1, added.len()) - 1];
    println!(
        "[postgres] two nodes: added delivery latency on the other node, {} events of a paced turn: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; lost 0",
        added.len(),
        q(0.5),
        q(0.99),
        added.last().unwrap(),
    );
    owner.stop();
    other.stop();
}

/// A WebSocket on the conversation from now on (connected when this
/// resolves): every event until the turn's end, with when it arrived.
async fn watch(node: &GatewayProcess, id: &str) -> tokio::task::JoinHandle<Vec<(Value, Instant)>> {
    // From the current end: what came before is not this turn's.
    let (status, events) = node
        .call(
            "GET",
            &format!("/api/v1/conversations/{id}/events?limit=1000"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let last = events["items"]
        .as_array()
        .unwrap()
        .last()
        .map_or(0, |e| e["seq"].as_i64().unwrap());
    let mut ws = node.conversation_ws(id, last).await;
    tokio::spawn(async move {
        let mut frames = Vec::new();
        loop {
            let frame = tokio::time::timeout(std::time::Duration::from_secs(120), ws.stream.next())
                .await
                .expect("events keep coming")
                .expect("the socket stays open")
                .expect("frames arrive");
            let WsMessage::Text(text) = frame else {
                continue;
            };
            let event: Value = serde_json::from_str(&text).unwrap();
            let end = event["type"] == "turn_ended";
            frames.push((event, Instant::now()));
            if end {
                return frames;
            }
        }
    })
}
