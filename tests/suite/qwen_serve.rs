//! A real agent that serves ACP over the network: `qwen serve` (npm
//! `@qwen-code/qwen-code`, pinned in `tests/real-agents/`, installed by
//! `tests/sdk-agents/install.sh`), reached by the gateway through a remote
//! profile `url = "ws://127.0.0.1:PORT/acp"` (or `http://…`, Streamable
//! HTTP, with its session-scoped event streams). Its model is a scripted fake of
//! the OpenAI Chat Completions API on loopback (streamed answers, a tool call
//! when the prompt asks for one), so the whole turn runs offline.
//!
//! Skipped, saying so, where qwen is not installed, unless
//! `ACP_GATEWAY_REQUIRE_QWEN` is set (CI sets it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::IntoResponse;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use acp_gateway::config::{AgentProfile, Config};

const REQUIRE_QWEN: &str = "ACP_GATEWAY_REQUIRE_QWEN";

/// The `qwen` launcher, once installed; `None` (the test skips, saying so)
/// where it is not and `ACP_GATEWAY_REQUIRE_QWEN` is unset.
pub(super) fn qwen_bin() -> Option<PathBuf> {
    let bin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-agents/node_modules/.bin/qwen");
    if !bin.exists() && std::env::var_os(REQUIRE_QWEN).is_some() {
        // CI: install it (loudly failing) rather than skip.
        sdk_agents_dir();
    }
    if bin.exists() {
        return Some(bin);
    }
    assert!(
        std::env::var_os(REQUIRE_QWEN).is_none(),
        "{REQUIRE_QWEN} is set but qwen is not installed at {} (run tests/sdk-agents/install.sh)",
        bin.display()
    );
    eprintln!(
        "skipping: qwen serve is not installed at {} (tests/sdk-agents/install.sh installs it)",
        bin.display()
    );
    None
}

/// The scripted model: an OpenAI-compatible `POST /v1/chat/completions`
/// that always streams (server-sent events, as qwen asks for). A prompt
/// holding `SHELL<<command>>` gets a `run_shell_command` tool call; the
/// tool's result gets "The command ran."; anything else (qwen's own side
/// requests included) gets "Hello from the fake model.", in pieces.
pub(super) struct FakeModel {
    port: u16,
    /// Every request body, in order.
    requests: Arc<Mutex<Vec<Value>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

const GREETING: [&str; 4] = ["Hello ", "from the ", "fake ", "model."];
const AFTER_TOOL: [&str; 2] = ["The command ", "ran."];

impl FakeModel {
    pub(super) async fn start() -> FakeModel {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                    let seen = seen.clone();
                    async move {
                        let reply = completion(&body);
                        seen.lock().unwrap().push(body);
                        (
                            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                            reply,
                        )
                            .into_response()
                    }
                }),
            )
            .route(
                "/v1/models",
                axum::routing::get(|| async { axum::Json(json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        let until = stop.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(until.cancelled_owned())
                .await
                .unwrap();
        });
        FakeModel {
            port,
            requests,
            stop,
            task,
        }
    }

    pub(super) fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        // Connections qwen keeps alive are not waited for.
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The text of a chat message (a string, or parts of which the text ones
/// count).
fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// The streamed answer to one request, as server-sent events.
fn completion(body: &Value) -> String {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let offers_shell = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["function"]["name"] == "run_shell_command");
    let asked = text_of(&last);
    let mut deltas: Vec<(Value, Option<&str>)> = Vec::new();
    match asked
        .split_once("SHELL<<")
        .and_then(|(_, rest)| rest.split_once(">>"))
    {
        Some((command, _)) if last["role"] == "user" && offers_shell => {
            let arguments = json!({"command": command, "description": "Write a file"}).to_string();
            deltas.push((
                json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "run_shell_command", "arguments": arguments}}]}),
                None,
            ));
            deltas.push((json!({}), Some("tool_calls")));
        }
        _ => {
            let words: &[&str] = if last["role"] == "tool" {
                &AFTER_TOOL
            } else {
                &GREETING
            };
            for word in words {
                deltas.push((json!({"role": "assistant", "content": word}), None));
            }
            deltas.push((json!({}), Some("stop")));
        }
    }
    let mut out = String::new();
    for (delta, finish) in deltas {
        let mut chunk = json!({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if finish.is_some() {
            chunk["usage"] =
                json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15});
        }
        out.push_str(&format!("data: {chunk}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// A port free now on loopback, from 20000 up to the kernel's ephemeral
/// range (where the kernel gives no port of its own accord), tried from a
/// place that depends on the process and the moment, so that tests running
/// at once seldom try the same.
fn free_port_below_the_ephemeral_range() -> u16 {
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (20000u16, low.saturating_sub(20000).max(1));
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
    for i in 0..u32::from(span) {
        let port = first + ((seed.wrapping_add(i)) % u32::from(span)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}

/// `qwen serve` on a port of the test's choosing, in a process group of its
/// own; it and everything it started are killed by `kill`, or when this is
/// dropped (a failed test).
struct QwenServe {
    child: tokio::process::Child,
    pgid: i32,
    port: u16,
    workspace: Arc<tempfile::TempDir>,
    home: Arc<tempfile::TempDir>,
    token: Option<String>,
    /// What it printed (stdout and stderr), for a failure's message.
    log: Arc<Mutex<Vec<String>>>,
    /// Its lines as they come (closed once both its streams end).
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// Killed and waited for: nothing left to do when dropped (its pid may
    /// be another process's by then).
    ended: bool,
}

impl QwenServe {
    /// Started and listening on `/acp`; `token` makes it require that
    /// bearer token on every route.
    async fn start(bin: &Path, model: &FakeModel, token: Option<&str>) -> QwenServe {
        let mut serve = QwenServe::spawn(bin, model, token);
        if let Err(log) = serve.ready().await {
            panic!("qwen serve is not ready in time; it printed:\n{log}");
        }
        serve
    }

    fn spawn(bin: &Path, model: &FakeModel, token: Option<&str>) -> QwenServe {
        let home = tempfile::tempdir().unwrap();
        let workspace = tempfile::tempdir().unwrap();
        // OpenAI-compatible auth, from the environment below; the default
        // approval mode asks before a shell command runs; nothing reaches
        // beyond loopback (no update check, statistics or telemetry).
        let settings = home.path().join(".qwen");
        std::fs::create_dir_all(&settings).unwrap();
        let settings_json = json!({
            "$version": 4,
            "security": {"auth": {"selectedType": "openai"}},
            "tools": {"approvalMode": "default"},
            "general": {"enableAutoUpdate": false},
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false},
        });
        std::fs::write(settings.join("settings.json"), settings_json.to_string()).unwrap();
        let tmp = home.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        // A free port, chosen here (qwen takes a number, not a listener;
        // see `ready` for one taken meanwhile), below the kernel's
        // ephemeral range: while it is killed and started again on it,
        // no other test's connection or port-0 listener can take it.
        let port = free_port_below_the_ephemeral_range();
        QwenServe::spawn_in(bin, model, token, Arc::new(home), Arc::new(workspace), port)
    }

    /// Starts it with `home` (its settings and what it records of its
    /// sessions) and `workspace`, on `port`.
    fn spawn_in(
        bin: &Path,
        model: &FakeModel,
        token: Option<&str>,
        home: Arc<tempfile::TempDir>,
        workspace: Arc<tempfile::TempDir>,
        port: u16,
    ) -> QwenServe {
        let tmp = home.path().join("tmp");
        let mut command = tokio::process::Command::new(bin);
        command
            .args([
                "serve",
                "--port",
                &port.to_string(),
                "--no-web",
                "--workspace",
            ])
            .arg(workspace.path())
            .current_dir(workspace.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home.path())
            // Its sockets' directory too, which a killed qwen cannot remove.
            .env("TMPDIR", &tmp)
            .env("OPENAI_API_KEY", "sk-fake")
            .env("OPENAI_BASE_URL", model.base_url())
            .env("OPENAI_MODEL", "fake-model")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(token) = token {
            command
                .arg("--require-auth")
                .env("QWEN_SERVER_TOKEN", token);
        }
        let mut child = command.spawn().expect("qwen serve starts");
        let pgid = child.id().unwrap() as i32;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (lines_tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(read_lines(
            child.stdout.take().unwrap(),
            log.clone(),
            lines_tx.clone(),
        ));
        tokio::spawn(read_lines(
            child.stderr.take().unwrap(),
            log.clone(),
            lines_tx,
        ));
        QwenServe {
            child,
            pgid,
            port,
            workspace,
            home,
            token: token.map(str::to_owned),
            log,
            lines,
            ended: false,
        }
    }

    /// Waits until it says its WebSocket transport is on, taking the port
    /// it says it listens on (the one chosen, or the next free one after
    /// it: qwen moves on when the port was taken meanwhile); what it
    /// printed if it ends first or takes too long.
    async fn ready(&mut self) -> Result<(), String> {
        const LISTENING: &str = "qwen serve listening on http://127.0.0.1:";
        // Its stdout and stderr each say one: in either order here.
        let (mut listening, mut enabled) = (false, false);
        while !(listening && enabled) {
            let Ok(Some(line)) =
                tokio::time::timeout(Duration::from_secs(60), self.lines.recv()).await
            else {
                return Err(self.log_text());
            };
            if let Some(rest) = line.strip_prefix(LISTENING) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                self.port = digits.parse().map_err(|_| self.log_text())?;
                listening = true;
            }
            enabled |= line.contains("/acp WebSocket transport enabled");
        }
        Ok(())
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/acp", self.port)
    }

    /// The same endpoint, spoken to over Streamable HTTP.
    fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}/acp", self.port)
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Stops (SIGSTOP) every process of its tree, and whoever is in their
    /// process groups, until no new one appears: frozen, none can start
    /// another or slip away from its parent before it is killed. qwen serve
    /// runs its ACP channel (`cli.js --acp`) in a process group of its own,
    /// and the commands it runs in groups of theirs: the group of qwen serve
    /// alone is not all of it.
    fn freeze(&self) -> Vec<i32> {
        let mut frozen: Vec<i32> = Vec::new();
        for _ in 0..50 {
            let fresh: Vec<i32> = tree_and_groups(self.pgid)
                .into_iter()
                .filter(|pid| !frozen.contains(pid))
                .collect();
            if fresh.is_empty() {
                return frozen;
            }
            for pid in fresh {
                // SAFETY: a process of the tree the test started.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                frozen.push(pid);
            }
        }
        panic!("qwen's processes keep multiplying: {frozen:?}");
    }

    /// Kills it (as [`QwenServe::kill`]) and starts it again on the same
    /// port, home and workspace: what it recorded of its sessions is there.
    async fn restart(self, bin: &Path, model: &FakeModel) -> QwenServe {
        let (home, workspace) = (self.home.clone(), self.workspace.clone());
        let (port, token) = (self.port, self.token.clone());
        self.kill().await;
        let mut serve = QwenServe::spawn_in(bin, model, token.as_deref(), home, workspace, port);
        if let Err(log) = serve.ready().await {
            panic!("qwen serve is not ready in time again; it printed:\n{log}");
        }
        assert_eq!(serve.port, port, "qwen serve is back on its port");
        serve
    }

    /// Kills it and everything it started, and waits until each has ended.
    async fn kill(mut self) {
        let pids = self.freeze();
        let watches: Vec<ProcessWatch> = pids.iter().map(|&pid| ProcessWatch::new(pid)).collect();
        kill_all(&pids, self.pgid);
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("qwen serve ends")
            .unwrap();
        for watch in &watches {
            assert!(watch.ended().await, "process {} of qwen's ended", watch.pid);
        }
        assert_eq!(
            tree_and_groups(self.pgid),
            Vec::<i32>::new(),
            "nothing of qwen is left"
        );
        self.ended = true;
    }
}

impl Drop for QwenServe {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // A failed test: the same, without waiting.
        let pids = self.freeze();
        kill_all(&pids, self.pgid);
    }
}

/// SIGKILL to each of `pids` and to the group `pgid`.
fn kill_all(pids: &[i32], pgid: i32) {
    // SAFETY: processes and a group of the test's own making.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
        for &pid in pids {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The live (not zombie) processes descending from `root`, with `root`,
/// and every live process in one of their process groups.
fn tree_and_groups(root: i32) -> Vec<i32> {
    // pid → (ppid, pgrp) of every live process.
    let mut table = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid pgrp …: comm may hold spaces.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        if fields.len() < 3 || fields[0] == "Z" {
            continue;
        }
        let (Ok(ppid), Ok(pgrp)) = (fields[1].parse::<i32>(), fields[2].parse::<i32>()) else {
            continue;
        };
        table.insert(pid, (ppid, pgrp));
    }
    let mut found: Vec<i32> = Vec::new();
    if table.contains_key(&root) {
        found.push(root);
    }
    let mut groups = vec![root];
    loop {
        let more: Vec<i32> = table
            .iter()
            .filter(|(pid, (ppid, pgrp))| {
                !found.contains(pid) && (found.contains(ppid) || groups.contains(pgrp))
            })
            .map(|(pid, _)| *pid)
            .collect();
        if more.is_empty() {
            return found;
        }
        for pid in more {
            groups.push(table[&pid].1);
            found.push(pid);
        }
    }
}

/// Collects the lines of one of qwen's streams, and passes each on.
async fn read_lines(
    stream: impl tokio::io::AsyncRead + Unpin,
    log: Arc<Mutex<Vec<String>>>,
    lines_tx: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        log.lock().unwrap().push(line.clone());
        let _ = lines_tx.send(line);
    }
}

/// A profile of qwen serve at `url` (loopback: `allow_private`), its
/// conversations in `cwd` (qwen's workspace), with the token in
/// `token_file` where one is given.
fn qwen_profile(name: &str, url: &str, cwd: &Path, token_file: Option<&Path>) -> AgentProfile {
    let mut agent: AgentProfile =
        serde_json::from_value(json!({"name": name, "url": url, "allow_private": true})).unwrap();
    agent.token_file = token_file.map(Path::to_path_buf);
    agent.cwd = Some(cwd.to_path_buf());
    agent.startup_timeout = Duration::from_secs(30);
    agent.idle_timeout = Duration::ZERO;
    agent
}

fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, format!("{token}\n")).unwrap();
    file
}

/// A conversation with qwen serve: a prompt answered with streamed text,
/// then a shell command qwen asks permission for, parked in the gateway,
/// answered over REST: the command runs and the turn ends `end_turn`.
async fn qwen_serve_streams_and_asks_permission_answered_over_rest(db: TestDb) {
    streams_and_asks_permission(db, QwenServe::url).await
}

/// The same over ACP's Streamable HTTP (POSTs, the connection's GET event
/// stream) instead of the WebSocket.
async fn qwen_serve_over_streamable_http_streams_and_asks_permission(db: TestDb) {
    streams_and_asks_permission(db, QwenServe::http_url).await
}

async fn streams_and_asks_permission(db: TestDb, url: fn(&QwenServe) -> String) {
    let Some(bin) = qwen_bin() else { return };
    let model = FakeModel::start().await;
    let qwen = QwenServe::start(&bin, &model, None).await;
    let config = Config::for_tests(
        &db,
        vec![qwen_profile(
            "qwen",
            &url(&qwen),
            qwen.workspace.path(),
            None,
        )],
    );
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("qwen").await;

    gw.prompt(&id, "Say hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        frames.last().unwrap()["data"]["stop_reason"],
        "end_turn",
        "{frames:#?}\n{}",
        qwen.log_text()
    );
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        GREETING.concat()
    );
    // Streamed: in pieces, each an event of the conversation.
    let stored = gw.events(&id).await;
    let chunks = stored
        .iter()
        .filter(|e| e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert!(chunks >= 2, "{stored:#?}");

    let out = qwen.workspace.path().join("out.txt");
    gw.prompt(&id, "Please run SHELL<<echo ran-by-qwen > out.txt>>")
        .await;
    let asked = ws.until_type("permission_requested").await;
    let request = asked.last().unwrap()["data"].clone();
    assert!(
        request["tool_call"]
            .to_string()
            .contains("echo ran-by-qwen"),
        "{request}"
    );
    assert!(!out.exists(), "nothing runs before the answer");
    let (status, pending) = gw
        .get(&format!("/api/v1/permissions?conversation_id={id}"))
        .await;
    assert_eq!(status, 200, "{pending}");
    let items = pending["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{pending}");
    assert_eq!(items[0]["id"], request["id"]);
    assert_eq!(items[0]["status"], "pending");
    let allow = items[0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "allow_once")
        .unwrap_or_else(|| panic!("an allow_once option: {pending}"))["optionId"]
        .clone();
    let (status, answered) = gw
        .post(
            &format!(
                "/api/v1/permissions/{}/respond",
                request["id"].as_str().unwrap()
            ),
            json!({"option_id": allow}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "approved");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        frames.last().unwrap()["data"]["stop_reason"],
        "end_turn",
        "{frames:#?}\n{}",
        qwen.log_text()
    );
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        AFTER_TOOL.concat()
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "ran-by-qwen");
    // The model saw the tool's result.
    assert!(model.requests.lock().unwrap().iter().any(|r| r["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["role"]
        == "tool"));

    gw.stop().await;
    qwen.kill().await;
    model.stop().await;
}

/// `GET /api/v1/agents` against qwen serve requiring a token: with the
/// right one it is available; with a wrong one it says the token is
/// refused.
async fn the_agents_list_says_qwen_is_available_or_refuses_the_token(db: TestDb) {
    let Some(bin) = qwen_bin() else { return };
    let model = FakeModel::start().await;
    let qwen = QwenServe::start(&bin, &model, Some("qwen-s3cret")).await;
    let dir = tempfile::tempdir().unwrap();
    let right = token_file(dir.path(), "right", "qwen-s3cret");
    let wrong = token_file(dir.path(), "wrong", "guess");
    let cwd = qwen.workspace.path();
    let gw = TestGateway::start(
        &db,
        vec![
            qwen_profile("qwen", &qwen.url(), cwd, Some(&right)),
            qwen_profile("qwen-wrong-token", &qwen.url(), cwd, Some(&wrong)),
            qwen_profile("qwen-no-token", &qwen.url(), cwd, None),
            qwen_profile("qwen-http", &qwen.http_url(), cwd, Some(&right)),
            qwen_profile("qwen-http-wrong-token", &qwen.http_url(), cwd, Some(&wrong)),
        ],
    )
    .await;
    let (status, list) = gw.get("/api/v1/agents").await;
    assert_eq!(status, 200, "{list}");
    let agent = |name: &str| {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        agent("qwen")["available"],
        true,
        "{list}\n{}",
        qwen.log_text()
    );
    assert_eq!(agent("qwen")["unavailable_reason"], json!(null));
    assert_eq!(agent("qwen-http")["available"], true, "{list}");
    for refused in ["qwen-wrong-token", "qwen-no-token", "qwen-http-wrong-token"] {
        let a = agent(refused);
        assert_eq!(a["available"], false, "{a}");
        let reason = a["unavailable_reason"].as_str().unwrap();
        assert!(reason.contains("refused the token"), "{refused}: {reason}");
    }
    gw.stop().await;
    qwen.kill().await;
    model.stop().await;
}

/// qwen serve killed mid-turn, while its permission request waits, and
/// started again on its port: the gateway connects again by itself and
/// has qwen load the conversation's session (what qwen recorded of it);
/// the request, which the new qwen does not ask again, expires saying
/// why; and the next turn's model request carries the earlier turns.
async fn qwen_serve_restarted_mid_turn_is_connected_again_and_loads_the_session(db: TestDb) {
    let Some(bin) = qwen_bin() else { return };
    let model = FakeModel::start().await;
    let qwen = QwenServe::start(&bin, &model, None).await;
    let config = Config::for_tests(
        &db,
        vec![qwen_profile(
            "qwen",
            &qwen.url(),
            qwen.workspace.path(),
            None,
        )],
    );
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("qwen").await;
    gw.prompt(&id, "Say hello").await;
    ws.until_type("turn_ended").await;
    gw.prompt(&id, "Please run SHELL<<echo never > never.txt>>")
        .await;
    let asked = ws.until_type("permission_requested").await;
    let request = asked.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let qwen = qwen.restart(&bin, &model).await;
    let frames = ws
        .until_within(Duration::from_secs(60), |e| {
            e["type"] == "agent_status" && e["data"]["status"] == "ready"
        })
        .await;
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error", "{frames:#?}");
    assert_eq!(
        frames.last().unwrap()["data"]["context"],
        "loaded",
        "{frames:#?}\n{}",
        qwen.log_text()
    );
    // The new qwen does not wait for the answer: the request expires.
    let frames = ws
        .until_type_within("permission_resolved", Duration::from_secs(40))
        .await;
    let resolved = frames.last().unwrap();
    assert_eq!(resolved["data"]["id"], request.as_str());
    assert_eq!(resolved["data"]["status"], "expired", "{resolved}");
    assert!(!qwen.workspace.path().join("never.txt").exists());

    // The session goes on with what it said before.
    let asked_before = model.requests.lock().unwrap().len();
    gw.prompt(&id, "Say hello again").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        frames.last().unwrap()["data"]["stop_reason"],
        "end_turn",
        "{frames:#?}\n{}",
        qwen.log_text()
    );
    let requests = model.requests.lock().unwrap().clone();
    let this_turn = &requests[asked_before..];
    assert!(
        this_turn.iter().any(|r| {
            let said = r["messages"].to_string();
            said.contains("Say hello again") && said.contains("Say hello\"")
        }),
        "the model hears the earlier turn: {this_turn:#?}"
    );

    gw.stop().await;
    qwen.kill().await;
    model.stop().await;
}

backend_tests!(
    qwen_serve_restarted_mid_turn_is_connected_again_and_loads_the_session,
    qwen_serve_streams_and_asks_permission_answered_over_rest,
    qwen_serve_over_streamable_http_streams_and_asks_permission,
    the_agents_list_says_qwen_is_available_or_refuses_the_token,
);
