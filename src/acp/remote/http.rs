//! A remote agent over ACP's Streamable HTTP (the remote transport RFD):
//! the first line the rpc layer writes (`initialize`) is POSTed without a
//! connection id and answered in the POST's body, with the connection's
//! id in `Acp-Connection-Id`; then the connection's one `GET` event stream
//! (`Accept: text/event-stream`) is opened, and every later line is POSTed
//! with that id (and `Acp-Session-Id` where the message is about a
//! session; before the first such POST, the session's own event stream
//! is asked for, as the RFD's later revision has it). What the agent sends (on the stream, or in the body of a
//! POST's answer, JSON or an event stream) becomes lines for the rpc
//! layer. Closing the link sends `DELETE`.
//!
//! The client is pinned to the addresses the guard admitted
//! ([`super::guard::target`]), follows no redirect and uses no proxy. Whether an
//! agent can be reached ([`probe`]) is asked with a `GET` that names no
//! connection: it starts nothing on the agent; an agent answers it 400
//! (reachable, the token taken) or 401/403 (the token refused).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

use super::guard::target;
use super::shared::{as_line, request_headers, Ended, Ends, RemoteLink, CLOSE_WITHIN, PIPE_BYTES};
use crate::config::AgentProfile;

/// The header naming a connection.
const CONNECTION_ID: &str = "acp-connection-id";
/// The header naming the session a POSTed message is about.
const SESSION_ID: &str = "acp-session-id";
/// How many of the agent's requests' sessions are remembered for the
/// answers' `Acp-Session-Id` (older ones are forgotten past this).
const REMEMBERED_REQUESTS: usize = 1024;
/// How many lines wait for the rpc layer to read them.
const LINES_WAITING: usize = 64;

/// An HTTP client for one agent: pinned to its admitted addresses, with
/// the profile's token and headers.
#[derive(Clone)]
struct Peer {
    client: reqwest::Client,
    url: reqwest::Url,
    name: String,
}

impl Peer {
    async fn new(profile: &AgentProfile) -> anyhow::Result<Peer> {
        let target = target(profile).await?;
        let headers = request_headers(profile)?;
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .tcp_nodelay(true)
            .resolve_to_addrs(&target.name, &target.addresses);
        // An event stream has no pings of its own: the kernel's keepalive
        // finds a peer gone without a word (slowly).
        if !profile.ping_interval.is_zero() {
            builder = builder.tcp_keepalive(profile.ping_interval);
        }
        if target.tls {
            builder = builder.use_preconfigured_tls(super::guard::tls_config(profile)?);
        }
        let client = builder.build().context("cannot make an HTTP client")?;
        Ok(Peer {
            client,
            url: target.url,
            name: target.name,
        })
    }

    /// A `GET` naming no connection: what [`probe`] asks.
    async fn look(&self) -> anyhow::Result<()> {
        let response = self
            .client
            .get(self.url.clone())
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| {
                anyhow::Error::new(e).context(format!("cannot connect to {}", self.name))
            })?;
        match response.status() {
            status @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                bail!("the remote agent refused the token (HTTP {status})")
            }
            StatusCode::NOT_FOUND => bail!("no ACP endpoint at {} (HTTP 404)", self.url),
            status if status.is_server_error() => {
                bail!("the remote agent answered HTTP {status}")
            }
            _ => Ok(()),
        }
    }

    /// POSTs one message (on `connection`, about `session`).
    async fn post(
        &self,
        line: String,
        connection: Option<&str>,
        session: Option<&str>,
    ) -> Result<reqwest::Response, Ended> {
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .body(line);
        if let Some(connection) = connection {
            request = request.header(CONNECTION_ID, connection);
        }
        if let Some(session) = session {
            request = request.header(SESSION_ID, session);
        }
        request.send().await.map_err(|e| {
            Ended::Lost(format!(
                "{:#}",
                anyhow::Error::new(e).context("a POST to the agent failed")
            ))
        })
    }

    /// Ends `connection` (bounded; what the agent answers is not read).
    async fn delete(&self, connection: &str) {
        let request = self
            .client
            .delete(self.url.clone())
            .header(CONNECTION_ID, connection)
            .send();
        let _ = tokio::time::timeout(CLOSE_WITHIN, request).await;
    }
}

/// Whether the profile's agent can be reached and takes the token: a
/// `GET` without a connection id (see the module's documentation).
pub(super) async fn probe(profile: &AgentProfile, within: Duration) -> anyhow::Result<()> {
    tokio::time::timeout(within, async { Peer::new(profile).await?.look().await })
        .await
        .map_err(|_| anyhow!("the remote agent did not answer within {within:?}"))?
}

/// Checks that the profile's agent can be reached and takes the token
/// (within `within`), then starts carrying messages both ways; the first
/// line the rpc layer writes opens the connection.
pub(super) async fn connect(
    profile: &AgentProfile,
    max_message_bytes: usize,
    within: Duration,
) -> anyhow::Result<RemoteLink> {
    let peer = tokio::time::timeout(within, async {
        let peer = Peer::new(profile).await?;
        peer.look().await?;
        anyhow::Ok(peer)
    })
    .await
    .map_err(|_| anyhow!("the remote agent did not answer within {within:?}"))??;
    let (to_rpc, output) = tokio::io::duplex(PIPE_BYTES);
    let (input, from_rpc) = tokio::io::duplex(PIPE_BYTES);
    let (ends, control) = Ends::new();
    let (lines, waiting) = mpsc::channel(LINES_WAITING);
    tokio::spawn(hand_over(waiting, to_rpc, ends.clone()));
    let carrier = Carrier {
        peer,
        lines,
        ends,
        sessions: Arc::default(),
        streams: Arc::default(),
        max: max_message_bytes,
    };
    tokio::spawn(carrier.send(from_rpc));
    Ok(RemoteLink {
        input,
        output,
        control,
    })
}

/// Writes the agent's messages, one a line, to the rpc layer; its pipe
/// closes (the agent's output ends) once every task that sends lines has.
async fn hand_over(mut waiting: mpsc::Receiver<String>, mut to_rpc: DuplexStream, ends: Ends) {
    while let Some(line) = waiting.recv().await {
        if to_rpc.write_all(line.as_bytes()).await.is_err() {
            ends.end(Ended::Closed("by the gateway (it stopped reading)".into()));
            ends.stop.cancel();
            return;
        }
    }
}

/// What a connection's tasks share.
#[derive(Clone)]
struct Carrier {
    peer: Peer,
    /// The agent's messages for the rpc layer, one a line.
    lines: mpsc::Sender<String>,
    ends: Ends,
    /// The sessions of the agent's requests not yet answered.
    sessions: Arc<Sessions>,
    /// The sessions whose own event stream was asked for.
    streams: Arc<Mutex<HashSet<String>>>,
    max: usize,
}

impl Carrier {
    /// Ends the connection saying how, and stops its tasks.
    fn end(&self, how: Ended) {
        self.ends.end(how);
        self.ends.stop.cancel();
    }

    /// The rpc layer's lines: the first opens the connection, the others
    /// are POSTed on it; a `DELETE` when told to stop or when the rpc
    /// layer closes its end.
    async fn send(self, from_rpc: DuplexStream) {
        let mut lines = BufReader::new(from_rpc);
        let stop = self.ends.stop.clone();
        let first = tokio::select! {
            _ = stop.cancelled() => None,
            line = next_line(&mut lines) => line,
        };
        let Some(first) = first else {
            self.ends.end(Ended::Closed("by the gateway".into()));
            return;
        };
        let opened = tokio::select! {
            _ = stop.cancelled() => {
                self.ends.end(Ended::Closed("by the gateway".into()));
                return;
            }
            opened = self.open(first) => opened,
        };
        let connection = match opened {
            Ok(connection) => connection,
            Err(how) => return self.end(how),
        };
        loop {
            let line = tokio::select! {
                _ = stop.cancelled() => break,
                line = next_line(&mut lines) => line,
            };
            let Some(line) = line else { break };
            let posted = tokio::select! {
                _ = stop.cancelled() => break,
                posted = self.post(line, &connection) => posted,
            };
            if let Err(how) = posted {
                return self.end(how);
            }
        }
        // Ours to close, unless the connection is gone already.
        if !self.ends.is_ended() {
            self.ends.stop.cancel();
            self.peer.delete(&connection).await;
            self.ends.end(Ended::Closed("by the gateway".into()));
        }
    }

    /// `initialize`: POSTed without a connection id, answered in the
    /// body; then the connection's event stream. The connection's id.
    async fn open(&self, initialize: String) -> Result<String, Ended> {
        let response = self.peer.post(initialize, None, None).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(refused(status, "initialize"));
        }
        let connection = response
            .headers()
            .get(CONNECTION_ID)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                Ended::Lost("the agent's answer to initialize has no Acp-Connection-Id".into())
            })?;
        // Read before anything else: the rpc layer waits for this answer.
        if let Err(how) = self.read_body(response).await {
            self.peer.delete(&connection).await;
            return Err(how);
        }
        let stream = self
            .peer
            .client
            .get(self.peer.url.clone())
            .header(ACCEPT, "text/event-stream")
            .header(CONNECTION_ID, &connection)
            .send()
            .await;
        let stream = match stream {
            Ok(stream) if stream.status().is_success() => stream,
            Ok(stream) => {
                self.peer.delete(&connection).await;
                return Err(refused(stream.status(), "the event stream"));
            }
            Err(e) => {
                return Err(Ended::Lost(format!(
                    "{:#}",
                    anyhow::Error::new(e).context("the event stream could not be opened")
                )))
            }
        };
        tokio::spawn(self.clone().receive(stream, true));
        Ok(connection)
    }

    /// Opens `session`'s own event stream the first time a message about
    /// it is POSTed (the RFD's revision of 2026-05: a session's updates,
    /// requests and answers come on a `GET` naming the connection and
    /// the session). An agent that serves only the connection's stream
    /// (this gateway's front door answers 409) sends everything there:
    /// a refusal is taken as that.
    async fn open_session_stream(&self, connection: &str, session: &str) -> Result<(), Ended> {
        if !self.streams.lock().unwrap().insert(session.to_owned()) {
            return Ok(());
        }
        let stream = self
            .peer
            .client
            .get(self.peer.url.clone())
            .header(ACCEPT, "text/event-stream")
            .header(CONNECTION_ID, connection)
            .header(SESSION_ID, session)
            .send()
            .await
            .map_err(|e| {
                Ended::Lost(format!(
                    "{:#}",
                    anyhow::Error::new(e).context("a session's event stream could not be opened")
                ))
            })?;
        if stream.status().is_success() {
            tokio::spawn(self.clone().receive(stream, false));
        } else {
            tracing::debug!(status = %stream.status(), "no event stream of the session's own: the connection's carries it");
        }
        Ok(())
    }

    /// An event stream (the connection's, or a session's), each message a
    /// line for the rpc layer. The connection's ending ends the
    /// connection: in order when the agent ends it, lost when the network
    /// fails; a session's ending in order ends only that stream.
    async fn receive(self, mut stream: reqwest::Response, connection: bool) {
        let stop = self.ends.stop.clone();
        let mut events = Events::new(self.max);
        let how = loop {
            let chunk = tokio::select! {
                // The sender ends the connection (a DELETE first).
                _ = stop.cancelled() => return,
                chunk = stream.chunk() => chunk,
            };
            let bytes = match chunk {
                Ok(Some(bytes)) => bytes,
                Ok(None) if !connection => return,
                Ok(None) => break Ended::Closed("by the agent (it ended the event stream)".into()),
                Err(e) => {
                    break Ended::Lost(format!(
                        "{:#}",
                        anyhow::Error::new(e).context("the event stream failed")
                    ))
                }
            };
            match events.push(&bytes) {
                Ok(messages) => {
                    if let Err(how) = self.pass_on(messages).await {
                        break how;
                    }
                }
                Err(too_long) => break Ended::Lost(too_long),
            }
        };
        self.end(how);
    }

    /// Hands the agent's messages to the rpc layer, remembering which
    /// session each of its requests is about.
    async fn pass_on(&self, messages: Vec<String>) -> Result<(), Ended> {
        for message in messages {
            self.sessions.remember(&message);
            if self.lines.send(as_line(message)).await.is_err() {
                return Err(Ended::Closed("by the gateway (it stopped reading)".into()));
            }
        }
        Ok(())
    }

    /// One later line, POSTed on the connection; what its answer's body
    /// carries is read apart (an agent may hold it open).
    async fn post(&self, line: String, connection: &str) -> Result<(), Ended> {
        let about = self.sessions.of(&line);
        if let Some(session) = &about {
            self.open_session_stream(connection, session).await?;
        }
        let request_id = request_id(&line);
        let response = self
            .peer
            .post(line, Some(connection), about.as_deref())
            .await?;
        let status = response.status();
        if status.is_success() {
            if response.content_length() != Some(0) {
                let carrier = self.clone();
                tokio::spawn(async move {
                    let stop = carrier.ends.stop.clone();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        read = carrier.read_body(response) => {
                            if let Err(how) = read {
                                carrier.end(how);
                            }
                        }
                    }
                });
            }
            return Ok(());
        }
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND => {
                Err(refused(status, "a message"))
            }
            _ if status.is_server_error() => Err(refused(status, "a message")),
            _ => {
                // One message refused (400, 413, 415, …): the connection
                // goes on; a request gets an error answer, so nothing
                // waits for one that will not come.
                tracing::warn!(%status, "the remote agent refused a message");
                if let Some(id) = request_id {
                    let error = serde_json::json!({
                        "jsonrpc": "2.0",
                        "id": id,
                        "error": {
                            "code": -32600,
                            "message": format!("the remote agent refused the message (HTTP {status})"),
                        },
                    });
                    let _ = self.lines.send(as_line(error.to_string())).await;
                }
                Ok(())
            }
        }
    }

    /// What a POST's answer carries: an event stream, or one JSON message
    /// (or nothing).
    async fn read_body(&self, mut response: reqwest::Response) -> Result<(), Ended> {
        let events = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        let mut stream = Events::new(self.max);
        let mut body = Vec::new();
        loop {
            let bytes = match response.chunk().await {
                Ok(Some(bytes)) => bytes,
                Ok(None) => break,
                Err(e) => {
                    return Err(Ended::Lost(format!(
                        "{:#}",
                        anyhow::Error::new(e).context("reading the agent's answer failed")
                    )))
                }
            };
            if events {
                let messages = stream.push(&bytes).map_err(Ended::Lost)?;
                self.pass_on(messages).await?;
            } else {
                body.extend_from_slice(&bytes);
                if body.len() > self.max {
                    return Err(Ended::Lost(too_long(self.max)));
                }
            }
        }
        let text = String::from_utf8_lossy(&body).trim().to_owned();
        if !text.is_empty() {
            self.pass_on(vec![text]).await?;
        }
        Ok(())
    }
}

/// The sessions of the agent's requests not yet answered, by request id
/// (as JSON), for the answers' `Acp-Session-Id`.
#[derive(Default)]
struct Sessions(Mutex<HashMap<String, String>>);

impl Sessions {
    /// Keeps the session an agent's request is about.
    fn remember(&self, message: &str) {
        if !message.contains("\"sessionId\"") {
            return;
        }
        let Ok(peek) = serde_json::from_str::<Peek>(message) else {
            return;
        };
        let session = peek.session();
        if let (Some(id), Some(_), Some(session)) = (peek.id, peek.method, session) {
            let mut sessions = self.0.lock().unwrap();
            if sessions.len() >= REMEMBERED_REQUESTS {
                sessions.clear();
            }
            sessions.insert(id.to_string(), session);
        }
    }

    /// The session a line of ours is about: its `params.sessionId`, or for
    /// an answer, the session of the request it answers.
    fn of(&self, line: &str) -> Option<String> {
        let peek = serde_json::from_str::<Peek>(line).ok()?;
        if peek.method.is_some() {
            return peek.session();
        }
        let id = peek.id?;
        self.0.lock().unwrap().remove(&id.to_string())
    }
}

/// What is read of a message to route it: its id, whether it has a
/// method, and its `params.sessionId`.
#[derive(Deserialize)]
struct Peek {
    id: Option<serde_json::Value>,
    method: Option<serde::de::IgnoredAny>,
    params: Option<PeekParams>,
}

#[derive(Deserialize)]
struct PeekParams {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
}

impl Peek {
    fn session(&self) -> Option<String> {
        self.params.as_ref()?.session_id.clone()
    }
}

/// The id of a request of ours (`None` for an answer or a notification).
fn request_id(line: &str) -> Option<serde_json::Value> {
    let peek = serde_json::from_str::<Peek>(line).ok()?;
    peek.method.and(peek.id)
}

/// How a connection ends when the agent answers `what` with `status`.
fn refused(status: StatusCode, what: &str) -> Ended {
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Ended::Lost(format!(
            "the remote agent refused the token (HTTP {status})"
        )),
        StatusCode::NOT_FOUND => Ended::Lost(format!(
            "the remote agent does not know the connection any more (HTTP {status} for {what})"
        )),
        _ => Ended::Lost(format!(
            "the remote agent answered {what} with HTTP {status}"
        )),
    }
}

/// The next line the rpc layer wrote, without its end; `None` once it
/// closed its end.
async fn next_line(lines: &mut BufReader<DuplexStream>) -> Option<String> {
    let mut line = Vec::new();
    match lines.read_until(b'\n', &mut line).await {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                line.pop();
            }
            Some(String::from_utf8_lossy(&line).into_owned())
        }
    }
}

fn too_long(max: usize) -> String {
    format!("a message of more than {max} bytes is too long")
}

/// A reader of `text/event-stream`: bytes in, each event's data out (its
/// `data:` lines joined by newlines); comments and other fields are
/// skipped. An event (or a line) longer than `max` bytes is an error.
struct Events {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    max: usize,
}

impl Events {
    fn new(max: usize) -> Events {
        Events {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            max,
        }
    }

    /// The events `bytes` completes.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            self.line.extend_from_slice(piece);
            if self.line.last() != Some(&b'\n') {
                break;
            }
            let mut line = std::mem::take(&mut self.line);
            while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                line.pop();
            }
            self.field(&line, &mut done)?;
        }
        if self.line.len() > self.max.saturating_add(8) {
            return Err(too_long(self.max));
        }
        Ok(done)
    }

    /// One whole line: a field, a comment, or the blank line that ends an
    /// event.
    fn field(&mut self, line: &[u8], done: &mut Vec<String>) -> Result<(), String> {
        if line.is_empty() {
            if std::mem::take(&mut self.has_data) {
                done.push(std::mem::take(&mut self.data));
            }
            return Ok(());
        }
        let line = String::from_utf8_lossy(line);
        let (name, value) = match line.split_once(':') {
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        if name == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
            if self.data.len() > self.max {
                return Err(too_long(self.max));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_across_chunks_with_comments_and_crlf() {
        let mut events = Events::new(1024);
        assert_eq!(
            events.push(b": keep-alive\n\ndata: {\"id\"").unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            events
                .push(b":1}\r\n\r\nevent: x\ndata:a\ndata: b\n\n")
                .unwrap(),
            vec!["{\"id\":1}".to_owned(), "a\nb".to_owned()]
        );
        // An event without data is none.
        assert!(events.push(b"id: 4\n\n").unwrap().is_empty());
    }

    #[test]
    fn an_event_over_the_limit_is_refused() {
        let mut events = Events::new(10);
        let err = events.push(b"data: 0123456789abc\n").unwrap_err();
        assert!(err.contains("more than 10 bytes"), "{err}");
        // A line that never ends is refused too.
        let mut events = Events::new(10);
        assert!(events.push(&[b'x'; 64]).is_err());
    }

    #[test]
    fn a_message_about_a_session_names_it_and_so_does_the_answer_to_a_request() {
        let sessions = Sessions::default();
        let prompt =
            r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s1"}}"#;
        assert_eq!(sessions.of(prompt), Some("s1".into()));
        assert_eq!(
            sessions.of(r#"{"jsonrpc":"2.0","id":0,"method":"initialize"}"#),
            None
        );
        // The agent asks about session s2; our answer names it, once.
        sessions.remember(
            r#"{"jsonrpc":"2.0","id":"r-7","method":"session/request_permission","params":{"sessionId":"s2"}}"#,
        );
        let answer = r#"{"jsonrpc":"2.0","id":"r-7","result":{"outcome":{"outcome":"cancelled"}}}"#;
        assert_eq!(sessions.of(answer), Some("s2".into()));
        assert_eq!(sessions.of(answer), None);
        // A notification is no request to answer.
        sessions
            .remember(r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s2"}}"#);
        assert!(sessions.0.lock().unwrap().is_empty());
    }

    #[test]
    fn requests_are_told_from_answers() {
        assert_eq!(
            request_id(r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt"}"#),
            Some(serde_json::json!(3))
        );
        assert_eq!(request_id(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#), None);
        assert_eq!(request_id(r#"{"jsonrpc":"2.0","method":"x"}"#), None);
    }
}
