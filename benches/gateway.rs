//! Throughput and footprint of the gateway, end to end: a real Postgres, real
//! demo-agent subprocesses, a real WebSocket. Prints its figures; asserts
//! nothing about speed.
//!
//! `cargo bench --bench gateway`: on SQLite, and on Postgres when the test
//! Postgres (TEST_DATABASE_URL, as for `cargo test`) answers.
//! Sizes can be changed with BENCH_CHUNKS, BENCH_STREAMS and BENCH_IDLE.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;

/// Resident memory of this process (the gateway runs in it), in KiB.
fn rss_kib() -> u64 {
    proc_status_kib("self", "VmRSS:")
}

/// One turn of `chunks` small chunks; returns (seconds, events stored).
async fn stream_once(gw: &TestGateway, chunks: usize) -> (f64, usize) {
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    ws.until_type("agent_status").await; // ready
    let started = Instant::now();
    gw.prompt(&id, &format!("long {chunks}")).await;
    let frames = ws.until_type("turn_ended").await;
    let secs = started.elapsed().as_secs_f64();
    let text = streamed_text(&frames, "agent_message_chunk");
    assert_eq!(
        text.split_whitespace().count(),
        chunks,
        "every chunk arrived"
    );
    (secs, gw.events(&id).await.len())
}

#[tokio::main]
async fn main() {
    run("sqlite", TestDb::sqlite().await).await;
    match TestDb::postgres().await {
        Some(db) => run("postgres", db).await,
        None => println!("[postgres] skipped: no Postgres at TEST_DATABASE_URL"),
    }
}

async fn run(backend: &str, db: TestDb) {
    let chunks = env_or("BENCH_CHUNKS", 20_000);
    let streams = env_or("BENCH_STREAMS", 8);
    let idle = env_or("BENCH_IDLE", 200);
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;

    // 1. One fast agent: chunks per second through agent → store → WebSocket.
    let (secs, events) = stream_once(&gw, chunks).await;
    println!(
        "[{backend}] single stream: {chunks} chunks in {secs:.3} s = {:.0} chunks/s; {events} events stored ({:.1} chunks per event)",
        chunks as f64 / secs,
        chunks as f64 / events as f64
    );

    // 2. Several fast agents at once.
    let started = Instant::now();
    let runs: Vec<_> = (0..streams).map(|_| stream_once(&gw, chunks / 4)).collect();
    let results = futures::future::join_all(runs).await;
    let secs = started.elapsed().as_secs_f64();
    let total = streams * (chunks / 4);
    let events: usize = results.iter().map(|r| r.1).sum();
    println!(
        "[{backend}] {streams} concurrent streams: {total} chunks in {secs:.3} s = {:.0} chunks/s; {events} events stored",
        total as f64 / secs
    );

    // 3. Footprint of idle conversations in the gateway process (agents are
    //    separate processes and not counted).
    let before = rss_kib();
    let started = Instant::now();
    for _ in 0..idle {
        gw.create_conversation("demo").await;
    }
    let secs = started.elapsed().as_secs_f64();
    let after = rss_kib();
    println!(
        "[{backend}] {idle} idle conversations: created in {secs:.2} s ({:.1} ms each); gateway RSS {before} KiB → {after} KiB = {:.1} KiB per conversation",
        secs * 1000.0 / idle as f64,
        (after.saturating_sub(before)) as f64 / idle as f64
    );
    gw.stop().await;
}
