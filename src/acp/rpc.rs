//! JSON-RPC 2.0 multiplexing over one line-delimited byte stream pair.
//!
//! ACP agents speak JSON-RPC 2.0 on their stdio, one JSON message per line, and both sides
//! send requests: we call `session/prompt`, the agent calls `session/request_permission`. This
//! module turns an `AsyncRead`/`AsyncWrite` pair into an [`RpcPeer`] handle plus a stream of
//! [`Incoming`] messages, and knows nothing about ACP methods (that is the session's job).
//!
//! # Design
//!
//! [`RpcPeer::spawn`] starts two tasks that share one `Arc<Shared>`:
//!
//! - **The reader** owns the `AsyncRead`. It cuts the stream into lines of at most
//!   [`RpcConfig::max_line_bytes`] (a longer line is dropped while it streams past, so memory
//!   stays bounded), parses each line and routes it:
//!   - a response (`id` + `result`/`error`) completes the caller waiting for that id;
//!   - a notification (`method`, no `id`) or a request (`method` + `id`) is sent, in arrival
//!     order, to the bounded [`Incoming`] channel. The reader waits while that channel is
//!     full: this is the backpressure that keeps memory bounded, and it also means responses
//!     queued behind it wait, so the receiver must keep draining the channel.
//!
//!   Anything that is not a JSON-RPC message (agents do print logs on stdout) is logged and
//!   skipped; nothing the peer sends can stop the reader except the end of the stream.
//! - **The writer** owns the `AsyncWrite`. Every outgoing message is serialized by its sender
//!   and queued on an unbounded channel, because [`Responder::respond`] must work from
//!   synchronous code and from `Drop`. The writer writes what is queued and flushes once per
//!   batch.
//!
//! Our request ids come from an `AtomicU64` counting from 0; callers wait on a `oneshot`
//! registered in a table under a std `Mutex` (never held across an `.await`). A caller that
//! gives up (its future is dropped, e.g. by `tokio::time::timeout`) removes its entry through a
//! drop guard, so abandoned ids do not pile up. The peer's ids are a separate space and are
//! echoed back verbatim by the [`Responder`] that comes with each [`IncomingRequest`]; a
//! `Responder` dropped without an answer answers `-32603` itself, so the agent never waits
//! forever.
//!
//! # Closing
//!
//! The connection closes, once and with a reason, when the reader meets end of stream or a
//! read error, when a write fails, or when [`RpcPeer::close`] is called. Then every waiting
//! caller gets [`RpcError::Closed`] at once, later calls fail fast, both tasks stop (the
//! writer shuts its side down so the agent sees end of input), the [`Incoming`] channel ends
//! after the messages already queued, and [`RpcPeer::closed`] resolves.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use super::chunk::{self, TextChunk};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, trace, warn};

/// JSON-RPC error code: the method does not exist or is not available.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC error code: invalid method parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC error code: internal error.
pub const INTERNAL_ERROR: i64 = -32603;

/// Size of the reader's own buffer; lines longer than this are assembled across refills.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Most messages written before one flush, so a steady stream still gets flushed regularly.
const MAX_MESSAGES_PER_FLUSH: usize = 64;
/// How much of a skipped line goes into the log.
const PREVIEW_BYTES: usize = 200;
/// How long the writer waits for the transport to shut down once the connection is closed;
/// a peer that stopped reading must not keep the writer task alive.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Settings for one connection.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// Longest accepted line in bytes, without its `\n`. Longer lines are discarded.
    pub max_line_bytes: usize,
    /// Capacity of the [`Incoming`] channel; when it is full the reader stops reading.
    pub incoming_capacity: usize,
    /// Put into the `label` field of every log event of this connection (e.g. a
    /// conversation id), so one agent's traffic can be followed in the logs.
    pub label: String,
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self {
            max_line_bytes: 16 * 1024 * 1024,
            incoming_capacity: 256,
            label: String::new(),
        }
    }
}

/// Why a request did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The peer answered with a JSON-RPC error object.
    #[error("remote error {code}: {message}")]
    Remote {
        /// The error's `code`.
        code: i64,
        /// The error's `message`.
        message: String,
        /// The error's `data`, if it had any.
        data: Option<Value>,
    },
    /// The connection is closed (peer exited, end of stream, write failed, or
    /// [`RpcPeer::close`]); the string says why.
    #[error("connection closed: {0}")]
    Closed(String),
}

/// A message the peer sent us that is not a response to one of our requests.
#[derive(Debug)]
pub enum Incoming {
    /// A message with a `method` and no `id`; it gets no answer.
    Notification {
        /// The method name.
        method: String,
        /// The `params` as sent, or `Value::Null` if there were none.
        params: Value,
    },
    /// A message with a `method` and an `id`; it must be answered through its
    /// [`Responder`].
    Request(IncomingRequest),
    /// A `session/update` notification that is one plain text chunk, read
    /// without building a JSON tree (see [`super::chunk`]).
    TextChunk(TextChunk),
}

/// A request the peer made of us. Answer it through `responder`, now or much later.
#[derive(Debug)]
pub struct IncomingRequest {
    /// The peer's id for this request, a number or a string, exactly as sent.
    pub id: Value,
    /// The method name.
    pub method: String,
    /// The `params` as sent, or `Value::Null` if there were none.
    pub params: Value,
    /// Sends the one answer this request gets.
    pub responder: Responder,
}

impl IncomingRequest {
    /// Answers `-32601 Method not found: <method>`, for methods we do not implement.
    pub fn reject_unknown_method(self) {
        debug!(
            label = %self.responder.shared.label,
            id = %self.id,
            method = %self.method,
            "rejecting unknown method"
        );
        let message = format!("Method not found: {}", self.method);
        self.responder
            .respond_error(METHOD_NOT_FOUND, message, None);
    }
}

/// Answers one incoming request, exactly once.
///
/// Answering is fire-and-forget: if the connection is already closed the answer is dropped
/// and only logged, since there is nobody left to tell. Dropping a `Responder` without
/// answering answers `-32603 request dropped without an answer`, so the peer is never left
/// waiting for a request we forgot.
pub struct Responder {
    id: Value,
    method: String,
    shared: Arc<Shared>,
    answered: bool,
}

impl Responder {
    /// The peer's id for the request, exactly as sent.
    pub fn id(&self) -> &Value {
        &self.id
    }

    /// Answers with a successful `result`.
    pub fn respond(mut self, result: Value) {
        self.answer(Ok(result));
    }

    /// Answers with an error object.
    pub fn respond_error(mut self, code: i64, message: impl Into<String>, data: Option<Value>) {
        self.answer(Err(ErrorObject {
            code,
            message: message.into(),
            data,
        }));
    }

    fn answer(&mut self, outcome: Result<Value, ErrorObject>) {
        self.answered = true;
        let (result, error) = match outcome {
            Ok(result) => (Some(result), None),
            Err(error) => (None, Some(error)),
        };
        let bytes = encode(&OutResponse {
            jsonrpc: "2.0",
            id: &self.id,
            result,
            error,
        });
        if let Err(err) = self.shared.enqueue(bytes) {
            debug!(
                label = %self.shared.label,
                id = %self.id,
                method = %self.method,
                %err,
                "answer not sent"
            );
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // Once the connection is closed nobody is waiting, so this is not worth a warning.
        if self.shared.closed_reason().is_none() {
            warn!(
                label = %self.shared.label,
                id = %self.id,
                method = %self.method,
                "incoming request dropped without an answer; answering -32603"
            );
        }
        self.answer(Err(ErrorObject {
            code: INTERNAL_ERROR,
            message: "request dropped without an answer".to_owned(),
            data: None,
        }));
    }
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("id", &self.id)
            .field("method", &self.method)
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}

/// A handle to one JSON-RPC connection: sends requests and notifications, awaits responses.
///
/// Cheap to clone; all clones share the connection. Incoming messages are not here but in
/// the receiver returned by [`RpcPeer::spawn`].
#[derive(Clone)]
pub struct RpcPeer {
    shared: Arc<Shared>,
}

impl fmt::Debug for RpcPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcPeer")
            .field("label", &self.shared.label)
            .field("closed", &self.shared.closed_reason())
            .finish_non_exhaustive()
    }
}

impl RpcPeer {
    /// Starts the reader and writer tasks over `reader` and `writer` (typically an agent's
    /// stdout and stdin) and returns the handle plus the channel of incoming notifications
    /// and requests, in the order they arrived.
    ///
    /// The tasks end when the connection closes (see the module docs). Must be called from
    /// within a Tokio runtime.
    pub fn spawn<R, W>(
        reader: R,
        writer: W,
        config: RpcConfig,
    ) -> (RpcPeer, mpsc::Receiver<Incoming>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (closed_tx, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            label: config.label,
            next_id: AtomicU64::new(0),
            state: Mutex::new(State {
                closed: None,
                waiters: HashMap::new(),
            }),
            closed_tx,
            out_tx,
        });
        // mpsc::channel panics on 0; a capacity of 1 is the closest meaningful value.
        let (incoming_tx, incoming_rx) = mpsc::channel(config.incoming_capacity.max(1));
        let lines = LineReader::new(
            BufReader::with_capacity(READ_BUFFER_BYTES, reader),
            config.max_line_bytes,
        );
        tokio::spawn(write_loop(Arc::clone(&shared), writer, out_rx));
        tokio::spawn(read_loop(Arc::clone(&shared), lines, incoming_tx));
        (RpcPeer { shared }, incoming_rx)
    }

    /// Sends a request and waits for its response.
    ///
    /// Returns the `result`, [`RpcError::Remote`] if the peer answered with an error, or
    /// [`RpcError::Closed`] if the connection is or becomes closed first. There is no
    /// timeout here: wrap the call in `tokio::time::timeout`; dropping the future forgets
    /// the request, and a late answer to it is logged and skipped.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            // Checking `closed` under the same lock that `close` drains the table with means a
            // waiter is either refused here or failed by `close`, never forgotten.
            let mut state = self.shared.state();
            if let Some(reason) = &state.closed {
                return Err(RpcError::Closed(reason.clone()));
            }
            state.waiters.insert(id, tx);
        }
        let _guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        self.shared.enqueue(encode(&OutMessage {
            jsonrpc: "2.0",
            id: Some(id),
            method,
            params,
        }))?;
        trace!(label = %self.shared.label, id, method, "request sent");
        match rx.await {
            Ok(outcome) => outcome,
            // `close` always sends before dropping a waiter, so this is only a safety net.
            Err(_) => Err(self.shared.closed_error()),
        }
    }

    /// Sends a notification (no response is expected). Succeeds once the message is queued
    /// for writing; fails at once if the connection is closed.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        if let Some(reason) = self.shared.closed_reason() {
            return Err(RpcError::Closed(reason));
        }
        self.shared.enqueue(encode(&OutMessage {
            jsonrpc: "2.0",
            id: None,
            method,
            params,
        }))?;
        trace!(label = %self.shared.label, method, "notification sent");
        Ok(())
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed_reason().is_some()
    }

    /// Resolves with the reason once the connection is closed; at once if it already is.
    pub async fn closed(&self) -> String {
        let mut closed_rx = self.shared.closed_tx.subscribe();
        // The sender lives in `Shared`, which `self` keeps alive, so this cannot fail.
        let reason = match closed_rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "connection closed".to_owned(),
        };
        reason
    }

    /// Closes the connection from our side with `reason`: waiting callers fail, both tasks
    /// stop, and the writer shuts the transport down (an agent sees end of input). Does
    /// nothing if the connection is already closed.
    pub fn close(&self, reason: impl Into<String>) {
        self.shared.close(reason.into());
    }

    /// How many requests are waiting for a response.
    #[cfg(test)]
    fn pending_len(&self) -> usize {
        self.shared.state().waiters.len()
    }
}

/// What the handle, the tasks and every [`Responder`] share.
struct Shared {
    label: String,
    next_id: AtomicU64,
    state: Mutex<State>,
    /// Carries the close reason to whoever awaits it (the tasks, [`RpcPeer::closed`]).
    closed_tx: watch::Sender<Option<String>>,
    /// Serialized messages, each ending in `\n`, for the writer task.
    out_tx: mpsc::UnboundedSender<Vec<u8>>,
}

struct State {
    closed: Option<String>,
    waiters: HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, but if something ever does, the table is
        // still consistent, so keep going rather than poison every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn closed_reason(&self) -> Option<String> {
        self.state().closed.clone()
    }

    fn closed_error(&self) -> RpcError {
        RpcError::Closed(
            self.closed_reason()
                .unwrap_or_else(|| "connection closed".to_owned()),
        )
    }

    /// Marks the connection closed and fails every waiting caller. The first reason wins.
    fn close(&self, reason: String) {
        let waiters = {
            let mut state = self.state();
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(reason.clone());
            self.closed_tx.send_replace(Some(reason.clone()));
            mem::take(&mut state.waiters)
        };
        debug!(
            label = %self.label,
            %reason,
            failed_requests = waiters.len(),
            "rpc connection closed"
        );
        for waiter in waiters.into_values() {
            // The caller may have given up in the meantime; nothing to do then.
            let _ = waiter.send(Err(RpcError::Closed(reason.clone())));
        }
    }

    /// Queues one serialized message for the writer.
    fn enqueue(&self, bytes: Vec<u8>) -> Result<(), RpcError> {
        self.out_tx.send(bytes).map_err(|_| self.closed_error())
    }

    /// Hands a response to the caller waiting for its id.
    fn complete(&self, id: Value, outcome: Result<Value, RpcError>) {
        let waiter = parse_our_id(&id).and_then(|id| self.state().waiters.remove(&id));
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

/// Removes a request's waiter when the `request` future ends, however it ends; this is what
/// cleans up after a caller whose future was dropped.
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.state().waiters.remove(&self.id);
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

/// A request (with `id`) or a notification (without).
#[derive(Serialize)]
struct OutMessage<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    method: &'a str,
    /// JSON-RPC lets `params` be left out, not be `null`.
    #[serde(skip_serializing_if = "Value::is_null")]
    params: Value,
}

#[derive(Serialize)]
struct OutResponse<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorObject>,
}

#[derive(Serialize)]
struct ErrorObject {
    code: i64,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
}

/// Serializes one outgoing message as a line.
fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Our message types hold only strings, numbers and `Value`s, whose maps have string keys,
    // so serialization has no way to fail.
    let mut bytes = serde_json::to_vec(message).expect("JSON-RPC messages always serialize");
    bytes.push(b'\n');
    bytes
}

/// Writes queued messages until the connection closes or a write fails.
async fn write_loop<W>(
    shared: Arc<Shared>,
    mut writer: W,
    mut out_rx: mpsc::UnboundedReceiver<Vec<u8>>,
) where
    W: AsyncWrite + Unpin,
{
    let mut closed_rx = shared.closed_tx.subscribe();
    loop {
        let first = tokio::select! {
            biased;
            _ = closed_rx.wait_for(Option::is_some) => break,
            message = out_rx.recv() => match message {
                Some(message) => message,
                // Cannot happen while `shared` (which holds the sender) is alive; harmless.
                None => break,
            },
        };
        // Selecting on `closed` keeps a peer that stopped reading from pinning this task.
        let written = tokio::select! {
            biased;
            _ = closed_rx.wait_for(Option::is_some) => break,
            written = write_batch(&mut writer, first, &mut out_rx) => written,
        };
        if let Err(err) = written {
            shared.close(format!("write failed: {err}"));
            return;
        }
    }
    // Tell the peer there is no more input; bounded, as a stuck transport must not keep us.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, writer.shutdown()).await;
}

/// Writes `first` and whatever else is already queued, then flushes once.
async fn write_batch<W>(
    writer: &mut W,
    first: Vec<u8>,
    out_rx: &mut mpsc::UnboundedReceiver<Vec<u8>>,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    writer.write_all(&first).await?;
    for _ in 1..MAX_MESSAGES_PER_FLUSH {
        match out_rx.try_recv() {
            Ok(message) => writer.write_all(&message).await?,
            Err(_) => break,
        }
    }
    writer.flush().await
}

/// Reads and routes lines until the stream ends or the connection is closed elsewhere.
async fn read_loop<R>(
    shared: Arc<Shared>,
    mut lines: LineReader<R>,
    incoming_tx: mpsc::Sender<Incoming>,
) where
    R: AsyncBufRead + Unpin,
{
    let mut closed_rx = shared.closed_tx.subscribe();
    let mut router = Router {
        shared: &shared,
        incoming_tx: Some(incoming_tx),
    };
    let reason = loop {
        let line = tokio::select! {
            biased;
            // Closed by a failed write or `RpcPeer::close`: stop reading, the reason is set.
            _ = closed_rx.wait_for(Option::is_some) => return,
            line = lines.next_line(|line| router.parse(line)) => line,
        };
        match line {
            Ok(Some(Line::Complete(Some(incoming)))) => {
                if !router.deliver(incoming, &mut closed_rx).await {
                    return;
                }
            }
            Ok(Some(Line::Complete(None))) => {}
            Ok(Some(Line::TooLong { len })) => warn!(
                label = %shared.label,
                len,
                max = lines.max,
                "discarded a line longer than the limit"
            ),
            Ok(None) => break "peer closed the stream (EOF)".to_owned(),
            Err(err) => break format!("read failed: {err}"),
        }
    };
    shared.close(reason);
    // Dropping `router` drops the incoming sender: the receiver gets what is queued, then None.
}

/// Routes parsed lines from the reader to waiting callers or the incoming channel.
struct Router<'a> {
    shared: &'a Arc<Shared>,
    /// `None` once the receiver is gone; from then on requests are refused.
    incoming_tx: Option<mpsc::Sender<Incoming>>,
}

impl Router<'_> {
    /// Reads one line (borrowed from the reader's buffer: parsed where it
    /// lies, not copied first): a response goes to its caller; what is
    /// returned goes to the incoming channel. A text chunk takes the fast path.
    fn parse(&self, line: &[u8]) -> Option<Incoming> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(chunk) = chunk::parse_line(line) {
            return Some(Incoming::TextChunk(chunk));
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
            Ok(Message::Response { id, outcome }) => {
                self.shared.complete(id, outcome);
                return None;
            }
            Ok(Message::Notification { method, params }) => {
                Incoming::Notification { method, params }
            }
            Ok(Message::Request { id, method, params }) => Incoming::Request(IncomingRequest {
                responder: Responder {
                    id: id.clone(),
                    method: method.clone(),
                    shared: Arc::clone(self.shared),
                    answered: false,
                },
                id,
                method,
                params,
            }),
            Err(why) => {
                self.skip(line, &format!("not a JSON-RPC message: {why}"));
                return None;
            }
        };
        Some(incoming)
    }

    async fn deliver(
        &mut self,
        incoming: Incoming,
        closed_rx: &mut watch::Receiver<Option<String>>,
    ) -> bool {
        let Some(incoming_tx) = &self.incoming_tx else {
            self.refuse(incoming);
            return true;
        };
        // Waiting here is the backpressure; `closed` keeps a stuck receiver from pinning us.
        let sent = tokio::select! {
            biased;
            _ = closed_rx.wait_for(Option::is_some) => return false,
            sent = incoming_tx.send(incoming) => sent,
        };
        if let Err(mpsc::error::SendError(incoming)) = sent {
            warn!(
                label = %self.shared.label,
                "incoming receiver dropped; refusing requests and dropping notifications from now on"
            );
            self.incoming_tx = None;
            self.refuse(incoming);
        }
        true
    }

    /// Disposes of a message nobody will receive.
    fn refuse(&self, incoming: Incoming) {
        match incoming {
            Incoming::Notification { method, .. } => {
                debug!(label = %self.shared.label, %method, "notification dropped: nobody is listening");
            }
            Incoming::TextChunk(_) => {
                debug!(label = %self.shared.label, "text chunk dropped: nobody is listening");
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

    fn skip(&self, line: &[u8], why: &str) {
        warn!(
            label = %self.shared.label,
            line = %preview(line),
            "skipping line: {why}"
        );
    }
}

/// One parsed JSON-RPC message.
#[derive(Debug)]
enum Message {
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
fn classify(mut object: Map<String, Value>) -> Result<Message, &'static str> {
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

/// What [`LineReader::next_line`] found.
#[derive(Debug, PartialEq)]
enum Line<T> {
    /// What the parser made of a line (given without its `\n`).
    Complete(T),
    /// A line longer than the limit, already discarded; `len` is its length.
    TooLong { len: usize },
}

/// Most bytes the line buffer keeps between lines: what a long line needed
/// is given back.
const RETAINED_LINE_BYTES: usize = 64 * 1024;

/// Splits a byte stream into `\n`-terminated lines of bounded length.
///
/// Hand-written rather than a `tokio_util` codec because `FramedRead` stops after a decode
/// error, and an over-long line must only cost that line. A line that lies whole in the
/// `BufReader`'s buffer (the usual case) is parsed there, never copied; one that spans
/// refills is assembled in `buf` first. Bytes of an over-long line are consumed and dropped
/// as they arrive, so at most `max` bytes are ever held (plus the `BufReader`'s fixed
/// buffer). Cancel-safe: all state lives in `self`, and a line is parsed and consumed with
/// no await in between.
struct LineReader<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
    /// `Some(bytes seen so far)` while skipping the rest of an over-long line.
    discarding: Option<usize>,
    /// The most bytes `buf` ever held, to prove the bound in tests.
    #[cfg(test)]
    peak: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            buf: Vec::new(),
            discarding: None,
            #[cfg(test)]
            peak: 0,
        }
    }

    /// The next line as `parse` reads it, or `None` at end of stream. An unterminated last
    /// line still counts.
    async fn next_line<T>(
        &mut self,
        mut parse: impl FnMut(&[u8]) -> T,
    ) -> io::Result<Option<Line<T>>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if let Some(len) = self.discarding.take() {
                    return Ok(Some(Line::TooLong { len }));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Line::Complete(self.take_buffered(&mut parse))));
            }
            let newline = memchr::memchr(b'\n', available);
            if let Some(end) = newline {
                if self.buf.is_empty() && self.discarding.is_none() && end <= self.max {
                    let parsed = parse(&available[..end]);
                    self.inner.consume(end + 1);
                    return Ok(Some(Line::Complete(parsed)));
                }
            }
            let chunk = &available[..newline.unwrap_or(available.len())];
            match &mut self.discarding {
                Some(seen) => *seen += chunk.len(),
                None if self.buf.len() + chunk.len() > self.max => {
                    self.discarding = Some(self.buf.len() + chunk.len());
                    // Give the memory back now; the line may go on for a long time.
                    self.buf = Vec::new();
                }
                None => {
                    self.buf.extend_from_slice(chunk);
                    #[cfg(test)]
                    {
                        self.peak = self.peak.max(self.buf.len());
                    }
                }
            }
            let consumed = chunk.len() + usize::from(newline.is_some());
            self.inner.consume(consumed);
            if newline.is_some() {
                return Ok(Some(match self.discarding.take() {
                    Some(len) => Line::TooLong { len },
                    None => Line::Complete(self.take_buffered(&mut parse)),
                }));
            }
        }
    }

    /// Parses the assembled line and empties the buffer (giving a long
    /// line's memory back).
    fn take_buffered<T>(&mut self, parse: impl FnOnce(&[u8]) -> T) -> T {
        let parsed = parse(&self.buf);
        if self.buf.capacity() > RETAINED_LINE_BYTES {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        parsed
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use serde_json::json;
    use tokio::io::{DuplexStream, Lines, ReadHalf, WriteHalf};
    use tokio::task::JoinHandle;

    use super::*;

    /// Bounds every wait, so a broken test fails instead of hanging; never a measured delay.
    async fn within<F: std::future::Future>(future: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), future)
            .await
            .expect("timed out waiting for an event")
    }

    /// The agent's end of the connection, driven by hand.
    struct Agent {
        lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
        writer: WriteHalf<DuplexStream>,
    }

    impl Agent {
        async fn send(&mut self, message: Value) {
            self.send_raw(format!("{message}\n").as_bytes()).await;
        }

        async fn send_raw(&mut self, bytes: &[u8]) {
            within(self.writer.write_all(bytes)).await.unwrap();
        }

        /// The next message we wrote.
        async fn recv(&mut self) -> Value {
            let line = within(self.lines.next_line())
                .await
                .unwrap()
                .expect("the gateway closed its output");
            serde_json::from_str(&line).unwrap()
        }

        /// Answers a request with `result`.
        async fn answer(&mut self, request: &Value, result: Value) {
            self.send(json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
                .await;
        }
    }

    fn connect(config: RpcConfig) -> (RpcPeer, mpsc::Receiver<Incoming>, Agent) {
        connect_with_pipe_capacity(config, 64 * 1024)
    }

    fn connect_with_pipe_capacity(
        config: RpcConfig,
        capacity: usize,
    ) -> (RpcPeer, mpsc::Receiver<Incoming>, Agent) {
        let (ours, theirs) = tokio::io::duplex(capacity);
        let (reader, writer) = tokio::io::split(ours);
        let (peer, incoming) = RpcPeer::spawn(reader, writer, config);
        let (their_reader, their_writer) = tokio::io::split(theirs);
        let agent = Agent {
            lines: BufReader::new(their_reader).lines(),
            writer: their_writer,
        };
        (peer, incoming, agent)
    }

    fn spawn_request(peer: &RpcPeer, method: &str) -> JoinHandle<Result<Value, RpcError>> {
        let peer = peer.clone();
        let method = method.to_owned();
        tokio::spawn(async move { peer.request(&method, json!({"asked": method})).await })
    }

    /// The next message, a fast-path text chunk as the notification it is.
    async fn next_incoming(incoming: &mut mpsc::Receiver<Incoming>) -> Incoming {
        match within(incoming.recv())
            .await
            .expect("incoming channel ended")
        {
            Incoming::TextChunk(chunk) => Incoming::Notification {
                method: "session/update".into(),
                params: chunk.to_params(),
            },
            other => other,
        }
    }

    async fn next_notification(incoming: &mut mpsc::Receiver<Incoming>) -> (String, Value) {
        match next_incoming(incoming).await {
            Incoming::Notification { method, params } => (method, params),
            other => panic!("expected a notification, got {other:?}"),
        }
    }

    async fn next_request(incoming: &mut mpsc::Receiver<Incoming>) -> IncomingRequest {
        match next_incoming(incoming).await {
            Incoming::Request(request) => request,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn notification(method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "method": method, "params": params})
    }

    #[tokio::test]
    async fn responses_answered_out_of_order_reach_their_own_callers() {
        let (peer, _incoming, mut agent) = connect(RpcConfig::default());
        let calls: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|method| (*method, spawn_request(&peer, method)))
            .collect();
        let mut requests = Vec::new();
        for _ in 0..3 {
            requests.push(agent.recv().await);
        }
        for request in requests.iter().rev() {
            let result = json!({"answer_to": request["method"]});
            agent.answer(request, result).await;
        }
        for (method, call) in calls {
            let result = within(call).await.unwrap().unwrap();
            assert_eq!(result, json!({"answer_to": method}));
        }
        assert_eq!(peer.pending_len(), 0);
    }

    #[tokio::test]
    async fn the_first_request_uses_id_zero_and_its_answer_is_accepted() {
        let (peer, _incoming, mut agent) = connect(RpcConfig::default());
        let call = spawn_request(&peer, "initialize");
        let request = agent.recv().await;
        assert_eq!(
            request,
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"asked": "initialize"}})
        );
        agent.answer(&request, json!({"protocolVersion": 1})).await;
        assert_eq!(
            within(call).await.unwrap().unwrap(),
            json!({"protocolVersion": 1})
        );
    }

    #[tokio::test]
    async fn a_response_id_sent_back_as_a_numeric_string_is_accepted() {
        let (peer, _incoming, mut agent) = connect(RpcConfig::default());
        let first = spawn_request(&peer, "first");
        agent.recv().await;
        let second = spawn_request(&peer, "second");
        agent.recv().await;
        agent
            .send(json!({"jsonrpc": "2.0", "id": "1", "result": "second"}))
            .await;
        agent
            .send(json!({"jsonrpc": "2.0", "id": "0", "result": "first"}))
            .await;
        assert_eq!(within(first).await.unwrap().unwrap(), json!("first"));
        assert_eq!(within(second).await.unwrap().unwrap(), json!("second"));
    }

    #[tokio::test]
    async fn incoming_request_ids_are_echoed_verbatim_as_strings_or_numbers() {
        let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
        agent
            .send(json!({"jsonrpc": "2.0", "id": "5f0c-uuid", "method": "fs/read_text_file", "params": {}}))
            .await;
        agent
            .send(json!({"jsonrpc": "2.0", "id": 0, "method": "fs/read_text_file", "params": {}}))
            .await;
        let by_string = next_request(&mut incoming).await;
        assert_eq!(by_string.id, json!("5f0c-uuid"));
        assert_eq!(by_string.responder.id(), &json!("5f0c-uuid"));
        by_string.responder.respond(json!({"content": "a"}));
        let by_number = next_request(&mut incoming).await;
        by_number.responder.respond(json!({"content": "b"}));

        assert_eq!(
            agent.recv().await,
            json!({"jsonrpc": "2.0", "id": "5f0c-uuid", "result": {"content": "a"}})
        );
        assert_eq!(
            agent.recv().await,
            json!({"jsonrpc": "2.0", "id": 0, "result": {"content": "b"}})
        );
    }

    #[tokio::test]
    async fn notifications_and_requests_are_delivered_in_arrival_order_under_backpressure() {
        // A tiny channel makes the reader wait for the receiver most of the time.
        let config = RpcConfig {
            incoming_capacity: 2,
            ..RpcConfig::default()
        };
        let (_peer, mut incoming, mut agent) = connect(config);
        for n in 0..50 {
            if n == 25 {
                agent
                    .send(json!({"jsonrpc": "2.0", "id": 25, "method": "session/request_permission", "params": {"n": n}}))
                    .await;
            } else {
                agent
                    .send(notification("session/update", json!({"n": n})))
                    .await;
            }
        }
        for n in 0..50 {
            match next_incoming(&mut incoming).await {
                Incoming::Request(request) => {
                    assert_eq!(n, 25);
                    assert_eq!(request.params, json!({"n": n}));
                    request.responder.respond(json!({}));
                }
                Incoming::Notification { method, params } => {
                    assert_eq!(method, "session/update");
                    assert_eq!(params, json!({"n": n}));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn text_chunks_take_the_fast_path_in_order_with_everything_else() {
        let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
        let chunk = |text: &str| {
            notification(
                "session/update",
                json!({"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": text}}}),
            )
        };
        agent.send(chunk("a")).await;
        agent
            .send(notification("session/update", json!({"n": 1})))
            .await;
        // Split across writes, so that it is assembled rather than read in place.
        let line = serde_json::to_vec(&chunk("b")).unwrap();
        agent.send_raw(&line[..10]).await;
        agent.send_raw(&line[10..]).await;
        agent.send_raw(b"\n").await;
        for text in ["a", "", "b"] {
            match within(incoming.recv()).await.unwrap() {
                Incoming::TextChunk(c) if !text.is_empty() => {
                    assert_eq!(c.text, text);
                    assert_eq!(c.session_id, "s");
                }
                Incoming::Notification { params, .. } if text.is_empty() => {
                    assert_eq!(params, json!({"n": 1}));
                }
                other => panic!("expected {text:?}, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_incoming_request_can_be_answered_later_while_other_traffic_flows() {
        let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
        agent
            .send(json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission", "params": {"sessionId": "s"}}))
            .await;
        let permission = next_request(&mut incoming).await;
        assert_eq!(permission.method, "session/request_permission");

        // While the permission request waits, a whole exchange happens in both directions.
        let prompt = spawn_request(&peer, "session/prompt");
        let sent = agent.recv().await;
        assert_eq!(sent["method"], "session/prompt");
        agent
            .send(notification("session/update", json!({"chunk": 1})))
            .await;
        assert_eq!(
            next_notification(&mut incoming).await,
            ("session/update".to_owned(), json!({"chunk": 1}))
        );
        within(peer.notify("session/cancel", json!({"sessionId": "s"})))
            .await
            .unwrap();
        assert_eq!(
            agent.recv().await,
            json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}})
        );
        agent
            .answer(&sent, json!({"stopReason": "cancelled"}))
            .await;
        assert_eq!(
            within(prompt).await.unwrap().unwrap(),
            json!({"stopReason": "cancelled"})
        );

        // Now, much later, the held request gets its answer, with the agent's id.
        let outcome = json!({"outcome": {"outcome": "cancelled"}});
        permission.responder.respond(outcome.clone());
        assert_eq!(
            agent.recv().await,
            json!({"jsonrpc": "2.0", "id": 0, "result": outcome})
        );
    }

    #[tokio::test]
    async fn reject_unknown_method_answers_method_not_found() {
        let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
        agent
            .send(json!({"jsonrpc": "2.0", "id": 3, "method": "terminal/create", "params": {}}))
            .await;
        next_request(&mut incoming).await.reject_unknown_method();
        assert_eq!(
            agent.recv().await,
            json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "Method not found: terminal/create"}})
        );
    }

    #[tokio::test]
    async fn garbage_and_invalid_shapes_are_skipped_and_later_messages_still_processed() {
        let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
        let junk: &[&[u8]] = &[
            b"Starting agent v1.2 ...\n",
            b"\xff\xfe\x00 not utf-8\n",
            b"{\"jsonrpc\": \"2.0\", \"method\": \n",
            b"[1, 2, 3]\n",
            b"42\n",
            b"\"just a string\"\n",
            b"{\"jsonrpc\": \"2.0\"}\n",
            b"{\"jsonrpc\": \"2.0\", \"method\": 5}\n",
            b"{\"jsonrpc\": \"2.0\", \"id\": {\"x\": 1}, \"method\": \"m\"}\n",
            b"{\"jsonrpc\": \"2.0\", \"id\": 0}\n",
            b"{\"jsonrpc\": \"2.0\", \"id\": 999, \"result\": {}}\n",
            b"{\"jsonrpc\": \"2.0\", \"id\": \"not ours\", \"result\": {}}\n",
            b"\n",
            b"\r\n",
            b"   \n",
        ];
        for line in junk {
            agent.send_raw(line).await;
        }
        agent
            .send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"after\",\"params\":{\"ok\":true}}\r\n")
            .await;
        assert_eq!(
            next_notification(&mut incoming).await,
            ("after".to_owned(), json!({"ok": true}))
        );

        let call = spawn_request(&peer, "still/works");
        let request = agent.recv().await;
        agent.answer(&request, json!("yes")).await;
        assert_eq!(within(call).await.unwrap().unwrap(), json!("yes"));
        assert!(!peer.is_closed());
    }

    /// A notification line of exactly `len` bytes.
    fn notification_line_of_len(method: &str, len: usize) -> Vec<u8> {
        let empty = format!("{{\"method\":\"{method}\",\"params\":\"\"}}");
        let padding = "x".repeat(len - empty.len());
        format!("{{\"method\":\"{method}\",\"params\":\"{padding}\"}}").into_bytes()
    }

    #[tokio::test]
    async fn a_line_longer_than_the_limit_is_discarded_and_the_next_line_processed() {
        const MAX: usize = 1024;
        let config = RpcConfig {
            max_line_bytes: MAX,
            ..RpcConfig::default()
        };
        // A small pipe means the agent's writes only go through if the reader keeps consuming.
        let (_peer, mut incoming, mut agent) = connect_with_pipe_capacity(config, 256);

        let mut fits = notification_line_of_len("fits", MAX);
        fits.push(b'\n');
        agent.send_raw(&fits).await;
        let mut one_too_many = notification_line_of_len("too/long", MAX + 1);
        one_too_many.push(b'\n');
        agent.send_raw(&one_too_many).await;
        // Ten times the limit without a newline, in chunks smaller than the pipe.
        for _ in 0..(10 * MAX / 128) {
            agent.send_raw(&[b'y'; 128]).await;
        }
        agent.send_raw(b"\n").await;
        agent.send(notification("after", json!({}))).await;

        let (method, params) = next_notification(&mut incoming).await;
        // The line of exactly the limit arrived whole.
        let line = serde_json::to_vec(&json!({"method": method, "params": params})).unwrap();
        assert_eq!(line, notification_line_of_len("fits", MAX));
        assert_eq!(
            next_notification(&mut incoming).await,
            ("after".to_owned(), json!({}))
        );
    }

    #[tokio::test]
    async fn the_line_reader_never_holds_more_than_the_limit_while_discarding() {
        const MAX: usize = 100;
        let (reader, mut writer) = tokio::io::duplex(64);
        let feeder = tokio::spawn(async move {
            for _ in 0..(10 * MAX / 25) {
                writer.write_all(&[b'z'; 25]).await.unwrap();
            }
            writer.write_all(b"\nnext\r\nlast").await.unwrap();
            // Dropping `writer` ends the stream.
        });
        let mut lines = LineReader::new(BufReader::with_capacity(32, reader), MAX);
        assert_eq!(
            within(lines.next_line(<[u8]>::to_vec)).await.unwrap(),
            Some(Line::TooLong { len: 10 * MAX })
        );
        assert_eq!(
            within(lines.next_line(<[u8]>::to_vec)).await.unwrap(),
            Some(Line::Complete(b"next\r".to_vec()))
        );
        assert_eq!(
            within(lines.next_line(<[u8]>::to_vec)).await.unwrap(),
            Some(Line::Complete(b"last".to_vec()))
        );
        assert_eq!(within(lines.next_line(<[u8]>::to_vec)).await.unwrap(), None);
        within(feeder).await.unwrap();
        assert!(lines.peak <= MAX, "buffered {} bytes", lines.peak);
    }

    #[tokio::test]
    async fn eof_fails_every_pending_caller_at_once_and_later_calls_fail_fast() {
        let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
        let calls: Vec<_> = (0..3)
            .map(|n| spawn_request(&peer, &format!("call/{n}")))
            .collect();
        for _ in 0..3 {
            agent.recv().await;
        }
        agent.send(notification("last/words", json!({}))).await;
        within(agent.writer.shutdown()).await.unwrap();

        for call in calls {
            match within(call).await.unwrap() {
                Err(RpcError::Closed(reason)) => assert!(reason.contains("EOF"), "{reason}"),
                other => panic!("expected Closed, got {other:?}"),
            }
        }
        assert!(within(peer.closed()).await.contains("EOF"));
        assert!(peer.is_closed());
        assert_eq!(peer.pending_len(), 0);
        assert!(matches!(
            within(peer.request("after", json!({}))).await,
            Err(RpcError::Closed(_))
        ));
        assert!(matches!(
            within(peer.notify("after", json!({}))).await,
            Err(RpcError::Closed(_))
        ));
        // What was queued before the end is still delivered, then the channel ends.
        assert_eq!(next_notification(&mut incoming).await.0, "last/words");
        assert!(within(incoming.recv()).await.is_none());
        // Our writer shut down too, so the agent sees the end of its input.
        assert!(within(agent.lines.next_line()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_dropped_request_future_removes_its_pending_entry() {
        let (peer, _incoming, mut agent) = connect(RpcConfig::default());
        let mut call = Box::pin(peer.request("slow", json!({})));
        let sent = tokio::select! {
            _ = &mut call => panic!("nobody answered yet"),
            sent = agent.recv() => sent,
        };
        assert_eq!(peer.pending_len(), 1);
        drop(call);
        assert_eq!(peer.pending_len(), 0);

        // A timeout that fires behaves the same: a zero timeout polls the request once.
        let timed_out =
            tokio::time::timeout(Duration::ZERO, peer.request("slower", json!({}))).await;
        assert!(timed_out.is_err());
        assert_eq!(peer.pending_len(), 0);
        let sent_too = agent.recv().await;
        assert_eq!(sent_too["method"], "slower");

        // Late answers to the abandoned ids are skipped; the connection keeps working.
        agent.answer(&sent, json!("late")).await;
        agent.answer(&sent_too, json!("later")).await;
        let call = spawn_request(&peer, "next");
        let request = agent.recv().await;
        assert_eq!(request["id"], 2);
        agent.answer(&request, json!("on time")).await;
        assert_eq!(within(call).await.unwrap().unwrap(), json!("on time"));
    }

    #[tokio::test]
    async fn a_dropped_responder_answers_internal_error() {
        let (_peer, mut incoming, mut agent) = connect(RpcConfig::default());
        agent
            .send(json!({"jsonrpc": "2.0", "id": 9, "method": "fs/write_text_file", "params": {}}))
            .await;
        drop(next_request(&mut incoming).await);
        assert_eq!(
            agent.recv().await,
            json!({"jsonrpc": "2.0", "id": 9, "error": {"code": -32603, "message": "request dropped without an answer"}})
        );
    }

    #[tokio::test]
    async fn a_remote_error_object_becomes_rpc_error_remote() {
        let (peer, _incoming, mut agent) = connect(RpcConfig::default());
        let call = spawn_request(&peer, "session/new");
        let request = agent.recv().await;
        agent
            .send(json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": "cwd must be absolute", "data": {"field": "cwd"}}}))
            .await;
        match within(call).await.unwrap() {
            Err(RpcError::Remote {
                code,
                message,
                data,
            }) => {
                assert_eq!(code, INVALID_PARAMS);
                assert_eq!(message, "cwd must be absolute");
                assert_eq!(data, Some(json!({"field": "cwd"})));
            }
            other => panic!("expected a remote error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn requests_are_refused_once_the_incoming_receiver_is_dropped() {
        let (peer, incoming, mut agent) = connect(RpcConfig::default());
        drop(incoming);
        agent.send(notification("session/update", json!({}))).await;
        agent
            .send(json!({"jsonrpc": "2.0", "id": "r1", "method": "session/request_permission", "params": {}}))
            .await;
        let answer = agent.recv().await;
        assert_eq!(answer["id"], "r1");
        assert_eq!(answer["error"]["code"], INTERNAL_ERROR);

        // Our own requests are unaffected.
        let call = spawn_request(&peer, "session/prompt");
        let request = agent.recv().await;
        agent.answer(&request, json!("fine")).await;
        assert_eq!(within(call).await.unwrap().unwrap(), json!("fine"));
    }

    /// A transport whose every write fails, like the stdin of an agent that exited.
    struct BrokenPipe;

    impl AsyncWrite for BrokenPipe {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "agent stdin closed",
            )))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_failed_write_closes_the_connection() {
        let (ours, _theirs) = tokio::io::duplex(1024);
        let (peer, mut incoming) = RpcPeer::spawn(ours, BrokenPipe, RpcConfig::default());
        match within(peer.request("initialize", json!({}))).await {
            Err(RpcError::Closed(reason)) => assert!(reason.contains("write failed"), "{reason}"),
            other => panic!("expected Closed, got {other:?}"),
        }
        assert!(within(peer.closed()).await.contains("agent stdin closed"));
        // The reader stops too, although its side of the pipe is still open.
        assert!(within(incoming.recv()).await.is_none());
    }

    #[tokio::test]
    async fn close_fails_pending_callers_and_ends_the_agents_input() {
        let (peer, mut incoming, mut agent) = connect(RpcConfig::default());
        let call = spawn_request(&peer, "session/prompt");
        agent.recv().await;
        peer.close("conversation deleted");
        match within(call).await.unwrap() {
            Err(RpcError::Closed(reason)) => assert_eq!(reason, "conversation deleted"),
            other => panic!("expected Closed, got {other:?}"),
        }
        assert_eq!(within(peer.closed()).await, "conversation deleted");
        assert!(within(agent.lines.next_line()).await.unwrap().is_none());
        assert!(within(incoming.recv()).await.is_none());
    }

    #[test]
    fn classify_tells_the_three_kinds_of_message_apart() {
        let parse = |value: Value| match value {
            Value::Object(object) => classify(object),
            _ => unreachable!(),
        };
        assert!(matches!(
            parse(json!({"id": null, "method": "m"})),
            Ok(Message::Notification {
                params: Value::Null,
                ..
            })
        ));
        assert!(matches!(
            parse(json!({"id": "x", "method": "m", "params": [1]})),
            Ok(Message::Request { .. })
        ));
        assert!(matches!(
            parse(json!({"id": 1, "result": 2, "error": null})),
            Ok(Message::Response { outcome: Ok(_), .. })
        ));
        assert!(matches!(
            parse(json!({"id": 1, "error": "boom"})),
            Ok(Message::Response {
                outcome: Err(RpcError::Remote {
                    code: INTERNAL_ERROR,
                    ..
                }),
                ..
            })
        ));
        assert!(parse(json!({"id": 1, "error": null})).is_err());
        assert!(parse(json!({"id": true, "result": 1})).is_err());
    }
    /// Property tests (a bounded fuzzer): `PROPTEST_CASES` raises the number
    /// of cases; `scripts/fuzz` runs them for longer.
    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn runtime() -> tokio::runtime::Runtime {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        }

        /// Lines as an agent might write them: JSON-RPC-ish fragments glued
        /// together, or any bytes at all (never a newline: that ends a line).
        fn agent_line() -> impl Strategy<Value = Vec<u8>> {
            let fragment = prop_oneof![
                Just(r#"{"jsonrpc":"2.0","#.to_owned()),
                Just(r#""id":"#.to_owned()),
                Just(r#""method":"session/update","#.to_owned()),
                Just(r#""method":"session/request_permission","#.to_owned()),
                Just(r#""params":{"update":{"sessionUpdate":"agent_message_chunk"}}"#.to_owned()),
                Just(r#""result":{"stopReason":"end_turn"}"#.to_owned()),
                Just(r#""error":{"code":-32603,"message":"x"}"#.to_owned()),
                Just(r#""\u0000\ud800""#.to_owned()),
                Just("0".to_owned()),
                Just("-1e999".to_owned()),
                Just("null".to_owned()),
                Just("[".to_owned()),
                Just("]".to_owned()),
                Just("}".to_owned()),
                Just(",".to_owned()),
                "[ -~]{0,12}",
            ];
            prop_oneof![
                proptest::collection::vec(fragment, 0..12).prop_map(|f| f.concat().into_bytes()),
                proptest::collection::vec(
                    any::<u8>().prop_filter("no newline", |b| *b != b'\n'),
                    0..200
                ),
            ]
        }

        proptest! {
            /// Whatever the stream and however it is cut into reads, the
            /// reader yields exactly its lines, longer ones as `TooLong`, and
            /// never holds more than the limit.
            #[test]
            fn the_line_reader_yields_every_line_and_never_holds_more_than_the_limit(
                input in proptest::collection::vec(prop_oneof![any::<u8>(), Just(b'\n')], 0..2000),
                read_size in 1usize..64,
                max in 1usize..300,
            ) {
                let mut parts: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
                let last = parts.pop().unwrap_or_default();
                if !last.is_empty() {
                    parts.push(last);
                }
                let expected: Vec<Line<Vec<u8>>> = parts
                    .into_iter()
                    .map(|part| {
                        if part.len() > max {
                            Line::TooLong { len: part.len() }
                        } else {
                            Line::Complete(part.to_vec())
                        }
                    })
                    .collect();
                let (got, peak) = runtime().block_on(async {
                    let mut lines =
                        LineReader::new(BufReader::with_capacity(read_size, &input[..]), max);
                    let mut got = Vec::new();
                    while let Some(line) = lines.next_line(<[u8]>::to_vec).await.unwrap() {
                        got.push(line);
                    }
                    (got, lines.peak)
                });
                prop_assert_eq!(got, expected);
                prop_assert!(peak <= max);
            }

            /// No line an agent writes stops the connection or panics: what
            /// follows it is still delivered.
            #[test]
            fn any_agent_output_is_routed_or_skipped_and_the_connection_goes_on(
                lines in proptest::collection::vec(agent_line(), 0..20),
            ) {
                runtime().block_on(async {
                    let config = RpcConfig { max_line_bytes: 150, ..RpcConfig::default() };
                    let (_peer, mut incoming, mut agent) = connect(config);
                    for line in &lines {
                        agent.send_raw(line).await;
                        agent.send_raw(b"\n").await;
                    }
                    agent.send(notification("done", json!({}))).await;
                    loop {
                        match next_incoming(&mut incoming).await {
                            Incoming::Notification { method, .. } if method == "done" => break,
                            // Requests among the noise are dropped: answered -32603.
                            _ => continue,
                        }
                    }
                });
            }
        }
    }
}
