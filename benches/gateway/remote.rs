//! What a remote agent adds: the same demo agent spawned by the gateway
//! (profile `local`, under its shim as configured by default) and served
//! over WebSocket on loopback (profile `remote`: `url` and
//! `allow_private = true`) by a small server of the bench's own, on a thread
//! and runtime of its own: one demo agent process per connection, each text
//! frame one line of its stdio (the lines the agent has written by then sent
//! in one write). For each: the time to create a conversation
//! (`POST /api/v1/conversations`, which answers once the agent's session is
//! open), the round trip of a one-chunk turn (prompt → `turn_ended` on the
//! conversation's WebSocket), and the streaming rate of a `long N` turn.

use std::time::{Duration, Instant};

use futures::stream::SplitSink;
use futures::{FutureExt, SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::common::*;
use crate::load::{quantile, sorted};
use acp_gateway::config::{AgentProfile, Config};

/// The demo agent served over WebSocket ACP on loopback, on its own thread.
struct AgentServer {
    url: String,
    stop: CancellationToken,
    thread: std::thread::JoinHandle<()>,
}

impl AgentServer {
    fn start() -> AgentServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the agent server");
        listener.set_nonblocking(true).unwrap();
        let url = format!("ws://{}/acp", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the agent server")
                .block_on(serve(listener, stopping))
        });
        AgentServer { url, stop, thread }
    }

    /// Ends every connection, kills and reaps every agent it started.
    fn kill(self) {
        self.stop.cancel();
        self.thread.join().expect("the agent server stops");
    }
}

async fn serve(listener: std::net::TcpListener, stop: CancellationToken) {
    let listener = TcpListener::from_std(listener).unwrap();
    let tasks = TaskTracker::new();
    loop {
        let tcp = tokio::select! {
            _ = stop.cancelled() => break,
            tcp = listener.accept() => tcp.expect("accept").0,
        };
        tasks.spawn(serve_one(tcp, stop.clone()));
    }
    tasks.close();
    tokio::time::timeout(WAIT, tasks.wait())
        .await
        .expect("every connection of the agent server ends");
}

/// One WebSocket connection: its own demo agent, frames to lines and back.
async fn serve_one(tcp: tokio::net::TcpStream, stop: CancellationToken) {
    // Each line is sent at once, as the gateway's end of the connection does.
    let _ = tcp.set_nodelay(true);
    let Ok(ws) = tokio_tungstenite::accept_async(tcp).await else {
        return;
    };
    let mut agent = tokio::process::Command::new(demo_agent_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the demo agent");
    let mut stdin = agent.stdin.take().unwrap();
    let mut stdout = BufReader::new(agent.stdout.take().unwrap()).lines();
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            frame = stream.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    let line = format!("{}\n", text.as_str());
                    if stdin.write_all(line.as_bytes()).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            line = stdout.next_line() => match line {
                Ok(Some(line)) => {
                    if send_ready(&mut sink, &mut stdout, line).await.is_err() {
                        break;
                    }
                }
                _ => break,
            },
        }
    }
    let _ = sink.close().await;
    // Killing an agent that already left is harmless; `kill` also reaps it.
    let _ = agent.kill().await;
}

/// Sends `line` and every further line the agent has already written (up
/// to [`BATCH`]) as frames, then flushes once: a write per burst, not per
/// line. Err when the connection or the agent's stdout is gone (the lines
/// read by then are sent).
async fn send_ready(
    sink: &mut SplitSink<WebSocketStream<tokio::net::TcpStream>, Message>,
    stdout: &mut Lines<BufReader<tokio::process::ChildStdout>>,
    line: String,
) -> Result<(), ()> {
    sink.feed(Message::text(line)).await.map_err(drop)?;
    let mut more = Ok(());
    for _ in 1..BATCH {
        // `next_line` is cancel safe: a line not ready yet is not lost.
        match stdout.next_line().now_or_never() {
            Some(Ok(Some(line))) => sink.feed(Message::text(line)).await.map_err(drop)?,
            Some(_) => {
                more = Err(());
                break;
            }
            None => break,
        }
    }
    sink.flush().await.map_err(drop)?;
    more
}

/// Most lines sent in one write.
const BATCH: usize = 1024;

/// The profile of the agent served at `url`.
fn remote_profile(url: &str) -> AgentProfile {
    let mut agent: AgentProfile =
        serde_json::from_value(json!({"name": "remote", "url": url, "allow_private": true}))
            .expect("a remote profile");
    agent.cwd = Some(std::env::temp_dir());
    agent.startup_timeout = Duration::from_secs(20);
    agent.idle_timeout = Duration::ZERO;
    agent
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Milliseconds of each of `count` creations of a conversation of `agent`
/// (each deleted before the next).
async fn creations(gw: &TestGateway, agent: &str, count: usize) -> Vec<f64> {
    let mut took = Vec::with_capacity(count);
    for _ in 0..count {
        let sent = Instant::now();
        let (status, body) = gw
            .post("/api/v1/conversations", json!({"agent": agent}))
            .await;
        took.push(ms(sent.elapsed()));
        assert_eq!(status, 201, "create conversation: {body}");
        let id = body["id"].as_str().unwrap();
        let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
        assert_eq!(status, 204, "{body}");
    }
    took
}

/// Milliseconds of each of `count` one-chunk turns (`long 1`) of one
/// conversation of `agent`, from the prompt until its WebSocket shows
/// `turn_ended`.
async fn round_trips(gw: &TestGateway, agent: &str, count: usize) -> Vec<f64> {
    let (id, mut ws) = gw.open_conversation(agent).await;
    ws.until_type("agent_status").await; // ready
    let mut took = Vec::with_capacity(count);
    for _ in 0..count {
        let sent = Instant::now();
        gw.prompt(&id, "long 1").await;
        let frames = ws.until_type("turn_ended").await;
        took.push(ms(sent.elapsed()));
        assert_eq!(streamed_text(&frames, "agent_message_chunk"), "w0 ");
    }
    ws.close().await;
    let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204, "{body}");
    took
}

/// Chunks per second of a `long {n}` turn of `agent` (median of `runs`),
/// every chunk checked as in `streaming`.
async fn stream_rate(gw: &TestGateway, agent: &str, n: usize, runs: usize) -> f64 {
    let mut secs: Vec<f64> = Vec::with_capacity(runs);
    for _ in 0..runs {
        secs.push(crate::stream_once(gw, agent, n).await.secs);
    }
    n as f64 / quantile(&sorted(secs), 0.5)
}

/// The `remote` scenario on `backend`: local against remote, and the
/// difference. Sizes: BENCH_REMOTE_CREATES (50), BENCH_REMOTE_TURNS (200),
/// BENCH_REMOTE_CHUNKS (200,000; BENCH_RUNS runs, the median).
pub async fn run(backend: &str, db: &TestDb) {
    let creates = env_or("BENCH_REMOTE_CREATES", 50).max(1);
    let turns = env_or("BENCH_REMOTE_TURNS", 200).max(1);
    let chunks = env_or("BENCH_REMOTE_CHUNKS", 200_000).max(1);
    let runs = env_or("BENCH_RUNS", 3).max(1);
    let server = AgentServer::start();
    let mut config = Config::for_tests(
        db,
        vec![demo_profile("local", &[]), remote_profile(&server.url)],
    );
    config.rate_limits.conversations_per_minute = 1_000_000;
    config.rate_limits.prompts_per_minute = 1_000_000;
    config.rate_limits.connections_per_minute = 1_000_000;
    let gw = TestGateway::start_with(config).await;
    // Warm up both (the first agent started and the first commits cost more).
    for agent in ["local", "remote"] {
        creations(&gw, agent, 3).await;
        crate::stream_once(&gw, agent, 10_000).await;
    }
    // Local, then remote, each whole.
    let mut figures = Vec::new();
    for agent in ["local", "remote"] {
        let created = sorted(creations(&gw, agent, creates).await);
        let turned = sorted(round_trips(&gw, agent, turns).await);
        let rate = stream_rate(&gw, agent, chunks, runs).await;
        figures.push((created, turned, rate));
    }
    gw.stop().await;
    server.kill();

    let (local, remote) = (&figures[0], &figures[1]);
    for (what, a, b) in [
        (
            format!("create a conversation ({creates})"),
            &local.0,
            &remote.0,
        ),
        (
            format!("one-chunk turn round trip ({turns})"),
            &local.1,
            &remote.1,
        ),
    ] {
        let (a50, a99, b50, b99) = (
            quantile(a, 0.5),
            quantile(a, 0.99),
            quantile(b, 0.5),
            quantile(b, 0.99),
        );
        println!(
            "[{backend}] remote: {what} p50 / p99: local {a50:.2} / {a99:.2} ms, remote {b50:.2} / {b99:.2} ms \
             (remote {:+.2} / {:+.2} ms)",
            b50 - a50,
            b99 - a99
        );
    }
    println!(
        "[{backend}] remote: streaming {chunks} chunks (median of {runs}): local {:.0} chunks/s, remote {:.0} chunks/s \
         (remote {:.2}× local)",
        local.2,
        remote.2,
        remote.2 / local.2
    );
}
