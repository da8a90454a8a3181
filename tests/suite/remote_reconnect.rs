//! A remote agent that outlives a dropped network: its server keeps the
//! one agent process (the demo agent with `--resumable`) while the
//! connection goes, and the gateway connects again by itself and resumes
//! the session (`session/resume`). A permission request that waited when
//! the connection went stays pending, is answerable once the agent asks
//! it again on the new connection, and expires, saying why, when the agent
//! comes back without asking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Mutex};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::remote_agents::remote_profile;
use crate::common::*;

/// One `--resumable` demo agent behind a WebSocket server on loopback,
/// one connection at a time; the agent stays when a connection goes.
struct ResumableServer {
    port: u16,
    /// Cuts the connection of the moment, without a close frame.
    cut: Arc<std::sync::Mutex<CancellationToken>>,
    /// Ends the server and its agent.
    stop: CancellationToken,
    tasks: TaskTracker,
    /// While set, connections are dropped as they come (the network is
    /// still away); the agent stays.
    away: Arc<AtomicBool>,
}

impl ResumableServer {
    /// With `forget`: on a connection after the first, the agent's
    /// requests asked again are not passed on (an agent that resumed its
    /// session but no longer waits for them).
    async fn start(forget: bool) -> ResumableServer {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut agent = tokio::process::Command::new(demo_agent_path())
            .arg("--resumable")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = Arc::new(Mutex::new(agent.stdin.take().unwrap()));
        let mut stdout = BufReader::new(agent.stdout.take().unwrap()).lines();
        // What the agent says waits here for the connection of the moment.
        let (said, hearing) = mpsc::unbounded_channel::<String>();
        let hearing = Arc::new(Mutex::new(hearing));
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let cut = Arc::new(std::sync::Mutex::new(CancellationToken::new()));
        let ending = stop.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = ending.cancelled() => break,
                    line = stdout.next_line() => match line {
                        Ok(Some(line)) => { let _ = said.send(line); }
                        _ => break,
                    },
                }
            }
            let _ = agent.kill().await;
        });
        let (accepting, cuts) = (stop.clone(), cut.clone());
        let away = Arc::new(AtomicBool::new(false));
        let refusing = away.clone();
        tasks.spawn(async move {
            let mut served = 0;
            loop {
                let tcp = tokio::select! {
                    _ = accepting.cancelled() => return,
                    tcp = listener.accept() => tcp.unwrap().0,
                };
                if refusing.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(ws) = tokio_tungstenite::accept_async(tcp).await else {
                    continue;
                };
                served += 1;
                let this = CancellationToken::new();
                *cuts.lock().unwrap() = this.clone();
                let forgetting = forget && served > 1;
                let (stdin, hearing, stop) = (stdin.clone(), hearing.clone(), accepting.clone());
                // One at a time: the next is accepted once this one went.
                serve(ws, stdin, hearing, this, stop, forgetting).await;
            }
        });
        ResumableServer {
            port,
            cut,
            stop,
            tasks,
            away,
        }
    }

    /// Whether connections are dropped as they come.
    fn set_away(&self, away: bool) {
        self.away.store(away, Ordering::SeqCst);
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/acp", self.port)
    }

    /// The network goes: the connection ends without a word.
    fn cut(&self) {
        self.cut.lock().unwrap().cancel();
    }

    async fn kill(self) {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(WAIT, self.tasks.wait())
            .await
            .expect("the agent server stops");
    }
}

/// Carries one connection's frames to the agent and its lines back, until
/// the connection ends or is cut.
async fn serve(
    ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    stdin: Arc<Mutex<tokio::process::ChildStdin>>,
    hearing: Arc<Mutex<mpsc::UnboundedReceiver<String>>>,
    cut: CancellationToken,
    stop: CancellationToken,
    forgetting: bool,
) {
    let (mut sink, mut stream) = ws.split();
    let mut hearing = hearing.lock().await;
    loop {
        tokio::select! {
            _ = cut.cancelled() => return,
            _ = stop.cancelled() => return,
            frame = stream.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    let line = format!("{}\n", text.as_str());
                    if stdin.lock().await.write_all(line.as_bytes()).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
            line = hearing.recv() => match line {
                Some(line) => {
                    if forgetting && line.contains("\"session/request_permission\"") {
                        continue;
                    }
                    if sink.send(Message::text(line)).await.is_err() {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}

/// Cuts the connection under a `tool` turn whose request waits: the turn
/// ends with an error, the request stays pending (answering it now is 409
/// `agent_away`), and the gateway connects again by itself. Returns the
/// request's id.
async fn cut_while_asking(
    gw: &TestGateway,
    server: &ResumableServer,
    id: &str,
    ws: &mut Ws,
) -> String {
    gw.prompt(id, "tool").await;
    ws.until_type("permission_requested").await;
    let (_, pending) = gw
        .get(&format!("/api/v1/permissions?conversation_id={id}"))
        .await;
    let request = pending["items"][0]["id"].as_str().unwrap().to_owned();
    server.cut();
    let frames = ws.until_agent_gone().await;
    assert_eq!(frames.last().unwrap()["data"]["status"], "failed");
    assert!(
        !frames.iter().any(|e| e["type"] == "permission_resolved"),
        "the request stays pending: {frames:?}"
    );
    let ended = frames.iter().find(|e| e["type"] == "turn_ended").unwrap();
    assert_eq!(ended["data"]["stop_reason"], "error");
    let (_, stored) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(stored["status"], "pending", "{stored}");
    request
}

async fn a_request_waiting_when_the_connection_went_is_answered_once_the_agent_asks_again(
    db: TestDb,
) {
    let server = ResumableServer::start(false).await;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    let request = cut_while_asking(&gw, &server, &id, &mut ws).await;

    // Back (the server never went): the session resumed, the context kept.
    let frames = ws
        .until(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .await;
    assert_eq!(frames.last().unwrap()["data"]["context"], "loaded");
    // The agent asks again; the same request, answerable now (an answer
    // just before the agent's question reaches the gateway is 409
    // agent_away, and the request still waits). The agent hears it.
    answer_once_asked_again(&gw, &mut ws, &request).await;
    let (_, resolved) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(resolved["status"], "approved", "{resolved}");
    // One request in all: asked again is not asked twice.
    let (_, all) = gw
        .get(&format!(
            "/api/v1/permissions?status=all&conversation_id={id}"
        ))
        .await;
    assert_eq!(all["items"].as_array().unwrap().len(), 1, "{all}");
    // The conversation goes on.
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    server.kill().await;
}

/// Answers `request` as soon as the agent, back, asks again (until then
/// 409 `agent_away`), then waits until the agent says its tool ran.
async fn answer_once_asked_again(gw: &TestGateway, ws: &mut Ws, request: &str) {
    let answered = eventually(WAIT, async || {
        let (status, body) = gw
            .post(
                &format!("/api/v1/permissions/{request}/respond"),
                json!({"option_id": "allow-once"}),
            )
            .await;
        match status {
            200 => Some(body),
            409 if body["code"] == "agent_away" => None,
            _ => panic!("{status}: {body}"),
        }
    })
    .await
    .expect("the request is answerable once the agent asks again");
    assert_eq!(answered["status"], "approved", "{answered}");
    ws.until(|e| {
        e["type"] == "session_update"
            && e["data"]["update"]["content"]["text"].as_str() == Some("Done.")
    })
    .await;
}

async fn a_question_waiting_when_the_connection_went_is_answered_once_the_agent_asks_again(
    db: TestDb,
) {
    let server = ResumableServer::start(false).await;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    gw.prompt(&id, "question").await;
    let frames = ws.until_type("question_asked").await;
    let question = frames.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    server.cut();
    let frames = ws.until_agent_gone().await;
    assert!(
        !frames.iter().any(|e| e["type"] == "question_resolved"),
        "{frames:?}"
    );
    ws.until(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .await;
    // The agent asks again: the same question, answerable now.
    let respond = format!("/api/v1/questions/{question}/respond");
    let answered = eventually(WAIT, async || {
        let (status, body) = gw
            .post(
                &respond,
                json!({"action": "accept", "content": {"go": true}}),
            )
            .await;
        match status {
            200 => Some(body),
            409 if body["code"] == "agent_away" => None,
            _ => panic!("{status}: {body}"),
        }
    })
    .await
    .expect("the question is answerable once the agent asks again");
    assert_eq!(answered["status"], "accepted", "{answered}");
    let said = r#"question answer: {"action":"accept","content":{"go":true}}"#;
    ws.until(|e| {
        e["type"] == "session_update"
            && e["data"]["update"]["content"]["text"].as_str() == Some(said)
    })
    .await;
    let (_, all) = gw
        .get(&format!(
            "/api/v1/questions?status=all&conversation_id={id}"
        ))
        .await;
    assert_eq!(all["items"].as_array().unwrap().len(), 1, "{all}");
    server.kill().await;
}

async fn a_gateway_restarted_while_the_agent_was_away_connects_again_and_the_request_waits(
    db: TestDb,
) {
    let server = ResumableServer::start(false).await;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    // The network goes, and stays away while the gateway restarts.
    server.set_away(true);
    let request = cut_while_asking(&gw, &server, &id, &mut ws).await;
    drop(ws);
    let gw = gw.restart().await;
    let (_, stored) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(stored["status"], "pending", "{stored}");
    // Back: the new gateway connects again by itself, the agent asks again.
    let mut ws = gw.conversation_ws(&id, 0).await;
    server.set_away(false);
    answer_once_asked_again(&gw, &mut ws, &request).await;
    server.kill().await;
}

async fn closing_the_conversation_while_the_agent_is_away_cancels_its_request(db: TestDb) {
    let server = ResumableServer::start(false).await;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    server.set_away(true);
    let request = cut_while_asking(&gw, &server, &id, &mut ws).await;
    let (status, body) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204, "{body}");
    let frames = ws.until_type("permission_resolved").await;
    let resolved = frames.last().unwrap();
    assert_eq!(resolved["data"]["id"], request.as_str());
    assert_eq!(resolved["data"]["status"], "cancelled", "{resolved}");
    assert_eq!(
        resolved["data"]["decision"]["reason"], "conversation closed",
        "{resolved}"
    );
    server.kill().await;
}

async fn a_request_whose_agent_never_comes_back_expires_after_the_last_try(db: TestDb) {
    let server = ResumableServer::start(false).await;
    let mut profile = remote_profile("remote", &server.url(), None);
    profile.reconnect_tries = Some(1);
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    server.set_away(true);
    let request = cut_while_asking(&gw, &server, &id, &mut ws).await;
    // One try, a second after the loss, fails: the gateway gives up.
    let frames = ws.until_type("permission_resolved").await;
    let resolved = frames.last().unwrap();
    assert_eq!(resolved["data"]["id"], request.as_str());
    assert_eq!(resolved["data"]["status"], "expired", "{resolved}");
    let why = resolved["data"]["decision"]["reason"].as_str().unwrap();
    assert!(why.contains("did not come back in 1 try"), "{why}");
    server.kill().await;
}

async fn a_request_the_agent_does_not_ask_again_once_back_expires_saying_why(db: TestDb) {
    let server = ResumableServer::start(true).await;
    let gw = TestGateway::start(&db, vec![remote_profile("remote", &server.url(), None)]).await;
    let (id, mut ws) = gw.open_conversation("remote").await;
    let request = cut_while_asking(&gw, &server, &id, &mut ws).await;
    ws.until(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .await;
    // Back, but it does not ask again: not answerable, and it expires once
    // the agent's time to ask again is over.
    let (status, body) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "agent_away", "{body}");
    let frames = ws
        .until_type_within("permission_resolved", Duration::from_secs(40))
        .await;
    let resolved = frames.last().unwrap();
    assert_eq!(resolved["data"]["status"], "expired", "{resolved}");
    let why = resolved["data"]["decision"]["reason"].as_str().unwrap();
    assert!(why.contains("did not ask again"), "{why}");
    server.kill().await;
}

backend_tests!(
    a_question_waiting_when_the_connection_went_is_answered_once_the_agent_asks_again,
    a_request_waiting_when_the_connection_went_is_answered_once_the_agent_asks_again,
    a_request_the_agent_does_not_ask_again_once_back_expires_saying_why,
    a_gateway_restarted_while_the_agent_was_away_connects_again_and_the_request_waits,
    closing_the_conversation_while_the_agent_is_away_cancels_its_request,
    a_request_whose_agent_never_comes_back_expires_after_the_last_try,
);
