//! The reader's side of the connection: each line read is parsed and routed, a response to
//! the caller waiting for its id (the id multiplexing), anything else to the incoming channel
//! as the [`Inbound`] hook reads it, with backpressure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::io::AsyncBufRead;
use tokio::sync::{mpsc, watch};
use tracing::{debug, trace, warn};

use super::framing::{Line, LineReader};
use super::inbound::{Inbound, Incoming, IncomingRequest, Responder};
use super::shared::{Connection, RpcError, INTERNAL_ERROR};

/// How much of a skipped line goes into the log.
const PREVIEW_BYTES: usize = 200;
/// Skipped lines of a connection each logged.
const SKIPS_LOGGED_EACH: u64 = 10;
/// Past those, one skipped line in this many is logged.
const SKIPS_LOGGED_EVERY: u64 = 10_000;

/// Reads and routes lines until the stream ends or the connection is closed elsewhere.
pub(super) async fn read_loop<I, R>(
    shared: Arc<Connection>,
    mut lines: LineReader<R>,
    incoming_tx: mpsc::Sender<(Incoming<I>, u64)>,
) where
    I: Inbound,
    R: AsyncBufRead + Unpin,
{
    let mut closed_rx = shared.closed_tx.subscribe();
    let mut router = Router {
        shared: &shared,
        skipped: AtomicU64::new(0),
        incoming_tx: Some(incoming_tx),
    };
    let reason = loop {
        let line = tokio::select! {
            biased;
            // Closed by a failed write or `RpcPeer::close`: stop reading, the reason is set.
            _ = closed_rx.wait_for(Option::is_some) => return,
            line = lines.next_line(|line| router.parse(line)) => line,
        };
        let (start, end) = lines.span();
        match line {
            Ok(Some(Line::Complete(Some(Routed::Incoming(incoming))))) => {
                shared.state().ledger.hand_on(start, end);
                if !router.deliver(incoming, start, &mut closed_rx).await {
                    return;
                }
            }
            Ok(Some(Line::Complete(Some(Routed::Answer { id, outcome })))) => {
                shared.complete(id, outcome, start, end);
            }
            Ok(Some(Line::Complete(None))) => shared.read_by_itself(end),
            Ok(Some(Line::Skipping)) => {
                shared.state().ledger.skipped(end);
                shared.moved_on.notify_one();
            }
            Ok(Some(Line::TooLong { len })) => {
                shared.read_by_itself(end);
                warn!(
                    label = %shared.label,
                    len,
                    max = lines.max,
                    "discarded a line longer than the limit"
                );
            }
            Ok(None) => break "peer closed the stream (EOF)".to_owned(),
            Err(err) => break format!("read failed: {err}"),
        }
    };
    shared.close(reason);
    // Dropping `router` drops the incoming sender: the receiver gets what is queued, then None.
}

/// What one line is, once read: for the incoming channel, or an answer to
/// one of our requests.
enum Routed<I> {
    Incoming(Incoming<I>),
    Answer {
        id: Value,
        outcome: Result<Value, RpcError>,
    },
}

/// Routes parsed lines from the reader to waiting callers or the incoming channel.
struct Router<'a, I> {
    shared: &'a Arc<Connection>,
    /// Lines skipped so far (see [`Router::skip`]).
    skipped: AtomicU64,
    /// `None` once the receiver is gone; from then on requests are refused.
    incoming_tx: Option<mpsc::Sender<(Incoming<I>, u64)>>,
}

impl<I: Inbound> Router<'_, I> {
    /// Reads one line (borrowed from the reader's buffer: parsed where it
    /// lies, not copied first): a response goes to its caller; what is
    /// returned goes to the incoming channel. What [`Inbound::read_fast`] knows takes the
    /// fast path.
    fn parse(&self, line: &[u8]) -> Option<Routed<I>> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(fast) = I::read_fast(line) {
            return Some(Routed::Incoming(Incoming::Fast(fast)));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        trace!(label = %self.shared.label, line = %preview(line), "received");
        let object = match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(object)) => object,
            Ok(_) => {
                self.skip(line, "not a JSON object");
                return None;
            }
            Err(err) => {
                let why = match std::str::from_utf8(line) {
                    Ok(_) => format!("not JSON: {err}"),
                    Err(_) => "not valid UTF-8".to_owned(),
                };
                self.skip(line, &why);
                return None;
            }
        };
        let incoming = match classify(object) {
            Ok(Message::Response { id, outcome }) => return Some(Routed::Answer { id, outcome }),
            Ok(Message::Notification { method, params }) => {
                Incoming::Notification { method, params }
            }
            Ok(Message::Request { id, method, params }) => Incoming::Request(IncomingRequest {
                responder: Responder::new(id.clone(), method.clone(), Arc::clone(self.shared)),
                id,
                method,
                params,
            }),
            Err(why) => {
                self.skip(line, &format!("not a JSON-RPC message: {why}"));
                return None;
            }
        };
        Some(Routed::Incoming(incoming))
    }

    /// Hands on the message of the line that begins at `start`.
    async fn deliver(
        &mut self,
        incoming: Incoming<I>,
        start: u64,
        closed_rx: &mut watch::Receiver<Option<String>>,
    ) -> bool {
        let Some(incoming_tx) = &self.incoming_tx else {
            self.refuse(incoming, start);
            return true;
        };
        // Waiting here is the backpressure; `closed` keeps a stuck receiver from pinning us.
        let sent = tokio::select! {
            biased;
            _ = closed_rx.wait_for(Option::is_some) => return false,
            sent = incoming_tx.send((incoming, start)) => sent,
        };
        if let Err(mpsc::error::SendError((incoming, _))) = sent {
            warn!(
                label = %self.shared.label,
                "incoming receiver dropped; refusing requests and dropping notifications from now on"
            );
            self.incoming_tx = None;
            self.refuse(incoming, start);
        }
        true
    }

    /// Disposes of a message nobody will receive (it is done with).
    fn refuse(&self, incoming: Incoming<I>, start: u64) {
        self.shared.state().ledger.done(start);
        self.shared.moved_on.notify_one();
        match incoming {
            notification @ (Incoming::Notification { .. } | Incoming::Fast(_)) => {
                debug!(
                    label = %self.shared.label,
                    method = %notification.method(),
                    "notification dropped: nobody is listening"
                );
            }
            Incoming::Request(request) => {
                debug!(
                    label = %self.shared.label,
                    id = %request.id,
                    method = %request.method,
                    "request refused: nobody is listening"
                );
                request.responder.respond_error(
                    INTERNAL_ERROR,
                    "client is not accepting requests",
                    None,
                );
            }
        }
    }

    /// Logs a line skipped: the first few of a connection each, then one
    /// in [`SKIPS_LOGGED_EVERY`] with the count (an agent printing
    /// gigabytes of garbage must not print as much into the log).
    fn skip(&self, line: &[u8], why: &str) {
        let skipped = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
        if skipped <= SKIPS_LOGGED_EACH {
            warn!(
                label = %self.shared.label,
                line = %preview(line),
                "skipping line: {why}"
            );
        } else if skipped.is_multiple_of(SKIPS_LOGGED_EVERY) {
            warn!(
                label = %self.shared.label,
                line = %preview(line),
                skipped,
                "skipping line: {why} (only one in {SKIPS_LOGGED_EVERY} is logged now)"
            );
        }
    }
}

/// One parsed JSON-RPC message.
#[derive(Debug)]
pub(super) enum Message {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Response {
        id: Value,
        outcome: Result<Value, RpcError>,
    },
}

/// Tells requests, notifications and responses apart by their fields. `jsonrpc` is not
/// checked: some agents leave it out, and the shape says enough.
pub(super) fn classify(mut object: Map<String, Value>) -> Result<Message, &'static str> {
    let id = match object.remove("id") {
        None | Some(Value::Null) => None,
        Some(id @ (Value::Number(_) | Value::String(_))) => Some(id),
        Some(_) => return Err("\"id\" must be a number or a string"),
    };
    if let Some(method) = object.remove("method") {
        let Value::String(method) = method else {
            return Err("\"method\" must be a string");
        };
        let params = object.remove("params").unwrap_or(Value::Null);
        return Ok(match id {
            Some(id) => Message::Request { id, method, params },
            None => Message::Notification { method, params },
        });
    }
    let Some(id) = id else {
        return Err("neither \"method\" nor \"id\"");
    };
    // Some peers send `"error": null` next to a result.
    let error = object.remove("error").filter(|error| !error.is_null());
    let outcome = match (error, object.remove("result")) {
        (Some(error), _) => Err(remote_error(error)),
        (None, Some(result)) => Ok(result),
        (None, None) => return Err("a response needs \"result\" or \"error\""),
    };
    Ok(Message::Response { id, outcome })
}

/// Turns an `error` member into [`RpcError::Remote`], tolerating malformed ones: the caller
/// must learn that its request failed even if the peer described the failure badly.
fn remote_error(error: Value) -> RpcError {
    match error {
        Value::Object(mut error) => RpcError::Remote {
            code: error
                .get("code")
                .and_then(Value::as_i64)
                .unwrap_or(INTERNAL_ERROR),
            message: match error.remove("message") {
                Some(Value::String(message)) => message,
                _ => "(no message)".to_owned(),
            },
            data: error.remove("data").filter(|data| !data.is_null()),
        },
        other => RpcError::Remote {
            code: INTERNAL_ERROR,
            message: format!("malformed error object: {other}"),
            data: None,
        },
    }
}

/// The start of a line, for logs.
fn preview(line: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(&line[..line.len().min(PREVIEW_BYTES)]).into_owned();
    if line.len() > PREVIEW_BYTES {
        text.push('…');
    }
    text
}

impl Connection {
    /// A line the reader dealt with by itself (nothing handed on) was read
    /// up to `end`: whoever acknowledges the stream is told.
    fn read_by_itself(&self, end: u64) {
        self.state().ledger.read(end);
        self.moved_on.notify_one();
    }

    /// Hands a response, the line from `start` to `end`, to the caller
    /// waiting for its id.
    fn complete(&self, id: Value, outcome: Result<Value, RpcError>, start: u64, end: u64) {
        let ours = parse_our_id(&id);
        let waiter = {
            let mut state = self.state();
            let waiter = ours.and_then(|ours| state.waiters.remove(&ours));
            match (ours, &waiter) {
                (Some(ours), Some(_)) => state.ledger.answer_handed_on(ours, start, end),
                _ => state.ledger.read(end),
            }
            waiter
        };
        if waiter.is_none() {
            self.moved_on.notify_one();
        }
        match waiter {
            Some(waiter) => {
                if waiter.send(outcome).is_err() {
                    debug!(label = %self.label, %id, "response arrived after its caller gave up");
                }
            }
            None => warn!(
                label = %self.label,
                %id,
                "skipping response to an unknown request id (its caller may have given up)"
            ),
        }
    }
}

/// Our ids are u64; peers echo them back as a number or, sometimes, as a string.
fn parse_our_id(id: &Value) -> Option<u64> {
    match id {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}
