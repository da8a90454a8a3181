//! Load scenarios: many conversations asking for permission at once, one
//! conversation watched by many WebSockets, and what many idle conversations
//! cost the gateway in memory and creation time (and what streaming leaves
//! behind in it). Each prints one line of
//! figures; each checks that what it measured arrived complete and in order,
//! and asserts nothing about speed.
//!
//! The gateway runs as its own process (`acp-gateway serve`, with the
//! default log filter) in all three: its memory and CPU time are then its
//! own, apart from the bench's clients and from the agents (its children),
//! and each line says how the CPU time split.
//!
//! Sizes (environment):
//! - BENCH_APPROVAL_CONVERSATIONS (200) × BENCH_APPROVAL_ASKS (50) requests;
//! - BENCH_FANOUT_SUBSCRIBERS (1000) sockets on a turn of BENCH_FANOUT_CHUNKS
//!   (500) chunks, BENCH_FANOUT_DELAY_MS (20) apart;
//! - BENCH_IDLE_CONVERSATIONS (1000), of which BENCH_IDLE_STREAMED (100) then
//!   stream a turn of 20,000 chunks each, all at once.
//!
//! A size of 0 skips its scenario, and so does BENCH_ONLY without its name
//! (`approvals`, `fanout`, `idle`).

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::*;

/// Runs the three scenarios with the sizes the environment gives; a size of
/// 0 skips its scenario.
pub async fn run(backend: &str, db: &TestDb) {
    let conversations = env_or("BENCH_APPROVAL_CONVERSATIONS", 200);
    if conversations > 0 && crate::selected("approvals") {
        let asks = env_or("BENCH_APPROVAL_ASKS", 50);
        approvals(backend, db, conversations, asks).await;
    }
    let subscribers = env_or("BENCH_FANOUT_SUBSCRIBERS", 1000);
    if subscribers > 0 && crate::selected("fanout") {
        let chunks = env_or("BENCH_FANOUT_CHUNKS", 500);
        let delay_ms = env_or("BENCH_FANOUT_DELAY_MS", 20);
        fan_out(backend, db, subscribers, chunks, delay_ms).await;
    }
    let idle = env_or("BENCH_IDLE_CONVERSATIONS", 1000);
    if idle > 0 && crate::selected("idle") {
        idle_and_create(backend, db, idle).await;
    }
}

/// The value at quantile `q` (0..=1) of sorted samples (nearest rank).
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// How many conversations or sockets are set up at once before a
/// measurement starts (setting up is not what is measured).
pub(crate) const SETUP_CONCURRENCY: usize = 32;

/// Every conversation, prompt and socket here comes from the one anonymous
/// caller, far over the default per-minute limits and agent limits (no
/// agent is stopped to make room for another).
const NO_RATE_LIMITS: &str = "max_agents = 100000\nmax_agents_per_user = 100000\n\
    [rate_limits]\nprompts_per_minute = 100000000\nconnections_per_minute = 100000000\n\
    conversations_per_minute = 100000000";

/// The gateway's default log filter (`docs/operating.md`), so logging costs what it
/// costs in production.
const LOG_FILTER: &str = "info,sqlx=warn,tower_http=info";

/// CPU time used so far, in ms: the gateway process, its children (the
/// agents), and this process (the bench's clients).
#[derive(Clone, Copy)]
pub(crate) struct Cpu {
    pub gateway: f64,
    pub agents: f64,
    pub client: f64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            gateway: self.gateway - earlier.gateway,
            agents: self.agents - earlier.agents,
            client: self.client - earlier.client,
        }
    }
}

impl Cpu {
    /// "CPU time per <unit>: …", in ms.
    fn per(&self, n: usize, unit: &str) -> String {
        let n = n as f64;
        format!(
            "CPU per {unit}: gateway {:.2} ms, agents {:.2} ms, bench clients {:.2} ms",
            self.gateway / n,
            self.agents / n,
            self.client / n
        )
    }
}

/// A process's user + system CPU time in ms, from `/proc/<pid>/stat`; 0
/// when it is gone.
fn cpu_ms(pid: impl fmt::Display) -> f64 {
    // SAFETY: sysconf takes a constant and returns a number.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After "pid (comm)", fields 3 onwards; utime and stime are 14 and 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks_used: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks_used * 1000.0 / ticks
}

/// The CPU time of a process's live threads in ms, to the nanosecond
/// (`/proc/<pid>/task/*/schedstat`): an agent uses less than the clock tick
/// that `stat` counts in. Threads that ended are not in it.
fn thread_cpu_ms(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    ns as f64 / 1e6
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let parent = pid.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            // `stat` is "pid (comm) state ppid …"; comm may hold spaces.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    Some(rest.split_whitespace().nth(1)? == parent)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// A gateway of its own with the demo agent (given extra arguments), and an
/// HTTP client for it.
pub(crate) struct Served {
    pub gw: GatewayProcess,
    pub http: reqwest::Client,
}

impl Served {
    fn start(db: &TestDb, agent_args: &[&str]) -> Served {
        Served::start_with(db, agent_args, "")
    }

    /// Like [`Served::start`], with config lines after the limits (tables,
    /// e.g. `[notifications]`).
    pub fn start_with(db: &TestDb, agent_args: &[&str], extra: &str) -> Served {
        let agent = demo_profile("demo", agent_args);
        let config = format!("{NO_RATE_LIMITS}\n{extra}");
        Served {
            gw: GatewayProcess::start_configured(db, &[agent], LOG_FILTER, &config),
            http: reqwest::Client::new(),
        }
    }

    fn pid(&self) -> u32 {
        self.gw.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gw.base)
    }

    /// Creates a conversation; its id, and how long the call took in ms.
    async fn create(&self) -> (String, f64) {
        let sent = Instant::now();
        let resp = self
            .http
            .post(self.url("/api/v1/conversations"))
            .json(&json!({"agent": "demo"}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        let took = millis(sent.elapsed());
        assert_eq!(status, 201, "create conversation: {body}");
        (body["id"].as_str().unwrap().to_owned(), took)
    }

    /// A conversation and a socket on it from its first event.
    async fn open(&self) -> (String, Ws) {
        let (id, _) = self.create().await;
        let ws = self.gw.conversation_ws(&id, 0).await;
        (id, ws)
    }

    async fn get(&self, path: &str) -> Value {
        let resp = self.http.get(self.url(path)).send().await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    pub fn cpu(&self) -> Cpu {
        Cpu {
            gateway: cpu_ms(self.pid()),
            agents: children(self.pid()).into_iter().map(thread_cpu_ms).sum(),
            client: cpu_ms("self"),
        }
    }

    pub fn stop(self) {
        self.gw.stop();
    }
}

// ---------------------------------------------------------------------------
// Approvals

pub struct ApprovalReport {
    pub backend: String,
    pub conversations: usize,
    pub asks: usize,
    pub secs: f64,
    /// `POST /api/v1/permissions/{id}/respond`, sent to answered, in ms.
    pub respond_ms: Vec<f64>,
    /// `permission_requested` on the socket → respond → the next one on
    /// it, in ms.
    pub round_trip_ms: Vec<f64>,
    cpu: Cpu,
}

impl fmt::Display for ApprovalReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.conversations * self.asks;
        write!(
            f,
            "[{}] approvals: {} conversations × {} asks = {total} requests, all approved, in {:.2} s ({:.0}/s); \
             respond call p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms (target p50 ≤ 3, p99 ≤ 20); \
             round trip request shown → respond → next shown p50 {:.2} ms, p99 {:.2} ms; {}",
            self.backend,
            self.conversations,
            self.asks,
            self.secs,
            total as f64 / self.secs,
            quantile(&self.respond_ms, 0.5),
            quantile(&self.respond_ms, 0.99),
            self.respond_ms.last().copied().unwrap_or(f64::NAN),
            quantile(&self.round_trip_ms, 0.5),
            quantile(&self.round_trip_ms, 0.99),
            self.cpu.per(total, "request"),
        )
    }
}

/// `conversations` conversations at once, each playing `ask <asks>`: every
/// request is answered `allow-once` over REST the moment its socket shows it.
pub async fn approvals(
    backend: &str,
    db: &TestDb,
    conversations: usize,
    asks: usize,
) -> ApprovalReport {
    let served = Served::start(db, &[]);
    let opened: Vec<(String, Ws)> = futures::stream::iter(0..conversations)
        .map(|_| served.open())
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;

    let cpu_before = served.cpu();
    let started = Instant::now();
    let turns: Vec<_> = opened
        .into_iter()
        .map(|(id, ws)| {
            let (http, base) = (served.http.clone(), served.gw.base.clone());
            tokio::spawn(ask_turn(http, base, id, ws, asks))
        })
        .collect();
    let mut respond_ms = Vec::with_capacity(conversations * asks);
    let mut round_trip_ms = Vec::with_capacity(conversations * asks);
    for turn in futures::future::join_all(turns).await {
        let (respond, round_trip) = turn.expect("a conversation's turn went as it should");
        respond_ms.extend(respond);
        round_trip_ms.extend(round_trip);
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = served.cpu() - cpu_before;
    let pending = served.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"], json!([]), "no request is left pending");
    served.stop();

    let report = ApprovalReport {
        backend: backend.to_owned(),
        conversations,
        asks,
        secs,
        respond_ms: sorted(respond_ms),
        round_trip_ms: sorted(round_trip_ms),
        cpu,
    };
    println!("{report}");
    report
}

/// One conversation's `ask` turn; the respond latencies and round trips.
async fn ask_turn(
    http: reqwest::Client,
    base: String,
    id: String,
    mut ws: Ws,
    asks: usize,
) -> (Vec<f64>, Vec<f64>) {
    let resp = http
        .post(format!("{base}/api/v1/conversations/{id}/prompts"))
        .json(&json!({"text": format!("ask {asks}")}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202, "prompt accepted");
    let mut respond_ms = Vec::with_capacity(asks);
    let mut round_trip_ms = Vec::with_capacity(asks);
    let mut shown: Option<Instant> = None;
    let (mut requested, mut approved, mut completed) = (0, 0, 0);
    let mut said = String::new();
    loop {
        let frame = ws.next().await;
        match frame["type"].as_str().unwrap_or_default() {
            "permission_requested" => {
                let seen = Instant::now();
                if let Some(previous) = shown.replace(seen) {
                    round_trip_ms.push(millis(seen - previous));
                }
                requested += 1;
                let request_id = frame["data"]["id"].as_str().unwrap();
                let sent = Instant::now();
                let resp = http
                    .post(format!("{base}/api/v1/permissions/{request_id}/respond"))
                    .json(&json!({"option_id": "allow-once"}))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status();
                let body: Value = resp.json().await.unwrap();
                respond_ms.push(millis(sent.elapsed()));
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["status"], "approved", "{body}");
            }
            "permission_resolved" => {
                assert_eq!(frame["data"]["status"], "approved", "{frame}");
                approved += 1;
            }
            "session_update" => {
                let update = &frame["data"]["update"];
                if update["sessionUpdate"] == "tool_call_update" && update["status"] == "completed"
                {
                    completed += 1;
                }
                if update["sessionUpdate"] == "agent_message_chunk" {
                    said += update["content"]["text"].as_str().unwrap_or_default();
                }
            }
            "turn_ended" => {
                assert_eq!(frame["data"]["stop_reason"], "end_turn", "{frame}");
                break;
            }
            _ => {}
        }
    }
    assert_eq!(
        (requested, approved, completed),
        (asks, asks, asks),
        "conversation {id}: every request shown, approved, and its tool call completed"
    );
    assert_eq!(said, format!("{asks} of {asks} tool calls ran."), "{id}");
    ws.close().await;
    (respond_ms, round_trip_ms)
}

// ---------------------------------------------------------------------------
// Fan-out

pub struct FanOutReport {
    pub backend: String,
    pub subscribers: usize,
    /// Events of the turn (`turn_started` to `turn_ended`).
    pub events: usize,
    pub secs: f64,
    /// Receipt time minus the event's `at` (when the gateway made it, before
    /// storing it), over every receipt of every event of the turn, in ms.
    pub lag_ms: Vec<f64>,
    /// Receipt time minus the first receipt of the same event by any
    /// subscriber: the spread of the fan-out itself, in ms.
    pub spread_ms: Vec<f64>,
    /// Events some subscriber missed, summed over subscribers (0: all saw
    /// every seq from 1 to the last, once each, in order).
    pub lost: u64,
    /// What went wrong for the subscribers that lost some (first few).
    pub failures: Vec<String>,
    cpu: Cpu,
}

impl fmt::Display for FanOutReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] fan-out: {} subscribers × {} events in {:.2} s; lag from the event's `at` p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms \
             (target p99 ≤ 100); after the first subscriber's receipt p50 {:.1} ms, p99 {:.1} ms; lost {} (target 0); {}",
            self.backend,
            self.subscribers,
            self.events,
            self.secs,
            quantile(&self.lag_ms, 0.5),
            quantile(&self.lag_ms, 0.99),
            self.lag_ms.last().copied().unwrap_or(f64::NAN),
            quantile(&self.spread_ms, 0.5),
            quantile(&self.spread_ms, 0.99),
            self.lost,
            self.cpu.per(self.events * self.subscribers, "frame delivered"),
        )?;
        if !self.failures.is_empty() {
            write!(f, " ({})", self.failures.join("; "))?;
        }
        Ok(())
    }
}

/// The fields of an event a subscriber looks at.
#[derive(serde::Deserialize)]
struct Head {
    seq: i64,
    #[serde(rename = "type")]
    kind: String,
    at: DateTime<Utc>,
}

/// What one subscriber saw.
struct Seen {
    /// (seq, received, lag in ms) of each event of the turn.
    turn: Vec<(i64, Instant, f64)>,
    /// Every seq received, in order of receipt.
    seqs: Vec<i64>,
    /// Why it stopped early, if it did.
    failure: Option<String>,
}

/// One conversation watched by `subscribers` sockets while its agent streams
/// `chunks` chunks `delay_ms` apart (`long` with `--chunk-delay-ms`: a steady
/// series of events).
pub async fn fan_out(
    backend: &str,
    db: &TestDb,
    subscribers: usize,
    chunks: usize,
    delay_ms: u64,
) -> FanOutReport {
    let served = Served::start(db, &["--chunk-delay-ms", &delay_ms.to_string()]);
    let (id, _) = served.create().await;

    // Every socket is live before the turn starts: it has had its first
    // (replayed) frame, so the gateway has subscribed it.
    let sockets: Vec<Ws> = futures::stream::iter(0..subscribers)
        .map(|_| served.gw.conversation_ws(&id, 0))
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(subscribers);
    let readers: Vec<_> = sockets
        .into_iter()
        .map(|ws| tokio::spawn(subscriber(ws, ready_tx.clone())))
        .collect();
    drop(ready_tx);
    for _ in 0..subscribers {
        tokio::time::timeout(WAIT, ready_rx.recv())
            .await
            .expect("every subscriber gets its first frame in time")
            .expect("subscribers report");
    }

    let cpu_before = served.cpu();
    let started = Instant::now();
    let resp = served
        .http
        .post(served.url(&format!("/api/v1/conversations/{id}/prompts")))
        .json(&json!({"text": format!("long {chunks}")}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202, "prompt accepted");
    let mut seen = Vec::with_capacity(subscribers);
    for reader in futures::future::join_all(readers).await {
        seen.push(reader.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = served.cpu() - cpu_before;
    let last = served.get(&format!("/api/v1/conversations/{id}")).await["last_seq"]
        .as_i64()
        .unwrap();
    let stored = all_events(&served, &id).await;
    assert_consecutive(&stored, 0);
    assert_eq!(stored.last().unwrap()["type"], "turn_ended");
    assert_eq!(stored.last().unwrap()["seq"], last);
    let streamed = streamed_text(&stored, "agent_message_chunk");
    assert_eq!(
        streamed.split_whitespace().count(),
        chunks,
        "the agent's chunks are all stored"
    );
    served.stop();

    // Losses: every subscriber must have seen exactly 1..=last, in order.
    let mut lost = 0;
    let mut failures = Vec::new();
    for (i, s) in seen.iter().enumerate() {
        let in_order = s
            .seqs
            .iter()
            .enumerate()
            .take_while(|(k, seq)| **seq == *k as i64 + 1)
            .count() as i64;
        let missing = last - in_order;
        if missing > 0 || s.seqs.len() as i64 != last {
            lost += missing.max(0) as u64;
            if failures.len() < 3 {
                failures.push(format!(
                    "subscriber {i}: {} frames, in order up to seq {in_order} of {last}{}",
                    s.seqs.len(),
                    s.failure
                        .as_deref()
                        .map(|f| format!(", {f}"))
                        .unwrap_or_default()
                ));
            }
        }
    }

    let mut first: HashMap<i64, Instant> = HashMap::new();
    for (seq, at, _) in seen.iter().flat_map(|s| &s.turn) {
        first
            .entry(*seq)
            .and_modify(|f| *f = (*f).min(*at))
            .or_insert(*at);
    }
    let events = first.len();
    let lag_ms = seen
        .iter()
        .flat_map(|s| s.turn.iter().map(|(_, _, lag)| *lag))
        .collect();
    let spread_ms = seen
        .iter()
        .flat_map(|s| &s.turn)
        .map(|(seq, at, _)| millis(*at - first[seq]))
        .collect();
    let report = FanOutReport {
        backend: backend.to_owned(),
        subscribers,
        events,
        secs,
        lag_ms: sorted(lag_ms),
        spread_ms: sorted(spread_ms),
        lost,
        failures,
        cpu,
    };
    println!("{report}");
    report
}

/// Every stored event of a conversation, page by page.
async fn all_events(served: &Served, id: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = served
            .get(&format!(
                "/api/v1/conversations/{id}/events?after={after}&limit=10000"
            ))
            .await;
        events.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str().and_then(|c| c.parse().ok()) {
            Some(cursor) => after = cursor,
            None => return events,
        }
    }
}

/// Reads one socket until `turn_ended` (or a failure, which it records
/// rather than panics: losses are counted, not fatal).
async fn subscriber(mut ws: Ws, ready: tokio::sync::mpsc::Sender<()>) -> Seen {
    let mut seen = Seen {
        turn: Vec::new(),
        seqs: Vec::new(),
        failure: None,
    };
    let mut in_turn = false;
    loop {
        let text = match tokio::time::timeout(WAIT, ws.stream.next()).await {
            Err(_) => {
                seen.failure = Some(format!("no frame for {WAIT:?}"));
                break;
            }
            Ok(None) => {
                seen.failure = Some("closed".into());
                break;
            }
            Ok(Some(Err(e))) => {
                seen.failure = Some(format!("error: {e}"));
                break;
            }
            Ok(Some(Ok(WsMessage::Text(text)))) => text,
            Ok(Some(Ok(WsMessage::Close(frame)))) => {
                seen.failure = Some(format!("closed by the gateway: {frame:?}"));
                break;
            }
            Ok(Some(Ok(_))) => continue,
        };
        let received = Instant::now();
        let now = Utc::now();
        let head: Head = serde_json::from_str(&text).expect("an event");
        if seen.seqs.is_empty() {
            let _ = ready.send(()).await;
        }
        seen.seqs.push(head.seq);
        in_turn |= head.kind == "turn_started";
        if in_turn {
            let lag = (now - head.at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
            seen.turn.push((head.seq, received, lag));
        }
        if head.kind == "turn_ended" {
            break;
        }
    }
    ws.close().await;
    seen
}

// ---------------------------------------------------------------------------
// Idle conversations and creation

pub struct IdleReport {
    pub backend: String,
    pub conversations: usize,
    /// The gateway's VmRSS once it has served one conversation, in KiB.
    pub rss_before_kib: u64,
    /// … and with `conversations` more, idle.
    pub rss_after_kib: u64,
    /// The agent processes running (they are not in the figure), and their
    /// VmRSS summed, in KiB.
    pub agents: usize,
    pub agents_rss_kib: u64,
    /// The gateway's open file descriptors with them all (pipes to each
    /// agent count against its `ulimit -n`).
    pub fds: usize,
    /// `POST /api/v1/conversations`, sent to 201, one after the other, in ms.
    pub create_ms: Vec<f64>,
    cpu: Cpu,
    /// How many of them then streamed a turn of [`STREAMED_CHUNKS`] chunks,
    /// all at once, and the gateway's VmRSS once they had all ended, in KiB:
    /// what streaming leaves behind.
    pub streamed: usize,
    pub rss_streamed_kib: u64,
}

/// The chunks of the turn each of the idle scenario's streaming
/// conversations runs.
const STREAMED_CHUNKS: usize = 20_000;

impl fmt::Display for IdleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {} idle conversations: gateway process RSS {:.1} MiB → {:.1} MiB (+{:.1} KiB per conversation; target ≤ 150 MB total), \
             not counting its {} agent processes ({:.0} MiB together); {} open fds; \
             create p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (target p50 ≤ 50); {}",
            self.backend,
            self.conversations,
            self.rss_before_kib as f64 / 1024.0,
            self.rss_after_kib as f64 / 1024.0,
            self.rss_after_kib.saturating_sub(self.rss_before_kib) as f64
                / self.conversations as f64,
            self.agents,
            self.agents_rss_kib as f64 / 1024.0,
            self.fds,
            quantile(&self.create_ms, 0.5),
            quantile(&self.create_ms, 0.99),
            self.create_ms.last().copied().unwrap_or(f64::NAN),
            self.cpu.per(self.conversations, "creation"),
        )?;
        if self.streamed > 0 {
            write!(
                f,
                "; then {} of them streamed {} chunks each, all at once: RSS {:.1} MiB once they ended \
                 (+{:.1} KiB per conversation that streamed)",
                self.streamed,
                STREAMED_CHUNKS,
                self.rss_streamed_kib as f64 / 1024.0,
                self.rss_streamed_kib.saturating_sub(self.rss_after_kib) as f64
                    / self.streamed as f64,
            )?;
        }
        Ok(())
    }
}

/// `conversations` conversations created one after the other (each timed)
/// and left idle, each with its own agent process; the gateway's RSS
/// before and after.
pub async fn idle_and_create(backend: &str, db: &TestDb, conversations: usize) -> IdleReport {
    let served = Served::start(db, &[]);
    let pid = served.pid();
    // The first one pays for what every conversation shares (pools, caches).
    served.create().await;
    let rss_before_kib = proc_status_kib(pid, "VmRSS:");
    let cpu_before = served.cpu();
    let mut create_ms = Vec::with_capacity(conversations);
    let mut ids = Vec::with_capacity(conversations);
    for _ in 0..conversations {
        let (id, took) = served.create().await;
        create_ms.push(took);
        ids.push(id);
    }
    let cpu = served.cpu() - cpu_before;
    let rss_after_kib = proc_status_kib(pid, "VmRSS:");
    let agents = children(pid);
    let agents_rss_kib = agents.iter().map(|p| proc_status_kib(p, "VmRSS:")).sum();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert_eq!(
        agents.len(),
        conversations + 1,
        "every conversation keeps its agent"
    );
    let streamed = env_or("BENCH_IDLE_STREAMED", 100).min(conversations);
    let gw = &served.gw;
    futures::future::join_all(ids[..streamed].iter().map(|id| async move {
        let mut ws = gw.conversation_ws(id, 0).await;
        gw.prompt(id, &format!("long {STREAMED_CHUNKS}")).await;
        ws.until_type("turn_ended").await;
    }))
    .await;
    let rss_streamed_kib = proc_status_kib(pid, "VmRSS:");
    served.stop();

    let report = IdleReport {
        backend: backend.to_owned(),
        conversations,
        rss_before_kib,
        rss_after_kib,
        agents: agents.len(),
        agents_rss_kib,
        fds,
        create_ms: sorted(create_ms),
        cpu,
        streamed,
        rss_streamed_kib,
    };
    println!("{report}");
    report
}
