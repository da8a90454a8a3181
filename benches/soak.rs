//! A soak run of a real gateway process on loopback: many conversations
//! playing random demo-agent scenarios, answering and cancelling, their
//! WebSockets reconnecting, their agents killed, idle-stopped and resumed,
//! and the gateway itself stopped (SIGTERM) or killed (SIGKILL) and started
//! again between rounds. At the end it checks and prints the invariants:
//! - every conversation's `seq` runs 1..=last_seq with no gap, and every
//!   client saw each event once, in order, across reconnects;
//! - every permission request ended with an honest status, announced once;
//! - every turn that started ended;
//! - no agent process is left, and none is on record;
//! - the gateway's memory stays flat while the load runs.
//!
//! `scripts/soak [SECONDS]` (default 60). Bounded in time and in count;
//! SQLite, or Postgres when SOAK_POSTGRES=1 and the test Postgres answers.
//! Exits non-zero when an invariant does not hold.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;

const WORKERS: usize = 12;
const SCENARIOS: &[&str] = &[
    "hello",
    "tool",
    "parallel 3",
    "plan",
    "long 300",
    "slow 10",
    "crash",
    "garbage",
    "unknown",
    "withdraw",
    "hang",
    "error",
    "refuse",
    "stderr",
    "execute ls",
];

/// xorshift: enough randomness for choosing, and a seed to replay a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A gateway process on a fixed loopback port.
struct Gateway {
    child: Child,
}

impl Gateway {
    fn start(config: &std::path::Path) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
            .args(["serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "warn,acp_gateway::app=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start acp-gateway");
        // It says when it listens; the rest of its log is not needed.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line.contains("acp-gateway listening") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
            }
        });
        rx.recv_timeout(WAIT).expect("the gateway listens");
        Gateway { child }
    }

    fn rss_kib(&self) -> u64 {
        proc_status_kib(self.child.id(), "VmRSS:")
    }

    /// SIGTERM (graceful) or SIGKILL (a crash); waits until it is gone.
    fn stop(mut self, crash: bool) -> std::process::ExitStatus {
        let signal = if crash { libc::SIGKILL } else { libc::SIGTERM };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.child.wait().unwrap()
    }
}

#[derive(Default)]
struct Counts {
    prompts: AtomicU64,
    answers: AtomicU64,
    cancels: AtomicU64,
    reconnects: AtomicU64,
    agent_kills: AtomicU64,
    errors: AtomicU64,
    frames: AtomicU64,
    order_violations: AtomicU64,
}

/// One conversation driven until `until`: random prompts, answers, cancels,
/// reconnects and agent kills. Every frame it reads must follow the last.
async fn worker(
    base: String,
    conversation: String,
    seed: u64,
    until: Instant,
    db_url: String,
    counts: Arc<Counts>,
    last_seq: &mut i64,
) {
    let http = reqwest::Client::new();
    let mut rng = Rng(seed | 1);
    let ws_url = |after: i64| {
        format!("{base}/api/v1/conversations/{conversation}/ws?after={after}")
            .replacen("http://", "ws://", 1)
    };
    let mut ws = None;
    while Instant::now() < until {
        if ws.is_none() {
            match tokio_tungstenite::connect_async(ws_url(*last_seq)).await {
                Ok((stream, _)) => ws = Some(stream),
                Err(_) => {
                    // The gateway is restarting: try again shortly.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let scenario = SCENARIOS[rng.below(SCENARIOS.len())];
        let sent = http
            .post(format!(
                "{base}/api/v1/conversations/{conversation}/prompts"
            ))
            .json(&json!({"text": scenario}))
            .send()
            .await;
        let (status, body) = match sent {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => {
                ws = None;
                continue;
            }
        };
        counts.prompts.fetch_add(1, Ordering::Relaxed);
        if status != 202 {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            if std::env::var_os("SOAK_DEBUG").is_some() {
                eprintln!("{conversation}: {scenario} -> {status} {body}");
            }
            let _ = http
                .post(format!("{base}/api/v1/conversations/{conversation}/cancel"))
                .send()
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let turn_id: Value =
            serde_json::from_str::<Value>(&body).unwrap_or_default()["turn_id"].clone();
        // Read the turn to its end (or until the socket breaks).
        let turn_deadline = Instant::now() + Duration::from_secs(10);
        let stream = ws.as_mut().unwrap();
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
            let text = match frame {
                Ok(Some(Ok(WsMessage::Text(text)))) => text,
                Ok(Some(Ok(_))) => continue,
                Ok(_) => {
                    ws = None;
                    break;
                }
                Err(_) if scenario == "hang" || Instant::now() > turn_deadline => {
                    counts.cancels.fetch_add(1, Ordering::Relaxed);
                    let _ = http
                        .post(format!("{base}/api/v1/conversations/{conversation}/cancel"))
                        .send()
                        .await;
                    continue;
                }
                Err(_) => continue,
            };
            let event: Value = serde_json::from_str(&text).unwrap();
            counts.frames.fetch_add(1, Ordering::Relaxed);
            let seq = event["seq"].as_i64().unwrap();
            if seq != *last_seq + 1 {
                counts.order_violations.fetch_add(1, Ordering::Relaxed);
                eprintln!("{conversation}: seq {seq} after {last_seq}");
            }
            *last_seq = seq;
            match event["type"].as_str().unwrap() {
                "permission_requested" => {
                    let id = event["data"]["id"].as_str().unwrap().to_owned();
                    let body = match rng.below(4) {
                        0 => json!({"option_id": "allow-once"}),
                        1 => json!({"option_id": "reject-once"}),
                        2 => json!({"option_id": "allow-always"}),
                        _ => json!({"outcome": "cancelled"}),
                    };
                    counts.answers.fetch_add(1, Ordering::Relaxed);
                    let _ = http
                        .post(format!("{base}/api/v1/permissions/{id}/respond"))
                        .json(&body)
                        .send()
                        .await;
                }
                "turn_ended" if event["data"]["turn_id"] == turn_id => break,
                _ => {}
            }
            if scenario == "hang"
                && event["type"] == "turn_started"
                && event["data"]["turn_id"] == turn_id
            {
                counts.cancels.fetch_add(1, Ordering::Relaxed);
                let _ = http
                    .post(format!("{base}/api/v1/conversations/{conversation}/cancel"))
                    .send()
                    .await;
            }
        }
        // Now and then the phone drops its connection and comes back.
        if rng.chance(15) {
            ws = None;
            counts.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        // Now and then the agent is killed between turns.
        if rng.chance(5) {
            if let Ok(store) = acp_gateway::store::open(&db_url).await {
                let records = store.list_agent_processes().await.unwrap_or_default();
                if let Some(r) = records
                    .iter()
                    .find(|r| r.conversation_id.to_string() == conversation)
                {
                    // SAFETY: kill(2); the record names a live agent of ours.
                    unsafe { libc::kill(r.pid, libc::SIGKILL) };
                    counts.agent_kills.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let seconds: u64 = env_or("SOAK_SECONDS", 60);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let db = match std::env::var("SOAK_POSTGRES").as_deref() {
        Ok("1") => TestDb::postgres().await.expect("the test Postgres"),
        _ => TestDb::sqlite().await,
    };
    let workdir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = workdir.path().join("soak.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndatabase_url = {:?}\nshutdown_timeout = \"2s\"\n\
             max_agents = 100000\nmax_agents_per_user = 100000\n\
             rate_limits = {{ prompts_per_minute = 1000000, connections_per_minute = 1000000, \
             conversations_per_minute = 1000000 }}\n\
             [[agents]]\nname = \"demo\"\ncommand = {:?}\nargs = [\"--chunk-delay-ms\", \"2\"]\n\
             cwd = {:?}\nidle_timeout = \"2s\"\npermission_timeout = \"4s\"\n",
            db.url,
            demo_agent_path(),
            workdir.path(),
        ),
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    println!(
        "soak: {seconds} s, {WORKERS} conversations, seed {seed}, {}",
        if db.url.starts_with("sqlite") {
            "SQLite"
        } else {
            "Postgres"
        }
    );

    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let rounds = 4u32;
    let counts = Arc::new(Counts::default());
    let mut gateway = Some(Gateway::start(&config));
    let http = reqwest::Client::new();
    let mut conversations = Vec::new();
    for _ in 0..WORKERS {
        let created: Value = http
            .post(format!("{base}/api/v1/conversations"))
            .json(&json!({"agent": "demo"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        conversations.push((created["id"].as_str().unwrap().to_owned(), 0i64));
    }
    let mut rss_rounds: Vec<Vec<u64>> = Vec::new();
    let mut stops = Vec::new();
    for round in 0..rounds {
        let round_end = started + (end - started) * (round + 1) / rounds;
        let mut tasks = Vec::new();
        for (i, (id, last)) in conversations.drain(..).enumerate() {
            let (base, db_url, counts) = (base.clone(), db.url.clone(), counts.clone());
            let worker_seed = seed ^ ((round as u64) << 32) ^ (i as u64 + 1).wrapping_mul(0x9E37);
            tasks.push(tokio::spawn(async move {
                let mut last = last;
                worker(
                    base,
                    id.clone(),
                    worker_seed,
                    round_end,
                    db_url,
                    counts,
                    &mut last,
                )
                .await;
                (id, last)
            }));
        }
        // Memory while the load runs.
        let mut samples = Vec::new();
        let running = gateway.take().expect("a gateway runs this round");
        while Instant::now() < round_end {
            samples.push(running.rss_kib());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Rounds end mid-flight: gracefully, or as a crash, in turn.
        let crash = round % 2 == 1 && round + 1 < rounds;
        let status = running.stop(crash);
        stops.push((if crash { "SIGKILL" } else { "SIGTERM" }, status));
        for task in tasks {
            conversations.push(task.await.unwrap());
        }
        rss_rounds.push(samples);
        if round + 1 < rounds {
            gateway = Some(Gateway::start(&config));
        }
    }

    // The invariants, read from the database the gateway left.
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let mut failures = Vec::new();
    let mut events_total = 0;
    let mut statuses: HashMap<String, usize> = HashMap::new();
    let mut turns = (0, 0);
    for (id, seen) in &conversations {
        let uuid: uuid::Uuid = id.parse().unwrap();
        let conversation = store.get_conversation(uuid).await.unwrap().unwrap();
        let events = store.list_events(uuid, 0, 1_000_000).await.unwrap();
        events_total += events.len();
        let contiguous = events
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as i64 + 1);
        if !contiguous || events.len() as i64 != conversation.last_seq {
            failures.push(format!("{id}: seq is not 1..={}", conversation.last_seq));
        }
        if *seen > conversation.last_seq {
            failures.push(format!("{id}: a client saw seq {seen} beyond the log"));
        }
        let requests = store
            .list_permissions(&acp_gateway::store::PermissionFilter {
                pending_only: false,
                conversation_id: Some(uuid),
                owner: None,
                kind: None,
            })
            .await
            .unwrap();
        for request in &requests {
            *statuses.entry(request.status.as_str().into()).or_default() += 1;
            let announced = |kind: &str| {
                events
                    .iter()
                    .filter(|e| e.body.kind() == kind && e.data_value()["id"] == json!(request.id))
                    .collect::<Vec<_>>()
            };
            let resolved = announced("permission_resolved");
            if request.status == acp_gateway::model::PermissionStatus::Pending {
                failures.push(format!("{id}: request {} still pending", request.id));
            } else if announced("permission_requested").len() != 1 || resolved.len() != 1 {
                failures.push(format!("{id}: request {} not announced once", request.id));
            } else if resolved[0].data_value()["status"] != json!(request.status.as_str()) {
                failures.push(format!("{id}: request {} resolved twice over", request.id));
            }
        }
        let started_turns = events
            .iter()
            .filter(|e| e.body.kind() == "turn_started")
            .count();
        let ended_turns = events
            .iter()
            .filter(|e| e.body.kind() == "turn_ended")
            .count();
        turns.0 += started_turns;
        turns.1 += ended_turns;
        if started_turns != ended_turns {
            failures.push(format!(
                "{id}: {started_turns} turns started, {ended_turns} ended"
            ));
        }
    }
    let on_record = store.list_agent_processes().await.unwrap().len();
    let agent_path = demo_agent_path();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(agent_path))
        })
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|p| p == workdir.path())
        })
        .map(|pid| pid.to_string())
        .collect();
    if on_record != 0 || !left.is_empty() {
        failures.push(format!(
            "agents left: {} on record, running: {left:?}",
            on_record
        ));
    }
    if counts.order_violations.load(Ordering::Relaxed) != 0 {
        failures.push("a client saw an event out of order or twice".into());
    }
    // Flat: in every round, once warmed up (the first third starts the
    // agents), the last third's peak within 25% (+4 MiB) of the middle's.
    let mut memory = Vec::new();
    for (round, samples) in rss_rounds.iter().enumerate() {
        let third = (samples.len() / 3).max(1);
        let early = samples
            .iter()
            .skip(third)
            .take(third)
            .max()
            .copied()
            .unwrap_or(0);
        let late = samples.iter().rev().take(third).max().copied().unwrap_or(0);
        memory.push(format!("round {}: {} → {} KiB", round + 1, early, late));
        if late > early + early / 4 + 4096 {
            failures.push(format!(
                "round {}: gateway memory grew from {early} to {late} KiB",
                round + 1
            ));
        }
    }

    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "load: {} prompts, {} permission answers, {} cancels, {} WebSocket reconnects, \
         {} agents killed, {} prompts refused while restarting",
        c(&counts.prompts),
        c(&counts.answers),
        c(&counts.cancels),
        c(&counts.reconnects),
        c(&counts.agent_kills),
        c(&counts.errors)
    );
    println!(
        "gateway stops: {}",
        stops
            .iter()
            .map(|(how, status)| format!("{how} → {status}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "seq: {} conversations, {events_total} events, contiguous 1..=last_seq: {}",
        conversations.len(),
        !failures.iter().any(|f| f.contains("seq"))
    );
    println!(
        "clients: {} frames read live, in order and once: {}",
        c(&counts.frames),
        c(&counts.order_violations) == 0
    );
    let mut statuses: Vec<_> = statuses.into_iter().collect();
    statuses.sort();
    println!("permission requests by final status: {statuses:?}");
    println!("turns: {} started, {} ended", turns.0, turns.1);
    println!(
        "agent processes left: {on_record} on record, {} running",
        left.len()
    );
    println!(
        "gateway memory (peak of the middle → last third of each round): {}",
        memory.join("; ")
    );
    if failures.is_empty() {
        println!("all invariants hold");
    } else {
        for f in &failures {
            println!("FAILED: {f}");
        }
        std::process::exit(1);
    }
}
