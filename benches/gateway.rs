//! What the gateway costs, end to end: real demo-agent subprocesses, a real
//! database (SQLite, then Postgres when the test Postgres answers), real
//! WebSockets. Prints its figures; asserts nothing about speed, only that
//! what it measured is complete and in order.
//!
//! `cargo bench --bench gateway`. In one run:
//! - streaming: N small message chunks from one fast agent, timed from the
//!   prompt until a WebSocket reader has every chunk (events reach
//!   WebSockets only once committed, so that is also "persisted"), at
//!   N = 50,000, 200,000 and 800,000, with the ratio of the largest to the
//!   smallest time, and the database rows and transactions per 1,000 chunks;
//!   every byte of text is then checked, in order, on the WebSocket, in the
//!   stored events and in the stored message;
//! - the same agent's output read by a client on the official Rust ACP SDK
//!   that only parses it, and by a bare line counter (what the agent alone
//!   writes), as references for the streaming rate;
//! - acp: the same turns read by an ACP client over WebSocket at
//!   `/api/v1/acp` (`initialize`, `session/new`, `session/prompt`, every
//!   `session/update` until the prompt's answer), printed beside the
//!   streaming and reference rates of the same run (see `gateway/acp.rs`);
//! - remote: the demo agent spawned by the gateway against the same agent
//!   served over WebSocket on loopback (a profile with `url`): creating a
//!   conversation, a one-chunk turn's round trip and the streaming rate
//!   (see `gateway/remote.rs`);
//! - approvals, WebSocket fan-out, idle conversations and creating one (see
//!   `gateway/load.rs`);
//! - on Postgres, two nodes: the rate and the added latency on the node that
//!   does not run the agent (see `gateway/cluster.rs`);
//! - notifications: 200 conversations asking at once, nobody present, from a
//!   request becoming due to a webhook receiver having it (see
//!   `gateway/notify.rs`);
//! - a restart (SIGTERM and start) with 50 turns streaming and 50 requests
//!   pending: the pause each conversation sees, events lost, the shims'
//!   cost (see `gateway/restart.rs`);
//! - what a conversation's box costs at agent start: creation p50 boxed and
//!   not (see `gateway/sandbox.rs`);
//! - an agent flooding its stdout with 1 GiB of what the gateway drops:
//!   the time to the turn's end, the gateway's and the shim's peak memory
//!   (see `gateway/flood.rs`);
//! - conversations on a repository of 10,000 files: creating one and
//!   listing its changes after 100 files changed, against `git worktree
//!   add` and `git diff --stat` by hand (see `gateway/worktrees.rs`).
//!
//! Sizes: BENCH_SIZES (comma-separated chunk counts; each run BENCH_RUNS times, 3 by
//! default, and the median shown), BENCH_BACKENDS
//! (`sqlite,postgres`), and those named in `gateway/load.rs`;
//! BENCH_REFERENCE=off skips the references (to profile the gateway alone).
//! BENCH_ONLY picks scenarios (comma-separated: `reference`, `streaming`,
//! `acp`, `remote`, `approvals`, `fanout`, `idle`, `cluster`, `notifications`, `shim`,
//! `restart`, `sandbox`, `flood`, `worktrees`; all when unset), e.g. `BENCH_ONLY=notifications cargo bench --bench gateway`.

#[path = "gateway/acp.rs"]
mod acp;
#[path = "gateway/cluster.rs"]
mod cluster;
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "gateway/flood.rs"]
mod flood;
#[path = "gateway/load.rs"]
mod load;
#[path = "gateway/notify.rs"]
mod notify;
#[path = "gateway/reference.rs"]
mod reference;
#[path = "gateway/remote.rs"]
mod remote;
#[path = "gateway/restart.rs"]
mod restart;
#[path = "gateway/sandbox.rs"]
mod sandbox;
#[path = "gateway/shim.rs"]
mod shim;
#[path = "gateway/worktrees.rs"]
mod worktrees;

use std::time::Instant;

use common::*;
use serde_json::Value;

/// Whether BENCH_ONLY (comma-separated scenario names; unset: all) picks
/// scenario `name`.
pub fn selected(name: &str) -> bool {
    match std::env::var("BENCH_ONLY") {
        Ok(only) => only.split(',').any(|s| s.trim() == name),
        Err(_) => true,
    }
}

/// The text the demo agent's `long n` streams.
fn expected_text(n: usize) -> String {
    (0..n).map(|i| format!("w{i} ")).collect()
}

/// A counter's value on the gateway's `/metrics` page.
async fn counter(gw: &TestGateway, name: &str) -> f64 {
    let text = gw
        .http
        .get(gw.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Every message of a conversation, paged.
async fn all_messages(gw: &TestGateway, id: &str) -> Vec<Value> {
    let mut messages = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = gw
            .get(&format!(
                "/api/v1/conversations/{id}/messages?limit=1000{after}"
            ))
            .await;
        assert_eq!(status, 200, "{page}");
        messages.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(cursor) => after = format!("&after={cursor}"),
            None => return messages,
        }
    }
}

struct Streamed {
    secs: f64,
    events: usize,
    transactions: f64,
    rows: f64,
}

/// One turn of `n` small chunks of a conversation of `agent`, timed; then
/// checks that every byte arrived on the WebSocket and is stored, in order.
async fn stream_once(gw: &TestGateway, agent: &str, n: usize) -> Streamed {
    let id = gw.create_conversation(agent).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    ws.until_type("agent_status").await; // ready
    let transactions = counter(gw, "acp_gateway_db_transactions_total").await;
    let rows = counter(gw, "acp_gateway_db_rows_written_total").await;
    let started = Instant::now();
    gw.prompt(&id, &format!("long {n}")).await;
    let frames = ws.until_type("turn_ended").await;
    let secs = started.elapsed().as_secs_f64();
    let transactions = counter(gw, "acp_gateway_db_transactions_total").await - transactions;
    let rows = counter(gw, "acp_gateway_db_rows_written_total").await - rows;

    let expected = expected_text(n);
    let seen = streamed_text(&frames, "agent_message_chunk");
    assert!(seen == expected, "the WebSocket got every chunk, in order");
    let events = gw.events(&id).await;
    assert_consecutive(&events, 0);
    let stored = streamed_text(&events, "agent_message_chunk");
    assert!(stored == expected, "the events stored hold every chunk");
    let messages = all_messages(gw, &id).await;
    let agent: Vec<&Value> = messages.iter().filter(|m| m["role"] == "agent").collect();
    assert_eq!(agent.len(), 1, "one agent message");
    assert!(
        agent[0]["content"] == serde_json::json!([{"type": "text", "text": expected}]),
        "the message stored is the whole text"
    );
    gw.delete(&format!("/api/v1/conversations/{id}")).await;
    Streamed {
        secs,
        events: events.len(),
        transactions,
        rows,
    }
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .unwrap_or_else(|_| "50000,200000,800000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("BENCH_SIZES: numbers"))
        .collect();
    // The references, at the size the targets compare (200,000 unless
    // BENCH_SIZES says otherwise), in the same run.
    let reference_size = if sizes.contains(&200_000) {
        200_000
    } else {
        sizes[sizes.len() / 2]
    };
    let sdk_rate = if std::env::var("BENCH_REFERENCE").as_deref() == Ok("off")
        || !selected("reference")
    {
        f64::NAN
    } else {
        let alone = reference::agent_alone(reference_size);
        let sdk = reference::sdk_parse_only(reference_size);
        println!(
            "[reference] agent alone (lines counted, nothing parsed): {reference_size} chunks in {alone:.3} s = {:.0} chunks/s",
            reference_size as f64 / alone
        );
        println!(
            "[reference] Rust SDK client (agent-client-protocol), parse only: {reference_size} chunks in {sdk:.3} s = {:.0} chunks/s",
            reference_size as f64 / sdk
        );
        reference_size as f64 / sdk
    };
    let shim_lines = env_or("BENCH_SHIM_LINES", 1_000_000);
    if shim_lines > 0 && selected("shim") {
        shim::cost(shim_lines).await;
    }
    let backends = std::env::var("BENCH_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    for backend in backends.split(',') {
        let db = match backend {
            "sqlite" => TestDb::sqlite().await,
            "postgres" => match TestDb::postgres().await {
                Some(db) => db,
                None => {
                    println!("[postgres] skipped: no Postgres at TEST_DATABASE_URL");
                    continue;
                }
            },
            other => panic!("BENCH_BACKENDS: unknown backend {other}"),
        };
        let rest_rates = if selected("streaming") {
            streaming(backend, &db, &sizes, (reference_size, sdk_rate)).await
        } else {
            Vec::new()
        };
        if selected("acp") {
            acp::run(
                backend,
                &db,
                &sizes,
                &rest_rates,
                (reference_size, sdk_rate),
            )
            .await;
        }
        if selected("remote") {
            remote::run(backend, &db).await;
        }
        load::run(backend, &db).await;
        if backend == "postgres" && selected("cluster") {
            cluster::run(&db).await;
        }
        if selected("restart") {
            restart::run(backend, &db).await;
        }
        if selected("sandbox") {
            sandbox::run(backend, &db).await;
        }
        if selected("flood") {
            flood::run(backend, &db).await;
        }
        if selected("worktrees") {
            worktrees::run(backend, &db).await;
        }
        let notified = env_or("BENCH_NOTIFY_CONVERSATIONS", 200);
        if notified > 0 && selected("notifications") {
            let grace_ms = env_or("BENCH_NOTIFY_GRACE_MS", 200);
            notify::notifications(backend, &db, notified, grace_ms).await;
        }
    }
}

async fn streaming(
    backend: &str,
    db: &TestDb,
    sizes: &[usize],
    (ref_size, sdk_rate): (usize, f64),
) -> Vec<(usize, f64)> {
    // A conversation per run, all from one caller.
    let mut config = Config::for_tests(db, vec![demo_profile("demo", &[])]);
    config.rate_limits.conversations_per_minute = 1_000_000;
    let gw = TestGateway::start_with(config).await;
    // Warm up (the first agent started and the first commits cost more).
    stream_once(&gw, "demo", 10_000).await;
    let mut times = Vec::new();
    let runs = env_or("BENCH_RUNS", 3).max(1);
    for &n in sizes {
        // The median of a few runs: one run of a fraction of a second is
        // at the mercy of whatever else the machine does.
        let mut all = Vec::new();
        for _ in 0..runs {
            all.push(stream_once(&gw, "demo", n).await);
        }
        all.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        let spread: Vec<String> = all.iter().map(|r| format!("{:.3}", r.secs)).collect();
        let s = all.swap_remove(all.len() / 2);
        println!(
            "[{backend}] stream {n:>7} chunks: {:7.3} s = {:>7.0} chunks/s end to end (median of {runs}: {} s); \
             {} events, {:.0} transactions, {:.0} rows = {:.2} rows and {:.2} transactions per 1,000 chunks",
            s.secs,
            n as f64 / s.secs,
            spread.join(", "),
            s.events,
            s.transactions,
            s.rows,
            s.rows * 1000.0 / n as f64,
            s.transactions * 1000.0 / n as f64,
        );
        // (No comparison when the references were skipped.)
        if n == ref_size && sdk_rate.is_finite() {
            println!(
                "[{backend}] at {n} chunks the gateway runs at {:.1}× the Rust SDK client's parse-only rate",
                n as f64 / s.secs / sdk_rate
            );
        }
        times.push((n, s.secs));
    }
    if let (Some(&(small, t_small)), Some(&(large, t_large))) = (times.first(), times.last()) {
        if large > small {
            println!(
                "[{backend}] time({large}) / time({small}) = {:.1} (linear: {:.1})",
                t_large / t_small,
                large as f64 / small as f64
            );
        }
    }
    gw.stop().await;
    times
        .iter()
        .map(|&(n, secs)| (n, n as f64 / secs))
        .collect()
}
