//! Remote agents over ACP's Streamable HTTP (and the WebSocket over real
//! TLS): gateway A's profile names a `url` on gateway B, a second gateway
//! in this process whose ACP front door (`/api/v1/acp/demo`) serves the
//! demo agent. B checks its bearer token and, where the test says so,
//! serves TLS with a certificate made here (`rcgen`) that A trusts through
//! the profile's `ca_file`. A connection is dropped by a TCP relay of the
//! test's own between A and B, cut without a word.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::remote_agents::refused;
use crate::common::*;
use acp_gateway::config::{AgentProfile, Config, TlsFiles, Transport};

/// Gateway B: the demo agent behind its ACP front door, a token of its
/// own, and (with TLS) its certificate.
struct AgentGateway {
    gw: TestGateway,
    /// Its REST API as the token's holder (over TLS where it serves it).
    api: Client,
    port: u16,
    /// The token A's profile sends, in a file.
    token_file: PathBuf,
    /// Its certificate (PEM) in a file, where it serves TLS.
    cert_file: Option<PathBuf>,
    dir: tempfile::TempDir,
    _db: TestDb,
}

impl AgentGateway {
    async fn start(tls: bool) -> AgentGateway {
        let db = TestDb::sqlite().await;
        let token = cli_token(&db, "gateway-a", "user");
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
        let mut cert_file = None;
        let mut http = reqwest::Client::builder();
        if tls {
            let made =
                rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
                    .unwrap();
            let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert, made.cert.pem()).unwrap();
            std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
            http = http.tls_built_in_root_certs(false).add_root_certificate(
                reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap(),
            );
            config.tls = Some(TlsFiles {
                cert_file: cert.clone(),
                key_file: key,
            });
            cert_file = Some(cert);
        }
        let gw = TestGateway::start_with(config).await;
        let port: u16 = gw.base.rsplit(':').next().unwrap().parse().unwrap();
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        let scheme = if tls { "https" } else { "http" };
        let api = Client {
            base: format!("{scheme}://127.0.0.1:{port}"),
            http: http.default_headers(headers).build().unwrap(),
            token: Some(token),
        };
        AgentGateway {
            gw,
            api,
            port,
            token_file,
            cert_file,
            dir,
            _db: db,
        }
    }

    /// Its ACP endpoint for the demo agent, as `scheme://host:port`.
    fn url(&self, scheme: &str, host: &str) -> String {
        format!("{scheme}://{host}:{}/api/v1/acp/demo", self.port)
    }

    /// A file holding another token than its own.
    fn wrong_token_file(&self) -> PathBuf {
        let file = self.dir.path().join("wrong");
        std::fs::write(&file, "not-the-token\n").unwrap();
        file
    }

    /// Its conversations (those A's connections started).
    async fn conversations(&self) -> Vec<Value> {
        let (status, list) = self.api.get("/api/v1/conversations").await;
        assert_eq!(status, 200, "{list}");
        list["items"].as_array().unwrap().clone()
    }

    /// Waits until none of its conversations runs a turn.
    async fn until_idle(&self) {
        eventually(WAIT, async || {
            let list = self.conversations().await;
            list.iter()
                .all(|c| matches!(c["status"].as_str(), Some("idle" | "closed" | "failed")))
                .then_some(())
        })
        .await
        .expect("gateway B's turns end");
    }
}

/// A's profile of the remote agent at `url` (on loopback: `allow_private`).
fn remote_profile(
    name: &str,
    url: &str,
    token_file: &Path,
    ca_file: Option<&Path>,
) -> AgentProfile {
    let mut agent: AgentProfile =
        serde_json::from_value(json!({"name": name, "url": url, "allow_private": true})).unwrap();
    agent.token_file = Some(token_file.to_path_buf());
    agent.ca_file = ca_file.map(Path::to_path_buf);
    agent.cwd = Some(std::env::temp_dir());
    agent.startup_timeout = Duration::from_secs(20);
    agent.idle_timeout = Duration::ZERO;
    agent
}

/// A TCP relay on loopback to `to`: what passes through it can be cut at
/// once, both ways, without a close of either protocol.
struct Relay {
    port: u16,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Relay {
    async fn on(port: u16, to: u16) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (accepting, inner) = (stop.clone(), tasks.clone());
        tasks.spawn(async move {
            loop {
                let mut near = tokio::select! {
                    _ = accepting.cancelled() => return,
                    tcp = listener.accept() => tcp.unwrap().0,
                };
                let stop = accepting.clone();
                inner.spawn(async move {
                    let Ok(mut far) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut near, &mut far) => {}
                    }
                });
            }
        });
        Relay { port, stop, tasks }
    }

    /// Cuts every connection and stops listening.
    async fn cut(self) {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(WAIT, self.tasks.wait())
            .await
            .expect("the relay stops");
    }
}

/// The request waiting in A's inbox for `conversation`, answered with
/// `option`.
async fn answer_pending(gw: &TestGateway, conversation: &str, option: &str) {
    let (_, pending) = gw
        .get(&format!(
            "/api/v1/permissions?conversation_id={conversation}"
        ))
        .await;
    let request = pending["items"][0]["id"].as_str().unwrap().to_owned();
    let (status, answered) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": option}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "approved");
}

async fn an_agent_over_https_streams_asks_permission_and_ends_each_turn_once(db: TestDb) {
    let b = AgentGateway::start(true).await;
    let profile = remote_profile(
        "remote",
        &b.url("https", "localhost"),
        &b.token_file,
        b.cert_file.as_deref(),
    );
    assert_eq!(profile.remote_transport(), Some(Transport::Http));
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (_, list) = gw.get("/api/v1/agents").await;
    assert_eq!(list["items"][0]["available"], true, "{list}");
    let (id, mut ws) = gw.open_conversation("remote").await;

    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "You said: hello"
    );

    // B's agent asks; B holds the request for a person and shows it to
    // its ACP client, A, where it waits in A's inbox.
    gw.prompt(&id, "tool").await;
    ws.until_type("permission_requested").await;
    answer_pending(&gw, &id, "allow-once").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert!(streamed_text(&frames, "agent_message_chunk").contains("Done."));
    // Each turn ended once.
    let ended = gw
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["type"] == "turn_ended")
        .count();
    assert_eq!(ended, 2);

    // B has the conversation of its own, the answer recorded as given
    // over ACP.
    let theirs = b.conversations().await;
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(theirs[0]["agent"], "demo");
    let (_, answered) = b
        .api
        .get(&format!(
            "/api/v1/permissions?conversation_id={}&status=all",
            theirs[0]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(answered["items"][0]["status"], "approved", "{answered}");
    assert_eq!(answered["items"][0]["decision"]["via"], "acp", "{answered}");

    // Closing A's conversation ends the connection (B's conversation
    // stays).
    let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204, "{body}");
    let frames = ws.until_agent_gone().await;
    assert_eq!(frames.last().unwrap()["data"]["status"], "exited");
    gw.stop().await;
    b.gw.stop().await;
}

async fn an_agent_over_wss_is_checked_against_the_ca_file(db: TestDb) {
    let b = AgentGateway::start(true).await;
    let ca = b.cert_file.as_deref();
    let wss = remote_profile("wss", &b.url("wss", "localhost"), &b.token_file, ca);
    // An https:// url spoken to as a WebSocket: upgraded over TLS.
    let mut upgraded = remote_profile("upgraded", &b.url("https", "127.0.0.1"), &b.token_file, ca);
    upgraded.transport = Some(Transport::Websocket);
    // Without the ca_file, B's certificate is not trusted.
    let untrusted = remote_profile("untrusted", &b.url("wss", "localhost"), &b.token_file, None);
    let untrusted_http = remote_profile(
        "untrusted-http",
        &b.url("https", "localhost"),
        &b.token_file,
        None,
    );
    let gw = TestGateway::start(&db, vec![wss, upgraded, untrusted, untrusted_http]).await;
    let (_, list) = gw.get("/api/v1/agents").await;
    let agent = |name: &str| {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap()
            .clone()
    };
    for name in ["untrusted", "untrusted-http"] {
        let a = agent(name);
        assert_eq!(a["available"], false, "{a}");
        assert!(
            a["unavailable_reason"]
                .as_str()
                .unwrap()
                .contains("certificate"),
            "{a}"
        );
    }
    for name in ["wss", "upgraded"] {
        assert_eq!(agent(name)["available"], true, "{list}");
        let (id, mut ws) = gw.open_conversation(name).await;
        gw.prompt(&id, "hello").await;
        let frames = ws.until_type("turn_ended").await;
        assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
        assert_eq!(
            streamed_text(&frames, "agent_message_chunk"),
            "You said: hello"
        );
    }
    gw.stop().await;
    b.gw.stop().await;
}

async fn the_agents_list_says_whether_an_http_agent_can_be_reached(db: TestDb) {
    let b = AgentGateway::start(false).await;
    let wrong = b.wrong_token_file();
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut private = remote_profile("private", &b.url("https", "localhost"), &b.token_file, None);
    private.allow_private = false;
    let missing_ca = b.dir.path().join("missing-ca.pem");
    let bad_ca = remote_profile(
        "bad-ca",
        &b.url("https", "127.0.0.1"),
        &b.token_file,
        Some(&missing_ca),
    );
    let gw = TestGateway::start(
        &db,
        vec![
            remote_profile("good", &b.url("http", "127.0.0.1"), &b.token_file, None),
            remote_profile("wrong-token", &b.url("http", "127.0.0.1"), &wrong, None),
            remote_profile(
                "unreachable",
                &format!("http://127.0.0.1:{closed_port}/acp"),
                &b.token_file,
                None,
            ),
            private,
            bad_ca,
        ],
    )
    .await;
    let (status, list) = gw.get("/api/v1/agents").await;
    assert_eq!(status, 200, "{list}");
    let said = |name: &str| {
        let a = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap()
            .clone();
        a["unavailable_reason"].as_str().map(str::to_owned)
    };
    assert_eq!(said("good"), None, "{list}");
    assert!(
        said("wrong-token")
            .unwrap()
            .contains("refused the token (HTTP 401"),
        "{list}"
    );
    assert!(
        said("unreachable").unwrap().contains("cannot connect"),
        "{list}"
    );
    // localhost resolves to loopback: refused without allow_private.
    assert!(said("private").unwrap().contains("allow_private"), "{list}");
    let bad_ca = said("bad-ca").unwrap();
    assert!(
        bad_ca.contains("ca_file: cannot read") && bad_ca.contains("missing-ca.pem"),
        "{list}"
    );
    // The probe started nothing on B.
    assert!(b.conversations().await.is_empty());

    // A conversation of the one with the wrong token fails to start,
    // saying why.
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
    gw.stop().await;
    b.gw.stop().await;
}

async fn a_dropped_http_connection_shows_agent_status_and_the_gateway_connects_again(db: TestDb) {
    let b = AgentGateway::start(false).await;
    let relay = Relay::on(0, b.port).await;
    let port = relay.port;
    let url = format!("http://127.0.0.1:{port}/api/v1/acp/demo");
    let gw = TestGateway::start(
        &db,
        vec![remote_profile("remote", &url, &b.token_file, None)],
    )
    .await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    gw.prompt(&id, "slow 10").await;
    ws.until(|e| {
        e["type"] == "session_update"
            && e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    })
    .await;

    // The network goes, mid-turn.
    relay.cut().await;
    let frames = ws.until_agent_gone().await;
    let status = frames.last().unwrap();
    assert_eq!(status["data"]["status"], "failed", "{status}");
    let detail = status["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("was lost"), "{detail}");
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");

    // Back on the same address: the gateway connects again by itself.
    let relay = Relay::on(port, b.port).await;
    ws.until(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .await;
    // B's own turn went on without A; once it has ended, A's next turn
    // runs over the new connection.
    b.until_idle().await;
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    gw.stop().await;
    relay.cut().await;
    b.gw.stop().await;
}

async fn a_message_over_max_line_bytes_ends_the_http_connection_saying_so(db: TestDb) {
    let b = AgentGateway::start(false).await;
    let profile = remote_profile("remote", &b.url("http", "127.0.0.1"), &b.token_file, None);
    let mut config = Config::for_tests(&db, vec![profile]);
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
    gw.stop().await;
    b.gw.stop().await;
}

backend_tests!(
    an_agent_over_https_streams_asks_permission_and_ends_each_turn_once,
    an_agent_over_wss_is_checked_against_the_ca_file,
    the_agents_list_says_whether_an_http_agent_can_be_reached,
    a_dropped_http_connection_shows_agent_status_and_the_gateway_connects_again,
    a_message_over_max_line_bytes_ends_the_http_connection_saying_so,
);

#[test]
fn the_transport_follows_the_scheme_unless_named() {
    let parse = |keys: &str| -> AgentProfile {
        let text = format!("[[agents]]\nname = \"remote\"\n{keys}\n");
        let config = Config::parse(&text).expect("it parses");
        config.validate().expect("valid");
        config.agents[0].clone()
    };
    let http = parse("url = \"https://agents.example.com/acp\"");
    assert_eq!(http.remote_transport(), Some(Transport::Http));
    let ws = parse("url = \"wss://agents.example.com/acp\"");
    assert_eq!(ws.remote_transport(), Some(Transport::Websocket));
    let upgraded = parse("url = \"https://agents.example.com/acp\"\ntransport = \"websocket\"");
    assert_eq!(upgraded.remote_transport(), Some(Transport::Websocket));
    let plain = parse("url = \"http://10.0.0.5:4000/acp\"\nallow_private = true");
    assert_eq!(plain.remote_transport(), Some(Transport::Http));

    // ws(s):// spoken to as Streamable HTTP, an unknown transport, plain
    // http:// without allow_private: refused.
    let err = refused("url = \"wss://agents.example.com/acp\"\ntransport = \"http\"");
    assert!(err.contains("agents[0].transport"), "{err}");
    let err = refused("url = \"http://agents.example.com/acp\"");
    assert!(err.contains("plain http:// is refused"), "{err}");
    let err = refused("url = \"https://10.0.0.5/acp\"");
    assert!(err.contains("allow_private = true"), "{err}");
    let text = "[[agents]]\nname = \"remote\"\nurl = \"https://a.example.com/acp\"\ntransport = \"grpc\"\n";
    assert!(Config::parse(text).is_err());
}

#[test]
fn a_ca_file_is_for_a_remote_agent_and_read_at_each_connection() {
    let err = refused("url = \"https://agents.example.com/acp\"\nca_file = \"ca.pem\"");
    assert!(err.contains("agents[0].ca_file"), "{err}");
    assert!(err.contains("absolute path"), "{err}");

    // Read when connecting: what cannot be used says which file.
    let dir = tempfile::tempdir().unwrap();
    let roots = |file: &Path| {
        let text = format!(
            "[[agents]]\nname = \"remote\"\nurl = \"https://agents.example.com/acp\"\nca_file = {:?}\n",
            file.display().to_string()
        );
        let config = Config::parse(&text).unwrap();
        config.validate().unwrap();
        config.agents[0].extra_roots()
    };
    let err = format!("{:#}", roots(&dir.path().join("missing.pem")).unwrap_err());
    assert!(
        err.contains("ca_file: cannot read") && err.contains("missing.pem"),
        "{err}"
    );
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let err = format!("{:#}", roots(&empty).unwrap_err());
    assert!(err.contains("holds no PEM certificate"), "{err}");
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let good = dir.path().join("ca.pem");
    std::fs::write(&good, made.cert.pem()).unwrap();
    assert_eq!(roots(&good).unwrap().len(), 1);
}
