//! A gateway restarted under load (`acp-gateway serve` as a process,
//! SIGTERM with `on_shutdown = "detach"`, then a new one started): N
//! conversations with a live turn streaming (the demo agent's `slow`, a chunk
//! every 50 ms) and N with a permission request pending
//! (BENCH_RESTART_CONVERSATIONS, 50 each), every conversation watched by a
//! WebSocket that reconnects with `after` once the new gateway listens.
//!
//! - The pause each streaming conversation sees: its last event before the
//!   stop to its first after the restart (the agent's own 50 ms between
//!   chunks included), p50/p99/max.
//! - Events lost: every conversation's events are consecutive across the
//!   restart, its chunks `s0 s1 …` each there once and in order, and every
//!   pending request is still pending afterwards, answered, and ends its
//!   turn `end_turn`.
//! - The shims' cost per agent: RSS, and CPU over the run (from `/proc`;
//!   the cost per line streamed is `BENCH_ONLY=shim`'s).
//!
//! BENCH_RESTART_CONVERSATIONS=0 skips it.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::*;

pub async fn run(backend: &str, db: &TestDb) {
    let n = env_or("BENCH_RESTART_CONVERSATIONS", 50);
    if n == 0 {
        return;
    }
    let agents = [demo_profile("demo", &["--chunk-delay-ms", "0"])];
    let extra = "max_agents = 1000\nmax_agents_per_user = 1000\n\
        rate_limits = { prompts_per_minute = 1000000, connections_per_minute = 1000000, \
        conversations_per_minute = 1000000 }";
    let gw = GatewayProcess::start_configured(db, &agents, "info,sqlx=warn", extra);

    // N streaming, N asking.
    let mut streaming = Vec::new();
    for _ in 0..n {
        let id = gw.create("demo").await;
        let ws = gw.conversation_ws(&id, 0).await;
        gw.prompt(&id, "slow 1000000").await;
        streaming.push((id, watch(ws)));
    }
    let mut asking = Vec::new();
    for _ in 0..n {
        let id = gw.create("demo").await;
        let mut ws = gw.conversation_ws(&id, 0).await;
        gw.prompt(&id, "ask 1").await;
        let request = ws.until_type("permission_requested").await.pop().unwrap();
        asking.push((id, request["data"]["id"].as_str().unwrap().to_owned()));
    }
    // Every stream is live (a few chunks in).
    for (_, watched) in &streaming {
        watched.chunks_at_least(3).await;
    }

    let stopped_at = Instant::now();
    let (status, log) = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert!(status.success(), "the gateway exits 0: {log}");
    let stop_took = stopped_at.elapsed();
    let before: Vec<Vec<(Value, Instant)>> =
        futures::future::join_all(streaming.iter_mut().map(|(_, w)| w.until_closed())).await;
    let started_at = Instant::now();
    let (db_url, agents2, extra2) = (db, agents.clone(), extra.to_owned());
    let gw = GatewayProcess::start_configured(db_url, &agents2, "info,sqlx=warn", &extra2);
    let start_took = started_at.elapsed();

    // Every client reconnects at once, each from where its socket stopped.
    let reconnected: Vec<Watched> =
        futures::future::join_all(streaming.iter().zip(&before).map(|((id, _), before)| {
            let last = before.last().map_or(0, |(e, _)| e["seq"].as_i64().unwrap());
            let gw = &gw;
            async move { watch(gw.conversation_ws(id, last).await) }
        }))
        .await;
    let mut pauses = Vec::new();
    let mut lines = 0usize;
    for (((id, _), before), after) in streaming.iter().zip(&before).zip(reconnected) {
        after.chunks_at_least(3).await;
        let (status, body) = gw
            .call("POST", &format!("/api/v1/conversations/{id}/cancel"), None)
            .await;
        assert!(status < 300, "{body}");
        let after = after.until_turn_ended().await;
        let (_, first_after) = after.first().expect("events after the restart");
        let (_, last_before) = before.last().expect("events before the stop");
        pauses.push((*first_after - *last_before).as_secs_f64() * 1000.0);
        // Nothing lost, nothing twice.
        let all: Vec<Value> = before
            .iter()
            .chain(&after)
            .map(|(e, _)| e.clone())
            .collect();
        assert_consecutive(&all, 0);
        let text = streamed_text(&all, "agent_message_chunk");
        let words: Vec<&str> = text.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(*w, format!("s{i}"), "chunk {i} of {id}, once and in order");
        }
        lines += words.len();
        assert_eq!(all.last().unwrap()["type"], "turn_ended");
    }
    // Each pending request is still pending, and answered now.
    for (id, request) in &asking {
        let (_, current) = gw.get(&format!("/api/v1/permissions/{request}")).await;
        assert_eq!(current["status"], "pending", "{current}");
        let mut ws = gw.conversation_ws(id, current_seq(&gw, id).await).await;
        let (status, body) = gw
            .post(
                &format!("/api/v1/permissions/{request}/respond"),
                json!({"option_id": "allow-once"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let ended = ws.until_type("turn_ended").await.pop().unwrap();
        assert_eq!(ended["data"]["stop_reason"], "end_turn", "{ended}");
    }

    let (shims, rss_kib, pss_kib, cpu_ms) = shims_cost(db.state_dir());
    pauses.sort_by(f64::total_cmp);
    let q = |q: f64| pauses[((q * pauses.len() as f64).ceil() as usize).clamp(1, pauses.len()) - 1];
    println!(
        "[{backend}] restart (SIGTERM, detach, start) with {n} turns streaming and {n} requests pending: \
         the pause each streaming conversation saw p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms \
         (the agent's own 50 ms between chunks included; stopping took {:.0} ms, starting and \
         reattaching {:.0} ms); events lost 0, chunks twice 0, {n} requests answered after it",
        q(0.5),
        q(0.99),
        pauses.last().unwrap(),
        stop_took.as_secs_f64() * 1000.0,
        start_took.as_secs_f64() * 1000.0,
    );
    if shims > 0 {
        println!(
            "[{backend}] restart: {shims} shims, each {:.1} MiB RSS, {:.2} MiB PSS (its own share, the executable's \
             pages shared); {:.1} ms CPU each over the whole run (starting, serving two gateways, {lines} \
             chunks in all; per line: BENCH_ONLY=shim)",
            rss_kib as f64 / shims as f64 / 1024.0,
            pss_kib as f64 / shims as f64 / 1024.0,
            cpu_ms / shims as f64,
        );
    }
    drop(gw);
    kill_shims_under(db.state_dir());
}

async fn current_seq(gw: &GatewayProcess, id: &str) -> i64 {
    gw.conversation(id).await["last_seq"].as_i64().unwrap()
}

/// A WebSocket read in the background: every event with when it came.
struct Watched {
    events: tokio::sync::watch::Receiver<Vec<(Value, Instant)>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

fn watch(mut ws: Ws) -> Watched {
    let (tx, rx) = tokio::sync::watch::channel(Vec::new());
    let task = tokio::spawn(async move {
        while let Some(Ok(frame)) = ws.stream.next().await {
            match frame {
                WsMessage::Text(text) => {
                    let event: Value = serde_json::from_str(&text).unwrap();
                    let at = Instant::now();
                    tx.send_modify(|events| events.push((event, at)));
                }
                WsMessage::Close(_) => break,
                _ => {}
            }
        }
    });
    Watched {
        events: rx,
        task: Some(task),
    }
}

impl Watched {
    async fn chunks_at_least(&self, n: usize) {
        let mut events = self.events.clone();
        tokio::time::timeout(
            Duration::from_secs(120),
            events.wait_for(|e| {
                e.iter()
                    .filter(|(e, _)| e["type"] == "session_update")
                    .count()
                    >= n
            }),
        )
        .await
        .expect("the stream goes on")
        .unwrap();
    }

    async fn until_closed(&mut self) -> Vec<(Value, Instant)> {
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(120), task)
                .await
                .expect("the socket closes")
                .unwrap();
        }
        self.events.borrow().clone()
    }

    async fn until_turn_ended(mut self) -> Vec<(Value, Instant)> {
        let mut events = self.events.clone();
        tokio::time::timeout(
            Duration::from_secs(120),
            events.wait_for(|e| e.iter().any(|(e, _)| e["type"] == "turn_ended")),
        )
        .await
        .expect("the turn ends")
        .unwrap();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let events = self.events.borrow().clone();
        let end = events
            .iter()
            .position(|(e, _)| e["type"] == "turn_ended")
            .unwrap();
        events[..=end].to_vec()
    }
}

/// The shims under `dir`: how many, their RSS and their PSS in all (KiB:
/// the executable's pages count once in PSS, shared among them), their
/// CPU in all (ms).
fn shims_cost(dir: &std::path::Path) -> (usize, u64, u64, f64) {
    // SAFETY: sysconf takes an integer.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (mut shims, mut rss, mut pss, mut cpu) = (0, 0, 0, 0.0);
    for pid in shims_under(dir) {
        shims += 1;
        let kib = |file: &str, key: &str| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        rss += kib("status", "VmRSS:");
        pss += kib("smaps_rollup", "Pss:");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // utime and stime: fields 14 and 15 (the 12th and 13th after the name).
        let used: f64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
            .sum();
        cpu += used / ticks * 1000.0;
    }
    (shims, rss, pss, cpu)
}
