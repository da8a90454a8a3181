//! Remote agents: a profile naming a `url` instead of a `command` reaches an
//! agent that serves ACP over a WebSocket. Here that agent is the demo
//! agent behind a small WebSocket server of the test's own (one demo agent
//! process per connection, each text frame one line of its stdio, the
//! bearer token checked), on loopback.

use std::path::Path;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::common::*;
use acp_gateway::config::{AgentProfile, Config};

/// The demo agent served over WebSocket ACP on loopback.
struct AgentServer {
    port: u16,
    /// Ends the server and every connection at once, without a close frame
    /// (as a dropped network or a killed server would).
    stop: CancellationToken,
    /// Makes every connection fall silent (it reads and answers nothing,
    /// pings included) but stay open: a network gone without a word.
    silence: CancellationToken,
    tasks: TaskTracker,
    /// How many connections it has accepted.
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AgentServer {
    /// On a free port, checking `token` where one is given.
    async fn start(token: Option<&str>) -> AgentServer {
        Self::on(0, token).await
    }

    async fn on(port: u16, token: Option<&str>) -> AgentServer {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        let silence = CancellationToken::new();
        let tasks = TaskTracker::new();
        let token = token.map(str::to_owned);
        let (accepting, inner, silent) = (stop.clone(), tasks.clone(), silence.clone());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        tasks.spawn(async move {
            loop {
                let tcp = tokio::select! {
                    _ = accepting.cancelled() => return,
                    tcp = listener.accept() => tcp.unwrap().0,
                };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                inner.spawn(serve_one(
                    tcp,
                    token.clone(),
                    accepting.clone(),
                    silent.clone(),
                ));
            }
        });
        AgentServer {
            port,
            stop,
            silence,
            tasks,
            accepted,
        }
    }

    /// How many connections it serves now (its tasks but the accepting one).
    fn connections(&self) -> usize {
        self.tasks.len().saturating_sub(1)
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/acp", self.port)
    }

    /// Drops every connection and kills every agent it started.
    async fn kill(self) {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(WAIT, self.tasks.wait())
            .await
            .expect("the agent server stops");
    }
}

/// One WebSocket connection: its own demo agent, frames to lines and back.
async fn serve_one(
    tcp: tokio::net::TcpStream,
    token: Option<String>,
    stop: CancellationToken,
    silence: CancellationToken,
) {
    // The handshake's callback type is tungstenite's.
    #[allow(clippy::result_large_err)]
    let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        let given = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        // A header that proves the profile's `headers` are sent.
        if request.headers().contains_key("x-refuse-me") {
            let mut refused = ErrorResponse::new(Some("refused".into()));
            *refused.status_mut() = StatusCode::FORBIDDEN;
            return Err(refused);
        }
        match &token {
            Some(token) if given != Some(&format!("Bearer {token}")) => {
                let mut refused = ErrorResponse::new(Some("bad token".into()));
                *refused.status_mut() = StatusCode::UNAUTHORIZED;
                Err(refused)
            }
            _ => Ok(response),
        }
    };
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(tcp, check).await else {
        return;
    };
    let mut agent = tokio::process::Command::new(demo_agent_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = agent.stdin.take().unwrap();
    let mut stdout = BufReader::new(agent.stdout.take().unwrap()).lines();
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = silence.cancelled() => {
                stop.cancelled().await;
                break;
            }
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
                    if sink.send(Message::text(line)).await.is_err() {
                        break;
                    }
                }
                _ => {
                    let _ = sink.close().await;
                    break;
                }
            },
        }
    }
    let _ = agent.kill().await;
}

/// A profile of the remote agent at `url` (loopback: `allow_private`),
/// with the token in `token_file` where one is given.
pub(super) fn remote_profile(name: &str, url: &str, token_file: Option<&Path>) -> AgentProfile {
    let mut agent: AgentProfile =
        serde_json::from_value(json!({"name": name, "url": url, "allow_private": true})).unwrap();
    agent.token_file = token_file.map(Path::to_path_buf);
    agent.cwd = Some(std::env::temp_dir());
    agent.startup_timeout = Duration::from_secs(20);
    agent.idle_timeout = Duration::ZERO;
    agent
}

/// A file holding `token`, in `dir`.
fn token_file(dir: &Path, name: &str, token: &str) -> std::path::PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, format!("{token}\n")).unwrap();
    file
}

async fn a_remote_agent_streams_asks_permission_and_changes_modes(db: TestDb) {
    let server = AgentServer::start(Some("s3cret")).await;
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "token", "s3cret");
    let mut config = Config::for_tests(
        &db,
        vec![remote_profile("remote", &server.url(), Some(&token))],
    );
    // A remote agent never runs under a shim, even where agents do.
    config.agent_shims = true;
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("remote").await;

    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert!(frames
        .iter()
        .any(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready"));
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: hello"
    );

    gw.prompt(&id, "tool").await;
    ws.until_type("permission_requested").await;
    let (_, pending) = gw
        .get(&format!("/api/v1/permissions?conversation_id={id}"))
        .await;
    let request = pending["items"][0]["id"].as_str().unwrap().to_owned();
    let (status, answered) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "approved");
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert!(streamed_text(&frames, "agent_message_chunk").contains("Done."));

    let (status, body) = gw.set_mode(&id, "plan").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw.set_option(&id, "model", json!("large")).await;
    assert_eq!(status, 200, "{body}");
    let conversation = gw.conversation(&id).await;
    assert_eq!(
        conversation["modes"]["currentModeId"], "plan",
        "{conversation}"
    );
    assert_eq!(
        conversation["config_options"][0]["currentValue"], "large",
        "{conversation}"
    );
    // No process of the gateway's: nothing on record, no shim.
    assert_eq!(agent_process_records(&db).await, vec![]);

    // Closing the conversation closes the connection (the server's agent
    // for it ends with it).
    let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204, "{body}");
    let frames = ws.until_agent_gone().await;
    assert_eq!(frames.last().unwrap()["data"]["status"], "exited");
    server.kill().await;
}

async fn the_agents_list_says_whether_a_remote_agent_can_be_reached(db: TestDb) {
    let server = AgentServer::start(Some("s3cret")).await;
    let dir = tempfile::tempdir().unwrap();
    let right = token_file(dir.path(), "right", "s3cret");
    let wrong = token_file(dir.path(), "wrong", "guess");
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut private = remote_profile(
        "private",
        &format!("wss://localhost:{}/acp", server.port),
        None,
    );
    private.allow_private = false;
    let mut unset = remote_profile("unset", &server.url(), None);
    unset.token_env = Some("ACP_GATEWAY_TEST_NO_SUCH_TOKEN".into());
    let mut headered = remote_profile("headered", &server.url(), Some(&right));
    headered.headers.insert("X-Refuse-Me".into(), "yes".into());
    let gw = TestGateway::start(
        &db,
        vec![
            remote_profile("good", &server.url(), Some(&right)),
            remote_profile("wrong-token", &server.url(), Some(&wrong)),
            remote_profile(
                "unreachable",
                &format!("ws://127.0.0.1:{closed_port}/acp"),
                None,
            ),
            private,
            unset,
            headered,
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
    assert_eq!(agent("good")["available"], true, "{list}");
    assert_eq!(agent("good")["unavailable_reason"], json!(null));
    let said = |name: &str| {
        let a = agent(name);
        assert_eq!(a["available"], false, "{a}");
        a["unavailable_reason"].as_str().unwrap().to_owned()
    };
    assert!(said("wrong-token").contains("refused the token"), "{list}");
    assert!(said("unreachable").contains("cannot connect"), "{list}");
    // localhost resolves to loopback: refused without allow_private.
    assert!(said("private").contains("allow_private"), "{list}");
    assert!(
        said("unset").contains("ACP_GATEWAY_TEST_NO_SUCH_TOKEN is not set"),
        "{list}"
    );
    // The profile's headers are sent (this server refuses that one: 403).
    assert!(said("headered").contains("HTTP 403"), "{list}");
    // Asked again at once: what was found is remembered, nothing connects.
    let accepted = server.accepted.load(std::sync::atomic::Ordering::SeqCst);
    let (_, again) = gw.get("/api/v1/agents").await;
    assert_eq!(again["items"], list["items"]);
    assert_eq!(
        server.accepted.load(std::sync::atomic::Ordering::SeqCst),
        accepted
    );

    // A conversation of the one with the wrong token fails to start, saying why.
    let (status, problem) = gw
        .post("/api/v1/conversations", json!({"agent": "wrong-token"}))
        .await;
    assert_eq!(status, 502, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("refused the token"),
        "{problem}"
    );
    server.kill().await;
}

async fn a_dropped_connection_shows_agent_status_and_the_gateway_connects_again(db: TestDb) {
    let server = AgentServer::start(None).await;
    let port = server.port;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    gw.prompt(&id, "tool").await;
    ws.until_type("permission_requested").await;

    // The network goes: the server and its agents are gone at once.
    server.kill().await;
    let frames = ws.until_agent_gone().await;
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "failed", "{status}");
    let detail = status["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("was lost"), "{detail}");
    // The request stays pending (the agent may come back still asking),
    // and is not answerable while it is away.
    assert!(!frames.iter().any(|e| e["type"] == "permission_resolved"));
    let (_, pending) = gw
        .get(&format!("/api/v1/permissions?conversation_id={id}"))
        .await;
    let request = pending["items"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(pending["items"][0]["status"], "pending", "{pending}");
    let (status, problem) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "agent_away", "{problem}");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    let (_, conversation) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conversation["status"], "idle");

    // While it is away, a prompt fails to start it and says why.
    let (status, problem) = gw.try_prompt(&id, "hello").await;
    assert_eq!(status, 502, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{problem}"
    );

    // Back on the same address: the gateway connects again by itself
    // (the demo agent cannot load a session: a new one, the context reset).
    let server = AgentServer::on(port, None).await;
    let frames = ws
        .until(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .await;
    assert_eq!(frames.last().unwrap()["data"]["context"], "reset");
    assert_eq!(server.connections(), 1);
    // A new session knows nothing of the request: it expires, saying why.
    let frames = ws.until_type("permission_resolved").await;
    let resolved = frames.last().unwrap();
    assert_eq!(resolved["data"]["id"], request.as_str());
    assert_eq!(resolved["data"]["status"], "expired");
    let why = resolved["data"]["decision"]["reason"].as_str().unwrap();
    assert!(why.contains("without its earlier session"), "{why}");
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    server.kill().await;
}

async fn a_connection_gone_silent_is_lost_after_three_unanswered_pings(db: TestDb) {
    let server = AgentServer::start(None).await;
    let mut profile = remote_profile("remote", &server.url(), None);
    profile.ping_interval = Duration::from_millis(200);
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    gw.prompt(&id, "hang").await;
    ws.until_type("turn_started").await;
    // The connection stays open, but nothing answers any more.
    server.silence.cancel();
    let frames = ws.until_agent_gone().await;
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "failed", "{status}");
    let detail = status["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("not even a pong"), "{detail}");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    server.kill().await;
}

async fn an_idle_remote_agent_is_stopped_by_closing_its_connection(db: TestDb) {
    let server = AgentServer::start(None).await;
    let mut profile = remote_profile("remote", &server.url(), None);
    profile.idle_timeout = Duration::from_millis(300);
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    gw.prompt(&id, "hello").await;
    ws.until_type("turn_ended").await;
    assert_eq!(server.connections(), 1);
    let frames = ws.until_agent_gone().await;
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "exited", "{status}");
    assert!(
        status["data"]["detail"].as_str().unwrap().contains("idle"),
        "{status}"
    );
    // The server saw its connection closed (and ended its agent).
    eventually(WAIT, async || (server.connections() == 0).then_some(()))
        .await
        .expect("the connection is closed");
    // The next prompt connects again.
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    server.kill().await;
}

async fn a_message_over_max_line_bytes_ends_the_connection_saying_so(db: TestDb) {
    let server = AgentServer::start(None).await;
    let mut config = Config::for_tests(&db, vec![remote_profile("remote", &server.url(), None)]);
    config.max_line_bytes = 64 * 1024;
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    gw.prompt(&id, "big 200000").await;
    let frames = ws.until_agent_gone().await;
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "failed", "{status}");
    let detail = status["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("too long"), "{detail}");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    // The conversation goes on: the next prompt connects again.
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    server.kill().await;
}

async fn an_agent_closing_its_connection_mid_turn_ends_the_turn_and_says_so(db: TestDb) {
    let server = AgentServer::start(None).await;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    // The demo agent exits mid-turn; its server closes the WebSocket in
    // order (a close frame).
    gw.prompt(&id, "crash").await;
    let frames = ws.until_agent_gone().await;
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "exited", "{status}");
    let detail = status["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("was closed by the agent"), "{detail}");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    assert!(!streamed_text(&frames, "agent_message_chunk").is_empty());
    server.kill().await;
}

backend_tests!(
    an_agent_closing_its_connection_mid_turn_ends_the_turn_and_says_so,
    a_message_over_max_line_bytes_ends_the_connection_saying_so,
    an_idle_remote_agent_is_stopped_by_closing_its_connection,
    a_connection_gone_silent_is_lost_after_three_unanswered_pings,
    a_remote_agent_streams_asks_permission_and_changes_modes,
    the_agents_list_says_whether_a_remote_agent_can_be_reached,
    a_dropped_connection_shows_agent_status_and_the_gateway_connects_again,
);

/// The config error a profile's `keys` (TOML lines) make.
pub(super) fn refused(keys: &str) -> String {
    let text = format!("[[agents]]\nname = \"remote\"\n{keys}\n");
    let config = Config::parse(&text).expect("it parses");
    match config.validate() {
        Err(err) => format!("{err:#}"),
        Ok(()) => panic!("accepted: {keys}"),
    }
}

#[test]
fn a_remote_profile_mixing_in_a_spawned_agents_keys_is_refused() {
    let url = "url = \"wss://agents.example.com/acp\"\n";
    for (key, line) in [
        ("command", "command = \"sh\""),
        ("sandbox", "sandbox = \"off\""),
        ("user", "user = \"nobody\""),
        ("pass_env", "pass_env = [\"HOME\"]"),
        ("env", "env = { A = \"b\" }"),
        ("client_terminal", "client_terminal = true"),
    ] {
        let err = refused(&format!("{url}{line}"));
        assert!(err.contains(&format!("agents[0].{key}")), "{err}");
        assert!(err.contains("does not apply to a remote agent"), "{err}");
    }
    // And a spawned agent's profile may not carry a remote one's keys.
    for (key, line) in [
        ("allow_private", "allow_private = true"),
        ("reconnect_tries", "reconnect_tries = 3"),
        ("ca_file", "ca_file = \"/etc/ssl/ca.pem\""),
        ("transport", "transport = \"http\""),
    ] {
        let err = refused(&format!("command = \"sh\"\n{line}"));
        let says = format!("agents[0].{key}: only for a remote agent");
        assert!(err.contains(&says), "{err}");
    }
}

#[test]
fn a_remote_profiles_url_is_checked() {
    for (url, says) in [
        ("ws://agents.example.com/acp", "plain ws:// is refused"),
        ("http://agents.example.com/acp", "plain http:// is refused"),
        ("https://10.0.0.5/acp", "allow_private = true"),
        ("wss://10.0.0.5/acp", "allow_private = true"),
        ("wss://[::1]:4000/acp", "allow_private = true"),
        ("wss://169.254.169.254/acp", "allow_private = true"),
        ("ftp://agents.example.com/", "not a remote agent's URL"),
        ("not a url", "agents[0].url"),
        ("wss://me:pw@agents.example.com/acp", "credentials"),
    ] {
        let err = refused(&format!("url = {url:?}"));
        assert!(err.contains(says), "{url}: {err}");
    }
    // allow_private admits them.
    let text =
        "[[agents]]\nname = \"remote\"\nurl = \"ws://10.0.0.5:4000/acp\"\nallow_private = true\n";
    Config::parse(text).unwrap().validate().unwrap();
    let err = refused("url = \"wss://a.example.com/acp\"\ntoken_env = \"NOT-A-NAME\"");
    assert!(err.contains("not an environment variable name"), "{err}");
    let err = refused("url = \"wss://a.example.com/acp\"\ntoken_file = \"token\"");
    assert!(err.contains("absolute path"), "{err}");
    let err = refused("url = \"wss://a.example.com/acp\"\nheaders = { Authorization = \"x\" }");
    assert!(err.contains("token_file or token_env"), "{err}");
}

#[tokio::test]
async fn the_gateway_refuses_to_start_with_a_remote_profile_naming_a_user() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\nstate_dir = {:?}\n\n[[agents]]\nname = \"remote\"\n\
         url = \"wss://agents.example.com/acp\"\nuser = \"nobody\"\n",
        dir.path().display().to_string()
    );
    std::fs::write(&config, text).unwrap();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env(
            "DATABASE_URL",
            format!("sqlite://{}/db", dir.path().display()),
        )
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(WAIT, run)
        .await
        .expect("it stops at once")
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("agents[0].user: does not apply to a remote agent"),
        "{said}"
    );
}
