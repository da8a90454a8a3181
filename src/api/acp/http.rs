//! ACP's Streamable HTTP transport (the remote transport RFD): a client
//! POSTs each JSON-RPC message; `initialize` opens a connection and is
//! answered in the POST's body with its id in `Acp-Connection-Id`; every
//! later message names that id and is answered 202, what the connection
//! sends (responses, notifications, requests) going out on the
//! connection's one `GET` event stream. `DELETE` ends a connection; so does
//! `acp_http_idle_secs` without a stream or a POST. The JSON-RPC is the connection's
//! ([`Conn`]); this file only moves text.
//!
//! Each event a stream sends has an `id` (1, 2, … per connection), and the
//! connection keeps the last ones it sent ([`REPLAY_MAX_EVENTS`],
//! [`REPLAY_MAX_BYTES`]): a client whose stream dropped opens another with
//! `Last-Event-ID` and is sent what came after that id first, each once and
//! in order; 409 `acp_events_gone` when some of that is no longer kept.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::conn::{Conn, Outgoing};
use super::wire::Incoming;
use crate::api::state::{AcpSlot, AppState};
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};

/// The header naming a connection.
pub const CONNECTION_ID: &str = "acp-connection-id";
/// The header a reconnecting event stream names the last event it got with.
const LAST_EVENT_ID: &str = "last-event-id";
/// Most events a connection keeps to send again after a stream drops.
pub const REPLAY_MAX_EVENTS: usize = 1000;
/// Most bytes of them (the newest event is kept whatever its size).
pub const REPLAY_MAX_BYTES: usize = 8 * 1024 * 1024;

/// The open connections of this transport, by id.
#[derive(Clone, Default)]
pub struct HttpConns(Arc<Mutex<HashMap<Uuid, Arc<HttpConn>>>>);

/// One connection: whose it is, and what it has to send while no stream
/// takes it (held in the connection's queues, which are bounded: a
/// connection's tasks wait once they are full).
pub struct HttpConn {
    conn: Arc<Conn>,
    user: String,
    /// `None` while a GET stream holds it.
    outgoing: Mutex<Option<Outgoing>>,
    /// The last POST, or when the last stream closed.
    touched: Mutex<Instant>,
    ended: CancellationToken,
    /// The events its streams sent, the newest kept.
    sent: Mutex<Sent>,
}

/// The events a connection's streams sent: ids, and the newest kept for a
/// stream that opens again with `Last-Event-ID`.
#[derive(Default)]
struct Sent {
    /// The id of the last event sent (0: none yet).
    last: u64,
    kept: VecDeque<(u64, Arc<str>)>,
    bytes: usize,
}

impl Sent {
    /// Gives `text` the next id and keeps it (dropping the oldest kept
    /// beyond the bounds).
    fn push(&mut self, text: Arc<str>) -> u64 {
        self.last += 1;
        self.bytes += text.len();
        self.kept.push_back((self.last, text));
        while self.kept.len() > 1
            && (self.kept.len() > REPLAY_MAX_EVENTS || self.bytes > REPLAY_MAX_BYTES)
        {
            if let Some((_, dropped)) = self.kept.pop_front() {
                self.bytes -= dropped.len();
            }
        }
        self.last
    }

    /// The events sent after `seen`, oldest first; an error when `seen` was
    /// never sent or some of those after it are no longer kept.
    fn after(&self, seen: u64) -> Result<VecDeque<(u64, Arc<str>)>> {
        if seen > self.last {
            return Err(Error::BadRequest(format!(
                "Last-Event-ID {seen}: this connection has sent {} events",
                self.last
            )));
        }
        let oldest = self.kept.front().map_or(self.last + 1, |(id, _)| *id);
        if seen + 1 < oldest {
            return Err(Error::Conflict {
                code: "acp_events_gone",
                detail: format!(
                    "events {} to {} after Last-Event-ID {seen} are no longer kept \
                     (a connection keeps its last {REPLAY_MAX_EVENTS} events, \
                     {REPLAY_MAX_BYTES} bytes at most): load the sessions again",
                    seen + 1,
                    oldest - 1
                ),
                extra: None,
            });
        }
        Ok(self
            .kept
            .iter()
            .filter(|(id, _)| *id > seen)
            .cloned()
            .collect())
    }
}

impl HttpConns {
    /// The caller's connection that `headers` name: 400 without the
    /// header, 404 for an unknown, ended or another user's one.
    fn named(&self, caller: &Caller, headers: &HeaderMap) -> Result<Arc<HttpConn>> {
        let Some(value) = headers.get(CONNECTION_ID) else {
            return Err(Error::BadRequest("Acp-Connection-Id is missing".into()));
        };
        let unknown = || Error::NotFound("no such ACP connection".into());
        let id = value
            .to_str()
            .ok()
            .and_then(|v| Uuid::parse_str(v.trim()).ok());
        let found = id.and_then(|id| self.0.lock().unwrap().get(&id).cloned());
        found.filter(|c| c.user == caller.user).ok_or_else(unknown)
    }

    fn end(&self, id: Uuid) {
        if let Some(http) = self.0.lock().unwrap().remove(&id) {
            http.ended.cancel();
            http.conn.detach_all();
        }
    }
}

/// Whether a `GET` asks for a connection's event stream rather than a
/// WebSocket: none of the WebSocket handshake's headers (`Upgrade`,
/// `Sec-WebSocket-Key`, `Sec-WebSocket-Version`, `Connection: upgrade`),
/// and an `Acp-Connection-Id` or an `Accept` naming `text/event-stream`.
pub fn wants_stream(headers: &HeaderMap) -> bool {
    let upgrading = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let handshake = upgrading
        || headers.contains_key(header::UPGRADE)
        || headers.contains_key(header::SEC_WEBSOCKET_KEY)
        || headers.contains_key(header::SEC_WEBSOCKET_VERSION);
    !handshake && (headers.contains_key(CONNECTION_ID) || accepts_event_stream(headers))
}

fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("text/event-stream") || t == "*/*" || t == "text/*"
        })
}

/// One POSTed message.
pub async fn post(
    conns: &HttpConns,
    state: AppState,
    caller: Caller,
    agent: Option<String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(Error::UnsupportedMediaType(
            "Content-Type must be application/json".into(),
        ));
    }
    let text = std::str::from_utf8(&body)
        .map_err(|_| Error::BadRequest("the body is not UTF-8".into()))?;
    if let Ok(Value::Array(_)) = serde_json::from_str::<Value>(text) {
        return Err(Error::NotImplemented(
            "JSON-RPC batches are not served".into(),
        ));
    }
    let initialize = match Incoming::parse(text) {
        Incoming::Invalid { message, .. } => return Err(Error::BadRequest(message)),
        Incoming::Request { method, .. } => method == "initialize",
        _ => false,
    };
    if initialize && !headers.contains_key(CONNECTION_ID) {
        return open(conns, state, caller, agent, text).await;
    }
    let http = conns.named(&caller, headers)?;
    *http.touched.lock().unwrap() = Instant::now();
    http.conn.clone().incoming(text).await;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `initialize`: a new connection, answered in the body.
async fn open(
    conns: &HttpConns,
    state: AppState,
    caller: Caller,
    agent: Option<String>,
    text: &str,
) -> Result<Response> {
    state.auth().check_rate(&caller, Limited::Connection)?;
    let slot = state.acp_slot(&caller.user)?;
    let revoked = state.auth().on_revocation(&caller);
    let (conn, mut outgoing) = Conn::open(state.clone(), caller.clone(), agent);
    conn.clone().incoming(text).await;
    // `initialize` is answered at once, on the connection's own queue.
    let answer = outgoing
        .try_recv()
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("initialize was not answered")))?;
    let id = Uuid::new_v4();
    let http = Arc::new(HttpConn {
        conn,
        user: caller.user.clone(),
        outgoing: Mutex::new(Some(outgoing)),
        touched: Mutex::new(Instant::now()),
        ended: CancellationToken::new(),
        sent: Mutex::default(),
    });
    conns.0.lock().unwrap().insert(id, http.clone());
    let idle = Duration::from_secs(state.config().acp_http_idle_secs);
    let ending = (revoked, state.closing().clone());
    let watch = watch(conns.clone(), id, http, idle, ending, slot);
    tokio::spawn(state.track_socket(watch));
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        answer,
    )
        .into_response();
    let value = HeaderValue::from_str(&id.to_string()).expect("a uuid is a header value");
    response.headers_mut().insert(CONNECTION_ID, value);
    Ok(response)
}

/// Ends the connection when it is deleted, `idle` without a stream or a
/// POST, its token revoked or the gateway shutting down (`ending`); holds
/// its place in the per-user limit until then.
async fn watch(
    conns: HttpConns,
    id: Uuid,
    http: Arc<HttpConn>,
    idle: Duration,
    (revoked, closing): (CancellationToken, CancellationToken),
    _slot: AcpSlot,
) {
    loop {
        let idle_at = *http.touched.lock().unwrap() + idle;
        tokio::select! {
            _ = http.ended.cancelled() => break,
            _ = revoked.cancelled() => break,
            _ = closing.cancelled() => break,
            _ = tokio::time::sleep_until(idle_at.into()) => {
                let streaming = http.outgoing.lock().unwrap().is_none();
                let touched = *http.touched.lock().unwrap();
                if !streaming && touched.elapsed() >= idle {
                    break;
                }
                if streaming {
                    // Looked at again a period after the stream closes.
                    *http.touched.lock().unwrap() = Instant::now();
                }
            }
        }
    }
    conns.end(id);
}

/// `DELETE`: ends the connection its header names.
pub fn delete(conns: &HttpConns, caller: &Caller, headers: &HeaderMap) -> Result<Response> {
    let http = conns.named(caller, headers)?;
    let id = conns
        .0
        .lock()
        .unwrap()
        .iter()
        .find(|(_, c)| Arc::ptr_eq(c, &http))
        .map(|(id, _)| *id);
    if let Some(id) = id {
        conns.end(id);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET`: the connection's event stream; 409 while another is open. With
/// `Last-Event-ID`, what was sent after that event comes first.
pub fn stream(conns: &HttpConns, caller: &Caller, headers: &HeaderMap) -> Result<Response> {
    if !accepts_event_stream(headers) {
        return Err(Error::NotAcceptable(
            "Accept must allow text/event-stream".into(),
        ));
    }
    let http = conns.named(caller, headers)?;
    let seen = match headers.get(LAST_EVENT_ID) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::BadRequest("Last-Event-ID must be an event's id (a number)".into())
                })?,
        ),
    };
    let Some(outgoing) = http.outgoing.lock().unwrap().take() else {
        return Err(Error::Conflict {
            code: "acp_stream_open",
            detail: "this connection's event stream is already open".into(),
            extra: None,
        });
    };
    // Held from here: only this stream adds to what was sent.
    // Given back if refused below.
    let mut held = Held {
        http,
        outgoing: Some(outgoing),
        replay: VecDeque::new(),
    };
    if let Some(seen) = seen {
        held.replay = held.http.sent.lock().unwrap().after(seen)?;
    }
    Ok(Sse::new(events(held))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// A stream's hold on its connection's messages, given back when it closes.
struct Held {
    http: Arc<HttpConn>,
    outgoing: Option<Outgoing>,
    /// Sent before, to send again first.
    replay: VecDeque<(u64, Arc<str>)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        *self.http.touched.lock().unwrap() = Instant::now();
        *self.http.outgoing.lock().unwrap() = self.outgoing.take();
    }
}

fn events(held: Held) -> impl Stream<Item = std::result::Result<Event, Infallible>> {
    futures::stream::unfold(held, |mut held| async move {
        let ended = held.http.ended.clone();
        if ended.is_cancelled() {
            return None;
        }
        if let Some((id, text)) = held.replay.pop_front() {
            return Some((Ok(event(id, &text)), held));
        }
        let outgoing = held.outgoing.as_mut()?;
        let text = tokio::select! {
            text = outgoing.recv() => text?,
            _ = ended.cancelled() => return None,
        };
        // Kept before it is sent: a stream that drops meanwhile loses none.
        let text: Arc<str> = text.into();
        let id = held.http.sent.lock().unwrap().push(text.clone());
        Some((Ok(event(id, &text)), held))
    })
}

fn event(id: u64, text: &str) -> Event {
    Event::default().id(id.to_string()).data(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_sent_after_an_id_is_given_once_or_its_gap_named() {
        let mut sent = Sent::default();
        assert!(sent.after(0).unwrap().is_empty());
        for i in 0..(REPLAY_MAX_EVENTS + 5) {
            let id = sent.push(Arc::from(format!("m{i}")));
            assert_eq!(id, i as u64 + 1);
        }
        assert_eq!(sent.kept.len(), REPLAY_MAX_EVENTS);
        let last = sent.last;
        assert!(sent.after(last).unwrap().is_empty());
        let tail: Vec<u64> = sent.after(last - 2).unwrap().iter().map(|e| e.0).collect();
        assert_eq!(tail, vec![last - 1, last]);
        // The oldest kept is 6: after 5 all is there, after 4 event 5 is gone.
        assert_eq!(sent.after(5).unwrap().len(), REPLAY_MAX_EVENTS);
        let gone = sent.after(4).unwrap_err().problem();
        assert_eq!((gone.status, gone.code.as_str()), (409, "acp_events_gone"));
        assert!(gone.detail.contains("events 5 to 5"), "{}", gone.detail);
        assert_eq!(sent.after(last + 1).unwrap_err().problem().status, 400);
        // Bytes bound too, the newest kept whatever its size.
        sent.push(Arc::from("x".repeat(REPLAY_MAX_BYTES + 1)));
        assert_eq!(sent.kept.len(), 1);
        assert_eq!(sent.after(sent.last - 1).unwrap().len(), 1);
    }
}
